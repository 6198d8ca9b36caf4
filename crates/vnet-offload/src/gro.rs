//! Coalescing (software GRO): consecutive segments of one TCP flow become one large frame with
//! a virtio-net header, so the receiving guest's stack handles 64 KB at a time. Headers are
//! read and the merged frame's rewritten through `vnet-wire`'s views.

use vnet_wire::checksum::{fold, sum};
use vnet_wire::tcp_flags::{
    ACK as TCP_ACK, FIN as TCP_FIN, PSH as TCP_PSH, RST as TCP_RST, SYN as TCP_SYN,
};
use vnet_wire::{Ipv4Packet, Ipv6Packet, TcpPacket, VirtioNetHdr};

use crate::headers::{parse_l3l4, Layout, L3, L4};

/// Most payload bytes in one coalesced frame (its IP length must fit 16 bits).
pub const MAX_GRO_PAYLOAD: usize = 65535 - 60 - 60;
/// Most segments merged into one frame.
const MAX_SEGS: usize = 64;

/// Where a payload lives: buffer `buf` of the caller, bytes `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    pub buf: u32,
    pub start: u32,
    pub end: u32,
}

/// A frame to deliver: virtio-net header, headers, then the payloads in order.
#[derive(Debug)]
pub struct GroOutput<'a> {
    pub vhdr: VirtioNetHdr,
    pub headers: &'a [u8],
    pub payloads: &'a [PayloadRef],
}

#[derive(Debug)]
struct Run {
    layout: Layout,
    mss: usize,
    next_seq: u32,
    payload: usize,
    psh: bool,
    ended: bool,
    /// A segment of the run came with its checksum left partial (see [`Coalescer::offer`]).
    partial: bool,
}

/// Merges TCP segments offered in order into runs; a run is handed to `emit` when the next
/// frame does not continue it, when it is full or ends (short segment, PSH), or on `flush`.
/// Only segments whose IPv4 and TCP checksums verify are merged (as the kernel's GRO does), so
/// a merged frame can be delivered with the checksum marked as already handled; or segments
/// the caller vouches for with their checksum left partial (an encrypted link's peer
/// authenticated every byte and skipped the checksum), delivered as partial.
#[derive(Debug, Default)]
pub struct Coalescer {
    run: Option<Run>,
    headers: Vec<u8>,
    payloads: Vec<PayloadRef>,
    merged: u64,
    runs: u64,
}

struct SegInfo {
    layout: Layout,
    partial: bool,
    seq: u32,
    flags: u8,
    payload_len: usize,
}

/// What [`Coalescer::offer`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Taken into a run; it will reach the guest through `emit`.
    Held,
    /// Not mergeable: deliver it as it is (with a plain virtio-net header).
    Plain,
    /// Its checksum was left partial by a local sender (a veth underlay never completes it):
    /// deliver it with this header, which marks it partial, as the kernel itself treats it.
    Partial(VirtioNetHdr),
}

enum Inspected {
    Mergeable(SegInfo),
    Plain,
    Partial(VirtioNetHdr),
}

/// Whether the L4 checksum of a TCP/UDP frame verifies; if not, whether the field holds just
/// the pseudo-header sum (a partial checksum nobody completed).
fn check_l4(frame: &[u8], l: &Layout) -> Result<(), Option<VirtioNetHdr>> {
    let l4 = l.l4_off();
    let csum = l.l4_checksum(frame);
    if l.l4 == L4::Udp && csum == 0 && l.l3 == L3::V4 {
        return Ok(()); // IPv4 UDP without a checksum
    }
    let pseudo = l.pseudo_sum(frame, l.ip_end - l4);
    if fold(pseudo + sum(&frame[l4..l.ip_end], 0)) == 0xffff {
        return Ok(());
    }
    let p = fold(pseudo);
    if csum == p || (p == 0xffff && csum == 0) || (p == 0 && csum == 0xffff) {
        return Err(Some(partial_header(l)));
    }
    Err(None)
}

/// The header that marks `frame`'s TCP/UDP checksum partial when its checksum field holds
/// exactly the pseudo-header sum, as a sender that left the checksum to the receiver's device
/// writes it; `None` otherwise. No pass over the payload: for frames whose every byte was
/// authenticated (an encrypted link), where the sender skips the checksum. A complete checksum
/// that happens to equal the pseudo-header sum (1 in 65,536) is called partial too, which is
/// harmless: whoever completes it computes the same checksum.
pub fn left_partial(frame: &[u8]) -> Option<VirtioNetHdr> {
    let l = parse_l3l4(frame).ok()?;
    let csum = l.l4_checksum(frame);
    (csum == fold(l.pseudo_sum(frame, l.ip_end - l.l4_off()))).then(|| partial_header(&l))
}

fn partial_header(l: &Layout) -> VirtioNetHdr {
    VirtioNetHdr {
        flags: VirtioNetHdr::F_NEEDS_CSUM,
        csum_start: l.l4_off() as u16,
        csum_offset: l.csum_offset() as u16,
        ..Default::default()
    }
}

/// Whether a TCP/UDP frame's IPv4 header and L4 checksums are complete and correct.
pub fn l4_checksum_ok(frame: &[u8]) -> bool {
    match parse_l3l4(frame) {
        Ok(l) => l.ip_checksum_ok(frame) && check_l4(frame, &l).is_ok(),
        Err(_) => false,
    }
}

/// For a frame from the wire bound to a guest: `Some` header marking its checksum partial when
/// a local sender left it so, `None` otherwise (valid, not TCP/UDP, or simply corrupt).
pub fn partial_checksum_hint(frame: &[u8]) -> Option<VirtioNetHdr> {
    let l = parse_l3l4(frame).ok()?;
    check_l4(frame, &l).err().flatten()
}

/// `partial`: the caller vouches that the frame's L4 checksum is left partial (not checked).
fn inspect(frame: &[u8], partial: bool) -> Inspected {
    let Ok(l) = parse_l3l4(frame) else {
        return Inspected::Plain;
    };
    let not_merged = || match partial {
        true => Inspected::Partial(partial_header(&l)),
        false => Inspected::Plain,
    };
    if !l.ip_checksum_ok(frame) {
        return not_merged();
    }
    if !partial {
        match check_l4(frame, &l) {
            Ok(()) => {}
            Err(Some(vh)) => return Inspected::Partial(vh),
            Err(None) => return Inspected::Plain,
        }
    }
    if l.l4 != L4::Tcp {
        return not_merged();
    }
    let t = TcpPacket::new_unchecked(&frame[l.l4_off()..l.hdr_len()]);
    let flags = t.flags();
    let payload_len = l.ip_end.saturating_sub(l.hdr_len());
    if flags & (TCP_FIN | TCP_SYN | TCP_RST) != 0
        || flags & !(TCP_ACK | TCP_PSH) != 0
        || flags & TCP_ACK == 0
        || payload_len == 0
    {
        return not_merged();
    }
    Inspected::Mergeable(SegInfo {
        layout: l,
        partial,
        seq: t.seq_number(),
        flags,
        payload_len,
    })
}

/// Whether two segments' headers agree on everything but lengths, IDs, sequence numbers,
/// checksums and PSH: byte ranges compared at once (per segment, on the hot path) rather than
/// field by field; the ranges skip IPv4 total length (2-3), ID (4-5) and checksum (10-11),
/// IPv6 payload length (4-5), TCP sequence number (4-7), flags (13) and checksum (16-17).
fn same_flow(a: &[u8], b: &[u8], l: &Layout) -> bool {
    let (l3, l4, hl) = (l.l2_len, l.l4_off(), l.hdr_len());
    if a.len() < hl || b.len() < hl || a[..l3] != b[..l3] {
        return false;
    }
    let ip_same = match l.l3 {
        L3::V4 => {
            a[l3..l3 + 2] == b[l3..l3 + 2]
                && a[l3 + 6..l3 + 10] == b[l3 + 6..l3 + 10]
                && a[l3 + 12..l4] == b[l3 + 12..l4]
        }
        L3::V6 => a[l3..l3 + 4] == b[l3..l3 + 4] && a[l3 + 6..l4] == b[l3 + 6..l4],
    };
    ip_same
        && a[l4..l4 + 4] == b[l4..l4 + 4]
        && a[l4 + 8..l4 + 13] == b[l4 + 8..l4 + 13]
        && a[l4 + 14..l4 + 16] == b[l4 + 14..l4 + 16]
        && a[l4 + 18..hl] == b[l4 + 18..hl]
}

impl Coalescer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Segments merged into an earlier one, and runs emitted, so far.
    pub fn stats(&self) -> (u64, u64) {
        (self.merged, self.runs)
    }

    pub fn is_empty(&self) -> bool {
        self.run.is_none()
    }

    /// Offers the frame at `at` (whose bytes are `frame`). Unless it is `Held`, any run has
    /// been emitted first and the caller delivers the frame itself, as the answer says.
    /// `partial`: the caller vouches that the frame's TCP/UDP checksum is left partial (the
    /// field holds the pseudo-header sum; see [`left_partial`]), because every byte of it was
    /// authenticated on its way here; it is merged without a pass over its payload, and
    /// whatever is not merged comes back `Partial`.
    pub fn offer(
        &mut self,
        frame: &[u8],
        at: PayloadRef,
        partial: bool,
        emit: &mut dyn FnMut(GroOutput<'_>),
    ) -> Offered {
        let seg = match inspect(frame, partial) {
            Inspected::Mergeable(s) => s,
            Inspected::Plain => {
                self.flush(emit);
                return Offered::Plain;
            }
            Inspected::Partial(vh) => {
                self.flush(emit);
                return Offered::Partial(vh);
            }
        };
        let hl = seg.layout.hdr_len();
        let continues = match &self.run {
            Some(r) => {
                !r.ended
                    && r.layout
                        == Layout {
                            ip_end: r.layout.ip_end,
                            ..seg.layout
                        }
                    && seg.seq == r.next_seq
                    && seg.payload_len <= r.mss
                    && r.payload + seg.payload_len <= MAX_GRO_PAYLOAD
                    && self.payloads.len() < MAX_SEGS
                    && same_flow(&self.headers, frame, &seg.layout)
            }
            None => false,
        };
        if !continues {
            self.flush(emit);
            self.headers.clear();
            self.headers.extend_from_slice(&frame[..hl]);
            self.run = Some(Run {
                layout: seg.layout,
                mss: seg.payload_len,
                next_seq: seg.seq,
                payload: 0,
                psh: false,
                ended: false,
                partial: false,
            });
        } else {
            self.merged += 1;
        }
        let start = at.start + hl as u32;
        self.payloads.push(PayloadRef {
            buf: at.buf,
            start,
            end: start + seg.payload_len as u32,
        });
        if let Some(r) = self.run.as_mut() {
            r.next_seq = seg.seq.wrapping_add(seg.payload_len as u32);
            r.payload += seg.payload_len;
            r.psh |= seg.flags & TCP_PSH != 0;
            r.partial |= seg.partial;
            r.ended = r.psh || seg.payload_len < r.mss;
            if r.ended || r.payload + r.mss > MAX_GRO_PAYLOAD || self.payloads.len() >= MAX_SEGS {
                self.flush(emit);
            }
        }
        Offered::Held
    }

    /// Emits the current run, if any.
    pub fn flush(&mut self, emit: &mut dyn FnMut(GroOutput<'_>)) {
        let Some(r) = self.run.take() else {
            return;
        };
        self.runs += 1;
        let l = r.layout;
        let (l3, l4, hl) = (l.l2_len, l.l4_off(), l.hdr_len());
        let vhdr = if self.payloads.len() == 1 && r.partial {
            // A single segment keeps its own headers, its checksum still partial.
            partial_header(&l)
        } else if self.payloads.len() == 1 {
            // A single segment keeps its own (verified) headers.
            VirtioNetHdr {
                flags: VirtioNetHdr::F_DATA_VALID,
                ..Default::default()
            }
        } else {
            let h = &mut self.headers[..hl];
            let l4_total = l.l4_len + r.payload;
            match l.l3 {
                L3::V4 => {
                    let mut ip = Ipv4Packet::new_unchecked(&mut h[l3..l4]);
                    ip.set_total_len((l.l3_len + l4_total) as u16);
                    ip.fill_checksum();
                }
                L3::V6 => {
                    Ipv6Packet::new_unchecked(&mut h[l3..l4]).set_payload_len(l4_total as u16)
                }
            }
            let mut t = TcpPacket::new_unchecked(&mut h[l4..hl]);
            if r.psh {
                t.set_flags(t.flags() | TCP_PSH);
            }
            // CHECKSUM_PARTIAL convention: the field holds the pseudo-header sum.
            let ps = fold(l.pseudo_sum(h, l4_total));
            l.set_l4_checksum(h, ps);
            VirtioNetHdr {
                flags: VirtioNetHdr::F_NEEDS_CSUM,
                gso_type: if l.l3 == L3::V4 {
                    VirtioNetHdr::GSO_TCPV4
                } else {
                    VirtioNetHdr::GSO_TCPV6
                },
                hdr_len: hl as u16,
                gso_size: r.mss as u16,
                csum_start: l4 as u16,
                csum_offset: 16,
            }
        };
        emit(GroOutput {
            vhdr,
            headers: &self.headers[..hl],
            payloads: &self.payloads,
        });
        self.payloads.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gso::tests::{tso_frame, valid};
    use crate::gso::{segment_with, L4Checksum, SegmentList};
    use vnet_wire::checksum::checksum;

    /// Segments a TSO frame into one buffer of wire frames and offers them all.
    fn run(
        payload: usize,
        v6: bool,
        corrupt: Option<usize>,
    ) -> (Vec<(VirtioNetHdr, Vec<u8>)>, Vec<u8>) {
        run_with(payload, v6, corrupt, L4Checksum::Complete)
    }

    /// [`run`] with the segments' checksums as `l4` says; partial ones are offered as vouched
    /// for (as an encrypted link's receiver offers them).
    fn run_with(
        payload: usize,
        v6: bool,
        corrupt: Option<usize>,
        l4: L4Checksum,
    ) -> (Vec<(VirtioNetHdr, Vec<u8>)>, Vec<u8>) {
        let (f, vh) = tso_frame(payload, v6);
        let mut segs = SegmentList::new();
        segment_with(&f, &vh, &mut segs, l4).unwrap();
        let mut buf = Vec::new();
        let mut refs = Vec::new();
        for i in 0..segs.len() {
            let s = segs.parts(&f, i).concat();
            refs.push((buf.len(), s.len()));
            buf.extend_from_slice(&s);
        }
        if let Some(i) = corrupt {
            let (off, len) = refs[i];
            buf[off + len - 1] ^= 0xff;
        }
        let out = std::cell::RefCell::new(Vec::new());
        let mut c = Coalescer::new();
        {
            let bufr = &buf;
            let mut emit = |g: GroOutput<'_>| {
                let mut frame = g.headers.to_vec();
                for p in g.payloads {
                    frame.extend_from_slice(&bufr[p.start as usize..p.end as usize]);
                }
                out.borrow_mut().push((g.vhdr, frame));
            };
            for (off, len) in &refs {
                let held = c.offer(
                    &buf[*off..off + len],
                    PayloadRef {
                        buf: 0,
                        start: *off as u32,
                        end: (off + len) as u32,
                    },
                    l4 == L4Checksum::Partial,
                    &mut emit,
                );
                let vh = match held {
                    Offered::Held => continue,
                    Offered::Plain => VirtioNetHdr::default(),
                    Offered::Partial(vh) => vh,
                };
                out.borrow_mut().push((vh, buf[*off..off + len].to_vec()));
            }
            c.flush(&mut emit);
        }
        (out.into_inner(), f)
    }

    #[test]
    fn merges_segments_back() {
        for v6 in [false, true] {
            let (out, orig) = run(20_000, v6, None);
            assert_eq!(out.len(), 1, "v6={v6}");
            let (vh, frame) = &out[0];
            assert_eq!(vh.gso_size, 1448);
            assert!(vh.needs_csum());
            assert_eq!(frame.len(), orig.len());
            assert_eq!(frame[frame.len() - 20_000..], orig[orig.len() - 20_000..]);
            // completing the partial checksum gives a valid frame
            let mut f = frame.clone();
            crate::gso::complete_checksum(&mut f, vh).unwrap();
            assert!(valid(&f));
        }
    }

    #[test]
    fn a_bad_checksum_breaks_the_run() {
        let (out, _) = run(5000, false, Some(1));
        // seg 0 alone, seg 1 plain (not merged), segs 2..3 merged
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].0.flags, VirtioNetHdr::F_DATA_VALID);
        assert_eq!(out[1].0, VirtioNetHdr::default());
        assert!(out[2].0.needs_csum());
    }

    #[test]
    fn non_tcp_passes() {
        let mut c = Coalescer::new();
        let arp = [0xffu8; 42];
        assert_eq!(
            c.offer(
                &arp,
                PayloadRef {
                    buf: 0,
                    start: 0,
                    end: 42
                },
                false,
                &mut |_| panic!()
            ),
            Offered::Plain
        );
    }

    #[test]
    fn partial_checksums_are_recognised() {
        // a single TCP segment as a local sender leaves it: pseudo-header sum in the field
        let (mut f, vh) = tso_frame(100, false);
        let tl = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&tl.to_be_bytes());
        let c = checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let hint = partial_checksum_hint(&f).unwrap();
        assert_eq!(
            (hint.csum_start, hint.csum_offset),
            (vh.csum_start, vh.csum_offset)
        );
        let mut co = Coalescer::new();
        assert!(matches!(
            co.offer(
                &f,
                PayloadRef {
                    buf: 0,
                    start: 0,
                    end: f.len() as u32
                },
                false,
                &mut |_| panic!()
            ),
            Offered::Partial(_)
        ));
        // completed, it verifies and is no longer partial
        crate::gso::complete_checksum(&mut f, &hint).unwrap();
        assert!(valid(&f));
        assert_eq!(partial_checksum_hint(&f), None);
        // corrupt, it is neither
        f[60] ^= 1;
        assert_eq!(partial_checksum_hint(&f), None);
    }

    /// Completes every delivered frame's checksum as the guest's device would (a frame marked
    /// partial) and checks it, so that two deliveries can be compared byte for byte.
    fn completed(out: &[(VirtioNetHdr, Vec<u8>)]) -> Vec<Vec<u8>> {
        out.iter()
            .map(|(vh, f)| {
                let mut f = f.clone();
                if vh.needs_csum() {
                    crate::gso::complete_checksum(&mut f, vh).unwrap();
                }
                assert!(valid(&f), "a delivered frame does not verify");
                f
            })
            .collect()
    }

    #[test]
    fn partial_segments_vouched_for_merge_as_verified_ones_do() {
        // An encrypted link's sender skips the payload pass; its receiver merges the segments
        // without one. What reaches the guest must be what the checksummed path delivers.
        for v6 in [false, true] {
            for payload in [1, 1447, 1448, 1449, 5000, 20_000, 64_000] {
                let (full, _) = run(payload, v6, None);
                let (part, _) = run_with(payload, v6, None, L4Checksum::Partial);
                assert_eq!(part.len(), full.len(), "payload {payload} v6={v6}");
                for ((pv, _), (fv, _)) in part.iter().zip(&full) {
                    // merged runs: the same header; a lone segment: partial instead of valid
                    if fv.gso_type != VirtioNetHdr::GSO_NONE {
                        assert_eq!(pv, fv);
                    } else {
                        assert!(
                            pv.needs_csum(),
                            "a lone partial segment is delivered partial"
                        );
                    }
                }
                assert_eq!(
                    completed(&part),
                    completed(&full),
                    "payload {payload} v6={v6}"
                );
            }
        }
    }

    #[test]
    fn partial_segments_are_recognised_without_a_payload_pass() {
        let (f, vh) = tso_frame(5000, false);
        let mut segs = SegmentList::new();
        segment_with(&f, &vh, &mut segs, L4Checksum::Partial).unwrap();
        for i in 0..segs.len() {
            let mut s = segs.parts(&f, i).concat();
            let hint = left_partial(&s).expect("partial");
            assert_eq!((hint.csum_start, hint.csum_offset), (34, 16));
            // the payload is not read: a changed byte is still called partial...
            s[80] ^= 0xff;
            assert!(left_partial(&s).is_some());
            s[80] ^= 0xff;
            // ...while a complete checksum is not
            crate::gso::complete_checksum(&mut s, &hint).unwrap();
            assert!(valid(&s));
            assert_eq!(left_partial(&s), None);
        }
        assert_eq!(left_partial(&[0xffu8; 42]), None, "not TCP/UDP");
        assert_eq!(left_partial(&f[..40]), None, "truncated");
    }

    #[test]
    fn a_partial_segment_that_cannot_merge_comes_back_partial() {
        // a SYN (never merged) vouched for as partial must not be delivered as a plain frame,
        // whose guest would drop it for its checksum
        let (f, vh) = tso_frame(100, false);
        let mut segs = SegmentList::new();
        segment_with(&f, &vh, &mut segs, L4Checksum::Partial).unwrap();
        let mut s = segs.parts(&f, 0).concat();
        s[14 + 20 + 13] |= TCP_SYN;
        let at = PayloadRef {
            buf: 0,
            start: 0,
            end: s.len() as u32,
        };
        let mut c = Coalescer::new();
        let Offered::Partial(vh) = c.offer(&s, at, true, &mut |_| panic!()) else {
            panic!("a SYN vouched for as partial must come back partial");
        };
        crate::gso::complete_checksum(&mut s, &vh).unwrap();
        assert!(valid(&s));
    }
}
