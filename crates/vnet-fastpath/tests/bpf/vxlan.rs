//! What the underlay program does with VXLAN: decapsulate the valid, and leave everything
//! hostile, foreign or inconsistent to the stack untouched.

use crate::helpers::*;
use std::net::Ipv4Addr;
use vnet_fastpath::*;
use vnet_wire::MacAddr;

#[test]
fn valid_vxlan_for_a_local_port_is_decapsulated() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 300);
    let r = l.run_from_underlay(&vxlan(REMOTE, 1, 0x08, &inner));
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(r.data, inner, "exactly the inner frame");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.rx_bytes), (1, inner.len() as u64));
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 1);
}

#[test]
fn hostile_or_foreign_vxlan_goes_on_to_the_stack_untouched() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 64);
    let mut bad_reserved = vxlan(REMOTE, 1, 0x08, &inner);
    bad_reserved[49] = 1; // reserved byte after the VNI
    let mut other_port = vxlan(REMOTE, 1, 0x08, &inner);
    other_port[36..38].copy_from_slice(&4790u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown VNI", vxlan(REMOTE, 7, 0x08, &inner)),
        (
            "unknown peer",
            vxlan(Ipv4Addr::new(10, 9, 0, 66), 1, 0x08, &inner),
        ),
        ("no I flag", vxlan(REMOTE, 1, 0x00, &inner)),
        ("reserved bits", bad_reserved),
        ("other UDP port", other_port),
        ("no inner frame", vxlan(REMOTE, 1, 0x08, &inner[..10])),
        (
            "inner broadcast",
            vxlan(REMOTE, 1, 0x08, &frame(MacAddr::BROADCAST, C, 64)),
        ),
        (
            "inner for a link (no hairpin)",
            vxlan(REMOTE, 1, 0x08, &frame(D, C, 64)),
        ),
        ("inner oversize", vxlan(REMOTE, 1, 0x08, &frame(A, C, 1500))),
    ];
    for (what, f) in cases {
        let r = l.run_from_underlay(&f);
        assert_eq!(r.verdict, TCX_NEXT, "{what}");
        assert_eq!(r.data, f, "{what}: untouched");
    }
    // A datagram that says GSO but is not a tunnel GSO skb (here: no GSO type at all, as a UDP
    // GRO aggregate of several VXLAN datagrams has none of the tunnel bits) is not decapsulated.
    let r =
        l.fp.test_run(
            Program::UnderlayIngress,
            &vxlan(REMOTE, 1, 0x08, &inner),
            l.underlay,
            1400,
        )
        .unwrap();
    assert_eq!(r.verdict, TCX_NEXT);
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.gro_passed), (0, 1));
    let g = l.fp.global_counters().unwrap();
    assert!(g.unknown_link >= 2, "{g:?}");
    assert!(g.not_vxlan >= 1, "{g:?}");
}

/// Sets the IPv4 header's total length of a `vxlan()` datagram (checksum kept valid).
fn set_ip_len(f: &mut [u8], tot: u16) {
    f[16..18].copy_from_slice(&tot.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = csum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

fn set_udp_len(f: &mut [u8], len: u16) {
    f[38..40].copy_from_slice(&len.to_be_bytes());
}

#[test]
fn vxlan_whose_lengths_disagree_with_the_datagram_is_not_decapsulated() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 300);
    let good = vxlan(REMOTE, 1, 0x08, &inner);
    let (tot, ulen) = ((good.len() - 14) as u16, (good.len() - 34) as u16);
    // Bytes after the datagram (an Ethernet pad, or junk): not part of the inner frame.
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0xee; 24]);
    // The IP length says less than the frame holds, consistently with the UDP length.
    let mut short_ip = good.clone();
    set_ip_len(&mut short_ip, tot - 4);
    set_udp_len(&mut short_ip, ulen - 4);
    // A UDP length shorter than the IP payload (the stack delivers only that much).
    let mut short_udp = good.clone();
    set_udp_len(&mut short_udp, ulen - 4);
    // A UDP length beyond the IP payload (the stack drops it).
    let mut long_udp = good.clone();
    set_udp_len(&mut long_udp, ulen + 4);
    // An IP length beyond the frame (truncated on the way).
    let mut long_ip = good.clone();
    set_ip_len(&mut long_ip, tot + 20);
    set_udp_len(&mut long_ip, ulen + 20);
    let cases = [
        ("trailing bytes", trailing),
        ("short IP length", short_ip),
        ("short UDP length", short_udp),
        ("long UDP length", long_udp),
        ("truncated datagram", long_ip),
    ];
    for (what, f) in &cases {
        let r = l.run_from_underlay(f);
        assert_eq!(
            (r.verdict, r.data == *f),
            (TCX_NEXT, true),
            "{what}: passed on to the stack untouched"
        );
    }
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.bad_length), (0, cases.len() as u64));
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 0);
    // The well-formed datagram still is decapsulated.
    let r = l.run_from_underlay(&good);
    assert_eq!((r.verdict, r.data), (TCX_REDIRECT, inner));
}

#[test]
fn vxlan_sent_to_another_hosts_mac_is_not_taken() {
    let Some(l) = lab() else { return };
    // As a promiscuous underlay device sees it: the stack drops it, so must the fast path.
    let mut f = vxlan(REMOTE, 1, 0x08, &frame(A, C, 100));
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x77]);
    let r = l.run_from_underlay(&f);
    assert_eq!((r.verdict, r.data == f), (TCX_NEXT, true));
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().rx_frames, 0);
}
