//! How frames enter: one module per source kind, each a [`Reader`] the dispatcher threads
//! (`dispatch`) call when its descriptor is ready (a port hands it over as a [`Source`]), and
//! which hands every frame to [`process`]:
//!
//! - [`tap`]: a TAP queue (virtio-net header, partial checksums completed once);
//! - [`udp`]: the shared VXLAN socket (demultiplexing by peer and VNI, tunnel GSO from kernel
//!   peers, decryption of encrypted links);
//! - [`packet`]: a direct link's packet socket;
//! - [`guest`]: NICs that have threads of their own (vhost-user) forward through
//!   [`guest::Ingress`] instead of a dispatcher.
//!
//! TCP links read their streams on their own threads (`ports::tcp`).

pub mod guest;
pub mod packet;
pub mod tap;
pub mod vxlan_reader;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use vnet_core::{DropReason, PortId};
use vnet_offload::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};
use vnet_wire::MAX_FRAME_LEN;

use crate::batch::TxBatch;
use crate::forward::{process, Arrival, FwdCtx};
use crate::shared::{Shared, Snapshot};
use crate::sys::{MmsgReceiver, Msg};
use crate::vxlan_socket::Received;

/// Frames (or UDP messages) read from one descriptor per pass.
pub const BATCH: usize = 32;
const RX_BUF: usize = VIRTIO_NET_HDR_LEN + MAX_FRAME_LEN + 64;

/// A descriptor a dispatcher reads.
pub trait Reader: Send + Sync {
    fn fd(&self) -> RawFd;

    /// Reads one batch without blocking and forwards it; returns how many frames (or
    /// datagrams) it read. An error is the descriptor's, not a frame's.
    fn drain(&self, w: &mut RxWork, shared: &Shared, snap: &Snapshot) -> io::Result<usize>;
}

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(1);

/// A descriptor a dispatcher reads (a [`Reader`]), with an identity for epoll and removal.
/// Ports make them when they open; the dispatcher threads read them.
pub struct Source {
    pub(crate) id: u64,
    pub(crate) reader: Box<dyn Reader>,
}

impl Source {
    pub fn new(reader: Box<dyn Reader>) -> Source {
        Source {
            id: NEXT_SOURCE.fetch_add(1, Relaxed),
            reader,
        }
    }
}

/// One dispatcher thread's receive buffers and forwarding state.
pub struct RxWork {
    pub(crate) bufs: Vec<Vec<u8>>,
    pub(crate) ctx: FwdCtx,
    pub(crate) mmsg: MmsgReceiver,
    pub(crate) msgs: Vec<Msg>,
    pub(crate) recvd: Vec<Received>,
    /// Datagrams of the current receive batch, after decryption (see [`udp`]).
    pub(crate) plan: Vec<vxlan_reader::RxItem>,
}

impl RxWork {
    /// The buffers and state of the dispatcher that writes to NIC queue `queue`.
    pub fn new(queue: usize) -> RxWork {
        RxWork {
            bufs: (0..BATCH).map(|_| vec![0u8; RX_BUF]).collect(),
            ctx: FwdCtx::with_queue(queue),
            mmsg: MmsgReceiver::new(BATCH),
            msgs: Vec::with_capacity(BATCH),
            recvd: Vec::with_capacity(BATCH),
            plan: Vec::with_capacity(BATCH),
        }
    }

    /// Publishes this thread's traffic-matrix counts.
    pub fn flush_matrix(&mut self, shared: &Shared) {
        self.ctx.flush(shared);
    }
}

/// Reads up to `BATCH` frames, one per buffer, until `recv` has nothing (`Ok(None)`) or fails;
/// returns how many were read, and the error that stopped it, if any.
pub(crate) fn read_batch(
    bufs: &mut [Vec<u8>],
    lens: &mut [usize; BATCH],
    mut recv: impl FnMut(&mut [u8]) -> io::Result<Option<usize>>,
) -> (usize, Option<io::Error>) {
    let mut n = 0;
    for buf in bufs.iter_mut().take(BATCH) {
        match recv(buf) {
            Ok(Some(len)) => {
                lens[n] = len;
                n += 1;
            }
            Ok(None) => break,
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// Forwards frames read into `w.bufs` (after `hl` header bytes) that entered by `port`, as one
/// batch; a frame already refused (`Err`) is only counted.
pub(crate) fn forward_read(
    w: &mut RxWork,
    shared: &Shared,
    snap: &Snapshot,
    port: PortId,
    hl: usize,
    lens: &[usize],
    frames: &[Result<VirtioNetHdr, DropReason>],
) {
    let bufs: &[Vec<u8>] = &w.bufs;
    let mut batch = TxBatch::reusing(&mut w.ctx.tx_spare);
    for (i, f) in frames.iter().enumerate() {
        match f {
            Ok(vh) => process(
                shared,
                snap,
                &mut w.ctx,
                port,
                Arrival::local(*vh, &bufs[i][hl..lens[i]]),
                &mut batch,
            ),
            Err(reason) => snap.count_rx_drop(port, lens[i], *reason),
        }
    }
    batch.flush(&shared.offload, &shared.daemon, &snap.udp);
    batch.give_back(&mut w.ctx.tx_spare);
    snap.end_of_burst();
}
