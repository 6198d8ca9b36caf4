//! The data path's offload and batching counters: one set, shared by every forwarding thread
//! (segmentation, coalescing, checksum completion, batched sends). A leaf: the batch, the ports
//! and the readers that count into it need nothing above them for it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use vnet_control::status::OffloadStatus;

/// Offload and batching counters, shared by all forwarding threads.
#[derive(Debug, Default)]
pub struct OffloadCounters {
    /// Frames from guests that vnet cut into wire segments, and the segments.
    pub gso_frames: AtomicU64,
    pub gso_segments: AtomicU64,
    /// `sendmsg` calls with `UDP_SEGMENT`, and `sendmmsg` calls.
    pub udp_gso_sends: AtomicU64,
    pub udp_batch_sends: AtomicU64,
    /// Received segments merged into a larger frame for a guest, and frames so delivered.
    pub gro_merged: AtomicU64,
    pub gro_frames: AtomicU64,
    /// Frames whose checksum a local sender left partial (veth), passed on as partial.
    pub partial_csum: AtomicU64,
    /// Partial checksums completed in user space.
    pub csum_completed: AtomicU64,
    /// Unsegmented large frames received from a kernel VXLAN peer (tunnel GSO over veth).
    pub tunnel_gso: AtomicU64,
}

impl OffloadCounters {
    pub fn gso(&self, segments: usize) {
        self.gso_frames.fetch_add(1, Relaxed);
        self.gso_segments.fetch_add(segments as u64, Relaxed);
    }

    pub fn snapshot(&self) -> OffloadStatus {
        OffloadStatus {
            gso_frames: self.gso_frames.load(Relaxed),
            gso_segments: self.gso_segments.load(Relaxed),
            udp_gso_sends: self.udp_gso_sends.load(Relaxed),
            udp_batch_sends: self.udp_batch_sends.load(Relaxed),
            gro_merged: self.gro_merged.load(Relaxed),
            gro_frames: self.gro_frames.load(Relaxed),
            partial_csum: self.partial_csum.load(Relaxed),
            csum_completed: self.csum_completed.load(Relaxed),
            tunnel_gso: self.tunnel_gso.load(Relaxed),
        }
    }
}
