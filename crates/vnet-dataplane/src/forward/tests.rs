//! `process` on test ports: the decision, the checks and what every port is handed.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vnet_control::{PortPolicy, RateLimit};
use vnet_core::{DropReason, PortId};
use vnet_offload::VirtioNetHdr;
use vnet_wire::MacAddr;

use super::*;
use crate::batch::TxBatch;
use crate::testing::*;

/// Two interfaces (A mac 1, B mac 2) and two links (X, Y) in VNI 1; an interface in VNI 2.
fn lab(rules: Vec<vnet_core::RouteRule>) -> (Arc<Shared>, [Arc<Recorder>; 5]) {
    let sh = shared();
    let r: [Arc<Recorder>; 5] = Default::default();
    let mut v2 = TestPort::interface(5, mac(5), r[4].clone());
    v2.vni = 2;
    publish(
        &sh,
        vec![
            TestPort::interface(1, mac(1), r[0].clone()),
            TestPort::interface(2, mac(2), r[1].clone()),
            TestPort::link(3, r[2].clone()),
            TestPort::link(4, r[3].clone()),
            v2,
        ],
        rules,
    );
    (sh, r)
}

/// `send` without offloads.
fn send_plain(sh: &Shared, ctx: &mut FwdCtx, from: u32, f: &[u8]) {
    send(sh, ctx, from, VirtioNetHdr::default(), f);
}

fn send(sh: &Shared, ctx: &mut FwdCtx, from: u32, vh: VirtioNetHdr, f: &[u8]) {
    let snap = sh.snapshot.load_full();
    let mut batch = TxBatch::default();
    process(
        sh,
        &snap,
        ctx,
        PortId(from),
        Arrival::local(vh, f),
        &mut batch,
    );
    batch.flush(&sh.offload, &sh.daemon, &snap.udp);
}

#[test]
fn unicast_goes_to_the_routed_port_alone_and_is_counted() {
    let (sh, r) = lab(vec![route(mac(9), 3), route(mac(2), 2)]);
    let mut ctx = FwdCtx::new();
    let f = frame(mac(9), mac(1), 100);
    send_plain(&sh, &mut ctx, 1, &f);
    let got = r[2].take();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].bytes, f);
    assert!(got[0].sole);
    assert_eq!(got[0].vh, VirtioNetHdr::default());
    assert!(r[0].take().is_empty() && r[1].take().is_empty() && r[3].take().is_empty());
    assert_eq!(
        (counters(&sh, 1).rx_frames, counters(&sh, 1).rx_bytes),
        (1, 100)
    );
    assert_eq!(
        (counters(&sh, 3).tx_frames, counters(&sh, 3).tx_bytes),
        (1, 100)
    );
    // The traffic matrix saw it once the thread published its slice.
    ctx.flush(&sh);
    let m = sh.matrix.lock().unwrap().entries();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].src, m[0].dst, m[0].frames), (mac(1), mac(9), 1));
    // The second frame of the pair is a route-cache hit.
    send_plain(&sh, &mut ctx, 1, &f);
    assert_eq!(ctx.cache_stats(), (1, 1));
}

#[test]
fn hostile_frames_are_counted_not_forwarded() {
    let (sh, r) = lab(vec![route(mac(2), 2)]);
    let mut ctx = FwdCtx::new();
    // A runt.
    send_plain(&sh, &mut ctx, 1, &frame(mac(2), mac(1), 13));
    // Empty.
    send_plain(&sh, &mut ctx, 1, &[]);
    // Larger than any frame vnet carries.
    let big = frame(mac(2), mac(1), vnet_wire::MAX_FRAME_LEN + 1);
    send_plain(&sh, &mut ctx, 1, &big);
    // An offload kind vnet does not honour.
    let vh = VirtioNetHdr {
        gso_type: 0x77,
        ..Default::default()
    };
    send(&sh, &mut ctx, 1, vh, &frame(mac(2), mac(1), 100));
    let c = counters(&sh, 1);
    assert_eq!(c.rx_frames, 4);
    assert_eq!(c.drops.get("truncated"), Some(&2));
    assert_eq!(c.drops.get("oversize"), Some(&1));
    assert_eq!(c.drops.get("bad_offload"), Some(&1));
    assert!(r[1].take().is_empty());
}

#[test]
fn a_spoofed_source_teaches_nothing_and_goes_nowhere() {
    let (sh, r) = lab(vec![route(mac(2), 2)]);
    let mut ctx = FwdCtx::new();
    send_plain(&sh, &mut ctx, 1, &frame(mac(2), mac(7), 80));
    send_plain(&sh, &mut ctx, 1, &frame(MacAddr::BROADCAST, mac(7), 80));
    assert_eq!(counters(&sh, 1).drops.get("spoofed_src"), Some(&2));
    assert!(r.iter().all(|x| x.take().is_empty()));
    ctx.flush(&sh);
    assert!(sh.matrix.lock().unwrap().entries().is_empty());
    // A link has no source check.
    send_plain(&sh, &mut ctx, 3, &frame(mac(2), mac(7), 80));
    assert_eq!(r[1].take().len(), 1);
}

#[test]
fn broadcast_floods_the_vni_with_split_horizon() {
    let (sh, r) = lab(vec![]);
    let mut ctx = FwdCtx::new();
    send_plain(&sh, &mut ctx, 1, &frame(MacAddr::BROADCAST, mac(1), 60));
    let n: Vec<usize> = r.iter().map(|x| x.take().len()).collect();
    assert_eq!(n, vec![0, 1, 1, 1, 0]);
    // From a link: the other link gets nothing (split horizon).
    send_plain(&sh, &mut ctx, 3, &frame(MacAddr::BROADCAST, mac(8), 60));
    let n: Vec<usize> = r.iter().map(|x| x.take().len()).collect();
    assert_eq!(n, vec![1, 1, 0, 0, 0]);
}

#[test]
fn no_route_and_a_failing_port_are_counted_where_they_happen() {
    let sh = shared();
    let bad = Arc::new(Recorder {
        fail: Some(DropReason::QueueFull),
        ..Default::default()
    });
    publish(
        &sh,
        vec![
            TestPort::interface(1, mac(1), Arc::new(Recorder::default())),
            TestPort::link(3, bad),
        ],
        vec![route(mac(9), 3)],
    );
    let mut ctx = FwdCtx::new();
    send_plain(&sh, &mut ctx, 1, &frame(mac(8), mac(1), 60));
    assert_eq!(counters(&sh, 1).drops.get("no_route"), Some(&1));
    send_plain(&sh, &mut ctx, 1, &frame(mac(9), mac(1), 60));
    let c = counters(&sh, 3);
    assert_eq!((c.tx_frames, c.drops.get("queue_full")), (0, Some(&1)));
}

#[test]
fn a_rate_limit_holds() {
    let sh = shared();
    let r = Arc::new(Recorder::default());
    let mut a = TestPort::interface(1, mac(1), Arc::new(Recorder::default()));
    a.policy = PortPolicy {
        any_source: false,
        rate: Some(RateLimit {
            mbit: 1,
            burst_kb: 10,
        }),
    };
    publish(
        &sh,
        vec![a, TestPort::link(3, r.clone())],
        vec![route(mac(9), 3)],
    );
    let mut ctx = FwdCtx::new();
    for _ in 0..100 {
        send_plain(&sh, &mut ctx, 1, &frame(mac(9), mac(1), 1000));
    }
    // A 10 KB bucket lets about ten 1000-byte frames through at once, not a hundred.
    let passed = r.take().len();
    assert!((9..=12).contains(&passed), "{passed}");
    assert_eq!(
        counters(&sh, 1).drops.get("rate_limited"),
        Some(&(100 - passed as u64))
    );
}

#[test]
fn a_guest_frame_in_shared_memory_is_sent_with_the_checked_macs() {
    // The guest's frame lives in memory the guest may rewrite at any moment. `process` copies
    // the MACs once, checks that copy, and every port gets that copy: rewriting the source in
    // guest memory after the check (here, before the port reads the rest) cannot spoof it.
    let sh = shared();
    type Mem = vm_memory::GuestMemoryMmap<()>;
    struct Rewriter {
        guest: Arc<Mem>,
        rec: Recorder,
    }
    impl crate::port::Port for Rewriter {
        fn send<'a>(
            &'a self,
            tx: &mut crate::port::Tx<'_, 'a>,
            f: &crate::port::Frame<'a>,
        ) -> Result<(), DropReason> {
            // The guest strikes between the check and the send.
            self.guest
                .write_slice(&mac(66).0, GuestAddress(0x1006))
                .unwrap();
            self.rec.send(tx, f)
        }
    }
    let mem = Arc::new(Mem::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap());
    mem.write_slice(&frame(mac(9), mac(1), 1500), GuestAddress(0x1000))
        .unwrap();
    let guest = mem.get_slice(GuestAddress(0x1000), 1500).unwrap();
    let port = Arc::new(Rewriter {
        guest: mem.clone(),
        rec: Recorder::default(),
    });
    publish(
        &sh,
        vec![
            TestPort::interface(1, mac(1), Arc::new(Recorder::default())),
            TestPort::link(3, port.clone()),
        ],
        vec![route(mac(9), 3)],
    );
    let head_len = 64;
    let mut head = [0u8; 64];
    guest.copy_to(&mut head[..]);
    let a = Arrival {
        vh: VirtioNetHdr::default(),
        head: &head[..head_len],
        tail: Some(guest.offset(head_len).unwrap()),
        origin: crate::port::Origin::Local,
    };
    let snap = sh.snapshot.load_full();
    let mut batch = TxBatch::default();
    let mut ctx = FwdCtx::new();
    process(&sh, &snap, &mut ctx, PortId(1), a, &mut batch);
    let got = port.rec.take();
    assert_eq!(got.len(), 1);
    assert_eq!(
        &got[0].macs[6..],
        &mac(1).0,
        "the checked source is what is sent"
    );
    assert_eq!(&got[0].bytes[6..12], &mac(1).0);
    assert_eq!(got[0].bytes.len(), 1500);
    // And the spoofed source, had the guest written it before the check, is refused.
    let mut head2 = [0u8; 64];
    guest.copy_to(&mut head2[..]);
    let a = Arrival {
        head: &head2[..head_len],
        ..a
    };
    process(&sh, &snap, &mut ctx, PortId(1), a, &mut batch);
    assert_eq!(counters(&sh, 1).drops.get("spoofed_src"), Some(&1));
}
