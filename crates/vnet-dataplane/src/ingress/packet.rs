//! A direct link's frames from the host NIC (AF_PACKET, promiscuous).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use vnet_core::{DropReason, PortId};
use vnet_offload::VirtioNetHdr;

use crate::ingress::{forward_read, read_batch, Reader, RxWork, BATCH};
use crate::packet::PacketSocket;
use crate::shared::{Shared, Snapshot};

pub struct PacketReader {
    pub sock: Arc<PacketSocket>,
    pub port: PortId,
}

impl Reader for PacketReader {
    fn fd(&self) -> RawFd {
        self.sock.fd()
    }

    fn drain(&self, w: &mut RxWork, shared: &Shared, snap: &Snapshot) -> io::Result<usize> {
        let mut lens = [0usize; BATCH];
        let (n, err) = read_batch(&mut w.bufs, &mut lens, |buf| self.sock.recv(buf));
        let mut frames: [Result<VirtioNetHdr, DropReason>; BATCH] =
            [Ok(VirtioNetHdr::default()); BATCH];
        for i in 0..n {
            if lens[i] > w.bufs[i].len() {
                // MSG_TRUNC: the frame was larger than anything vnet carries.
                frames[i] = Err(DropReason::Oversize);
            }
        }
        forward_read(w, shared, snap, self.port, 0, &lens[..n], &frames[..n]);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }
}
