//! A frame's fate: every ingress (TAP queues, the VXLAN socket, TCP and direct links,
//! vhost-user guests, and the vhost-user cut-through receive) hands each frame to one
//! decision, [`Decider::decide`], which counts it, checks it (length, offload header, the
//! ingress port's guard), learns, records it in the traffic matrix and asks the thread's route
//! cache; [`transmit`] then hands it to each egress port's
//! [`Port::send`](crate::port::Port::send). [`process`] is the two in a row, what every
//! ingress but the cut-through receive calls (that one writes a frame for its own guest
//! itself, and hands the others on later: `ingress::guest`). What happens on the way out is
//! the port kind's business (`ports`, above); this module knows no port kind.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use vm_memory::VolatileSlice;
use vnet_core::{Decision, DropReason, FastMap, LockRecover, PortId, RouteCache, TrafficMatrix};
use vnet_offload::{Coalescer, PayloadRef, SegmentList, VirtioNetHdr};
use vnet_wire::{ethertype, EthernetFrame, Ipv4Packet, ETHERNET_HEADER_LEN, MAX_FRAME_LEN};

use crate::batch::{TxBatch, TxSpare};
use crate::port::{Frame, Origin, Tx};
use crate::shared::{Shared, Snapshot};

const ROUTE_CACHE_SIZE: usize = 4096;
/// How often a thread's traffic-matrix slice is merged into the shared one.
pub const IDLE_TICK: Duration = Duration::from_millis(100);

/// Per-thread forwarding state: the decision's (route cache, a local slice of the traffic
/// matrix), scratch space for segmentation, and one coalescer per guest NIC this thread
/// delivers to.
pub struct FwdCtx {
    pub(crate) decider: Decider,
    pub(crate) seg: SegmentList,
    pub(crate) coalescers: FastMap<PortId, Coalescer>,
    pub(crate) scratch: Vec<u8>,
    /// The thread's batch vectors, kept from batch to batch.
    pub(crate) tx_spare: TxSpare,
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
            decider: Decider {
                cache: RouteCache::new(ROUTE_CACHE_SIZE),
                matrix: TrafficMatrix::new(ROUTE_CACHE_SIZE),
                pending: 0,
            },
            seg: SegmentList::new(),
            coalescers: FastMap::default(),
            scratch: Vec::new(),
            tx_spare: TxSpare::default(),
            queue,
        }
    }

    /// Merges this thread's traffic-matrix counts into the shared matrix.
    pub fn flush(&mut self, shared: &Shared) {
        self.decider.flush(shared);
    }

    /// Route-cache hits and misses of this thread (for tests and tuning).
    pub fn cache_stats(&self) -> (u64, u64) {
        (self.decider.cache.hits(), self.decider.cache.misses())
    }
}

/// The state the forwarding decision keeps per thread: the route cache and this thread's
/// slice of the traffic matrix.
pub(crate) struct Decider {
    cache: RouteCache,
    matrix: TrafficMatrix,
    pending: u32,
}

/// What the decision made of a frame it let in: its two MACs as checked (every output takes
/// them from here, never from the frame again: a vhost-user guest can rewrite its frame after
/// the check) and the ports it goes to.
#[derive(Debug, Clone, Copy)]
pub struct Verdict<'t> {
    pub macs: [u8; 12],
    pub targets: &'t [PortId],
}

impl Decider {
    /// The forwarding decision for a frame that arrived on `ingress`, one for every ingress:
    /// counts the frame on the ingress port, checks that it is an Ethernet frame with an
    /// offload header vnet can honour and that the port's guard lets it in, learns its source,
    /// records it in this thread's traffic matrix, and asks the route cache (the forwarding
    /// table on a miss). `None`: dropped, and counted on the ingress port.
    pub(crate) fn decide<'t>(
        &'t mut self,
        shared: &Shared,
        snap: &Snapshot,
        ingress: PortId,
        a: &Arrival<'_>,
    ) -> Option<Verdict<'t>> {
        let inp = snap.ports.get(&ingress)?; // the port was removed while this frame was in flight
        let len = a.len();
        inp.counters.rx(len);
        if len < ETHERNET_HEADER_LEN || a.head.len() < ETHERNET_HEADER_LEN {
            inp.counters.count_drop(DropReason::Truncated);
            return None;
        }
        if len > MAX_FRAME_LEN {
            inp.counters.count_drop(DropReason::Oversize);
            return None;
        }
        if !matches!(
            a.vh.gso_kind(),
            VirtioNetHdr::GSO_NONE
                | VirtioNetHdr::GSO_TCPV4
                | VirtioNetHdr::GSO_TCPV6
                | VirtioNetHdr::GSO_UDP_L4
        ) {
            inp.counters.count_drop(DropReason::BadOffload);
            return None;
        }
        // The MACs are copied once, checked, and every output takes them from this copy, not
        // from the frame: a vhost-user guest's frame is its shared memory, which it can rewrite
        // after the check (a spoofed source sent with a checked one's approval).
        let mut macs = [0u8; 12];
        macs.copy_from_slice(&a.head[..12]);
        let eth = EthernetFrame::new_unchecked(&macs[..]);
        let (dst, src) = (eth.dst(), eth.src());
        // Before learning or the traffic matrix see it: a spoofed source must not teach anything.
        if let Err(r) = inp.guard.check(src, len) {
            inp.counters.count_drop(r);
            return None;
        }
        let vni = inp.info.vni;
        let learn_gen = shared.learn_observe(vni, src, ingress);
        let learning = learn_gen.is_some();
        self.matrix.record(vni, src, dst, 1, len as u64);
        self.pending += 1;
        if self.pending >= 256 {
            self.flush(shared);
        }
        let decision = self.cache.lookup(
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
        match decision {
            Decision::Drop(r) => {
                inp.counters.count_drop(*r);
                None
            }
            Decision::Forward(t) => Some(Verdict { macs, targets: t }),
        }
    }

    /// Merges this thread's traffic-matrix counts into the shared matrix.
    fn flush(&mut self, shared: &Shared) {
        if self.pending > 0 {
            let mut m = shared.matrix.lock_or_recover();
            m.merge_from(&mut self.matrix);
            self.pending = 0;
        }
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
    /// see `ports::udp_link`): then the header says so (`NEEDS_CSUM`), so a guest gets the frame
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
    let FwdCtx {
        decider,
        seg,
        coalescers,
        scratch,
        queue,
        ..
    } = ctx;
    if let Some(v) = decider.decide(shared, snap, ingress, &a) {
        let mut out = Egress {
            seg,
            coalescers,
            scratch,
            queue: *queue,
        };
        transmit(shared, snap, &mut out, ingress, v, a, batch);
    }
}

/// The per-thread scratch space the egress ports use (see [`crate::port::Tx`]), borrowed from
/// a [`FwdCtx`] beside its decision.
pub(crate) struct Egress<'c> {
    pub(crate) seg: &'c mut SegmentList,
    pub(crate) coalescers: &'c mut FastMap<PortId, Coalescer>,
    pub(crate) scratch: &'c mut Vec<u8>,
    pub(crate) queue: usize,
}

/// Hands a frame the decision let in to each port of its verdict, counting what each sent or
/// dropped. A frame a link's path cannot carry (`too_big`) is answered to `ingress`, its
/// sender, with ICMP "fragmentation needed" / "packet too big".
pub(crate) fn transmit<'a>(
    shared: &Shared,
    snap: &'a Snapshot,
    out: &mut Egress<'_>,
    ingress: PortId,
    v: Verdict<'_>,
    a: Arrival<'a>,
    batch: &mut TxBatch<'a>,
) {
    let len = a.len();
    let frame = Frame {
        vh: a.vh,
        macs: v.macs,
        head: a.head,
        tail: a.tail,
        origin: a.origin,
        sole: v.targets.len() == 1,
    };
    for t in v.targets {
        let Some(port) = snap.ports.get(t) else {
            continue;
        };
        let mut tx = Tx {
            offload: &shared.offload,
            port: *t,
            counters: &port.counters,
            queue: out.queue,
            seg: out.seg,
            coalescers: out.coalescers,
            scratch: out.scratch,
            batch,
        };
        match port.port.send(&mut tx, &frame) {
            Ok(()) => port.counters.tx(len),
            Err(DropReason::TooBig) => {
                let limit = port.port.as_udp().and_then(|u| u.path.load().limit);
                let Some(limit) = limit else {
                    port.counters.count_drop(DropReason::TooBig);
                    continue;
                };
                if !fragment_too_big(shared, snap, out, *t, &frame, limit) {
                    port.counters.count_drop(DropReason::TooBig);
                    answer_too_big(shared, snap, out, ingress, &frame, limit);
                }
            }
            Err(reason) => port.counters.count_drop(reason),
        }
    }
}

/// Sends `frame`, an IPv4 datagram without DF too large for port `to`'s path, as fragments
/// whose IP packets are at most `limit` bytes (`fragment.rs`), as a router would. `false`: not
/// such a frame (DF, not IPv4, a segmentation offload frame) or not sent; the caller answers
/// or drops it.
fn fragment_too_big(
    shared: &Shared,
    snap: &Snapshot,
    out: &mut Egress<'_>,
    to: PortId,
    frame: &Frame<'_>,
    limit: usize,
) -> bool {
    // A frame the guest left to be segmented is TCP or UDP with its own sizes: never cut.
    if frame.vh.gso_kind() != VirtioNetHdr::GSO_NONE {
        return false;
    }
    // Cheap refusal before the frame is copied: only IPv4 without DF is cut (its header is in
    // `head`; `fragment_ipv4` checks the whole datagram again).
    let v4_no_df = EthernetFrame::new_checked(frame.head)
        .is_ok_and(|e| e.ethertype() == ethertype::IPV4)
        && Ipv4Packet::new_checked(&frame.head[ETHERNET_HEADER_LEN..])
            .is_ok_and(|p| !p.dont_frag());
    if !v4_no_df {
        return false;
    }
    let mut whole = Vec::with_capacity(frame.len());
    whole.extend_from_slice(frame.head);
    if let Some(t) = frame.tail {
        let at = whole.len();
        whole.resize(at + t.len(), 0);
        if t.copy_to(&mut whole[at..]) != t.len() {
            return false;
        }
    }
    whole[..12].copy_from_slice(&frame.macs);
    // A checksum left to the NIC is computed before the datagram is cut (the receiver checks
    // it over the reassembled datagram).
    if frame.vh.needs_csum() && vnet_offload::complete_checksum(&mut whole, &frame.vh).is_err() {
        return false;
    }
    let Ok(frags) = crate::fragment::fragment_ipv4(&whole, limit) else {
        return false;
    };
    send_made(
        shared,
        snap,
        out,
        to,
        frame.origin,
        frags.iter().map(Vec::as_slice),
    );
    shared.reach.fragmented.fetch_add(1, Relaxed);
    true
}

/// Tells the sender of `frame` (behind port `to`) that its IP packets may be at most `limit`
/// bytes on the way it took: the ICMP reply goes out through that port at once.
fn answer_too_big(
    shared: &Shared,
    snap: &Snapshot,
    out: &mut Egress<'_>,
    to: PortId,
    frame: &Frame<'_>,
    limit: usize,
) {
    // `head` holds at least the first 128 bytes of any frame: every header a quote needs.
    let mut whole = frame.head.to_vec();
    whole[..12].copy_from_slice(&frame.macs);
    let crate::too_big::TooBig::Reply(reply) = crate::too_big::too_big(&whole, limit) else {
        return;
    };
    if send_made(shared, snap, out, to, Origin::Local, [reply.as_slice()]) == 1 {
        shared.reach.too_big_answered.fetch_add(1, Relaxed);
    }
}

/// Sends frames vnet made (whole and plain: fragments, ICMP answers) through port `to`, in a
/// batch of their own flushed at once, each counted as sent or dropped on the port. Returns
/// how many were sent.
fn send_made<'f>(
    shared: &Shared,
    snap: &Snapshot,
    out: &mut Egress<'_>,
    to: PortId,
    origin: Origin<'f>,
    frames: impl IntoIterator<Item = &'f [u8]>,
) -> usize {
    let Some(port) = snap.ports.get(&to) else {
        return 0;
    };
    let mut batch = TxBatch::default();
    let mut sent = 0;
    for f in frames {
        let mut macs = [0u8; 12];
        macs.copy_from_slice(&f[..12]);
        let made = Frame {
            vh: VirtioNetHdr::default(),
            macs,
            head: f,
            tail: None,
            origin,
            sole: true,
        };
        let mut tx = Tx {
            offload: &shared.offload,
            port: to,
            counters: &port.counters,
            queue: out.queue,
            seg: out.seg,
            coalescers: out.coalescers,
            scratch: out.scratch,
            batch: &mut batch,
        };
        match port.port.send(&mut tx, &made) {
            Ok(()) => {
                port.counters.tx(f.len());
                sent += 1;
            }
            Err(reason) => port.counters.count_drop(reason),
        }
    }
    batch.flush(&shared.offload, &shared.daemon, &snap.udp);
    sent
}

#[cfg(test)]
mod tests;
