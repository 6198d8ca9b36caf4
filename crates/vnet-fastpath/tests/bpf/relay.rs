//! Relays in the kernel: a relayed link's datagrams carry the relay header both ways (sent
//! through the relay, found by the relay's endpoint and the peer's tag), and a relay forwards
//! the pairs vnetd admitted, rewritten (destination, ports, tag, both checksums), within the
//! pair's budget, leaving every other relay datagram to vnetd untouched.

use crate::helpers::*;
use std::net::SocketAddrV4;
use vnet_fastpath::*;

const PEER_TAG: [u8; 8] = [0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8];
const OTHER_TAG: [u8; 8] = [0xb1; 8];

/// The relay header with `tag`, then `rest`.
fn relay_payload(tag: [u8; 8], rest: &[u8]) -> Vec<u8> {
    let mut p = vec![0x22, 1, 0, 0];
    p.extend_from_slice(&tag);
    p.extend_from_slice(rest);
    p
}

/// VXLAN header of `vni`, then `inner`.
fn vxlan_payload(vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut p = vec![0x08, 0, 0, 0];
    p.extend_from_slice(&(vni << 8).to_be_bytes());
    p.extend_from_slice(inner);
    p
}

#[test]
fn a_relayed_link_carries_the_relay_header_both_ways() {
    let Some(mut l) = lab() else { return };
    // Link C's path goes through the relay at REMOTE:4789 (from the VXLAN socket's port).
    l.fp.set_link(&LinkSpec {
        src_port: Some(4789),
        relay_tag: Some(PEER_TAG),
        ..link_spec(LINK_C, 1, REMOTE, None)
    })
    .expect("relayed link");
    let f = frame(C, A, 200);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    let d = &r.data;
    assert_eq!(
        d.len(),
        f.len() + 62,
        "VXLAN's 50 bytes and the relay header's 12"
    );
    let ip = &d[14..34];
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, f.len() + 48);
    assert_eq!(&ip[16..20], &REMOTE.octets(), "to the relay");
    assert_eq!(u16::from_be_bytes([ip[6], ip[7]]) & 0x4000, 0x4000, "DF");
    assert_eq!(csum(ip), 0);
    let udp = &d[34..42];
    assert_eq!(&udp[0..4], &[0x12, 0xb5, 0x12, 0xb5], "4789 to 4789");
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, f.len() + 28);
    assert_eq!(&d[42..54], &relay_payload(PEER_TAG, &[])[..]);
    assert_eq!(&d[54..62], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(&d[62..], &f[..], "the inner frame whole");

    // From the relay, with the peer's tag: decapsulated to port A.
    let inner = frame(A, C, 300);
    let from_relay = udp_to_u0(
        REMOTE,
        4789,
        &relay_payload(PEER_TAG, &vxlan_payload(1, &inner)),
        false,
    );
    let r = l.run_from_underlay(&from_relay);
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(r.data, inner, "exactly the inner frame");
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().rx_frames, 1);
    // Another peer's tag, another VNI, the relay's other port, an encrypted link's message,
    // or plain VXLAN from the relay's address: vnetd's, untouched.
    let cases = [
        udp_to_u0(
            REMOTE,
            4789,
            &relay_payload(OTHER_TAG, &vxlan_payload(1, &inner)),
            false,
        ),
        udp_to_u0(
            REMOTE,
            4789,
            &relay_payload(PEER_TAG, &vxlan_payload(2, &inner)),
            false,
        ),
        udp_to_u0(
            REMOTE,
            4790,
            &relay_payload(PEER_TAG, &vxlan_payload(1, &inner)),
            false,
        ),
        udp_to_u0(
            REMOTE,
            4789,
            &relay_payload(PEER_TAG, &[4, 0, 0, 0, 9, 9, 9, 9]),
            false,
        ),
        udp_to_u0(REMOTE, 4789, &vxlan_payload(1, &inner), false),
    ];
    for (i, c) in cases.iter().enumerate() {
        let r = l.run_from_underlay(c);
        assert_eq!(r.verdict, TCX_NEXT, "case {i}");
        assert_eq!(&r.data, c, "case {i} untouched");
    }
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().rx_frames, 1);

    // Back to a plain path: relay datagrams are no longer the link's, VXLAN from the peer is.
    l.fp.set_link(&LinkSpec {
        src_port: Some(4789),
        ..link_spec(LINK_C, 1, REMOTE, None)
    })
    .expect("direct link");
    assert_eq!(l.run_from_underlay(&from_relay).verdict, TCX_NEXT);
    let plain = udp_to_u0(REMOTE, 4789, &vxlan_payload(1, &inner), false);
    assert_eq!(l.run_from_underlay(&plain).verdict, TCX_REDIRECT);
}

fn pair(rate_bps: u64, burst_bytes: u64) -> RelayPair {
    RelayPair {
        from: SocketAddrV4::new(REMOTE, 5000),
        dst_tag: PEER_TAG,
        to: SocketAddrV4::new(REMOTE, 6000),
        src_tag: OTHER_TAG,
        local: LOCAL,
        ifindex: ifindex("u0"),
        rate_bps,
        burst_bytes,
    }
}

#[test]
fn a_relay_forwards_admitted_pairs_rewritten_within_their_budget() {
    let Some(mut l) = lab() else { return };
    // 8 Mbit/s (1 byte a microsecond), a 2,500-byte burst: in the test's few microseconds,
    // three 1,012-byte payloads pass (a datagram passes while any token is left).
    let p = pair(8_000_000, 2_500);
    l.fp.set_relay_pair(&p).expect("pair");
    let body: Vec<u8> = (0..1000).map(|i| (i * 7) as u8).collect();
    let payload = relay_payload(PEER_TAG, &body);
    for with_csum in [true, false] {
        l.fp.set_relay_pair(&p).expect("pair, full bucket");
        let d = udp_to_u0(REMOTE, 5000, &payload, with_csum);
        let r = l.run_from_underlay(&d);
        assert_eq!(r.verdict, TCX_REDIRECT, "forwarded (checksum {with_csum})");
        let o = &r.data;
        assert_eq!(o.len(), d.len(), "the same size");
        let ip = &o[14..34];
        assert_eq!(csum(ip), 0, "IPv4 checksum valid");
        assert_eq!(&ip[12..16], &LOCAL.octets(), "from the relay");
        assert_eq!(&ip[16..20], &REMOTE.octets());
        assert_eq!(ip[8], 64, "TTL");
        let udp = &o[34..];
        assert_eq!(
            &udp[0..4],
            &[0x12, 0xb5, 0x17, 0x70],
            "4789 to the binding's 6000"
        );
        assert_eq!(
            &udp[8..20],
            &relay_payload(OTHER_TAG, &[])[..],
            "the source's tag"
        );
        assert_eq!(&udp[20..], &body[..], "the payload unread");
        let sum = u16::from_be_bytes([udp[6], udp[7]]);
        if with_csum {
            let mut z = udp.to_vec();
            z[6..8].copy_from_slice(&[0, 0]);
            assert_eq!(sum, udp_csum(LOCAL, REMOTE, &z), "UDP checksum follows");
        } else {
            assert_eq!(sum, 0, "no checksum stays none");
        }
    }
    let c = l.fp.relay_pair_counts(&p).unwrap().expect("counts");
    assert_eq!(
        (c.frames, c.bytes, c.rate_limited),
        (1, payload.len() as u64, 0)
    );

    // The budget (the pair set anew: a full bucket, counts from zero): 3 pass, the rest are
    // dropped and counted; tokens again after a while.
    l.fp.set_relay_pair(&p).expect("pair, full bucket");
    let d = udp_to_u0(REMOTE, 5000, &payload, false);
    let verdicts: Vec<i32> = (0..6).map(|_| l.run_from_underlay(&d).verdict).collect();
    assert_eq!(&verdicts[..3], &[TCX_REDIRECT; 3], "{verdicts:?}");
    assert!(verdicts[3..].iter().all(|v| *v == TCX_DROP), "{verdicts:?}");
    std::thread::sleep(std::time::Duration::from_millis(5)); // 5,000 bytes of tokens
    assert_eq!(l.run_from_underlay(&d).verdict, TCX_REDIRECT);
    let c = l.fp.relay_pair_counts(&p).unwrap().expect("counts");
    assert_eq!((c.frames, c.rate_limited), (4, 3));

    // Not an admitted pair (another source port, another destination tag), a fragment: vnetd's.
    let mut frag = d.clone();
    frag[20] |= 0x20; // more fragments
    let cases = [
        udp_to_u0(REMOTE, 5001, &payload, false),
        udp_to_u0(REMOTE, 5000, &relay_payload(OTHER_TAG, &body), false),
        frag,
    ];
    for (i, c) in cases.iter().enumerate() {
        let r = l.run_from_underlay(c);
        assert_eq!(r.verdict, TCX_NEXT, "case {i}");
        assert_eq!(&r.data, c, "case {i} untouched");
    }
    // Taken out of the kernel: vnetd's again.
    l.fp.del_relay_pair(&p).unwrap();
    assert_eq!(l.run_from_underlay(&d).verdict, TCX_NEXT);
    assert!(l.fp.relay_pair_counts(&p).unwrap().is_none());
}
