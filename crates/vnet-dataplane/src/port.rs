//! The one interface between forwarding and the ports it sends through. Forwarding
//! (`forward::process`, above) decides where a frame goes; each port kind says, in its own
//! module under `ports` (above too), how a frame leaves through it: a guest NIC (TAP or
//! vhost-user), a UDP link (batched VXLAN datagrams), a TCP link, a direct link. Adding a kind
//! is one new file there implementing [`Port`] and one registration line in the engine.
//!
//! A frame is borrowed for the forwarding batch (`'a`): a port may keep datagrams in the
//! batch ([`TxBatch`]) until the batch ends; anything else it must finish inside `send`.

use std::sync::Arc;

use vm_memory::VolatileSlice;
use vnet_control::status::{LinkState, NicStatus};
use vnet_control::DataPathSettings;
use vnet_core::{DropReason, FastMap, PortCounters, PortId};
use vnet_offload::{Coalescer, PayloadRef, SegmentList, VirtioNetHdr};

use crate::batch::{TxBatch, UdpLinkTx};
use crate::counters::OffloadCounters;
use crate::nic::GuestNic;

/// Where a frame came from, for the coalescer.
#[derive(Clone, Copy)]
pub enum Origin<'a> {
    /// A TAP, a direct link, a TCP link or a guest: the frame is in a buffer of its own.
    Local,
    /// A UDP datagram at `at` inside the receive buffers `bufs`. Its checksums are whatever
    /// the wire brought, unless the frame's header says `NEEDS_CSUM`: then an encrypted link
    /// authenticated it and its sender left the checksum partial (`Arrival::authenticated`).
    Wire { at: PayloadRef, bufs: &'a [Vec<u8>] },
}

/// A frame on its way out.
#[derive(Clone, Copy)]
pub struct Frame<'a> {
    /// Its virtio-net header: honest (a partial checksum of an ordinary frame was completed
    /// where it entered, unless the frame lives in guest memory; see [`Frame::tail`]).
    pub vh: VirtioNetHdr,
    /// The checked copy of its two MACs. Every way out sends these, never the frame's own
    /// first 12 bytes: a vhost-user guest can rewrite its frame after the source check.
    pub macs: [u8; 12],
    /// The bytes vnet may read: the whole frame, or (with a `tail`) a copy of its first bytes.
    pub head: &'a [u8],
    /// The rest of a frame that lives in a guest's shared memory (vhost-user cut-through):
    /// never read as a Rust slice, only handed to the kernel or copied. `None`: `head` is the
    /// whole frame.
    pub tail: Option<VolatileSlice<'a>>,
    pub origin: Origin<'a>,
    /// Whether this port is the frame's only destination (a coalescer may then hold it).
    pub sole: bool,
}

impl<'a> Frame<'a> {
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.map(|t| t.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame as readable bytes, if it is (not in guest memory).
    pub fn whole(&self) -> Option<&'a [u8]> {
        self.tail.is_none().then_some(self.head)
    }

    /// The whole frame copied into `buf` (volatile reads for guest memory), for a port that
    /// must read every byte.
    pub fn copy_into<'b>(&self, buf: &'b mut Vec<u8>) -> &'b [u8] {
        buf.clear();
        buf.extend_from_slice(self.head);
        if let Some(t) = self.tail {
            let at = buf.len();
            buf.resize(at + t.len(), 0);
            t.copy_to(&mut buf[at..]);
        }
        buf
    }
}

/// What a port may use while sending: per-thread scratch and the batch, lent by forwarding.
pub struct Tx<'c, 'a> {
    pub offload: &'c OffloadCounters,
    /// The sending port's id and counters.
    pub port: PortId,
    pub counters: &'c Arc<PortCounters>,
    /// Which queue of a multi-queue NIC this thread uses.
    pub queue: usize,
    pub seg: &'c mut SegmentList,
    /// Per-NIC coalescers of frames from the wire (software GRO), one set per thread.
    pub coalescers: &'c mut FastMap<PortId, Coalescer>,
    pub scratch: &'c mut Vec<u8>,
    pub batch: &'c mut TxBatch<'a>,
}

/// A port of the switch, as forwarding sees it.
pub trait Port: Send + Sync {
    /// Sends one frame that forwarding decided goes out through this port.
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason>;

    /// The end of a forwarding batch: a NIC that notifies its guest per burst decides now.
    fn end_of_burst(&self) {}

    /// The data-path settings changed (and once when the port is added).
    fn configure(&self, _settings: &DataPathSettings) {}

    /// The guest NIC behind an interface (forwarding writes coalesced frames through it).
    fn as_nic(&self) -> Option<&dyn GuestNic> {
        None
    }

    /// The sending side of a udp link (demultiplexing, encryption, vhost-user cut-through).
    fn as_udp(&self) -> Option<&UdpLinkTx> {
        None
    }

    /// Whether the port can carry frames now (links; interfaces are always up).
    fn state(&self) -> LinkState {
        LinkState::Up
    }

    /// NIC-specific state for `show stats`.
    fn nic_status(&self) -> Option<NicStatus> {
        None
    }

    /// A `tcp accept` link takes a connection a listener accepted for it (the peer's greeting
    /// read): it answers the greeting and uses it, or refuses it while its own connection is
    /// alive (see `ports::tcp`); other ports refuse it (false, and the connection is closed).
    fn accept_stream(&self, _stream: std::net::TcpStream) -> bool {
        false
    }
}
