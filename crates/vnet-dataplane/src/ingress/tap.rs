//! A TAP queue's frames. With offload on, each frame comes with a virtio-net header; an
//! ordinary frame with a partial checksum (the guest's checksum offload) has it completed here,
//! in place, once, so every port downstream gets an honest frame; a 64 KB TSO segment stays
//! whole.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vnet_core::{DropReason, PortId};
use vnet_offload::{complete_checksum, VirtioNetHdr, VIRTIO_NET_HDR_LEN};

use crate::counters::OffloadCounters;
use crate::ingress::{forward_read, read_batch, Reader, RxWork, BATCH};
use crate::nic::GuestNic;
use crate::shared::{Shared, Snapshot};
use crate::sys;
use crate::tap::Tap;

/// One queue of a TAP, read by one dispatcher.
pub struct TapReader {
    pub tap: Arc<Tap>,
    pub queue: usize,
    pub port: PortId,
}

impl Reader for TapReader {
    fn fd(&self) -> RawFd {
        self.tap.queue_fd(self.queue)
    }

    fn drain(&self, w: &mut RxWork, shared: &Shared, snap: &Snapshot) -> io::Result<usize> {
        let fd = self.fd();
        let hl = if self.tap.has_vnet_hdr() {
            VIRTIO_NET_HDR_LEN
        } else {
            0
        };
        let mut lens = [0usize; BATCH];
        let (n, err) = read_batch(&mut w.bufs, &mut lens, |buf| match sys::read(fd, buf) {
            Ok(len) => Ok(Some(len)),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        });
        let mut frames: [Result<VirtioNetHdr, DropReason>; BATCH] =
            [Ok(VirtioNetHdr::default()); BATCH];
        for i in 0..n {
            frames[i] = if lens[i] < hl {
                Err(DropReason::Truncated)
            } else if hl == 0 {
                Ok(VirtioNetHdr::default())
            } else {
                ingress_header(&shared.offload, &mut w.bufs[i][..lens[i]])
            };
        }
        forward_read(w, shared, snap, self.port, hl, &lens[..n], &frames[..n]);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }
}

/// Reads the virtio-net header in front of a frame from a TAP and completes a partial checksum
/// of an ordinary (non-GSO) frame in place.
pub fn ingress_header(
    offload: &OffloadCounters,
    buf: &mut [u8],
) -> Result<VirtioNetHdr, DropReason> {
    let mut vh = VirtioNetHdr::parse(buf).map_err(|_| DropReason::Truncated)?;
    if vh.gso_kind() == VirtioNetHdr::GSO_NONE && vh.needs_csum() {
        complete_checksum(&mut buf[VIRTIO_NET_HDR_LEN..], &vh)
            .map_err(|_| DropReason::BadOffload)?;
        offload.csum_completed.fetch_add(1, Relaxed);
        vh.flags = VirtioNetHdr::F_DATA_VALID;
    }
    Ok(vh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_offload::test_frames::{partial_csum_frame, tso_frame, valid};

    #[test]
    fn a_partial_checksum_is_completed_once_and_a_tso_header_kept() {
        let off = OffloadCounters::default();
        // An ordinary frame with a partial checksum (a TSO frame's header minus the GSO).
        let (f, vh) = partial_csum_frame(300);
        let mut buf = vh.emit()[..VIRTIO_NET_HDR_LEN].to_vec();
        buf.extend_from_slice(&f);
        let got = ingress_header(&off, &mut buf).unwrap();
        assert!(!got.needs_csum());
        assert!(valid(&buf[VIRTIO_NET_HDR_LEN..]));
        assert_eq!(off.csum_completed.load(Relaxed), 1);
        // A TSO frame keeps its header (cut only where it leaves).
        let (f, vh) = tso_frame(3000, false);
        let mut buf = vh.emit()[..VIRTIO_NET_HDR_LEN].to_vec();
        buf.extend_from_slice(&f);
        assert_eq!(ingress_header(&off, &mut buf).unwrap(), vh);
    }

    #[test]
    fn hostile_headers_are_refused() {
        let off = OffloadCounters::default();
        assert_eq!(
            ingress_header(&off, &mut [0u8; 3]),
            Err(DropReason::Truncated)
        );
        // Needs a checksum at an offset beyond the frame.
        let vh = VirtioNetHdr {
            flags: VirtioNetHdr::F_NEEDS_CSUM,
            csum_start: 60_000,
            csum_offset: 16,
            ..Default::default()
        };
        let mut buf = vh.emit()[..VIRTIO_NET_HDR_LEN].to_vec();
        buf.extend_from_slice(&[0u8; 100]);
        assert_eq!(ingress_header(&off, &mut buf), Err(DropReason::BadOffload));
    }
}
