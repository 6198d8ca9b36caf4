//! One direction of the path: a thread that reads frames from one interface, asks the schedule
//! when each leaves (or drops it), holds it in the bounded delay line, and sends it out of the
//! other interface on time. One thread does both so the delay line needs no lock; it never
//! sleeps longer than `TICK`, so a stop is seen promptly.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::packet::{
    is_gso, realtime, tight_timer_slack, PacketSocket, RxBatch, BATCH, VNET_HDR_LEN,
};
use crate::queue::DelayLine;
use crate::schedule::{Drop, Nanos, Schedule, Verdict};
use crate::stats::Counters;

/// The longest wait without looking at the stop flag.
const TICK: Duration = Duration::from_millis(20);

pub struct Direction {
    pub name: &'static str,
    pub from: Arc<PacketSocket>,
    pub to: Arc<PacketSocket>,
    pub schedule: Schedule,
    pub counters: Arc<Counters>,
    pub max_frame: usize,
    /// `SCHED_FIFO` priority of the thread (None: an ordinary thread).
    pub realtime: Option<i32>,
}

impl Direction {
    /// Runs until `stop`; an error is the interfaces' (gone, down): the caller reports it.
    pub fn run(mut self, epoch: Instant, stop: Arc<AtomicBool>) -> std::io::Result<()> {
        tight_timer_slack();
        if let Some(p) = self.realtime {
            if let Err(e) = realtime(p) {
                tracing::warn!(
                    dir = self.name,
                    "no real-time scheduling ({e}): delays will be less exact"
                );
            }
        }
        let imp = self.schedule.impairment().clone();
        let mut line: DelayLine<Vec<u8>> =
            DelayLine::new(imp.reorder, imp.limit_packets, imp.limit_bytes);
        let mut rx = RxBatch::new(self.max_frame + VNET_HDR_LEN);
        let c = self.counters.clone();
        let now = || epoch.elapsed().as_nanos() as Nanos;
        let mut due: Vec<(Nanos, Vec<u8>)> = Vec::with_capacity(BATCH);
        let mut last_stats = Instant::now();
        while !stop.load(Relaxed) {
            // 1. everything whose time has come
            loop {
                let t = now();
                due.clear();
                while due.len() < BATCH {
                    match line.pop_due(t) {
                        Some(x) => due.push(x),
                        None => break,
                    }
                }
                if due.is_empty() {
                    break;
                }
                self.send(&due, t);
            }
            c.queued.store(line.len() as u64, Relaxed);
            c.queue_high_water.store(line.high_water as u64, Relaxed);
            if last_stats.elapsed() > Duration::from_millis(200) {
                Counters::add(&c.drop_rx_socket, self.from.take_kernel_drops()?);
                last_stats = Instant::now();
            }
            // 2. wait for a frame, or the next departure
            let wait = match line.next_departure() {
                Some(d) => Duration::from_nanos(d.saturating_sub(now())).min(TICK),
                None => TICK,
            };
            if !wait.is_zero() && !self.from.wait_readable(wait)? {
                continue;
            }
            // 3. read what is there (a few batches at most, so departures stay on time)
            for _ in 0..4 {
                let n = self.from.recv_batch(&mut rx)?;
                let t = now();
                for i in 0..n {
                    let len = rx.lens[i];
                    let wire = len.saturating_sub(VNET_HDR_LEN);
                    Counters::add(&c.rx_packets, 1);
                    Counters::add(&c.rx_bytes, wire as u64);
                    if rx.truncated[i] || len > rx.bufs[i].len() || len <= VNET_HDR_LEN {
                        Counters::add(&c.drop_oversize, 1);
                        continue;
                    }
                    let frame = &rx.bufs[i][..len];
                    if is_gso(frame) {
                        Counters::add(&c.gso_frames, 1);
                    }
                    match self.schedule.admit(t, wire) {
                        Verdict::Drop(Drop::Loss) => Counters::add(&c.drop_loss, 1),
                        Verdict::Drop(Drop::QueueFull) => Counters::add(&c.drop_queue, 1),
                        Verdict::Depart(at) => {
                            if line.push(at, frame.to_vec()).is_err() {
                                Counters::add(&c.drop_queue, 1);
                            }
                        }
                    }
                }
                if n < BATCH {
                    break;
                }
            }
        }
        c.queued.store(line.len() as u64, Relaxed);
        Counters::add(&c.drop_rx_socket, self.from.take_kernel_drops()?);
        Ok(())
    }

    fn send(&self, due: &[(Nanos, Vec<u8>)], t: Nanos) {
        let c = &self.counters;
        let frames: Vec<&[u8]> = due.iter().map(|(_, f)| f.as_slice()).collect();
        let mut i = 0;
        while i < frames.len() {
            let (k, err) = self.to.send_batch(&frames[i..]);
            for (depart, f) in &due[i..i + k] {
                c.sent(f.len() - VNET_HDR_LEN, t.saturating_sub(*depart));
            }
            i += k;
            if i < frames.len() && (err.is_some() || k == 0) {
                // the kernel refused frame i (backlog of the next device full, device down):
                // it is lost, as on a real link
                if let Some(e) = err {
                    tracing::debug!(dir = self.name, "send: {e}");
                }
                Counters::add(&c.drop_send, 1);
                i += 1;
            }
        }
    }
}
