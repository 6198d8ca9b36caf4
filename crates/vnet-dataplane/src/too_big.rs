//! What a guest is told when its frame does not fit the path to its destination (issue #31):
//! an ICMP "fragmentation needed" (IPv4 with DF) or "packet too big" (IPv6), from the frame's
//! destination back to its sender, as the Linux kernel's VXLAN answers, so the guest's TCP
//! sends smaller segments instead of its frames vanishing in a black hole. Pure: the frame in,
//! the reply frame out; the forwarding path sends it to the port the frame came from.

use vnet_wire::{
    EthernetFrame, EthernetRepr, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr, Ipv4Packet,
    Ipv4Repr, Ipv6Packet, Ipv6Repr, ETHERNET_HEADER_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN,
    IPV6_MIN_MTU,
};

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;
const ICMPV4_DST_UNREACHABLE: u8 = 3;
/// ICMPv6 error types are below 128 (RFC 4443).
const ICMPV6_ERROR_MAX: u8 = 127;

/// What to do with a frame whose IP packet is larger than `mtu` (the largest IP packet the
/// path carries for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooBig {
    /// Tell the sender: this frame goes back to the port it came from.
    Reply(Vec<u8>),
    /// IPv4 without DF: the sender allows fragmentation, so the datagram may be fragmented.
    Fragment,
    /// Nothing to say: not IP, an ICMP error itself (never answered, no loops), malformed.
    Drop,
}

/// The answer to `frame` (a whole Ethernet frame, or its first bytes: the IP header and the
/// start of its payload are all that is quoted) when its IP packet exceeds `mtu`.
pub fn too_big(frame: &[u8], mtu: usize) -> TooBig {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return TooBig::Drop;
    };
    let (src_mac, dst_mac) = (eth.src(), eth.dst());
    if src_mac.is_multicast() || dst_mac.is_multicast() {
        return TooBig::Drop;
    }
    let ip = &frame[ETHERNET_HEADER_LEN..];
    let reply_eth = EthernetRepr {
        src: dst_mac,
        dst: src_mac,
        ethertype: 0,
    };
    match eth.ethertype() {
        ETHERTYPE_IPV4 => v4(ip, mtu, reply_eth),
        ETHERTYPE_IPV6 => v6(ip, mtu, reply_eth),
        _ => TooBig::Drop,
    }
}

fn v4(ip: &[u8], mtu: usize, mut eth: EthernetRepr) -> TooBig {
    let Ok(p) = Ipv4Packet::new_checked(ip) else {
        return TooBig::Drop;
    };
    if p.version() != 4 || p.src_addr().is_unspecified() || p.src_addr().is_broadcast() {
        return TooBig::Drop;
    }
    if !p.dont_frag() {
        return TooBig::Fragment;
    }
    if p.protocol() == PROTO_ICMP {
        let t = ip.get(p.header_len()).copied().unwrap_or(0);
        if t == ICMPV4_DST_UNREACHABLE || t == 11 || t == 12 || t == 4 || t == 5 {
            return TooBig::Drop;
        }
    }
    // Only what is there: the header and what follows of the packet (a quote).
    let invoking = &ip[..ip
        .len()
        .min(p.total_len().max(p.header_len() as u16) as usize)];
    let icmp = Icmpv4Repr::frag_needed(invoking, mtu.min(u16::MAX as usize) as u16);
    let ipr = Ipv4Repr {
        src_addr: p.dst_addr(),
        dst_addr: p.src_addr(),
        protocol: PROTO_ICMP,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    eth.ethertype = ETHERTYPE_IPV4;
    let mut out = vec![0u8; ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + icmp.buffer_len()];
    eth.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
    ipr.emit(&mut Ipv4Packet::new_unchecked(
        &mut out[ETHERNET_HEADER_LEN..],
    ));
    let at = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN;
    match icmp.emit(&mut Icmpv4Packet::new_unchecked(&mut out[at..])) {
        Ok(()) => TooBig::Reply(out),
        Err(_) => TooBig::Drop,
    }
}

fn v6(ip: &[u8], mtu: usize, mut eth: EthernetRepr) -> TooBig {
    let Ok(p) = Ipv6Packet::new_checked(ip) else {
        return TooBig::Drop;
    };
    if p.version() != 6 || p.src_addr().is_unspecified() || p.src_addr().is_multicast() {
        return TooBig::Drop;
    }
    if p.next_header() == PROTO_ICMPV6
        && ip
            .get(IPV6_HEADER_LEN)
            .is_some_and(|t| *t <= ICMPV6_ERROR_MAX)
    {
        return TooBig::Drop;
    }
    let invoking = &ip[..ip.len().min(IPV6_HEADER_LEN + p.payload_len() as usize)];
    // IPv6 links carry at least 1280 bytes: a path below that is not for a guest to adapt to.
    let icmp = Icmpv6Repr::packet_too_big(invoking, mtu.max(IPV6_MIN_MTU) as u32);
    let ipr = Ipv6Repr {
        src_addr: p.dst_addr(),
        dst_addr: p.src_addr(),
        next_header: PROTO_ICMPV6,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    eth.ethertype = ETHERTYPE_IPV6;
    let mut out = vec![0u8; ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + icmp.buffer_len()];
    eth.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
    ipr.emit(&mut Ipv6Packet::new_unchecked(
        &mut out[ETHERNET_HEADER_LEN..],
    ));
    let at = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN;
    let (src, dst) = (ipr.src_addr, ipr.dst_addr);
    let mut m = Icmpv6Packet::new_unchecked(&mut out[at..]);
    match icmp.emit(src, dst, &mut m) {
        Ok(()) => TooBig::Reply(out),
        Err(_) => TooBig::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_wire::MacAddr;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    /// An Ethernet frame from A to B with an IPv4 TCP packet of `len` bytes.
    fn v4_frame(len: usize, df: bool) -> Vec<u8> {
        let mut f = vec![0u8; ETHERNET_HEADER_LEN + len];
        EthernetRepr {
            src: A,
            dst: B,
            ethertype: ETHERTYPE_IPV4,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        let mut p = Ipv4Packet::new_unchecked(&mut f[ETHERNET_HEADER_LEN..]);
        Ipv4Repr {
            src_addr: "192.168.80.1".parse().unwrap(),
            dst_addr: "192.168.80.2".parse().unwrap(),
            protocol: 6,
            payload_len: len - IPV4_HEADER_LEN,
            hop_limit: 64,
        }
        .emit(&mut p);
        p.set_unfragmented(df);
        p.fill_checksum();
        f
    }

    #[test]
    fn ipv4_with_df_gets_fragmentation_needed_from_its_destination() {
        let f = v4_frame(1500, true);
        let TooBig::Reply(r) = too_big(&f, 1438) else {
            panic!("no reply")
        };
        let e = EthernetFrame::new_checked(&r[..]).unwrap();
        assert_eq!((e.src(), e.dst()), (B, A));
        let ip = Ipv4Packet::new_checked(&r[ETHERNET_HEADER_LEN..]).unwrap();
        let ipr = Ipv4Repr::parse(&ip).unwrap();
        assert_eq!(ipr.src_addr.to_string(), "192.168.80.2");
        assert_eq!(ipr.dst_addr.to_string(), "192.168.80.1");
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum());
        assert_eq!((icmp.msg_type(), icmp.msg_code()), (3, 4));
        assert_eq!(icmp.next_hop_mtu(), 1438);
        // The quote starts with the packet's own header.
        assert_eq!(&icmp.payload()[..20], &f[14..34]);
        assert!(
            r.len() <= ETHERNET_HEADER_LEN + 576,
            "RFC 1812's bound: {}",
            r.len()
        );
    }

    #[test]
    fn ipv4_without_df_may_be_fragmented() {
        assert_eq!(too_big(&v4_frame(1500, false), 1438), TooBig::Fragment);
    }

    #[test]
    fn ipv6_gets_packet_too_big() {
        let len = 1500;
        let mut f = vec![0u8; ETHERNET_HEADER_LEN + len];
        EthernetRepr {
            src: A,
            dst: B,
            ethertype: ETHERTYPE_IPV6,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        Ipv6Repr {
            src_addr: "fd00::1".parse().unwrap(),
            dst_addr: "fd00::2".parse().unwrap(),
            next_header: 6,
            payload_len: len - IPV6_HEADER_LEN,
            hop_limit: 64,
        }
        .emit(&mut Ipv6Packet::new_unchecked(
            &mut f[ETHERNET_HEADER_LEN..],
        ));
        let TooBig::Reply(r) = too_big(&f, 1400) else {
            panic!("no reply")
        };
        let ip = Ipv6Packet::new_checked(&r[ETHERNET_HEADER_LEN..]).unwrap();
        let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum(ip.src_addr(), ip.dst_addr()));
        assert_eq!(icmp.msg_type(), 2);
        assert_eq!(icmp.pkt_too_big_mtu(), 1400);
        assert_eq!(ip.src_addr().to_string(), "fd00::2");
        // Below IPv6's minimum the guest is told the minimum.
        let TooBig::Reply(r) = too_big(&f, 1200) else {
            panic!()
        };
        let ip = Ipv6Packet::new_checked(&r[ETHERNET_HEADER_LEN..]).unwrap();
        assert_eq!(
            Icmpv6Packet::new_checked(ip.payload())
                .unwrap()
                .pkt_too_big_mtu(),
            1280
        );
    }

    #[test]
    fn errors_broadcasts_and_garbage_get_nothing() {
        // An ICMP error is never answered with another.
        let mut f = v4_frame(1500, true);
        f[ETHERNET_HEADER_LEN + 9] = PROTO_ICMP;
        f[ETHERNET_HEADER_LEN + 20] = 3;
        assert_eq!(too_big(&f, 1400), TooBig::Drop);
        // A broadcast frame.
        let mut f = v4_frame(1500, true);
        f[..6].copy_from_slice(&[0xff; 6]);
        assert_eq!(too_big(&f, 1400), TooBig::Drop);
        // ARP, truncated headers, nothing.
        let mut f = v4_frame(100, true);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(too_big(&f, 1400), TooBig::Drop);
        assert_eq!(too_big(&v4_frame(100, true)[..20], 1400), TooBig::Drop);
        assert_eq!(too_big(&[], 1400), TooBig::Drop);
    }

    proptest::proptest! {
        #[test]
        fn any_frame_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200), mtu in 0usize..70000) {
            let _ = too_big(&data, mtu);
        }
    }
}
