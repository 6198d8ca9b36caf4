//! The counters of one direction, written by its forwarding thread and read (as JSON) by the
//! main thread on SIGUSR1 and at exit: every frame that came in is accounted for as sent,
//! dropped for a reason, or still queued.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

#[derive(Default, Debug)]
pub struct Counters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// The random loss asked for.
    pub drop_loss: AtomicU64,
    /// The bottleneck's byte limit or the delay line's limits.
    pub drop_queue: AtomicU64,
    /// Frames larger than the receive buffer (a segmentation offload left on upstream).
    pub drop_oversize: AtomicU64,
    /// Sends the kernel refused (the next device's backlog full, the device down).
    pub drop_send: AtomicU64,
    /// Segmentation-offload super-frames forwarded whole (loss and rate then apply to the
    /// whole: the lab turns offloads off where frames enter the forwarder).
    pub gso_frames: AtomicU64,
    /// Frames the kernel dropped before we read them (the socket's receive buffer full;
    /// `PACKET_STATISTICS`).
    pub drop_rx_socket: AtomicU64,
    /// Queued now.
    pub queued: AtomicU64,
    pub queue_high_water: AtomicU64,
    /// How late frames left against their schedule (the forwarder's own imprecision).
    pub late_ns_sum: AtomicU64,
    pub late_ns_max: AtomicU64,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Snapshot {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drop_loss: u64,
    pub drop_queue: u64,
    pub drop_oversize: u64,
    pub drop_send: u64,
    pub drop_rx_socket: u64,
    pub gso_frames: u64,
    pub queued: u64,
    pub queue_high_water: u64,
    pub late_us_mean: f64,
    pub late_us_max: f64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// A frame of `len` bytes on the wire left `late_ns` after its scheduled departure.
    pub fn sent(&self, len: usize, late_ns: u64) {
        Self::add(&self.tx_packets, 1);
        Self::add(&self.tx_bytes, len as u64);
        Self::add(&self.late_ns_sum, late_ns);
        self.late_ns_max.fetch_max(late_ns, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let tx = self.tx_packets.load(Relaxed);
        Snapshot {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: tx,
            tx_bytes: self.tx_bytes.load(Relaxed),
            drop_loss: self.drop_loss.load(Relaxed),
            drop_queue: self.drop_queue.load(Relaxed),
            drop_oversize: self.drop_oversize.load(Relaxed),
            drop_send: self.drop_send.load(Relaxed),
            drop_rx_socket: self.drop_rx_socket.load(Relaxed),
            gso_frames: self.gso_frames.load(Relaxed),
            queued: self.queued.load(Relaxed),
            queue_high_water: self.queue_high_water.load(Relaxed),
            late_us_mean: if tx > 0 {
                self.late_ns_sum.load(Relaxed) as f64 / tx as f64 / 1e3
            } else {
                0.0
            },
            late_us_max: self.late_ns_max.load(Relaxed) as f64 / 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_means() {
        let c = Counters::default();
        c.sent(100, 2_000);
        c.sent(300, 4_000);
        let s = c.snapshot();
        assert_eq!((s.tx_packets, s.tx_bytes), (2, 400));
        assert_eq!((s.late_us_mean, s.late_us_max), (3.0, 4.0));
        assert_eq!(Counters::default().snapshot().late_us_mean, 0.0);
    }
}
