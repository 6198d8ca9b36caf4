//! The data path benchmark: tx threads keep their rings full of preallocated frames, rx threads
//! keep their rings stocked with buffers; both count kicks and call notifications.

use crate::device::{Device, Queue};
use crate::frame::{self, FrameSpec, VirtioNetHdr, VNET_HDR_LEN};
use crate::mem::GuestMem;
use crate::ring::{DriverRing, DESC_F_WRITE};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Tx,
    Rx,
    Both,
}

#[derive(Clone, Debug)]
pub struct BenchOpts {
    pub role: Role,
    pub frame: FrameSpec,
    /// Stop after this long (tx: from the first frame sent; rx: from the first frame received).
    pub duration: Option<Duration>,
    /// Stop after this many frames (per direction, over all queues).
    pub count: Option<u64>,
    /// Frames per second over all tx queues (0 = as fast as possible).
    pub rate: u64,
    /// Frames published per kick decision.
    pub batch: u16,
    /// rx: end the run when no frame came for this long after the first one.
    pub idle: Duration,
    /// No progress for this long is an error.
    pub timeout: Duration,
}

/// One direction's numbers (the JSON report).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub role: &'static str,
    pub queues: usize,
    /// Frames completed (tx: returned used by the backend; rx: received).
    pub frames: u64,
    /// Ethernet bytes of those frames (no virtio header).
    pub bytes: u64,
    /// tx: first frame sent to last completion; rx: first to last frame received.
    pub seconds: f64,
    pub pps: f64,
    pub gbit_per_s: f64,
    /// Kicks written to the kick eventfds.
    pub kicks: u64,
    /// Notifications the backend sent: the sum of the call eventfd counters.
    pub calls: u64,
    /// read()s of the call eventfds that returned a non-zero counter (wake-ups).
    pub call_wakeups: u64,
    pub frames_per_call: f64,
    #[serde(rename = "calls_per_MB")]
    pub calls_per_mb: f64,
    /// Frames submitted but not completed when the run ended (tx).
    pub in_flight_at_end: u64,
    /// Used entries with an out-of-range id or length (a buggy backend).
    pub bad_used: u64,
    /// tx: extra kicks sent because nothing completed for 200 ms (lost-kick insurance).
    pub rekicks: u64,
    /// rx: frames larger than `--size`/smaller than a header, etc. are still counted; this is
    /// the number of frames whose length differed from the frame size we sent (informative).
    pub size_mismatch: u64,
    #[serde(skip)]
    first: Option<Instant>,
    #[serde(skip)]
    last: Option<Instant>,
}

impl Stats {
    fn merge(&mut self, o: &Stats) {
        self.queues += o.queues;
        self.frames += o.frames;
        self.bytes += o.bytes;
        self.kicks += o.kicks;
        self.calls += o.calls;
        self.call_wakeups += o.call_wakeups;
        self.in_flight_at_end += o.in_flight_at_end;
        self.bad_used += o.bad_used;
        self.rekicks += o.rekicks;
        self.size_mismatch += o.size_mismatch;
        self.first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last = match (self.last, o.last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    fn finish(&mut self) {
        self.seconds = match (self.first, self.last) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        if self.seconds > 0.0 {
            self.pps = self.frames as f64 / self.seconds;
            self.gbit_per_s = self.bytes as f64 * 8.0 / self.seconds / 1e9;
        }
        if self.calls > 0 {
            self.frames_per_call = self.frames as f64 / self.calls as f64;
        }
        if self.bytes > 0 {
            self.calls_per_mb = self.calls as f64 / (self.bytes as f64 / 1e6);
        }
    }
}

/// Reads the call eventfd without blocking and adds to the counters.
fn drain_call(call: &EventFd, st: &mut Stats) {
    if let Ok(v) = call.read() {
        if v > 0 {
            st.calls += v;
            st.call_wakeups += 1;
        }
    }
}

/// Waits up to `t` for the call eventfd, then drains it.
fn wait_call(call: &EventFd, t: Duration, st: &mut Stats) -> Result<()> {
    crate::conn::poll_readable(call.as_raw_fd(), t).context("poll call eventfd")?;
    drain_call(call, st);
    Ok(())
}

fn kick(q: &Queue) -> Result<()> {
    q.kick.write(1).context("write kick eventfd")
}

const REKICK: Duration = Duration::from_millis(200);

struct TxCtx {
    ring: DriverRing,
    frame_len: usize,
    count: Option<u64>,
    rate: u64,
}

fn tx_worker(
    q: &Queue,
    mut cx: TxCtx,
    opts: &BenchOpts,
    stop: &AtomicBool,
    template: &[u8],
) -> (Stats, Result<()>) {
    let mut st = Stats {
        role: "tx",
        queues: 1,
        ..Default::default()
    };
    let r = tx_loop(q, &mut cx, opts, stop, template, &mut st);
    drain_call(&q.call, &mut st);
    st.bytes = st.frames * cx.frame_len as u64;
    (st, r)
}

fn tx_loop(
    q: &Queue,
    cx: &mut TxCtx,
    opts: &BenchOpts,
    stop: &AtomicBool,
    template: &[u8],
    st: &mut Stats,
) -> Result<()> {
    let mem: Arc<GuestMem> = cx.ring.mem.clone();
    let num = cx.ring.num();
    let buf_len = template.len();
    // One preallocated buffer per descriptor, each holding [virtio hdr + frame].
    for i in 0..num {
        let off = mem.alloc(buf_len, 64)?;
        mem.write(off, template);
        cx.ring.set_desc(i, mem.gpa(off), buf_len as u32, 0, 0);
    }
    let mut free: Vec<u16> = (0..num).rev().collect();
    let mut sent: u64 = 0;
    let mut in_flight: u64 = 0;
    let mut last_progress = Instant::now();
    let mut last_rekick = Instant::now();
    let mut start: Option<Instant> = None;
    // Some backends only start processing after a kick (the old reading of the spec).
    kick(q)?;
    loop {
        while let Some((id, _len)) = cx.ring.pop_used() {
            if id >= num as u32 || free.len() >= num as usize {
                bail!("backend returned used id {id} (ring size {num}) - not one we gave it");
            }
            free.push(id as u16);
            in_flight -= 1;
            st.in_flight_at_end = in_flight;
            st.frames += 1;
            st.last = Some(Instant::now());
            last_progress = Instant::now();
        }
        let now = Instant::now();
        let done_submitting = stop.load(Ordering::Relaxed)
            || cx.count.is_some_and(|c| sent >= c)
            || matches!((start, opts.duration), (Some(s), Some(d)) if now.duration_since(s) >= d);
        if done_submitting {
            if in_flight == 0 {
                break;
            }
            if now.duration_since(last_progress) > opts.timeout || stop.load(Ordering::Relaxed) {
                // Give the backend a last moment, then report what is left.
                if !stop.load(Ordering::Relaxed) {
                    bail!(
                        "tx stalled: {in_flight} frames not completed within {:?}",
                        opts.timeout
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
                while cx.ring.pop_used().is_some() {
                    in_flight -= 1;
                    st.frames += 1;
                }
                st.in_flight_at_end = in_flight;
                break;
            }
        }
        let mut allowed = if done_submitting {
            0
        } else {
            free.len() as u64
        };
        if let Some(c) = cx.count {
            allowed = allowed.min(c.saturating_sub(sent));
        }
        let mut rate_wait = None;
        if cx.rate > 0 && allowed > 0 {
            let elapsed = start.map_or(0.0, |s| now.duration_since(s).as_secs_f64());
            let budget = (elapsed * cx.rate as f64) as u64 + 1;
            let tokens = budget.saturating_sub(sent);
            if tokens == 0 {
                let next = (sent + 1) as f64 / cx.rate as f64 - elapsed;
                rate_wait = Some(Duration::from_secs_f64(next.clamp(0.0, 0.01)));
            }
            allowed = allowed.min(tokens);
        }
        allowed = allowed.min(opts.batch as u64);
        if allowed > 0 {
            if start.is_none() {
                start = Some(Instant::now());
                st.first = start;
                last_progress = Instant::now();
            }
            for _ in 0..allowed {
                if let Some(d) = free.pop() {
                    cx.ring.push(d);
                }
            }
            sent += allowed;
            in_flight += allowed;
            st.in_flight_at_end = in_flight;
            if cx.ring.publish() {
                kick(q)?;
                st.kicks += 1;
            }
            continue;
        }
        if let Some(w) = rate_wait {
            std::thread::sleep(w);
            drain_call(&q.call, st);
            continue;
        }
        if in_flight == 0 {
            // Nothing to wait for (count reached / stopped) - loop ends above.
            continue;
        }
        // Ring full (or draining): ask for a call once most in-flight frames are done.
        if cx.ring.arm_call((in_flight * 3 / 4) as u16) {
            continue;
        }
        wait_call(&q.call, Duration::from_millis(20), st)?;
        let quiet = Instant::now().duration_since(last_progress);
        if quiet > REKICK && last_rekick.elapsed() > REKICK {
            // Nothing completes: kick again in case a kick was lost (not counted in kicks).
            kick(q)?;
            st.rekicks += 1;
            last_rekick = Instant::now();
        }
        if quiet > opts.timeout {
            bail!(
                "tx stalled: the backend completed nothing for {:?} ({in_flight} in flight)",
                opts.timeout
            );
        }
    }
    Ok(())
}

/// What one rx queue's worker is given besides the queue.
struct RxCtx<'a> {
    ring: DriverRing,
    /// Mergeable receive buffers were negotiated.
    mrg: bool,
    /// Stop once all queues together received this many.
    count: Option<u64>,
    /// Receiving nothing within the timeout is an error.
    must_receive: bool,
    /// Frames received by all queues.
    total: &'a AtomicU64,
}

fn rx_worker(
    q: &Queue,
    mut cx: RxCtx<'_>,
    opts: &BenchOpts,
    stop: &AtomicBool,
) -> (Stats, Result<()>) {
    let mut st = Stats {
        role: "rx",
        queues: 1,
        ..Default::default()
    };
    let r = rx_loop(q, &mut cx, opts, stop, &mut st);
    drain_call(&q.call, &mut st);
    (st, r)
}

fn rx_loop(
    q: &Queue,
    cx: &mut RxCtx<'_>,
    opts: &BenchOpts,
    stop: &AtomicBool,
    st: &mut Stats,
) -> Result<()> {
    let (mrg, count, must_receive, total) = (cx.mrg, cx.count, cx.must_receive, cx.total);
    let ring = &mut cx.ring;
    let mem = ring.mem.clone();
    let num = ring.num();
    // With mergeable buffers, page-sized buffers; else big enough for any frame.
    let buf_len: usize = if mrg { 4096 } else { 65562 };
    let mut bufs = Vec::with_capacity(num as usize);
    for i in 0..num {
        let off = mem.alloc(buf_len, 64)?;
        bufs.push(off);
        ring.set_desc(i, mem.gpa(off), buf_len as u32, DESC_F_WRITE, 0);
        ring.push(i);
    }
    ring.arm_call(0);
    ring.publish();
    kick(q)?;
    let started = Instant::now();
    let mut remaining_bufs: u16 = 0;
    let mut pkt_len: u64 = 0;
    let mut hdr = [0u8; VNET_HDR_LEN];
    loop {
        let mut got = 0u32;
        while let Some((id, len)) = ring.pop_used() {
            got += 1;
            if id >= num as u32 {
                bail!("backend returned used id {id} (ring size {num}) - not one we gave it");
            }
            let len = if len as usize > buf_len {
                st.bad_used += 1;
                buf_len as u32
            } else {
                len
            };
            if remaining_bufs == 0 {
                if (len as usize) < VNET_HDR_LEN {
                    st.bad_used += 1;
                    ring.push(id as u16);
                    continue;
                }
                mem.read(bufs[id as usize], &mut hdr);
                let h = VirtioNetHdr::from_bytes(&hdr);
                remaining_bufs = if mrg { h.num_buffers.max(1) } else { 1 };
                pkt_len = 0;
            }
            pkt_len += len as u64;
            remaining_bufs -= 1;
            if remaining_bufs == 0 {
                let flen = pkt_len.saturating_sub(VNET_HDR_LEN as u64);
                st.frames += 1;
                total.fetch_add(1, Ordering::Relaxed);
                st.bytes += flen;
                if flen != opts.frame.size as u64 {
                    st.size_mismatch += 1;
                }
                let now = Instant::now();
                st.first.get_or_insert(now);
                st.last = Some(now);
            }
            ring.push(id as u16);
        }
        if got > 0 && ring.publish() {
            kick(q)?;
            st.kicks += 1;
        }
        let now = Instant::now();
        let all = total.load(Ordering::Relaxed);
        if stop.load(Ordering::Relaxed) || count.is_some_and(|c| all >= c) {
            break;
        }
        if st
            .first
            .zip(opts.duration)
            .is_some_and(|(f, d)| now.duration_since(f) >= d)
        {
            break;
        }
        // Idle end: nothing for `idle` on this queue while some queue has received.
        if all > 0 && now.duration_since(st.last.unwrap_or(started)) >= opts.idle {
            break;
        }
        if must_receive && all == 0 && now.duration_since(started) > opts.timeout {
            bail!("rx: no frame received within {:?}", opts.timeout);
        }
        if got > 0 {
            continue;
        }
        if ring.arm_call(0) {
            continue;
        }
        wait_call(&q.call, Duration::from_millis(50), st)?;
    }
    Ok(())
}

/// The result of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub tx: Option<Stats>,
    pub rx: Option<Stats>,
    /// Set when the run ended early (disconnect, stall, ...).
    pub error: Option<String>,
}

/// Runs the benchmark on a device that is up. Watches the control connection for a
/// disconnect while the workers run.
pub fn run(dev: &Device, opts: &BenchOpts) -> Result<Report> {
    let neg = &dev.neg;
    let mut spec = opts.frame.clone();
    spec.tso = neg.host_tso4;
    let (hdr, frame_bytes) = if opts.role == Role::Rx {
        (VirtioNetHdr::default(), Vec::new())
    } else {
        frame::build_frame(&spec)?
    };
    let mut template = hdr.to_bytes().to_vec();
    template.extend_from_slice(&frame_bytes);
    let pairs = dev.queues.len() / 2;
    let stop = AtomicBool::new(false);
    let rx_total = AtomicU64::new(0);
    let tx_on = opts.role != Role::Rx;
    let rx_on = opts.role != Role::Tx;
    let split = |v: Option<u64>, k: usize| {
        v.map(|c| c / pairs as u64 + u64::from((k as u64) < c % pairs as u64))
    };
    let mut report = Report::default();
    std::thread::scope(|s| -> Result<()> {
        let mut tx_handles = Vec::new();
        let mut rx_handles = Vec::new();
        for k in 0..pairs {
            if rx_on {
                let q = &dev.queues[2 * k];
                let cx = RxCtx {
                    ring: dev.driver_ring(2 * k),
                    mrg: neg.mrg_rxbuf,
                    count: if opts.role == Role::Rx {
                        opts.count
                    } else {
                        None
                    },
                    must_receive: opts.role == Role::Rx,
                    total: &rx_total,
                };
                let stop = &stop;
                rx_handles.push(s.spawn(move || rx_worker(q, cx, opts, stop)));
            }
            if tx_on {
                let q = &dev.queues[2 * k + 1];
                let cx = TxCtx {
                    ring: dev.driver_ring(2 * k + 1),
                    frame_len: frame_bytes.len(),
                    count: split(opts.count, k),
                    // A paced run never gives a queue 0 (which would mean unpaced).
                    rate: split(Some(opts.rate), k).map_or(0, |r| r.max(u64::from(opts.rate > 0))),
                };
                let stop = &stop;
                let t = &template;
                tx_handles.push(s.spawn(move || tx_worker(q, cx, opts, stop, t)));
            }
        }
        // Watch the connection and the workers.
        let mut tx_done_at: Option<Instant> = None;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            if dev.conn.peer_closed() {
                report.error = Some("backend closed the connection".into());
                stop.store(true, Ordering::Relaxed);
                break;
            }
            let tx_finished = tx_handles.iter().all(|h| h.is_finished());
            let rx_finished = rx_handles.iter().all(|h| h.is_finished());
            if tx_finished && rx_finished {
                break;
            }
            if opts.role == Role::Both && tx_finished {
                // rx of `both` runs on until tx is done plus the idle time.
                let t = *tx_done_at.get_or_insert_with(Instant::now);
                if t.elapsed() >= opts.idle {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        let mut collect = |hs: Vec<std::thread::ScopedJoinHandle<'_, (Stats, Result<()>)>>| {
            let mut total: Option<Stats> = None;
            for h in hs {
                match h.join() {
                    Ok((st, r)) => {
                        if let Err(e) = r {
                            stop.store(true, Ordering::Relaxed);
                            report.error.get_or_insert(format!("{e:#}"));
                        }
                        match total.as_mut() {
                            Some(t) => t.merge(&st),
                            None => total = Some(st),
                        }
                    }
                    Err(_) => {
                        report.error.get_or_insert("worker thread panicked".into());
                    }
                }
            }
            total.map(|mut t| {
                t.finish();
                t
            })
        };
        report.tx = collect(tx_handles);
        report.rx = collect(rx_handles);
        Ok(())
    })?;
    Ok(report)
}
