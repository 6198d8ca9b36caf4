//! The frames of one receive ring waiting for its guest's buffers (or for the device thread,
//! when copying): bounded in frames and in bytes, so that a guest that stalls (posts no
//! receive buffers) while frames keep coming holds at most 4 MiB per queue, not 1,024 frames of
//! up to 64 KiB each (issue 32: about 64 MiB per queue); a frame beyond is refused
//! (`queue_full`, counted by the caller). A module of its own, below both the ring it belongs
//! to (`device`) and the receive path that fills and drains it (`rx`). Pure.

use std::collections::VecDeque;

use vnet_core::DropReason;
use vnet_offload::VirtioNetHdr;

/// Frames waiting for receive buffers, per queue; beyond this they are dropped (`queue_full`).
const RX_BACKLOG: usize = 1024;
/// Bytes of the frames waiting for receive buffers, per queue (64 frames of 64 KiB; 2,800 of
/// an MTU's size, past the frame bound): beyond this they are dropped (`queue_full`).
const RX_BACKLOG_BYTES: usize = 4 << 20;

/// The frames of one receive ring waiting for the guest's buffers (or for the device
/// thread, when copying), bounded by [`RX_BACKLOG`] frames and [`RX_BACKLOG_BYTES`] bytes.
#[derive(Default)]
pub struct Backlog {
    frames: VecDeque<(VirtioNetHdr, Vec<u8>)>,
    bytes: usize,
}

impl Backlog {
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
    }

    /// Whether a frame of `len` bytes may join (one always may join an empty backlog).
    fn room_for(&self, len: usize) -> bool {
        self.frames.is_empty()
            || (self.frames.len() < RX_BACKLOG && self.bytes + len <= RX_BACKLOG_BYTES)
    }

    /// Queues a frame at the end, if there is room for it.
    pub(crate) fn push_back(
        &mut self,
        vh: VirtioNetHdr,
        parts: &[&[u8]],
    ) -> Result<(), DropReason> {
        let len = parts.iter().map(|p| p.len()).sum();
        if !self.room_for(len) {
            return Err(DropReason::QueueFull);
        }
        self.bytes += len;
        self.frames.push_back((vh, parts.concat()));
        Ok(())
    }

    /// Puts back a frame [`Backlog::pop_front`] took (it was in: no bound).
    pub(crate) fn push_front(&mut self, vh: VirtioNetHdr, f: Vec<u8>) {
        self.bytes += f.len();
        self.frames.push_front((vh, f));
    }

    pub(crate) fn pop_front(&mut self) -> Option<(VirtioNetHdr, Vec<u8>)> {
        let (vh, f) = self.frames.pop_front()?;
        self.bytes -= f.len();
        Some((vh, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32: a stalled guest's backlog held up to 1,024 frames whatever their size (64 MiB
    /// of 64 KiB frames per queue). Bounded in bytes too: 4 MiB of large frames, 1,024 small
    /// ones; a frame put back after a failed write is not refused; emptied, it takes frames
    /// again.
    #[test]
    fn the_backlog_is_bounded_in_frames_and_bytes() {
        let vh = VirtioNetHdr::default();
        let big = vec![0u8; 64 << 10];
        let mut b = Backlog::default();
        let mut taken = 0;
        while b.push_back(vh, &[&big[..1000], &big[1000..]]).is_ok() {
            taken += 1;
            assert!(taken <= RX_BACKLOG, "no bound");
        }
        assert_eq!(taken, RX_BACKLOG_BYTES / big.len());
        assert_eq!(b.bytes, RX_BACKLOG_BYTES);
        assert_eq!(
            b.push_back(vh, &[&big[..60]]),
            Err(DropReason::QueueFull),
            "full in bytes"
        );
        let (h, f) = b.pop_front().expect("a frame");
        assert_eq!(f.len(), big.len());
        b.push_front(h, f);
        assert_eq!(b.len(), taken);
        b.clear();
        assert_eq!((b.len(), b.bytes), (0, 0));
        let small = [0u8; 60];
        let mut n = 0;
        while b.push_back(vh, &[&small]).is_ok() {
            n += 1;
        }
        assert_eq!(n, RX_BACKLOG);
        while b.pop_front().is_some() {}
        assert_eq!(b.bytes, 0);
        // A frame larger than the byte bound still passes through an empty backlog.
        let huge = vec![0u8; RX_BACKLOG_BYTES + 1];
        assert!(b.push_back(vh, &[&huge]).is_ok());
    }
}
