//! A udp link's datagrams, received for real on a loopback socket (no root needed).

use std::net::UdpSocket;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vnet_core::PortId;
use vnet_offload::test_frames::{partial_csum_frame, tso_frame, valid};
use vnet_offload::VirtioNetHdr;
use vnet_wire::{VxlanPacket, VXLAN_HEADER_LEN};

use crate::batch::{TxBatch, UdpLinkTx};
use crate::forward::{process, Arrival, FwdCtx};
use crate::port::Origin;
use crate::shared::{Shared, Snapshot};
use crate::testing::*;
use vnet_wire::MacAddr;

/// Publishes a guest on port 1 (MAC `src`) whose frames for `dst` go to the udp `link` on
/// port 3; returns the snapshot published.
fn guest_to_link(sh: &Shared, src: MacAddr, link: Arc<UdpLinkTx>, dst: MacAddr) -> Arc<Snapshot> {
    publish(
        sh,
        vec![
            TestPort::interface(1, src, Arc::new(Recorder::default())),
            TestPort::link(3, link),
        ],
        vec![route(dst, 3)],
    );
    sh.snapshot.load_full()
}

/// Forwards `a` from the guest's port 1 into `batch`.
fn from_guest<'a>(
    sh: &Shared,
    snap: &'a Snapshot,
    ctx: &mut FwdCtx,
    a: Arrival<'a>,
    batch: &mut TxBatch<'a>,
) {
    process(sh, snap, ctx, PortId(1), a, batch);
}

fn recv_all(rx: &UdpSocket, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70000];
    for _ in 0..n {
        let k = rx.recv(&mut buf).expect("a datagram");
        out.push(buf[..k].to_vec());
    }
    out
}

fn inner(d: &[u8], vni: u32) -> &[u8] {
    let p = VxlanPacket::new_checked(d).expect("VXLAN");
    assert_eq!(p.vni(), vni);
    &d[VXLAN_HEADER_LEN..]
}

#[test]
fn frames_become_vxlan_datagrams_in_order() {
    let sh = shared();
    let (link, rx) = udp_link(&sh, 42);
    let snap = guest_to_link(&sh, mac(1), link, mac(9));
    let (mut batch, mut ctx) = (TxBatch::default(), FwdCtx::new());
    let frames: Vec<Vec<u8>> = (0..10)
        .map(|i| frame(mac(9), mac(1), if i == 9 { 300 } else { 1000 }))
        .collect();
    for f in &frames {
        let a = Arrival::local(VirtioNetHdr::default(), f);
        from_guest(&sh, &snap, &mut ctx, a, &mut batch);
    }
    assert_eq!(batch.len(), 10);
    batch.flush(&sh.offload, &sh.daemon, &snap.udp);
    let got = recv_all(&rx, 10);
    for (d, f) in got.iter().zip(&frames) {
        assert_eq!(inner(d, 42), &f[..]);
    }
    assert_eq!(counters(&sh, 3).tx_frames, 10);
}

#[test]
fn a_guest_frame_goes_from_guest_memory_with_its_checked_macs() {
    let sh = shared();
    let (link, rx) = udp_link(&sh, 1);
    let snap = guest_to_link(&sh, mac(1), link, mac(9));
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
    let f = frame(mac(9), mac(1), 1400);
    mem.write_slice(&f, GuestAddress(0x2000)).unwrap();
    let g = mem.get_slice(GuestAddress(0x2000), f.len()).unwrap();
    let mut head = [0u8; 64];
    g.copy_to(&mut head[..]);
    let (mut batch, mut ctx) = (TxBatch::default(), FwdCtx::new());
    let a = Arrival {
        vh: VirtioNetHdr::default(),
        head: &head,
        tail: Some(g.offset(64).unwrap()),
        origin: Origin::Local,
    };
    from_guest(&sh, &snap, &mut ctx, a, &mut batch);
    // The guest rewrites its source MAC, and a payload byte, before the batch goes out.
    mem.write_slice(&mac(66).0, GuestAddress(0x2006)).unwrap();
    mem.write_slice(&[0xab], GuestAddress(0x2000 + 1000))
        .unwrap();
    batch.flush(&sh.offload, &sh.daemon, &snap.udp);
    let d = &recv_all(&rx, 1)[0];
    let sent = inner(d, 1);
    assert_eq!(sent.len(), f.len());
    assert_eq!(
        &sent[6..12],
        &mac(1).0,
        "the checked source, not the rewritten one"
    );
    // The payload went from guest memory as it was at send time (the guest's own business).
    assert_eq!(sent[1000], 0xab);
    assert_eq!(&sent[12..1000], &f[12..1000]);
}

#[test]
fn a_tso_frame_is_cut_into_valid_datagrams() {
    let sh = shared();
    let (link, rx) = udp_link(&sh, 1);
    let (f, vh) = tso_frame(20_000, false);
    let (dst, src) = (
        vnet_wire::MacAddr::from_bytes(&f[..6]),
        vnet_wire::MacAddr::from_bytes(&f[6..12]),
    );
    let snap = guest_to_link(&sh, src, link, dst);
    let (mut batch, mut ctx) = (TxBatch::default(), FwdCtx::new());
    from_guest(&sh, &snap, &mut ctx, Arrival::local(vh, &f), &mut batch);
    let n = 20_000usize.div_ceil(vh.gso_size as usize);
    let got = recv_all(&rx, n);
    let mut payload = Vec::new();
    for d in &got {
        let s = inner(d, 1);
        assert!(valid(s), "every segment has valid checksums");
        assert!(s.len() <= vh.hdr_len as usize + vh.gso_size as usize);
        payload.extend_from_slice(&s[vh.hdr_len as usize..]);
    }
    assert_eq!(payload, f[f.len() - 20_000..]);
    assert_eq!(
        sh.offload
            .gso_frames
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn a_partial_checksum_is_completed_in_a_copy_and_oversize_is_refused() {
    let sh = shared();
    let (link, rx) = udp_link(&sh, 1);
    // An ordinary TCP frame whose checksum the guest left partial (its IP header complete).
    let (f, vh) = partial_csum_frame(500);
    let src = vnet_wire::MacAddr::from_bytes(&f[6..12]);
    let dst = vnet_wire::MacAddr::from_bytes(&f[..6]);
    let snap = guest_to_link(&sh, src, link, dst);
    let (mut batch, mut ctx) = (TxBatch::default(), FwdCtx::new());
    from_guest(&sh, &snap, &mut ctx, Arrival::local(vh, &f), &mut batch);
    let big = frame(dst, src, super::UDP_MAX_FRAME + 1);
    let a = Arrival::local(VirtioNetHdr::default(), &big);
    from_guest(&sh, &snap, &mut ctx, a, &mut batch);
    batch.flush(&sh.offload, &sh.daemon, &snap.udp);
    let d = &recv_all(&rx, 1)[0];
    assert!(valid(inner(d, 1)));
    assert_eq!(f[..f.len() - 500].len() + 500, inner(d, 1).len());
    assert_eq!(counters(&sh, 3).drops.get("oversize"), Some(&1));
}
