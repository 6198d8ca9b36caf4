//! IPv4 fragmentation of a guest's datagram that does not fit a link's path and allows it (no
//! DF), as a router on the way would fragment it (RFC 791, RFC 4459's "inner fragmentation"):
//! a reach link never fragments its own datagrams (NATs and firewalls drop outer fragments), so
//! a frame larger than the path carries is cut here into frames that fit, and the destination
//! guest reassembles them. Datagrams with DF get ICMP "fragmentation needed" instead
//! (`too_big.rs`). Pure: one frame in, its fragments' frames out.

use vnet_wire::{ethertype, EthernetFrame, Ipv4Packet, ETHERNET_HEADER_LEN, IPV4_HEADER_LEN};

/// Why a frame cannot be fragmented (it is then dropped and counted as `too_big`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    #[error("not an IPv4 frame")]
    NotIpv4,
    #[error("malformed IPv4 header or options")]
    Malformed,
    #[error("the datagram does not allow fragmentation (DF)")]
    DontFragment,
    #[error("the path is too small for any fragment ({0} bytes of IP)")]
    PathTooSmall(usize),
}

/// The smallest IP packet every IPv4 link carries (RFC 791): a path below it is broken.
const IPV4_MIN_MTU: usize = 68;
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
/// Options with this bit set are copied into every fragment; the others only into the first.
const OPT_COPIED: u8 = 0x80;

/// Cuts `frame` (a whole Ethernet frame holding an IPv4 datagram or fragment without DF)
/// into frames whose IP packets are at most `max_ip` bytes. Each keeps the frame's MACs and the
/// datagram's identification; offsets and "more fragments" continue those of `frame` when it
/// is itself a fragment. The first keeps every option, the others only the copied ones.
pub fn fragment_ipv4(frame: &[u8], max_ip: usize) -> Result<Vec<Vec<u8>>, FragmentError> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| FragmentError::NotIpv4)?;
    if eth.ethertype() != ethertype::IPV4 {
        return Err(FragmentError::NotIpv4);
    }
    let ip = &frame[ETHERNET_HEADER_LEN..];
    let p = Ipv4Packet::new_checked(ip).map_err(|_| FragmentError::Malformed)?;
    if p.dont_frag() {
        return Err(FragmentError::DontFragment);
    }
    // A router drops a header whose checksum is wrong; fragments would carry fresh ones.
    if !p.verify_checksum() {
        return Err(FragmentError::Malformed);
    }
    let hl = p.header_len();
    let total = p.total_len() as usize;
    if total < hl || total > ip.len() {
        return Err(FragmentError::Malformed);
    }
    if max_ip < IPV4_MIN_MTU {
        return Err(FragmentError::PathTooSmall(max_ip));
    }
    let header = &ip[..hl];
    let later_header = copied_options_header(header)?;
    let payload = &ip[hl..total];
    let (base_offset, base_more) = (p.frag_offset(), p.more_frags());

    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() || out.is_empty() {
        let h: &[u8] = if out.is_empty() {
            header
        } else {
            &later_header
        };
        // Every fragment but the last carries a multiple of 8 bytes (offsets count 8s).
        let room = (max_ip - h.len()) / 8 * 8;
        if room == 0 {
            return Err(FragmentError::PathTooSmall(max_ip));
        }
        let end = (at + room).min(payload.len());
        let more = end < payload.len() || base_more;
        let offset = base_offset + at;
        if offset + (end - at) > u16::MAX as usize {
            return Err(FragmentError::Malformed);
        }
        let mut f = Vec::with_capacity(ETHERNET_HEADER_LEN + h.len() + end - at);
        f.extend_from_slice(&frame[..ETHERNET_HEADER_LEN]);
        f.extend_from_slice(h);
        f.extend_from_slice(&payload[at..end]);
        let mut q = Ipv4Packet::new_unchecked(&mut f[ETHERNET_HEADER_LEN..]);
        q.set_version_and_header_len(h.len());
        q.set_total_len((h.len() + end - at) as u16);
        q.set_fragment(more, offset);
        q.fill_checksum();
        out.push(f);
        at = end;
    }
    Ok(out)
}

/// The header of the fragments after the first: the fixed header and the options marked
/// "copied", padded with end-of-options to a multiple of 4 bytes.
fn copied_options_header(header: &[u8]) -> Result<Vec<u8>, FragmentError> {
    let mut h = header[..IPV4_HEADER_LEN].to_vec();
    let opts = &header[IPV4_HEADER_LEN..];
    let mut i = 0;
    while i < opts.len() {
        let kind = opts[i];
        if kind == OPT_END {
            break;
        }
        if kind == OPT_NOP {
            i += 1;
            continue;
        }
        let len = *opts.get(i + 1).ok_or(FragmentError::Malformed)? as usize;
        if len < 2 || i + len > opts.len() {
            return Err(FragmentError::Malformed);
        }
        if kind & OPT_COPIED != 0 {
            h.extend_from_slice(&opts[i..i + len]);
        }
        i += len;
    }
    while !h.len().is_multiple_of(4) {
        h.push(OPT_END);
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// An Ethernet frame holding an IPv4 datagram of `payload` bytes (bytes counting up), with
    /// `options` (a multiple of 4 bytes), DF as given.
    fn v4(payload: usize, options: &[u8], df: bool) -> Vec<u8> {
        let hl = IPV4_HEADER_LEN + options.len();
        let mut f = vec![0u8; ETHERNET_HEADER_LEN + hl + payload];
        f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ethertype::IPV4.to_be_bytes());
        let ip = &mut f[ETHERNET_HEADER_LEN..];
        ip[IPV4_HEADER_LEN..hl].copy_from_slice(options);
        for (i, b) in ip[hl..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let mut p = Ipv4Packet::new_unchecked(&mut ip[..]);
        p.set_version_and_header_len(hl);
        p.set_total_len((hl + payload) as u16);
        p.set_ident(0x1234);
        p.set_unfragmented(df);
        p.set_hop_limit(64);
        p.set_protocol(17);
        p.set_src_addr([192, 168, 1, 1].into());
        p.set_dst_addr([192, 168, 1, 2].into());
        p.fill_checksum();
        f
    }

    /// Reassembles fragments as a receiver would: payload bytes by offset, and whether the
    /// last one (no "more fragments") came.
    fn reassemble(frags: &[Vec<u8>]) -> (Vec<u8>, bool) {
        let mut parts = BTreeMap::new();
        let mut last_seen = false;
        for f in frags {
            let p = Ipv4Packet::new_checked(&f[ETHERNET_HEADER_LEN..]).unwrap();
            parts.insert(p.frag_offset(), p.payload().to_vec());
            last_seen |= !p.more_frags();
        }
        let mut out = Vec::new();
        for (off, data) in parts {
            assert_eq!(off, out.len(), "a hole or an overlap at {off}");
            out.extend_from_slice(&data);
        }
        (out, last_seen)
    }

    #[test]
    fn a_1500_byte_datagram_over_a_1230_byte_path() {
        let f = v4(1480, &[], false);
        let frags = fragment_ipv4(&f, 1230).unwrap();
        assert_eq!(frags.len(), 2);
        let sizes: Vec<usize> = frags.iter().map(|f| f.len() - 14).collect();
        // 1210 bytes of payload (the largest multiple of 8 in 1230 - 20), then the rest.
        assert_eq!(sizes, vec![1228, 20 + 1480 - 1208]);
        for g in &frags {
            let p = Ipv4Packet::new_checked(&g[14..]).unwrap();
            assert!(p.verify_checksum() && !p.dont_frag());
            assert_eq!((p.ident(), p.protocol(), p.hop_limit()), (0x1234, 17, 64));
            assert_eq!(&g[..14], &f[..14]);
        }
        let (data, last) = reassemble(&frags);
        assert!(last);
        assert_eq!(data, f[34..].to_vec());
    }

    #[test]
    fn a_fragment_is_fragmented_further() {
        // The second half of a datagram (offset 1480, more fragments after it).
        let mut f = v4(1480, &[], false);
        let mut p = Ipv4Packet::new_unchecked(&mut f[14..]);
        p.set_fragment(true, 1480);
        p.fill_checksum();
        let frags = fragment_ipv4(&f, 1000).unwrap();
        let p0 = Ipv4Packet::new_checked(&frags[0][14..]).unwrap();
        let pn = Ipv4Packet::new_checked(&frags[frags.len() - 1][14..]).unwrap();
        assert_eq!(p0.frag_offset(), 1480);
        assert!(
            p0.more_frags() && pn.more_frags(),
            "the datagram goes on after it"
        );
    }

    #[test]
    fn only_copied_options_go_past_the_first_fragment() {
        // Loose source route (0x83, copied, 7 bytes) + record route (0x07, not copied, 7
        // bytes) + 2 NOPs: 16 bytes.
        let opts = [
            0x83, 7, 4, 10, 0, 0, 1, 0x07, 7, 4, 0, 0, 0, 0, OPT_NOP, OPT_NOP,
        ];
        let frags = fragment_ipv4(&v4(600, &opts, false), 300).unwrap();
        assert_eq!(
            Ipv4Packet::new_checked(&frags[0][14..])
                .unwrap()
                .header_len(),
            36
        );
        for g in &frags[1..] {
            let p = Ipv4Packet::new_checked(&g[14..]).unwrap();
            assert_eq!(p.header_len(), 28);
            assert_eq!(&g[14 + 20..14 + 28], &[0x83, 7, 4, 10, 0, 0, 1, OPT_END]);
            assert!(p.verify_checksum());
        }
        let (data, _) = reassemble(&frags);
        assert_eq!(data.len(), 600);
    }

    #[test]
    fn what_is_refused() {
        assert_eq!(
            fragment_ipv4(&v4(1480, &[], true), 1230),
            Err(FragmentError::DontFragment)
        );
        assert_eq!(
            fragment_ipv4(&v4(1480, &[], false), 60),
            Err(FragmentError::PathTooSmall(60))
        );
        let mut arp = v4(100, &[], false);
        arp[12..14].copy_from_slice(&ethertype::ARP.to_be_bytes());
        assert_eq!(fragment_ipv4(&arp, 1230), Err(FragmentError::NotIpv4));
        // An option whose length runs past the header.
        let bad = [0x83, 9, 4, 10, 0, 0, 1, 0];
        assert_eq!(
            fragment_ipv4(&v4(600, &bad, false), 300),
            Err(FragmentError::Malformed)
        );
        // A header checksum that is wrong.
        let mut bad_sum = v4(600, &[], false);
        bad_sum[14 + 10] ^= 0xff;
        assert_eq!(fragment_ipv4(&bad_sum, 300), Err(FragmentError::Malformed));
        // A total length beyond the frame.
        let mut long = v4(100, &[], false);
        let mut p = Ipv4Packet::new_unchecked(&mut long[14..]);
        p.set_total_len(400);
        p.fill_checksum();
        assert_eq!(fragment_ipv4(&long, 100), Err(FragmentError::Malformed));
    }

    proptest! {
        /// Any datagram, any path from 68 bytes up: the fragments fit, carry the datagram
        /// exactly once in order, and only the last says no more follow.
        #[test]
        fn fragments_fit_and_reassemble(payload in 0usize..9000, max_ip in 68usize..9100,
                                         nops in 0usize..3) {
            let opts = vec![OPT_NOP; nops * 4];
            let f = v4(payload, &opts, false);
            let frags = fragment_ipv4(&f, max_ip).unwrap();
            for (i, g) in frags.iter().enumerate() {
                let p = Ipv4Packet::new_checked(&g[14..]).unwrap();
                prop_assert!(g.len() - 14 <= max_ip);
                prop_assert!(p.verify_checksum());
                prop_assert_eq!(p.more_frags(), i + 1 < frags.len());
                prop_assert_eq!(p.total_len() as usize, g.len() - 14);
            }
            let (data, last) = reassemble(&frags);
            prop_assert!(last);
            prop_assert_eq!(data, f[14 + 20 + opts.len()..].to_vec());
        }

        /// Hostile bytes: an error or fragments, never a panic.
        #[test]
        fn any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200), max_ip in 0usize..300) {
            let mut f = bytes;
            if f.len() > 14 {
                f[12] = 8;
                f[13] = 0;
            }
            let _ = fragment_ipv4(&f, max_ip);
        }
    }
}
