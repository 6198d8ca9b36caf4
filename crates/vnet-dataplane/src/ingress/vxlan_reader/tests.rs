//! The VXLAN socket's reader on loopback: who may send, what is forwarded, what is counted.

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use vnet_wire::VxlanRepr;

use super::{is_tunnel_gso, VxlanReader};
use crate::ingress::{Reader, RxWork};
use crate::testing::*;

/// A daemon socket with a guest (port 2, mac 2) and a udp link (port 3) from 127.0.0.1 in
/// VNI 7; returns the peer's socket to send from.
fn lab() -> (
    Arc<crate::shared::Shared>,
    Arc<Recorder>,
    UdpSocket,
    VxlanReader,
) {
    let sh = shared();
    let guest = guest_and_link(
        &sh,
        Arc::new(Recorder::default()),
        "127.0.0.1".parse().unwrap(),
    );
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.connect(sh.snapshot.load().udp.local_addr()).unwrap();
    let reader = VxlanReader {
        sock: sh.snapshot.load().udp.clone(),
    };
    (sh, guest, peer, reader)
}

/// Publishes on `sh` a guest (port 2, mac 2; its recorder is returned) and `link` as port 3
/// from `peer_ip`, both in VNI 7, with mac 2 routed to the guest.
fn guest_and_link(
    sh: &crate::shared::Shared,
    link: Arc<dyn crate::port::Port>,
    peer_ip: std::net::IpAddr,
) -> Arc<Recorder> {
    let guest = Arc::new(Recorder::default());
    let mut g = TestPort::interface(2, mac(2), guest.clone());
    g.vni = 7;
    let mut l = TestPort::link(3, link);
    l.vni = 7;
    l.udp_peer = Some(peer_ip);
    let mut rule = route(mac(2), 2);
    rule.vni = 7;
    publish(sh, vec![g, l], vec![rule]);
    guest
}

fn drain(sh: &crate::shared::Shared, r: &VxlanReader, w: &mut RxWork, want: usize) -> usize {
    let mut n = 0;
    for _ in 0..200 {
        let snap = sh.snapshot.load_full();
        n += r.drain(w, sh, &snap).unwrap();
        if n >= want {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    n
}

fn dgram(vni: u32, f: &[u8]) -> Vec<u8> {
    let mut d = VxlanRepr { vni }.header().to_vec();
    d.extend_from_slice(f);
    d
}

#[test]
fn datagrams_of_a_link_reach_the_guest_and_bad_ones_are_counted() {
    let (sh, guest, peer, r) = lab();
    let mut w = RxWork::new(0);
    let f = frame(mac(2), mac(9), 200);
    peer.send(&dgram(7, &f)).unwrap();
    // Unknown VNI from a known peer; not VXLAN at all; shorter than a header.
    peer.send(&dgram(8, &f)).unwrap();
    peer.send(&[0u8; 40]).unwrap();
    peer.send(&[0x08, 0]).unwrap();
    assert_eq!(drain(&sh, &r, &mut w, 4), 4);
    let got = guest.take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].bytes, f);
    assert_eq!(counters(&sh, 3).rx_frames, 1);
    let d = sh.daemon.snapshot();
    assert_eq!(d.drops.get("unknown_vni"), Some(&1));
    assert_eq!(d.drops.get("bad_vxlan"), Some(&2));
}

#[test]
fn a_stranger_is_refused_before_anything_is_parsed() {
    let (sh, guest, _peer, r) = lab();
    // 127.0.0.2 is loopback too, but no link's peer.
    let stranger = UdpSocket::bind("127.0.0.2:0").unwrap();
    stranger
        .send_to(
            &dgram(7, &frame(mac(2), mac(9), 100)),
            sh.snapshot.load().udp.local_addr(),
        )
        .unwrap();
    let mut w = RxWork::new(0);
    assert_eq!(drain(&sh, &r, &mut w, 1), 1);
    assert!(guest.take().is_empty());
    assert_eq!(sh.daemon.snapshot().drops.get("unknown_peer"), Some(&1));
}

#[test]
fn tunnel_gso_is_told_from_a_gro_batch() {
    // One VXLAN datagram whose inner IPv4 frame claims 3000 bytes, with a "segment size" of
    // 1400: an unsegmented inner frame from a kernel sender.
    let mut f = frame(mac(2), mac(9), 3014);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&3000u16.to_be_bytes());
    let d = dgram(7, &f);
    assert!(is_tunnel_gso(&d, 1400));
    // Datagrams merged by GRO: the first inner frame ends at the segment boundary.
    let mut g = frame(mac(2), mac(9), 1014);
    g[14] = 0x45;
    g[16..18].copy_from_slice(&1000u16.to_be_bytes());
    let d = dgram(7, &g);
    assert!(!is_tunnel_gso(&d, d.len()));
    // Garbage is neither.
    assert!(!is_tunnel_gso(&[1, 2, 3], 1));
}

/// An encrypted link (port 3, VNI 7) from 127.0.0.1 whose datagrams are opened in place by the
/// reader: sealed datagrams sent out of order within the replay window all reach the guest,
/// opened to the frames they carry; a replayed one and a tampered one are counted (`replay`,
/// `bad_auth`) and go nowhere.
#[test]
fn encrypted_datagrams_open_in_place_reordered_and_replays_refused() {
    use crate::batch::UdpLinkTx;
    use crate::crypto::established_pair;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    let sh = shared();
    let sock = sh.snapshot.load().udp.clone();
    let (a, b) = established_pair(sock.clone());
    let link = UdpLinkTx {
        sock: sock.clone(),
        path: crate::testing::path_to(sock.local_addr()),
        fixed_peer: Some(sock.local_addr()),
        header: VxlanRepr { vni: 7 }.header(),
        gso_refused: AtomicUsize::new(usize::MAX),
        crypto: Some(b.clone()),
        counters: Default::default(),
    };
    let guest = guest_and_link(&sh, Arc::new(link), "127.0.0.1".parse().unwrap());
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    peer.connect(sock.local_addr()).unwrap();
    let reader = VxlanReader { sock };

    // Five datagrams sealed by A under counters c..c+5, each carrying a distinct frame.
    let s = a.sending_session().expect("A has a session");
    let c = s.reserve(5).unwrap();
    let frames: Vec<Vec<u8>> = (0..5)
        .map(|k| frame(mac(2), mac(9), 100 + 10 * k))
        .collect();
    let sealed: Vec<Vec<u8>> = frames
        .iter()
        .enumerate()
        .map(|(k, f)| {
            let mut d = vec![0u8; vnet_crypto::DATA_HEADER_LEN];
            d.extend_from_slice(&dgram(7, f));
            d.extend_from_slice(&[0; vnet_crypto::TAG_LEN]);
            s.seal_in_place(c + k as u64, &mut d).unwrap();
            d
        })
        .collect();
    let mut tampered = sealed[4].clone();
    *tampered.last_mut().unwrap() ^= 1;
    // Reordered: 2, 0, 3, 1; then 0 again and 4 with a flipped tag bit.
    for k in [2, 0, 3, 1] {
        peer.send(&sealed[k]).unwrap();
    }
    peer.send(&sealed[0]).unwrap();
    peer.send(&tampered).unwrap();
    let mut w = RxWork::new(0);
    assert_eq!(drain(&sh, &reader, &mut w, 6), 6);
    let got: Vec<Vec<u8>> = guest.take().into_iter().map(|s| s.bytes).collect();
    let want: Vec<Vec<u8>> = [2, 0, 3, 1].iter().map(|&k| frames[k].clone()).collect();
    assert_eq!(got, want);
    assert_eq!(b.opened.load(Relaxed), 1 + 4); // the handshake's keepalive, then these
    let drops = counters(&sh, 3).drops;
    assert_eq!(drops.get("replay"), Some(&1), "{drops:?}");
    assert_eq!(drops.get("bad_auth"), Some(&1), "{drops:?}");
}

/// One daemon of [`rekeying_under_load_loses_nothing`]: its socket, a guest (port 2, mac 2)
/// and an encrypted link (port 3, VNI 7) to the other daemon on loopback.
struct End {
    sh: Arc<crate::shared::Shared>,
    guest: Arc<Recorder>,
    link: Arc<crate::batch::UdpLinkTx>,
    crypto: Arc<crate::crypto::LinkCrypto>,
    reader: VxlanReader,
}

fn encrypted_end(
    sh: Arc<crate::shared::Shared>,
    name: &str,
    key: vnet_crypto::PrivateKey,
    peer: (vnet_crypto::PublicKey, std::net::SocketAddr),
    timers: vnet_crypto::Timers,
) -> End {
    use std::sync::atomic::AtomicUsize;
    let sock = sh.snapshot.load().udp.clone();
    let to = crate::testing::path_to(peer.1);
    let crypto = Arc::new(crate::crypto::LinkCrypto::new(
        name,
        key,
        peer.0,
        7,
        sock.clone(),
        to.clone(),
        timers,
    ));
    let link = Arc::new(crate::batch::UdpLinkTx {
        sock: sock.clone(),
        path: to,
        fixed_peer: Some(peer.1),
        header: VxlanRepr { vni: 7 }.header(),
        gso_refused: AtomicUsize::new(usize::MAX),
        crypto: Some(crypto.clone()),
        counters: Default::default(),
    });
    let guest = guest_and_link(&sh, link.clone(), peer.1.ip().to_canonical());
    End {
        sh,
        guest,
        link,
        crypto,
        reader: VxlanReader { sock },
    }
}

/// Two daemons' ends, on `sha`'s and `shb`'s sockets, of one encrypted link (fresh keys).
fn encrypted_pair(
    sha: Arc<crate::shared::Shared>,
    shb: Arc<crate::shared::Shared>,
    timers: vnet_crypto::Timers,
) -> (End, End) {
    let (ka, kb) = (
        vnet_crypto::PrivateKey::generate().unwrap(),
        vnet_crypto::PrivateKey::generate().unwrap(),
    );
    let (addr_a, addr_b) = (
        sha.snapshot.load().udp.local_addr(),
        shb.snapshot.load().udp.local_addr(),
    );
    let a = encrypted_end(sha, "a", ka.clone(), (kb.public(), addr_b), timers);
    let b = encrypted_end(shb, "b", kb, (ka.public(), addr_a), timers);
    (a, b)
}

/// Reads what arrived at `end`'s socket once.
fn pump(end: &End, w: &mut RxWork) {
    let snap = end.sh.snapshot.load_full();
    end.reader.drain(w, &end.sh, &snap).unwrap();
}

/// A starts the handshake; both ends read until both are established.
fn establish(a: &End, b: &End, wa: &mut RxWork, wb: &mut RxWork) {
    a.crypto.tick();
    for _ in 0..200 {
        pump(a, wa);
        pump(b, wb);
        if a.crypto.established() && b.crypto.established() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no session after 1 s");
}

/// Two daemons on loopback rekey every 150 ms while A sends B a batch of frames every
/// millisecond through the batch path (sealed in place, opened in place): over several rekeys
/// every frame sent once A had its first session arrives, none is dropped for want of a
/// session (`no_session`) or refused, so a rekey never stalls the stream.
/// The same batch path over an IPv6 underlay (`::1`): the handshake completes through the
/// sockets, and every frame A sends reaches B's guest.
#[test]
fn encrypted_link_over_ipv6() {
    use crate::batch::{Rest, TxBatch};

    let (sha, shb) = (shared_on("[::1]:0"), shared_on("[::1]:0"));
    assert!(sha.snapshot.load().udp.local_addr().is_ipv6());
    let (a, b) = encrypted_pair(sha, shb, vnet_crypto::Timers::default());
    let (mut wa, mut wb) = (RxWork::new(0), RxWork::new(0));
    establish(&a, &b, &mut wa, &mut wb);
    let frames: Vec<Vec<u8>> = (0..20).map(|k| frame(mac(2), mac(9), 200 + k)).collect();
    let mut batch = TxBatch::default();
    for f in &frames {
        batch.push(&a.link, &[&f[..12]], Rest::Local(&f[12..]));
    }
    batch.flush(&a.sh.offload, &a.sh.daemon, &a.sh.snapshot.load().udp);
    let mut got = Vec::new();
    for _ in 0..200 {
        pump(&a, &mut wa);
        pump(&b, &mut wb);
        got.extend(b.guest.take().into_iter().map(|s| s.bytes));
        if got.len() >= frames.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(got, frames);
    assert!(counters(&b.sh, 3).drops.is_empty());
}

#[test]
fn rekeying_under_load_loses_nothing() {
    use crate::batch::{Rest, TxBatch};
    use std::time::Instant;

    let timers = vnet_crypto::Timers {
        rekey_after_ms: 150,
        reject_after_ms: 1_000,
        ..Default::default()
    };
    let (a, b) = encrypted_pair(shared(), shared(), timers);
    let f = frame(mac(2), mac(9), 900);
    let (mut wa, mut wb) = (RxWork::new(0), RxWork::new(0));
    let (mut sent, mut got) = (0u64, 0u64);
    let start = Instant::now();
    let mut last_tick = None;
    while start.elapsed() < Duration::from_millis(1_000) {
        if last_tick.is_none_or(|t: Instant| t.elapsed() >= Duration::from_millis(10)) {
            // B's timer starts once A has a session: A initiates every handshake (two hosts
            // that both initiate at first both become responders, who rekey 10 s later).
            a.crypto.tick();
            if a.crypto.established() {
                b.crypto.tick();
            }
            last_tick = Some(Instant::now());
        }
        if a.crypto.established() {
            let mut batch = TxBatch::default();
            for _ in 0..8 {
                batch.push(&a.link, &[&f[..12]], Rest::Local(&f[12..]));
            }
            batch.flush(&a.sh.offload, &a.sh.daemon, &a.sh.snapshot.load().udp);
            sent += 8;
        }
        pump(&a, &mut wa);
        pump(&b, &mut wb);
        got += b.guest.take().len() as u64;
        std::thread::sleep(Duration::from_millis(1));
    }
    // What is still on its way.
    for _ in 0..50 {
        pump(&b, &mut wb);
        got += b.guest.take().len() as u64;
        if got >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = a.crypto.status();
    assert!(
        st.rekeys >= 3,
        "only {} rekeys in 1 s: {st:?} / {:?}",
        st.rekeys,
        b.crypto.status()
    );
    assert!(sent > 1000, "sent only {sent}");
    let tx = a.link.counters.snapshot();
    assert!(tx.drops.is_empty(), "A dropped: {:?}", tx.drops);
    let rx = counters(&b.sh, 3);
    assert!(rx.drops.is_empty(), "B refused: {:?}", rx.drops);
    assert_eq!(
        got,
        sent,
        "{} frames lost over {} rekeys",
        sent - got,
        st.rekeys
    );
}

/// Publishes on `end` its encrypted link (port 3, from `peer`) and `others`, with mac 2 routed
/// to port `to`, all in VNI 7.
fn publish_vni7(end: &End, peer: std::net::IpAddr, others: Vec<TestPort>, to: u32) {
    let mut link = TestPort::link(3, end.link.clone());
    link.udp_peer = Some(peer);
    let mut ports = vec![link];
    ports.extend(others);
    for p in &mut ports {
        p.vni = 7;
    }
    let mut r = route(mac(2), to);
    r.vni = 7;
    publish(&end.sh, ports, vec![r]);
}

/// A guest's 64 KB TSO frame crosses an encrypted link between two daemons on loopback whose
/// handshake agreed on partial checksums: A cuts it without summing the payload, B merges the
/// segments unverified. B's guest (a NIC with offloads) gets frames marked partial that
/// complete to exactly the original stream; the same frames forwarded by B to a plaintext link
/// (a gateway toward a network) leave with complete, valid checksums.
#[test]
fn a_tso_frame_crosses_an_encrypted_link_with_partial_checksums() {
    use crate::batch::TxBatch;
    use crate::forward::{process, Arrival, FwdCtx};
    use crate::ports::nic::NicPort;
    use vnet_offload::test_frames::{tso_frame, valid};
    use vnet_offload::{complete_checksum, parse_l3l4};

    let (a, b) = encrypted_pair(shared(), shared(), vnet_crypto::Timers::default());
    let (addr_a, addr_b) = (
        a.sh.snapshot.load().udp.local_addr(),
        b.sh.snapshot.load().udp.local_addr(),
    );
    let (mut wa, mut wb) = (RxWork::new(0), RxWork::new(0));
    establish(&a, &b, &mut wa, &mut wb);
    assert!(a.crypto.partial_checksums() && b.crypto.partial_checksums());

    // The guest's frame: mac 1 (A's guest) to mac 2, 60,000 bytes of payload.
    let (mut tso, vh) = tso_frame(60_000, false);
    tso[..6].copy_from_slice(&mac(2).0);
    tso[6..12].copy_from_slice(&mac(1).0);
    let guest = TestPort::interface(2, mac(1), Arc::new(Recorder::default()));
    publish_vni7(&a, addr_b.ip(), vec![guest], 3);
    let send = || {
        let snap = a.sh.snapshot.load_full();
        let mut ctx = FwdCtx::new();
        let mut batch = TxBatch::default();
        process(
            &a.sh,
            &snap,
            &mut ctx,
            vnet_core::PortId(2),
            Arrival::local(vh, &tso),
            &mut batch,
        );
        batch.flush(&a.sh.offload, &a.sh.daemon, &snap.udp);
    };

    // B delivers to its guest, a NIC with offloads.
    let nic = Arc::new(FakeNic::new(true, 1500));
    let guest = TestPort::interface(2, mac(2), Arc::new(NicPort(nic.clone())));
    publish_vni7(&b, addr_a.ip(), vec![guest], 2);
    send();
    let mut got: Vec<(vnet_offload::VirtioNetHdr, Vec<u8>)> = Vec::new();
    for _ in 0..200 {
        pump(&b, &mut wb);
        got.extend(nic.take());
        let bytes: usize = got.iter().map(|(_, f)| f.len() - 66).sum();
        if bytes >= 60_000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        got.len() < 10,
        "{} frames: the segments were not merged",
        got.len()
    );
    let mut payload = Vec::new();
    for (vh, mut f) in got {
        assert!(vh.needs_csum(), "delivered marked partial");
        complete_checksum(&mut f, &vh).unwrap();
        assert!(valid(&f), "completes to a valid frame");
        payload.extend_from_slice(&f[parse_l3l4(&f).unwrap().hdr_len()..]);
    }
    assert_eq!(payload, tso[tso.len() - 60_000..]);
    assert!(counters(&b.sh, 3).drops.is_empty());

    // B as a gateway: the same frame on to a plaintext link, checksums completed.
    let (plain, plain_rx) = udp_link(&b.sh, 7);
    publish_vni7(&b, addr_a.ip(), vec![TestPort::link(4, plain)], 4);
    send();
    let (mut segs, mut buf) = (0, vec![0u8; 65536]);
    let mut payload = Vec::new();
    while payload.len() < 60_000 {
        pump(&b, &mut wb);
        let Ok(n) = plain_rx.recv(&mut buf) else {
            continue;
        };
        let inner = &buf[vnet_wire::VXLAN_HEADER_LEN..n];
        assert!(
            valid(inner),
            "segment {segs} leaves with a complete checksum"
        );
        payload.extend_from_slice(&inner[parse_l3l4(inner).unwrap().hdr_len()..]);
        segs += 1;
    }
    assert_eq!(payload, tso[tso.len() - 60_000..]);
}
