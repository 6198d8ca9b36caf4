//! Segmentation (software GSO) and checksum completion, for frames leaving toward a network.
//! Each segment's headers are a copy of the frame's, rewritten through `vnet-wire`'s views.

use std::ops::Range;

use vnet_wire::checksum::{fold, sum};
use vnet_wire::{tcp_flags, Ipv4Packet, Ipv6Packet, TcpPacket, UdpPacket, VirtioNetHdr};

use crate::headers::{parse_l3l4, L3, L4};
use crate::OffloadError;

/// Fewest bytes per segment a guest may ask for: a hostile `gso_size` of 1 would otherwise
/// turn one 64 KB frame into 65536 segments.
const MIN_MSS: usize = 64;

/// One wire frame: headers from [`SegmentList::headers`], payload from the original frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub hdr: Range<usize>,
    pub payload: Range<usize>,
}

/// Reusable output of [`segment`].
#[derive(Debug, Default)]
pub struct SegmentList {
    pub headers: Vec<u8>,
    pub segs: Vec<Segment>,
}

impl SegmentList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.segs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Writes `macs` (destination and source MAC) over the start of every segment's headers:
    /// the caller's checked copy wins over whatever the frame held when it was cut (a guest can
    /// change its shared-memory frame at any time).
    pub fn pin_macs(&mut self, macs: &[u8; 12]) {
        for s in &self.segs {
            if let Some(h) = self.headers.get_mut(s.hdr.start..s.hdr.start + 12) {
                h.copy_from_slice(macs);
            }
        }
    }

    /// The bytes of segment `i`: its headers and its payload (a slice of `frame`).
    pub fn parts<'a>(&'a self, frame: &'a [u8], i: usize) -> [&'a [u8]; 2] {
        let s = &self.segs[i];
        [&self.headers[s.hdr.clone()], &frame[s.payload.clone()]]
    }
}

/// Sum of `data` as if it started at an odd offset of the checksummed region when `odd`.
fn sum_at(data: &[u8], odd: bool) -> u64 {
    let s = fold(sum(data, 0));
    (if odd { s.swap_bytes() } else { s }) as u64
}

/// The virtio-net header that describes `frame`, a large TCP or UDP frame with a partial
/// checksum (as a local sender leaves it), as one to be cut into `mss`-byte segments.
pub fn gso_header(frame: &[u8], mss: u16) -> Option<VirtioNetHdr> {
    let l = parse_l3l4(frame).ok()?;
    let gso_type = match (l.l3, l.l4) {
        (L3::V4, L4::Tcp) => VirtioNetHdr::GSO_TCPV4,
        (L3::V6, L4::Tcp) => VirtioNetHdr::GSO_TCPV6,
        (_, L4::Udp) => VirtioNetHdr::GSO_UDP_L4,
    };
    Some(VirtioNetHdr {
        flags: VirtioNetHdr::F_NEEDS_CSUM,
        gso_type,
        hdr_len: l.hdr_len() as u16,
        gso_size: mss,
        csum_start: l.l4_off() as u16,
        csum_offset: l.csum_offset() as u16,
    })
}

/// Turns the headers of a large frame whose checksum is complete (`total_len` bytes in all)
/// into those of a GSO frame with a partial checksum, as a guest must receive a frame larger
/// than its MTU: the L4 checksum field gets the pseudo-header sum, and the returned header
/// asks for `mss`-byte segments.
pub fn as_partial_gso(headers: &mut [u8], total_len: usize, mss: u16) -> Option<VirtioNetHdr> {
    let l = parse_l3l4(headers).ok()?;
    let l4_total = total_len.checked_sub(l.l4_off())?;
    let ps = fold(l.pseudo_sum(headers, l4_total));
    l.set_l4_checksum(headers, ps);
    gso_header(headers, mss)
}

/// Completes a partial checksum in place (`NEEDS_CSUM` without segmentation): the sum from
/// `csum_start` to the end, with the field holding the pseudo-header sum, goes into the field.
pub fn complete_checksum(frame: &mut [u8], vh: &VirtioNetHdr) -> Result<(), OffloadError> {
    let start = vh.csum_start as usize;
    let field = start + vh.csum_offset as usize;
    if field + 2 > frame.len() {
        return Err(OffloadError::BadHeader);
    }
    let c = !fold(sum(&frame[start..], 0));
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// What [`segment_with`] writes into each segment's TCP/UDP checksum field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Checksum {
    /// The complete checksum: a pass over every payload byte. What a network needs.
    Complete,
    /// Only the pseudo-header sum (the CHECKSUM_PARTIAL convention, as a virtio-net device
    /// hands a TSO segment on): no pass over the payload. For a peer that authenticates every
    /// byte anyway and delivers the segments with the checksum marked partial (an encrypted
    /// link whose peer said so in its handshake).
    Partial,
}

/// Cuts a frame the guest handed over with a virtio-net header into wire frames, each with
/// complete checksums. Headers are written into `out.headers`; payloads stay in `frame`.
/// A frame that needs nothing gives one segment covering it.
pub fn segment(frame: &[u8], vh: &VirtioNetHdr, out: &mut SegmentList) -> Result<(), OffloadError> {
    segment_with(frame, vh, out, L4Checksum::Complete)
}

/// [`segment`], with the TCP/UDP checksum of a GSO frame's segments as `l4` says (the IPv4
/// header checksum is always complete; a frame that is not GSO is handled as by [`segment`]).
pub fn segment_with(
    frame: &[u8],
    vh: &VirtioNetHdr,
    out: &mut SegmentList,
    l4: L4Checksum,
) -> Result<(), OffloadError> {
    out.headers.clear();
    out.segs.clear();
    let kind = vh.gso_kind();
    if kind == VirtioNetHdr::GSO_NONE {
        if !vh.needs_csum() {
            out.segs.push(Segment {
                hdr: 0..0,
                payload: 0..frame.len(),
            });
            return Ok(());
        }
        // Copy up to and including the checksum field, sum the rest in place.
        let start = vh.csum_start as usize;
        let field = start + vh.csum_offset as usize;
        if field + 2 > frame.len() {
            return Err(OffloadError::BadHeader);
        }
        out.headers.extend_from_slice(&frame[..field + 2]);
        let s = sum(&out.headers[start..], 0)
            + sum_at(&frame[field + 2..], (field + 2 - start) % 2 == 1);
        let c = !fold(s);
        out.headers[field..field + 2].copy_from_slice(&c.to_be_bytes());
        out.segs.push(Segment {
            hdr: 0..field + 2,
            payload: field + 2..frame.len(),
        });
        return Ok(());
    }
    let layout = parse_l3l4(frame)?;
    let expect = match kind {
        VirtioNetHdr::GSO_TCPV4 => (L3::V4, L4::Tcp),
        VirtioNetHdr::GSO_TCPV6 => (L3::V6, L4::Tcp),
        VirtioNetHdr::GSO_UDP_L4 => (layout.l3, L4::Udp),
        _ => return Err(OffloadError::Unsupported),
    };
    if (layout.l3, layout.l4) != expect {
        return Err(OffloadError::BadHeader);
    }
    let mss = vh.gso_size as usize;
    if mss < MIN_MSS {
        return Err(OffloadError::BadHeader);
    }
    let hl = layout.hdr_len();
    let l3o = layout.l2_len;
    let l4o = layout.l4_off();
    let payload_total = frame.len() - hl;
    let n = payload_total.div_ceil(mss).max(1);
    out.headers.reserve(n * hl);
    let ip_id = match layout.l3 {
        L3::V4 => Ipv4Packet::new_unchecked(&frame[l3o..l4o]).ident(),
        L3::V6 => 0,
    };
    let seq0 = match layout.l4 {
        L4::Tcp => TcpPacket::new_unchecked(&frame[l4o..hl]).seq_number(),
        L4::Udp => 0,
    };
    for i in 0..n {
        let p0 = hl + i * mss;
        let p1 = (p0 + mss).min(frame.len());
        let len = p1 - p0;
        let h0 = out.headers.len();
        out.headers.extend_from_slice(&frame[..hl]);
        let h = &mut out.headers[h0..h0 + hl];
        let l4_total = layout.l4_len + len;
        match layout.l3 {
            L3::V4 => {
                let mut ip = Ipv4Packet::new_unchecked(&mut h[l3o..l4o]);
                ip.set_total_len((layout.l3_len + l4_total) as u16);
                ip.set_ident(ip_id.wrapping_add(i as u16));
                ip.fill_checksum();
            }
            L3::V6 => Ipv6Packet::new_unchecked(&mut h[l3o..l4o]).set_payload_len(l4_total as u16),
        }
        let last = i + 1 == n;
        match layout.l4 {
            L4::Tcp => {
                let mut t = TcpPacket::new_unchecked(&mut h[l4o..hl]);
                t.set_seq_number(seq0.wrapping_add((i * mss) as u32));
                let mut flags = t.flags();
                if !last {
                    flags &= !(tcp_flags::FIN | tcp_flags::PSH); // only on the last segment
                }
                if i > 0 {
                    flags &= !tcp_flags::CWR; // only on the first
                }
                t.set_flags(flags);
            }
            L4::Udp => UdpPacket::new_unchecked(&mut h[l4o..hl]).set_len(l4_total as u16),
        }
        let c = match l4 {
            L4Checksum::Partial => fold(layout.pseudo_sum(h, l4_total)),
            L4Checksum::Complete => {
                layout.set_l4_checksum(h, 0);
                let s = layout.pseudo_sum(h, l4_total)
                    + sum(&h[l4o..hl], 0)
                    + sum_at(&frame[p0..p1], false);
                match !fold(s) {
                    0 if layout.l4 == L4::Udp => 0xffff,
                    c => c,
                }
            }
        };
        layout.set_l4_checksum(h, c);
        out.segs.push(Segment {
            hdr: h0..h0 + hl,
            payload: p0..p1,
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    pub use crate::test_frames::{tso_frame, valid};
    use vnet_wire::checksum::checksum;

    fn join(list: &SegmentList, frame: &[u8], i: usize) -> Vec<u8> {
        list.parts(frame, i).concat()
    }

    #[test]
    fn segments_tcp_v4_and_v6() {
        for v6 in [false, true] {
            let (f, vh) = tso_frame(10_000, v6);
            let mut out = SegmentList::new();
            segment(&f, &vh, &mut out).unwrap();
            assert_eq!(out.len(), 7);
            let mut payload = Vec::new();
            let mut seq = 0x1000u32;
            for i in 0..out.len() {
                let s = join(&out, &f, i);
                assert!(valid(&s), "segment {i} v6={v6}");
                let l = parse_l3l4(&s).unwrap();
                let t = &s[l.l4_off()..];
                assert_eq!(u32::from_be_bytes([t[4], t[5], t[6], t[7]]), seq);
                let psh = t[13] & 0x08 != 0;
                assert_eq!(psh, i == out.len() - 1);
                seq += (s.len() - l.hdr_len()) as u32;
                payload.extend_from_slice(&s[l.hdr_len()..]);
            }
            assert_eq!(payload, f[f.len() - 10_000..]);
        }
    }

    #[test]
    fn partial_segments_complete_to_the_checksummed_ones() {
        for v6 in [false, true] {
            let (f, vh) = tso_frame(10_000, v6);
            let (mut full, mut part) = (SegmentList::new(), SegmentList::new());
            segment(&f, &vh, &mut full).unwrap();
            segment_with(&f, &vh, &mut part, L4Checksum::Partial).unwrap();
            assert_eq!(part.segs, full.segs);
            for i in 0..full.len() {
                let want = join(&full, &f, i);
                let mut got = join(&part, &f, i);
                assert!(
                    !valid(&got),
                    "segment {i}: a partial checksum does not verify"
                );
                let l = parse_l3l4(&got).unwrap();
                let ps = fold(l.pseudo_sum(&got, l.ip_end - l.l4_off()));
                let co = l.l4_off() + 16;
                assert_eq!(got[co..co + 2], ps.to_be_bytes(), "the pseudo-header sum");
                let pvh = VirtioNetHdr {
                    flags: VirtioNetHdr::F_NEEDS_CSUM,
                    csum_start: l.l4_off() as u16,
                    csum_offset: 16,
                    ..Default::default()
                };
                complete_checksum(&mut got, &pvh).unwrap();
                assert_eq!(got, want, "segment {i} v6={v6}");
            }
        }
    }

    #[test]
    fn pinned_macs_replace_what_the_frame_held() {
        let (mut f, vh) = tso_frame(5_000, false);
        let checked: [u8; 12] = [2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa];
        // The frame's source changed after the check (a guest rewriting shared memory) and
        // before it was cut...
        f[..12].copy_from_slice(&checked);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x66]);
        let mut out = SegmentList::new();
        segment(&f, &vh, &mut out).unwrap();
        out.pin_macs(&checked);
        // ...every segment still carries the checked ones, and stays valid.
        for i in 0..out.len() {
            let s = join(&out, &f, i);
            assert_eq!(s[..12], checked, "segment {i}");
            assert!(valid(&s));
        }
    }

    #[test]
    fn completes_a_plain_partial_checksum() {
        let (mut f, mut vh) = tso_frame(500, false);
        // fix the IP length and checksum as a non-TSO frame would have them
        let tl = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&tl.to_be_bytes());
        let c = checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        vh.gso_type = 0;
        let mut out = SegmentList::new();
        segment(&f, &vh, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(valid(&join(&out, &f, 0)));
        complete_checksum(&mut f, &vh).unwrap();
        assert!(valid(&f));
    }

    #[test]
    fn describes_a_large_frame_for_segmentation() {
        let (f, vh) = tso_frame(5000, false);
        let g = gso_header(&f, 1448).unwrap();
        assert_eq!(
            (
                g.gso_type,
                g.gso_size,
                g.csum_start,
                g.csum_offset,
                g.hdr_len
            ),
            (vh.gso_type, 1448, vh.csum_start, 16, vh.hdr_len)
        );
        let mut out = SegmentList::new();
        segment(&f, &g, &mut out).unwrap();
        assert_eq!(out.len(), 4);
        assert!((0..4).all(|i| valid(&join(&out, &f, i))));
        assert_eq!(crate::headers::claimed_frame_len(&[0u8; 10]), None);
    }

    #[test]
    fn a_complete_large_frame_becomes_partial_gso() {
        let (f, vh) = tso_frame(5000, false);
        // complete its checksum as a software sender would have
        let mut full = f.clone();
        let tl = (full.len() - 14) as u16;
        full[16..18].copy_from_slice(&tl.to_be_bytes());
        let c = checksum(&full[14..34]);
        full[24..26].copy_from_slice(&c.to_be_bytes());
        complete_checksum(&mut full, &VirtioNetHdr { gso_type: 0, ..vh }).unwrap();
        assert!(valid(&full));
        let hl = vh.hdr_len as usize;
        let mut h = full[..hl].to_vec();
        let g = as_partial_gso(&mut h, full.len(), 1400).unwrap();
        assert_eq!((g.gso_size, g.flags), (1400, VirtioNetHdr::F_NEEDS_CSUM));
        let mut again = h.clone();
        again.extend_from_slice(&full[hl..]);
        complete_checksum(&mut again, &g).unwrap();
        assert_eq!(again, full);
    }

    #[test]
    fn refuses_hostile_headers() {
        let (f, mut vh) = tso_frame(3000, false);
        let mut out = SegmentList::new();
        vh.gso_size = 1;
        assert_eq!(segment(&f, &vh, &mut out), Err(OffloadError::BadHeader));
        vh.gso_size = 1448;
        vh.gso_type = VirtioNetHdr::GSO_TCPV6;
        assert_eq!(segment(&f, &vh, &mut out), Err(OffloadError::BadHeader));
        let plain = VirtioNetHdr {
            flags: 1,
            csum_start: 60000,
            csum_offset: 16,
            ..Default::default()
        };
        assert_eq!(segment(&f, &plain, &mut out), Err(OffloadError::BadHeader));
        vh.gso_type = VirtioNetHdr::GSO_TCPV4;
        assert!(segment(&f[..40], &vh, &mut out).is_err());
    }
}
