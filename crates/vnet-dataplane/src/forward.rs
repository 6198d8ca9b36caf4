//! A frame's fate: every ingress (TAP queues, the VXLAN socket, TCP and direct links,
//! vhost-user guests) hands each frame to [`process`], which counts it, checks it (length,
//! offload header, the ingress port's guard), learns, records it in the traffic matrix, asks the
//! thread's route cache for the decision, and hands it to each egress port's
//! [`Port::send`](crate::port::Port::send). What happens on the way out is the port kind's
//! business (`ports`, above); this module knows no port kind.

use std::time::Duration;

use vm_memory::VolatileSlice;
use vnet_core::{Decision, DropReason, FastMap, PortId, RouteCache, TrafficMatrix};
use vnet_offload::{Coalescer, PayloadRef, SegmentList, VirtioNetHdr};
use vnet_wire::{MacAddr, ETHERNET_HEADER_LEN, MAX_FRAME_LEN};

use crate::batch::TxBatch;
use crate::port::{Frame, Origin, Tx};
use crate::shared::{Shared, Snapshot};

const ROUTE_CACHE_SIZE: usize = 4096;
/// How often a thread's traffic-matrix slice is merged into the shared one.
pub const IDLE_TICK: Duration = Duration::from_millis(100);

/// Per-thread forwarding state: the route cache, a local slice of the traffic matrix, scratch
/// space for segmentation, and one coalescer per guest NIC this thread delivers to.
pub struct FwdCtx {
    cache: RouteCache,
    matrix: TrafficMatrix,
    pending: u32,
    pub(crate) seg: SegmentList,
    pub(crate) coalescers: FastMap<PortId, Coalescer>,
    scratch: Vec<u8>,
    /// Which queue of a multi-queue NIC this thread writes to.
    pub queue: usize,
}

impl Default for FwdCtx {
    fn default() -> Self {
        Self::new()
    }
}

impl FwdCtx {
    pub fn new() -> Self {
        Self::with_queue(0)
    }

    pub fn with_queue(queue: usize) -> Self {
        FwdCtx {
            cache: RouteCache::new(ROUTE_CACHE_SIZE),
            matrix: TrafficMatrix::new(ROUTE_CACHE_SIZE),
            pending: 0,
            seg: SegmentList::new(),
            coalescers: FastMap::default(),
            scratch: Vec::new(),
            queue,
        }
    }

    /// Counts one frame in this thread's traffic matrix.
    pub fn record(&mut self, vni: u32, src: MacAddr, dst: MacAddr, len: usize) {
        self.matrix.record(vni, src, dst, 1, len as u64);
        self.pending += 1;
    }

    /// Merges this thread's traffic-matrix counts into the shared matrix.
    pub fn flush(&mut self, shared: &Shared) {
        if self.pending > 0 {
            let mut m = shared.matrix.lock().unwrap_or_else(|p| p.into_inner());
            m.merge_from(&mut self.matrix);
            self.pending = 0;
        }
    }

    fn maybe_flush(&mut self, shared: &Shared) {
        if self.pending >= 256 {
            self.flush(shared);
        }
    }

    /// Route-cache hits and misses of this thread (for tests and tuning).
    pub fn cache_stats(&self) -> (u64, u64) {
        (self.cache.hits(), self.cache.misses())
    }
}

/// A frame as it arrives, before any decision.
#[derive(Clone, Copy)]
pub struct Arrival<'a> {
    /// Must be honest: a partial checksum on an ordinary frame has been completed by the
    /// caller, except for a frame in guest memory (`tail`), where a port completes it in a copy.
    pub vh: VirtioNetHdr,
    /// The readable bytes: the whole frame, or a copy of the first bytes of a guest's frame.
    pub head: &'a [u8],
    /// The rest of a frame that lives in a guest's shared memory (see [`Frame::tail`]).
    pub tail: Option<VolatileSlice<'a>>,
    pub origin: Origin<'a>,
}

impl<'a> Arrival<'a> {
    /// A frame in a buffer of its own.
    pub fn local(vh: VirtioNetHdr, frame: &'a [u8]) -> Self {
        Arrival {
            vh,
            head: frame,
            tail: None,
            origin: Origin::Local,
        }
    }

    /// A frame inside a received UDP datagram (which the coalescer may merge for a guest).
    pub fn wire(frame: &'a [u8], at: PayloadRef, bufs: &'a [Vec<u8>]) -> Self {
        Arrival {
            vh: VirtioNetHdr::default(),
            head: frame,
            tail: None,
            origin: Origin::Wire { at, bufs },
        }
    }

    /// A frame an encrypted link's session authenticated and decrypted in place. Its sender
    /// may have left its TCP/UDP checksum partial (the session's AEAD protects every byte;
    /// see `ports::udp`): then the header says so (`NEEDS_CSUM`), so a guest gets the frame
    /// marked partial and a port toward a network completes the checksum first.
    pub fn authenticated(frame: &'a [u8], at: PayloadRef, bufs: &'a [Vec<u8>]) -> Self {
        Arrival {
            vh: vnet_offload::left_partial(frame).unwrap_or_default(),
            ..Self::wire(frame, at, bufs)
        }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.tail.map(|t| t.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Decides and transmits one frame that arrived on `ingress`.
pub fn process<'a>(
    shared: &Shared,
    snap: &'a Snapshot,
    ctx: &mut FwdCtx,
    ingress: PortId,
    a: Arrival<'a>,
    batch: &mut TxBatch<'a>,
) {
    let Some(inp) = snap.ports.get(&ingress) else {
        return; // the port was removed while this frame was in flight
    };
    let len = a.len();
    inp.counters.rx(len);
    if len < ETHERNET_HEADER_LEN || a.head.len() < ETHERNET_HEADER_LEN {
        return inp.counters.count_drop(DropReason::Truncated);
    }
    if len > MAX_FRAME_LEN {
        return inp.counters.count_drop(DropReason::Oversize);
    }
    if !matches!(
        a.vh.gso_kind(),
        VirtioNetHdr::GSO_NONE
            | VirtioNetHdr::GSO_TCPV4
            | VirtioNetHdr::GSO_TCPV6
            | VirtioNetHdr::GSO_UDP_L4
    ) {
        return inp.counters.count_drop(DropReason::BadOffload);
    }
    // The MACs are copied once, checked, and every output takes them from this copy, not
    // from the frame: a vhost-user guest's frame is its shared memory, which it can rewrite
    // after the check (a spoofed source sent with a checked one's approval).
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&a.head[..12]);
    let dst = MacAddr::from_bytes(&macs[..6]);
    let src = MacAddr::from_bytes(&macs[6..]);
    // Before learning or the traffic matrix see it: a spoofed source must not teach anything.
    if let Err(r) = inp.guard.check(src, len) {
        return inp.counters.count_drop(r);
    }
    let vni = inp.info.vni;
    let learn_gen = shared.learn_observe(vni, src, ingress);
    let learning = learn_gen.is_some();
    ctx.matrix.record(vni, src, dst, 1, len as u64);
    ctx.pending += 1;
    let FwdCtx {
        cache,
        seg,
        coalescers,
        scratch,
        queue,
        ..
    } = ctx;
    let decision = cache.lookup(
        &snap.table,
        learn_gen.unwrap_or(0),
        (ingress, src, dst),
        || {
            let learned = if learning && dst.is_unicast() {
                shared.learned(vni, dst)
            } else {
                None
            };
            snap.table.decide(ingress, src, dst, learning, learned)
        },
    );
    let targets = match decision {
        Decision::Drop(r) => {
            inp.counters.count_drop(*r);
            return ctx.maybe_flush(shared);
        }
        Decision::Forward(t) => t,
    };
    let frame = Frame {
        vh: a.vh,
        macs,
        head: a.head,
        tail: a.tail,
        origin: a.origin,
        sole: targets.len() == 1,
    };
    for t in targets {
        let Some(out) = snap.ports.get(t) else {
            continue;
        };
        let mut tx = Tx {
            offload: &shared.offload,
            port: *t,
            counters: &out.counters,
            queue: *queue,
            seg,
            coalescers,
            scratch,
            batch,
        };
        match out.port.send(&mut tx, &frame) {
            Ok(()) => out.counters.tx(len),
            Err(reason) => out.counters.count_drop(reason),
        }
    }
    ctx.maybe_flush(shared);
}

#[cfg(test)]
mod tests;
