//! One module per port kind, each implementing [`crate::port::Port`]: how a frame leaves.
//!
//! - [`nic`]: a guest's NIC (a TAP, or a vhost-user device through [`crate::GuestNic`]);
//! - [`udp`]: a udp link (VXLAN datagrams, batched, `UDP_SEGMENT` for large frames,
//!   optionally sealed);
//! - [`tcp`]: a tcp link (a framed stream with a bounded queue, and its reader);
//! - [`direct`]: a direct link (raw Ethernet on a host NIC).
//!
//! Adding a kind: a new module here implementing `Port`, and the line in
//! [`crate::Engine`] that opens it for its interface or link kind.

pub mod direct;
pub mod netdev;
pub mod nic;
pub mod punt;
pub mod tcp;
pub mod udp_link;
pub mod veth;

use std::net::IpAddr;
use std::sync::Arc;

use vnet_core::{DropReason, PortCounters, PortKind};
use vnet_offload::{segment, SegmentList, VirtioNetHdr};

use crate::counters::OffloadCounters;
use crate::ingress::Source;
use crate::kernel::KernelAttach;
use crate::made::Made;
use crate::port::{Frame, Port, Tx};
use crate::worker::Worker;

/// Why a port could not be opened.
#[derive(Debug)]
pub enum OpenError {
    Io(std::io::Error),
    /// The configuration asks for something this host cannot do (said in words).
    Unsupported(String),
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> Self {
        OpenError::Io(e)
    }
}

/// What opening a port gives the engine: how frames leave (`port`), the descriptors the
/// dispatchers read for it, its threads, how datagrams and connections find it, what it asks
/// of the kernel fast path, and what must be undone when it goes.
pub struct Opened {
    pub port: Arc<dyn Port>,
    pub kind: PortKind,
    pub counters: Arc<PortCounters>,
    pub sources: Vec<Arc<Source>>,
    pub workers: Vec<Worker>,
    pub udp_peer: Option<IpAddr>,
    pub tcp_accept_peer: Option<IpAddr>,
    /// A reach link's peer probe key and configured address (set by the engine).
    pub reach: Option<(vnet_crypto::PublicKey, std::net::SocketAddr)>,
    pub kernel: Option<KernelAttach>,
    /// The port works only if the kernel takes it (a veth or netdev whose frames reach vnetd
    /// only through the kernel's programs): opening fails if the kernel refuses it.
    pub kernel_required: bool,
    /// Devices vnetd made for the port: removed (after the port's threads stopped) when the
    /// port goes for good, left in place when vnetd only stops ([`crate::made`]).
    pub owned: Vec<Box<dyn Made>>,
}

impl Opened {
    pub fn new(port: Arc<dyn Port>, kind: PortKind) -> Opened {
        Opened {
            port,
            kind,
            counters: Arc::new(PortCounters::default()),
            sources: vec![],
            workers: vec![],
            udp_peer: None,
            tcp_accept_peer: None,
            reach: None,
            kernel: None,
            kernel_required: false,
            owned: vec![],
        }
    }
}

/// [`each_segment`] for a frame as a port is handed it (copied into the thread's scratch
/// buffer first when it is not in one piece): the whole `Port::send` of a port that carries
/// only ordinary Ethernet frames.
pub(crate) fn send_segments<'a>(
    tx: &mut Tx<'_, 'a>,
    f: &Frame<'a>,
    send: impl FnMut(&[&[u8]]) -> Result<(), DropReason>,
) -> Result<(), DropReason> {
    let frame = match f.whole() {
        Some(b) => b,
        None => f.copy_into(tx.scratch),
    };
    each_segment(tx.offload, frame, &f.vh, tx.seg, &f.macs, send)
}

/// Calls `send` with the parts of each wire frame of `frame` (the frame itself when it needs
/// no segmentation and no checksum), its MACs taken from `macs`, the checked copy: for ports
/// that carry only ordinary Ethernet frames (TCP and direct links, a TAP without offloads).
pub(crate) fn each_segment(
    offload: &OffloadCounters,
    frame: &[u8],
    vh: &VirtioNetHdr,
    seg: &mut SegmentList,
    macs: &[u8; 12],
    mut send: impl FnMut(&[&[u8]]) -> Result<(), DropReason>,
) -> Result<(), DropReason> {
    if vh.is_plain() || (vh.gso_kind() == VirtioNetHdr::GSO_NONE && !vh.needs_csum()) {
        return send(&[macs, &frame[12..]]);
    }
    segment(frame, vh, seg).map_err(|_| DropReason::BadOffload)?;
    seg.pin_macs(macs);
    if seg.len() > 1 {
        offload.gso(seg.len());
    }
    for i in 0..seg.len() {
        send(&seg.parts(frame, i))?;
    }
    Ok(())
}
