//! Moving frames: the decision for each frame (route cache over the snapshot's table) and its
//! transmission on every egress port, with software offloads where a port needs them.
//!
//! Frames from a TAP arrive with a virtio-net header: a 64 KB TCP segment stays whole on its
//! way to another local TAP, is cut into wire segments (with checksums) only when it leaves by
//! UDP, TCP or a direct link, and UDP sends a whole segment run in one `UDP_SEGMENT` call.
//! Frames from the wire that go to a TAP are merged per flow ([`Coalescer`]) and handed to the
//! guest 64 KB at a time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockAddr;
use vnet_control::status::OffloadStatus;
use vnet_core::{Decision, DropReason, FastMap, PortCounters, PortId, RouteCache, TrafficMatrix};
use vnet_offload::{segment, Coalescer, GroOutput, Offered, PayloadRef, SegmentList, VirtioNetHdr};
use vnet_wire::{EthernetFrame, MacAddr, WireError, VXLAN_HEADER_LEN};

use crate::engine::{PortTx, Shared, Snapshot, UdpLinkTx};
use crate::nic::GuestNic;
use crate::udp::{VxlanSocket, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// Largest frame a UDP link carries whole: one UDP datagram holds at most 65507 bytes (IPv4).
pub const UDP_MAX_FRAME: usize = 65507 - VXLAN_HEADER_LEN;
const ROUTE_CACHE_SIZE: usize = 4096;
/// How often a thread's traffic-matrix slice is merged into the shared one.
pub const IDLE_TICK: Duration = Duration::from_millis(100);

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

/// Per-thread forwarding state: the route cache, a local slice of the traffic matrix, scratch
/// space for segmentation, and one coalescer per TAP this thread delivers to.
pub struct FwdCtx {
    cache: RouteCache,
    matrix: TrafficMatrix,
    pending: u32,
    seg: SegmentList,
    coalescers: FastMap<PortId, Coalescer>,
    scratch: Vec<u8>,
    /// Which TAP queue this thread writes to.
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
}

/// Datagrams waiting to be sent, borrowing the frames they carry.
#[derive(Default)]
pub struct TxBatch<'a> {
    /// (link, head, rest): `head` is a range of `heads` (headers we rewrote, say to complete a
    /// checksum), `rest` the frame bytes after it, borrowed.
    udp: Vec<(&'a UdpLinkTx, std::ops::Range<usize>, &'a [u8])>,
    heads: Vec<u8>,
}

/// One datagram ready to send: its link, its parts, its length.
type Ready<'b> = (&'b UdpLinkTx, [&'b [u8]; 3], usize);

impl<'a> TxBatch<'a> {
    /// Seals the datagrams of encrypted links (into `sealed`) and lists every datagram with
    /// the parts it is sent from; a datagram of an encrypted link without a session is
    /// dropped and counted (`no_session`).
    fn ready<'b>(&'b self, sealed: &'b mut Vec<u8>) -> Vec<Ready<'b>> {
        let mut scratch = Vec::new();
        let mut ranges: Vec<Option<std::ops::Range<usize>>> = Vec::with_capacity(self.udp.len());
        // The session of the previous entry's link: batches mostly go to one link.
        let mut last: Option<(*const UdpLinkTx, Option<Arc<vnet_crypto::Session>>)> = None;
        for (l, h, f) in &self.udp {
            let Some(c) = &l.crypto else {
                ranges.push(None);
                continue;
            };
            let session = match &last {
                Some((p, s)) if std::ptr::eq(*p, *l) => s.clone(),
                _ => {
                    let s = c.sending_session();
                    last = Some((*l as *const UdpLinkTx, s.clone()));
                    s
                }
            };
            let at = sealed.len();
            let r = match session {
                Some(s) => s
                    .seal(
                        &[&l.header[..], &self.heads[h.clone()], f],
                        &mut scratch,
                        sealed,
                    )
                    .map_err(crate::crypto::drop_reason),
                None => Err(DropReason::NoSession),
            };
            match r {
                Ok(()) => {
                    c.sealed.fetch_add(1, Relaxed);
                    ranges.push(Some(at..sealed.len()));
                }
                Err(reason) => {
                    l.counters.count_drop(reason);
                    ranges.push(Some(at..at));
                }
            }
        }
        let sealed: &'b Vec<u8> = sealed;
        self.udp
            .iter()
            .zip(ranges)
            .filter_map(|((l, h, f), r)| match r {
                None => Some((
                    *l,
                    [&l.header[..], &self.heads[h.clone()], *f],
                    VXLAN_HEADER_LEN + h.len() + f.len(),
                )),
                Some(r) if r.is_empty() => None,
                Some(r) => Some((*l, [&sealed[r.clone()], &[][..], &[][..]], r.len())),
            })
            .collect()
    }

    /// Sends the batch: a run of consecutive datagrams to one link, all of one size but the
    /// last (which may be shorter), goes as one `UDP_SEGMENT` send, so the kernel's stack
    /// handles the run once; the rest go in `sendmmsg` batches, in order. Datagrams of
    /// encrypted links are sealed first (same sizes in, same sizes out, so runs survive).
    pub fn flush(&mut self, shared: &Shared, sock: &VxlanSocket) {
        if self.udp.is_empty() {
            return;
        }
        let mut sealed = Vec::new();
        let items = self.ready(&mut sealed);
        let n = items.len();
        let mut singles: Vec<(&SockAddr, [&[u8]; 3])> = Vec::new();
        let send_singles = |singles: &mut Vec<(&SockAddr, [&[u8]; 3])>| {
            if singles.is_empty() {
                return;
            }
            let sent = sock.send_many(singles);
            shared.offload.udp_batch_sends.fetch_add(1, Relaxed);
            for _ in sent..singles.len() {
                shared.daemon.count_drop(DropReason::TxError);
            }
            singles.clear();
        };
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut i = 0;
        while i < n {
            let (link, _, first_len) = items[i];
            let size = first_len;
            let per = (GSO_MAX_BYTES / size.max(1)).clamp(1, GSO_MAX_SEGMENTS);
            let mut j = i + 1;
            while j < n && j - i < per {
                let (l, _, flen) = items[j];
                if !std::ptr::eq(l, link) || flen > first_len {
                    break;
                }
                j += 1;
                if flen < first_len {
                    break;
                }
            }
            if j - i > 1 && sock.gso_enabled() && size < link.gso_refused.load(Relaxed) {
                parts.clear();
                for (_, p, _) in &items[i..j] {
                    parts.extend_from_slice(p);
                }
                send_singles(&mut singles);
                match sock.send_parts(&link.to, &parts, Some(size as u16)) {
                    Ok(()) => {
                        shared.offload.udp_gso_sends.fetch_add(1, Relaxed);
                        i = j;
                        continue;
                    }
                    Err(None) => {
                        link.gso_refused.fetch_min(size, Relaxed);
                    }
                    Err(Some(r)) => {
                        for _ in i..j {
                            shared.daemon.count_drop(r);
                        }
                        i = j;
                        continue;
                    }
                }
            }
            for (l, p, _) in &items[i..j] {
                singles.push((&l.to, *p));
            }
            i = j;
        }
        send_singles(&mut singles);
        drop(singles);
        drop(items);
        self.udp.clear();
        self.heads.clear();
    }
}

/// Where a frame came from, for the coalescer.
#[derive(Clone, Copy)]
pub enum Origin<'a> {
    /// A TAP, a direct link or a TCP link: the frame is in a buffer of its own.
    Local,
    /// A UDP datagram at `at` inside the receive buffers `bufs`.
    Wire { at: PayloadRef, bufs: &'a [Vec<u8>] },
}

fn gso_count(shared: &Shared, segs: usize) {
    shared.offload.gso_frames.fetch_add(1, Relaxed);
    shared.offload.gso_segments.fetch_add(segs as u64, Relaxed);
}

/// Decides and transmits one frame that arrived on `ingress`. `vh` must already be honest:
/// a partial checksum on a non-GSO frame has been completed by the caller.
#[allow(clippy::too_many_arguments)]
pub fn process<'a>(
    shared: &Shared,
    snap: &'a Snapshot,
    ctx: &mut FwdCtx,
    ingress: PortId,
    vh: VirtioNetHdr,
    frame: &'a [u8],
    origin: Origin<'a>,
    batch: &mut TxBatch<'a>,
) {
    let Some(inp) = snap.ports.get(&ingress) else {
        return; // the port was removed while this frame was in flight
    };
    inp.counters.rx(frame.len());
    match EthernetFrame::new_checked(frame) {
        Ok(_) => {}
        Err(WireError::Truncated { .. }) => return inp.counters.count_drop(DropReason::Truncated),
        Err(_) => return inp.counters.count_drop(DropReason::Oversize),
    }
    if !matches!(
        vh.gso_kind(),
        VirtioNetHdr::GSO_NONE
            | VirtioNetHdr::GSO_TCPV4
            | VirtioNetHdr::GSO_TCPV6
            | VirtioNetHdr::GSO_UDP_L4
    ) {
        return inp.counters.count_drop(DropReason::BadOffload);
    }
    // The MACs are copied once, checked, and every output below takes them from this copy, not
    // from `frame`: a vhost-user guest's frame is its shared memory, which it can rewrite after
    // the check (a spoofed source sent with a checked one's approval).
    let mut macs = [0u8; 12];
    macs.copy_from_slice(&frame[..12]);
    let (mut dst, mut src) = (MacAddr([0; 6]), MacAddr([0; 6]));
    dst.0.copy_from_slice(&macs[..6]);
    src.0.copy_from_slice(&macs[6..]);
    // Before learning or the traffic matrix see it: a spoofed source must not teach anything.
    if let Err(r) = inp.guard.check(src, frame.len()) {
        return inp.counters.count_drop(r);
    }
    let vni = inp.info.vni;
    let learn_gen = shared.learn_observe(vni, src, ingress);
    let learning = learn_gen.is_some();
    ctx.matrix.record(vni, src, dst, 1, frame.len() as u64);
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
        (snap.table.generation(), learn_gen.unwrap_or(0)),
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
    for t in targets {
        let Some(out) = snap.ports.get(t) else {
            continue;
        };
        let r = match (&*out.tx, origin) {
            (PortTx::Nic(tap), Origin::Wire { at, bufs })
                if tap.has_vnet_hdr() && targets.len() == 1 =>
            {
                let c = coalescers.entry(*t).or_default();
                let mut emit =
                    |g: GroOutput<'_>| emit_to_tap(shared, &**tap, *queue, &out.counters, g, bufs);
                match c.offer(frame, at, &mut emit) {
                    Offered::Held => Ok(()),
                    Offered::Plain => wire_to_tap(shared, &**tap, *queue, frame, None, scratch),
                    Offered::Partial(p) => {
                        wire_to_tap(shared, &**tap, *queue, frame, Some(p), scratch)
                    }
                }
            }
            (PortTx::Nic(tap), Origin::Wire { .. }) => {
                let hint = vnet_offload::partial_checksum_hint(frame);
                wire_to_tap(shared, &**tap, *queue, frame, hint, scratch)
            }
            (PortTx::Nic(tap), Origin::Local) => {
                if tap.has_vnet_hdr() || vh.is_plain() {
                    tap.write(*queue, &vh, &[&macs, &frame[12..]])
                } else {
                    each_segment(shared, frame, &vh, seg, &macs, |parts| {
                        tap.write(*queue, &VirtioNetHdr::default(), parts)
                    })
                }
            }
            (PortTx::Udp(link), _)
                if link.crypto.is_some() && vh.gso_kind() != VirtioNetHdr::GSO_NONE =>
            {
                // Encrypted: cut in user space; every segment is sealed on its own at flush
                // (runs of equal-size segments still go as one UDP_SEGMENT send).
                match segment(frame, &vh, seg) {
                    Ok(()) => {
                        seg.pin_macs(&macs);
                        gso_count(shared, seg.len());
                        for s in &seg.segs {
                            let at = batch.heads.len();
                            batch.heads.extend_from_slice(&seg.headers[s.hdr.clone()]);
                            batch.udp.push((
                                link,
                                at..batch.heads.len(),
                                &frame[s.payload.clone()],
                            ));
                        }
                        Ok(())
                    }
                    Err(_) => Err(DropReason::BadOffload),
                }
            }
            (PortTx::Udp(link), _) => {
                let max = if link.crypto.is_some() {
                    UDP_MAX_FRAME - vnet_crypto::DATA_OVERHEAD
                } else {
                    UDP_MAX_FRAME
                };
                if vh.gso_kind() == VirtioNetHdr::GSO_NONE {
                    if frame.len() > max {
                        Err(DropReason::Oversize)
                    } else if vh.needs_csum() {
                        // Complete the checksum in a copy of the headers; the rest of the
                        // frame is sent from where it is.
                        match segment(frame, &vh, seg) {
                            Ok(()) if seg.len() == 1 => {
                                seg.pin_macs(&macs);
                                let at = batch.heads.len();
                                batch.heads.extend_from_slice(&seg.headers);
                                let rest = seg.segs[0].payload.clone();
                                batch.udp.push((link, at..batch.heads.len(), &frame[rest]));
                                Ok(())
                            }
                            _ => Err(DropReason::BadOffload),
                        }
                    } else {
                        let at = batch.heads.len();
                        batch.heads.extend_from_slice(&macs);
                        batch.udp.push((link, at..batch.heads.len(), &frame[12..]));
                        Ok(())
                    }
                } else {
                    send_udp_gso(shared, link, frame, &vh, seg, &macs)
                }
            }
            (PortTx::Tcp(link), _) => {
                each_segment(shared, frame, &vh, seg, &macs, |parts| link.send(parts))
            }
            (PortTx::Direct(p), _) => {
                each_segment(shared, frame, &vh, seg, &macs, |parts| p.send(parts))
            }
        };
        match r {
            Ok(()) => out.counters.tx(frame.len()),
            Err(reason) => out.counters.count_drop(reason),
        }
    }
    ctx.maybe_flush(shared);
}

/// A frame from the wire that no coalescer took, to a guest. `partial` says its checksum was
/// left partial by a local sender.
fn wire_to_tap(
    shared: &Shared,
    tap: &dyn GuestNic,
    queue: usize,
    frame: &[u8],
    partial: Option<VirtioNetHdr>,
    scratch: &mut Vec<u8>,
) -> Result<(), DropReason> {
    match partial {
        Some(p) if !tap.has_vnet_hdr() => {
            // Without a virtio-net header the guest needs complete checksums.
            scratch.clear();
            scratch.extend_from_slice(frame);
            vnet_offload::complete_checksum(scratch, &p).map_err(|_| DropReason::BadOffload)?;
            shared.offload.csum_completed.fetch_add(1, Relaxed);
            tap.write(queue, &VirtioNetHdr::default(), &[scratch])
        }
        Some(p) => {
            shared.offload.partial_csum.fetch_add(1, Relaxed);
            tap.write(queue, &partial_for_tap(tap, frame, p), &[frame])
        }
        None if frame.len() > tap.max_frame()
            && tap.has_vnet_hdr()
            && vnet_offload::l4_checksum_ok(frame) =>
        {
            // An unsegmented frame a kernel sender did checksum in full (say one carrying FIN):
            // the guest takes a frame above its MTU only as a GSO frame.
            let Ok(l) = vnet_offload::parse_l3l4(frame) else {
                return tap.write(queue, &VirtioNetHdr::default(), &[frame]);
            };
            let hl = l.hdr_len();
            let mut h = [0u8; 128];
            if hl > h.len() {
                return Err(DropReason::Oversize);
            }
            h[..hl].copy_from_slice(&frame[..hl]);
            let mss = tap
                .max_frame()
                .saturating_sub(18 + l.l3_len + l.l4_len)
                .max(536) as u16;
            match vnet_offload::as_partial_gso(&mut h[..hl], frame.len(), mss) {
                Some(vh) => tap.write(queue, &vh, &[&h[..hl], &frame[hl..]]),
                None => Err(DropReason::Oversize),
            }
        }
        None => tap.write(queue, &VirtioNetHdr::default(), &[frame]),
    }
}

/// A frame with a partial checksum larger than the guest's MTU is a kernel sender's
/// unsegmented GSO frame (a veth underlay passes those whole): describe it to the guest as
/// one, with segments that fit its MTU.
fn partial_for_tap(tap: &dyn GuestNic, frame: &[u8], partial: VirtioNetHdr) -> VirtioNetHdr {
    if frame.len() <= tap.max_frame() {
        return partial;
    }
    let Ok(l) = vnet_offload::parse_l3l4(frame) else {
        return partial;
    };
    let mss = tap
        .max_frame()
        .saturating_sub(18 + l.l3_len + l.l4_len)
        .max(536);
    vnet_offload::gso_header(frame, mss as u16).unwrap_or(partial)
}

/// Writes a coalesced (or single, verified) frame to a guest.
fn emit_to_tap(
    shared: &Shared,
    tap: &dyn GuestNic,
    queue: usize,
    counters: &Arc<PortCounters>,
    g: GroOutput<'_>,
    bufs: &[Vec<u8>],
) {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + g.payloads.len());
    parts.push(g.headers);
    for p in g.payloads {
        let b = &bufs[p.buf as usize];
        parts.push(&b[p.start as usize..p.end as usize]);
    }
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut vhdr = g.vhdr;
    let mut patched = [0u8; 128];
    if total > tap.max_frame()
        && vhdr.gso_kind() == VirtioNetHdr::GSO_NONE
        && g.headers.len() <= patched.len()
    {
        // A single large segment (a kernel sender's unsegmented frame whose checksum it did
        // complete): the guest takes it only as a GSO frame.
        let h = &mut patched[..g.headers.len()];
        h.copy_from_slice(g.headers);
        let mss = (tap.max_frame() + 14)
            .saturating_sub(18 + g.headers.len())
            .max(536) as u16;
        if let Some(v) = vnet_offload::as_partial_gso(h, total, mss) {
            vhdr = v;
            parts[0] = &patched[..g.headers.len()];
        }
    }
    if g.payloads.len() > 1 {
        shared.offload.gro_frames.fetch_add(1, Relaxed);
        shared
            .offload
            .gro_merged
            .fetch_add(g.payloads.len() as u64, Relaxed);
    }
    if let Err(r) = tap.write(queue, &vhdr, &parts) {
        counters.count_drop(r);
    }
}

/// Hands every coalesced run this thread holds to its guest; call at the end of a receive
/// batch, before the buffers are reused.
pub fn flush_coalescers(shared: &Shared, snap: &Snapshot, ctx: &mut FwdCtx, bufs: &[Vec<u8>]) {
    let queue = ctx.queue;
    for (port, c) in ctx.coalescers.iter_mut() {
        if c.is_empty() {
            continue;
        }
        match snap.ports.get(port).map(|e| (&*e.tx, &e.counters)) {
            Some((PortTx::Nic(tap), counters)) => {
                c.flush(&mut |g| emit_to_tap(shared, &**tap, queue, counters, g, bufs));
            }
            _ => c.flush(&mut |_| {}),
        }
    }
}

/// Calls `send` with the parts of each wire frame of `frame` (the frame itself when it needs
/// no segmentation and no checksum), its MACs taken from `macs`, the checked copy.
fn each_segment(
    shared: &Shared,
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
        gso_count(shared, seg.len());
    }
    for i in 0..seg.len() {
        send(&seg.parts(frame, i))?;
    }
    Ok(())
}

/// Sends a guest's large segment as VXLAN datagrams: cut in user space (headers only; the
/// payload is gathered from the guest's buffer), then one `UDP_SEGMENT` send per run of up to
/// 64 segments.
fn send_udp_gso(
    shared: &Shared,
    link: &UdpLinkTx,
    frame: &[u8],
    vh: &VirtioNetHdr,
    seg: &mut SegmentList,
    macs: &[u8; 12],
) -> Result<(), DropReason> {
    let UdpLinkTx {
        sock,
        to,
        header,
        gso_refused,
        ..
    } = link;
    segment(frame, vh, seg).map_err(|_| DropReason::BadOffload)?;
    seg.pin_macs(macs);
    gso_count(shared, seg.len());
    let n = seg.len();
    let dgram = |k: usize| VXLAN_HEADER_LEN + seg.segs[k].hdr.len() + seg.segs[k].payload.len();
    // segment() makes every datagram the same size but the last, so any run of consecutive
    // segments is a valid UDP_SEGMENT send; runs are bounded by count and by bytes.
    let per = (GSO_MAX_BYTES / dgram(0)).clamp(1, GSO_MAX_SEGMENTS);
    let mut parts: Vec<&[u8]> = Vec::with_capacity(per * 3);
    for i in (0..n).step_by(per) {
        let j = (i + per).min(n);
        parts.clear();
        for k in i..j {
            let [h, p] = seg.parts(frame, k);
            parts.extend_from_slice(&[&header[..], h, p]);
        }
        let size = dgram(i);
        let gso = (j - i > 1 && sock.gso_enabled() && size < gso_refused.load(Relaxed))
            .then_some(size as u16);
        let result = match gso {
            Some(_) => sock.send_parts(to, &parts, gso),
            None => Err(None),
        };
        match result {
            Ok(()) => {
                shared.offload.udp_gso_sends.fetch_add(1, Relaxed);
            }
            Err(None) => {
                if gso.is_some() {
                    gso_refused.fetch_min(size, Relaxed);
                }
                // No segmentation offload for this run: its datagrams go in one sendmmsg.
                let msgs: Vec<(&SockAddr, [&[u8]; 3])> = (i..j)
                    .map(|k| {
                        let [h, p] = seg.parts(frame, k);
                        (to, [&header[..], h, p])
                    })
                    .collect();
                if sock.send_many(&msgs) < msgs.len() {
                    return Err(DropReason::TxError);
                }
                shared.offload.udp_batch_sends.fetch_add(1, Relaxed);
            }
            Err(Some(r)) => return Err(r),
        }
    }
    Ok(())
}
