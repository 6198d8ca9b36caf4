//! What the port programs do with a guest's frame: redirect, encapsulate, punt, drop
//! (spoofed, oversize, over the rate), the punt TAP's way back, and decisions that leave the VNI.

use crate::helpers::*;
use vnet_fastpath::*;
use vnet_wire::MacAddr;

#[test]
fn known_unicast_between_ports_is_redirected_and_counted() {
    let Some(l) = lab() else { return };
    let f = frame(B, A, 100);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(r.data, f, "forwarded unchanged");
    let a = l.fp.port_counters(PORT_A).unwrap();
    let b = l.fp.port_counters(PORT_B).unwrap();
    assert_eq!(
        (a.rx_frames, a.rx_bytes, a.punted_frames),
        (1, f.len() as u64, 0)
    );
    assert_eq!((b.tx_frames, b.tx_bytes), (1, f.len() as u64));
    let m = l.fp.matrix().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].vni, m[0].src, m[0].dst, m[0].frames), (1, A, B, 1));
}

/// A full matrix keeps counting the pairs it holds, and counts the frames of the pairs it has
/// no room for instead of dropping older pairs' counts.
#[test]
fn a_full_matrix_counts_what_it_has_no_room_for() {
    let Some(l) = lab_with(FastPathConfig {
        max_matrix: 2,
        ..FastPathConfig::default()
    }) else {
        return;
    };
    let ab = frame(B, A, 100);
    assert_eq!(l.run_from_a(&ab).verdict, TCX_REDIRECT);
    // From link C to port A: the inner source may be any MAC, so pairs can be made at will.
    let from = |src: u8| frame(A, MacAddr([0x52, 0x54, 0, 0, 1, src]), 60);
    for src in 1..=3u8 {
        let r = l.run_from_underlay(&vxlan(REMOTE, 1, 0x08, &from(src)));
        assert_eq!(r.verdict, TCX_REDIRECT, "forwarded, matrix or not");
    }
    assert_eq!(l.run_from_a(&ab).verdict, TCX_REDIRECT);
    let m = l.fp.matrix().unwrap();
    let pairs: Vec<_> = m.iter().map(|e| (e.src, e.dst, e.frames)).collect();
    assert_eq!(
        pairs,
        vec![(A, B, 2), (MacAddr([0x52, 0x54, 0, 0, 1, 1]), A, 1)],
        "the first two pairs, still counted"
    );
    assert_eq!(m[0].bytes, 2 * ab.len() as u64);
    assert_eq!(l.fp.global_counters().unwrap().matrix_full, 2);
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().rx_frames, 3);
}

#[test]
fn frames_for_a_link_are_encapsulated_in_vxlan() {
    let Some(l) = lab() else { return };
    let f = frame(C, A, 200);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    let d = &r.data;
    eprintln!(
        "global {:?} port {:?}",
        l.fp.global_counters(),
        l.fp.port_counters(PORT_A)
    );
    assert_eq!(d.len(), f.len() + 50);
    assert_eq!(
        &d[0..6],
        &NEIGH_MAC,
        "outer destination from the neighbour table"
    );
    assert_eq!(&d[12..14], &[0x08, 0x00]);
    let ip = &d[14..34];
    assert_eq!(ip[0], 0x45);
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, f.len() + 36);
    assert_eq!(ip[9], 17);
    assert_eq!(&ip[12..16], &LOCAL.octets());
    assert_eq!(&ip[16..20], &REMOTE.octets());
    assert_eq!(csum(ip), 0, "outer IPv4 checksum valid");
    let udp = &d[34..42];
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    assert!((32768..=60999).contains(&sport), "source port {sport}");
    assert_eq!(&udp[2..4], &4789u16.to_be_bytes());
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, f.len() + 16);
    assert_eq!(&udp[6..8], &[0, 0], "UDP checksum 0, as the kernel's VXLAN");
    assert_eq!(
        &d[42..50],
        &[0x08, 0, 0, 0, 0, 0, 1, 0],
        "VXLAN header, VNI 1"
    );
    assert_eq!(&d[50..], &f[..], "the inner frame whole");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.tx_frames, c.tx_bytes), (1, f.len() as u64));
    // The same flow keeps its source port (flow hash), as the kernel's VXLAN.
    let again = l.run_from_a(&f);
    assert_eq!(&again.data[34..36], &udp[0..2]);
}

#[test]
fn unresolved_next_hop_and_unknown_destinations_are_punted() {
    let Some(l) = lab() else { return };
    for (dst, what) in [
        (D, "unresolved neighbour"),
        (MacAddr([0x52, 0x54, 0, 0, 0, 0x99]), "no rule"),
    ] {
        let r = l.run_from_a(&frame(dst, A, 64));
        assert_eq!(r.verdict, TCX_REDIRECT, "{what}: to the punt TAP");
    }
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(a.punted_frames, 2);
    assert_eq!(a.neigh_miss, 1);
    assert_eq!(a.rx_frames, 0, "the kernel forwarded nothing itself");
    assert_eq!(l.fp.link_counters(LINK_D).unwrap().tx_frames, 0);
}

#[test]
fn broadcast_multicast_and_vlan_go_to_the_slow_path() {
    let Some(l) = lab() else { return };
    let mut vlan = frame(B, A, 64);
    vlan.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    for f in [
        frame(MacAddr::BROADCAST, A, 64),
        frame(MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]), A, 64),
        vlan,
    ] {
        let r = l.run_from_a(&f);
        assert_eq!(r.verdict, TCX_REDIRECT);
        assert_eq!(r.data, f);
    }
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.punted_frames, a.rx_frames), (3, 0));
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
}

#[test]
fn spoofed_sources_are_dropped_unless_any_source() {
    let Some(mut l) = lab() else { return };
    let f = frame(B, C, 64);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_DROP);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().drops.get("spoofed_src"),
        Some(&1)
    );
    l.fp.update_port(
        PORT_A,
        &PortPolicy {
            any_source: true,
            rate: None,
        },
    )
    .unwrap();
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 1);
}

#[test]
fn oversize_frames_and_gso_segments_are_dropped() {
    let Some(l) = lab() else { return };
    // MTU 1450: a 1464-byte frame is the largest that passes.
    let ok = frame(B, A, 1450 - 28);
    assert_eq!(ok.len(), 1464);
    assert_eq!(l.run_from_a(&ok).verdict, TCX_REDIRECT);
    let big = frame(B, A, 1450 - 28 + 1);
    assert_eq!(l.run_from_a(&big).verdict, TCX_DROP);
    // A GSO frame whose segments (gso_size + IPv4 + UDP headers) would exceed the MTU.
    let gso = frame(B, A, 3000); // test_run takes at most about a page
    assert_eq!(
        l.fp.test_run(Program::PortIngress, &gso, l.pa, 1422)
            .unwrap()
            .verdict,
        TCX_REDIRECT
    );
    assert_eq!(
        l.fp.test_run(Program::PortIngress, &gso, l.pa, 1423)
            .unwrap()
            .verdict,
        TCX_DROP
    );
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(a.drops.get("oversize"), Some(&2));
    assert_eq!(a.rx_frames, 2);
    // Runts (< 14 bytes) cannot be fed to BPF_PROG_TEST_RUN (the kernel refuses data shorter
    // than an Ethernet header), so `truncated` is exercised only by the program's check.
}

#[test]
fn the_rate_limit_drops_beyond_the_bucket() {
    let Some(mut l) = lab() else { return };
    // 8 Mbit/s = 1 MB/s, a 3000-byte bucket: three 1000-byte frames pass at once, a fourth
    // only if a microsecond or so refilled a token, then drops.
    l.fp.update_port(
        PORT_A,
        &PortPolicy {
            any_source: false,
            rate: Some(Rate {
                bits_per_sec: 8_000_000,
                burst_bytes: 3000,
            }),
        },
    )
    .unwrap();
    let f = frame(B, A, 1000 - 42);
    assert_eq!(f.len(), 1000);
    let passed = (0..10)
        .filter(|_| l.run_from_a(&f).verdict == TCX_REDIRECT)
        .count();
    assert!((3..=4).contains(&passed), "{passed} passed");
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(
        a.drops.get("rate_limited").copied(),
        Some(10 - passed as u64)
    );
    assert!(l.fp.rate_available(PORT_A).unwrap().unwrap() <= 0);
    // After 5 ms, about 5000 bytes more: the bucket is full (3000) again.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(l.run_from_a(&f).verdict, TCX_REDIRECT);
    // Removing the limit lets everything through.
    l.fp.update_port(PORT_A, &PortPolicy::default()).unwrap();
    for _ in 0..10 {
        assert_eq!(l.run_from_a(&f).verdict, TCX_REDIRECT);
    }
}

#[test]
fn the_punt_tap_delivers_what_vnetd_writes() {
    let Some(l) = lab() else { return };
    let f = frame(A, B, 80);
    let r =
        l.fp.test_run(Program::PuntIngress, &f, l.punt_a, 0)
            .unwrap();
    assert_eq!(r.verdict, TCX_REDIRECT);
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.slow_tx_frames, a.slow_tx_bytes), (1, f.len() as u64));
    // A device that is no port's punt TAP: not ours, go on.
    assert_eq!(
        l.fp.test_run(Program::PuntIngress, &f, l.pb, 0)
            .unwrap()
            .verdict,
        TCX_NEXT
    );
}

#[test]
fn a_links_rate_is_charged_for_what_goes_on_to_vnetd_too() {
    let Some(mut l) = lab() else { return };
    // 8 Mbit/s with a 3000-byte bucket on what arrives from link C.
    let rate = Rate {
        bits_per_sec: 8_000_000,
        burst_bytes: 3000,
    };
    l.fp.set_link(&link_spec(LINK_C, 1, REMOTE, Some(rate)))
        .unwrap();
    // Inner broadcasts (and a datagram with reserved bits set, which vnetd also takes) are
    // vnetd's to forward: the kernel passes them on, but charges them first, so that the
    // link's one bucket holds for both paths (vnetd does not charge links the kernel serves).
    let bcast = vxlan(REMOTE, 1, 0x08, &frame(MacAddr::BROADCAST, C, 1000 - 42));
    let mut reserved = vxlan(REMOTE, 1, 0x08, &frame(B, C, 1000 - 42));
    reserved[49] = 1;
    let verdicts: Vec<i32> = [&bcast, &reserved, &bcast, &reserved, &bcast, &bcast]
        .iter()
        .map(|f| l.run_from_underlay(f).verdict)
        .collect();
    let passed = verdicts.iter().filter(|v| **v == TCX_NEXT).count();
    assert!((3..=4).contains(&passed), "{verdicts:?}");
    assert!(verdicts[4..].iter().all(|v| *v == TCX_DROP), "{verdicts:?}");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!(
        c.drops.get("rate_limited").copied(),
        Some(6 - passed as u64)
    );
    // and the bucket is empty for what the kernel itself would deliver
    let r = l.run_from_underlay(&vxlan(REMOTE, 1, 0x08, &frame(A, C, 100)));
    assert_eq!(r.verdict, TCX_DROP);
}

#[test]
fn a_decision_into_another_vni_is_not_followed() {
    let Some(mut l) = lab() else { return };
    // Port B and link C move to VNI 2 while the table (compiled when they were in VNI 1)
    // still sends VNI 1's B and C to them: an inconsistent table, as a bug in compile()
    // would write. Isolation must not rest on it.
    let pb = l.pb;
    l.fp.detach_port(PORT_B).unwrap();
    l.fp.attach_port(&port_spec(PORT_B, pb, ifindex("puntb"), B, 2))
        .unwrap();
    l.fp.set_link(&link_spec(LINK_C, 2, REMOTE, None)).unwrap();
    // And an entry of VNI 2 that sends frames from link C to port A (VNI 1).
    let mut t = compile(
        &compile_ports(&[
            (PORT_A, Egress::FastPort),
            (PORT_B, Egress::FastPort),
            (LINK_C, Egress::UdpLink),
        ]),
        &exact_routes(&[(B, PORT_B), (C, LINK_C)]),
        false,
    );
    t.entries.insert(
        FwdKey {
            vni: 2,
            kind: KeyKind::Dst,
            src: MacAddr::ZERO,
            dst: A,
        },
        FwdEntry {
            action: Action::Port(PORT_A),
            check_src: false,
        },
    );
    l.fp.apply_table(&t).unwrap();
    for (dst, what) in [(B, "a port of VNI 2"), (C, "a link of VNI 2")] {
        let f = frame(dst, A, 100);
        let r = l.run_from_a(&f);
        assert_eq!(
            (r.verdict, r.data == f),
            (TCX_REDIRECT, true),
            "{what}: to vnetd (the punt TAP), unchanged"
        );
    }
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().tx_frames, 0);
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.rx_frames, a.punted_frames), (0, 2));
    // From link C (VNI 2) to port A (VNI 1): passed to vnetd, not delivered.
    let f = vxlan(REMOTE, 2, 0x08, &frame(A, C, 100));
    let r = l.run_from_underlay(&f);
    assert_eq!(r.verdict, TCX_NEXT);
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 0);
    assert_eq!(l.fp.global_counters().unwrap().vni_mismatch, 3);
}
