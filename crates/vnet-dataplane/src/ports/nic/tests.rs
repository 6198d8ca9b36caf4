//! Frames to a guest's NIC: whole with offloads, cut without, coalesced from the wire, copied
//! from another guest's shared memory.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vnet_core::PortId;
use vnet_offload::test_frames::{tso_frame, valid};
use vnet_offload::{segment, PayloadRef, SegmentList, VirtioNetHdr};
use vnet_wire::MacAddr;

use super::NicPort;
use crate::batch::TxBatch;
use crate::forward::{process, Arrival, FwdCtx};
use crate::gro_to_guest::flush_coalescers;
use crate::ingress::guest::{GuestFrame, Ingress, GUEST_HEAD};
use crate::shared::Shared;
use crate::testing::*;

/// Interface 1 (the sender, a recorder) and interface 2 (the NIC under test) in VNI 1.
fn lab(nic: Arc<FakeNic>, from_link: bool) -> (Arc<Shared>, Vec<u8>, VirtioNetHdr) {
    let sh = shared();
    let (f, vh) = tso_frame(10_000, false);
    let src = MacAddr::from_bytes(&f[6..12]);
    let dst = MacAddr::from_bytes(&f[..6]);
    let first = if from_link {
        TestPort::link(1, Arc::new(Recorder::default()))
    } else {
        TestPort::interface(1, src, Arc::new(Recorder::default()))
    };
    publish(
        &sh,
        vec![first, TestPort::interface(2, dst, Arc::new(NicPort(nic)))],
        vec![route(dst, 2)],
    );
    (sh, f, vh)
}

/// Forwards `f` as interface 1's guest sent it.
fn from_interface_1(sh: &Shared, vh: VirtioNetHdr, f: &[u8]) {
    let snap = sh.snapshot.load_full();
    let mut batch = TxBatch::default();
    process(
        sh,
        &snap,
        &mut FwdCtx::new(),
        PortId(1),
        Arrival::local(vh, f),
        &mut batch,
    );
}

/// What a `FakeNic` was written: each frame with its header.
type Written = Vec<(VirtioNetHdr, Vec<u8>)>;

/// A guest's TSO frame (and its header) from interface 1 to a NIC with or without offloads,
/// and what the NIC was written.
fn tso_frame_to_nic(offloads: bool) -> (Vec<u8>, VirtioNetHdr, Written) {
    let nic = Arc::new(FakeNic::new(offloads, 1500));
    let (sh, f, vh) = lab(nic.clone(), false);
    from_interface_1(&sh, vh, &f);
    (f, vh, nic.take())
}

#[test]
fn a_tso_frame_stays_whole_for_a_nic_with_offloads() {
    let (f, vh, w) = tso_frame_to_nic(true);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0, vh);
    assert_eq!(w[0].1, f);
}

#[test]
fn a_tso_frame_is_cut_for_a_nic_without_offloads() {
    let (_, vh, w) = tso_frame_to_nic(false);
    assert_eq!(w.len(), 10_000usize.div_ceil(vh.gso_size as usize));
    for (h, frame) in &w {
        assert_eq!(*h, VirtioNetHdr::default());
        assert!(valid(frame));
        assert!(frame.len() <= 1514);
    }
}

#[test]
fn segments_from_the_wire_are_merged_back_for_the_guest() {
    let nic = Arc::new(FakeNic::new(true, 1500));
    let (sh, f, vh) = lab(nic.clone(), true);
    // The wire's segments, one per receive buffer, as the UDP dispatcher holds them.
    let mut segs = SegmentList::new();
    segment(&f, &vh, &mut segs).unwrap();
    let bufs: Vec<Vec<u8>> = (0..segs.len())
        .map(|i| segs.parts(&f, i).concat())
        .collect();
    let snap = sh.snapshot.load_full();
    let mut batch = TxBatch::default();
    let mut ctx = FwdCtx::new();
    // All but the last segment (which carries PSH and would end the run at once).
    let n = bufs.len();
    for (i, b) in bufs.iter().enumerate().take(n - 1) {
        let at = PayloadRef {
            buf: i as u32,
            start: 0,
            end: b.len() as u32,
        };
        process(
            &sh,
            &snap,
            &mut ctx,
            PortId(1),
            Arrival::wire(b, at, &bufs),
            &mut batch,
        );
    }
    // Held until the end of the receive batch, then one frame.
    assert!(nic.take().is_empty());
    flush_coalescers(&sh, &snap, &mut ctx, &bufs);
    let w = nic.take();
    assert_eq!(w.len(), 1, "one merged frame");
    assert_eq!(w[0].0.gso_kind(), VirtioNetHdr::GSO_TCPV4);
    let hl = vh.hdr_len as usize;
    let merged: Vec<u8> = bufs[..n - 1]
        .iter()
        .flat_map(|b| b[hl..].to_vec())
        .collect();
    assert_eq!(&w[0].1[hl..], &merged[..]);
    assert_eq!(counters(&sh, 2).tx_frames, (n - 1) as u64);
}

#[test]
fn a_broadcast_from_the_wire_is_not_held() {
    let nic = Arc::new(FakeNic::new(true, 1500));
    let (sh, _, _) = lab(nic.clone(), true);
    let b = vec![frame(MacAddr::BROADCAST, mac(7), 60)];
    let at = PayloadRef {
        buf: 0,
        start: 0,
        end: 60,
    };
    let snap = sh.snapshot.load_full();
    let mut batch = TxBatch::default();
    process(
        &sh,
        &snap,
        &mut FwdCtx::new(),
        PortId(1),
        Arrival::wire(&b[0], at, &b),
        &mut batch,
    );
    assert_eq!(nic.take().len(), 1);
}

// Frames a guest hands over in its shared memory (vhost-user cut-through), through the
// guest's ingress to every kind of port: a NIC reads every byte, so it gets a copy.

#[test]
fn frames_in_guest_memory_are_forwarded_to_every_kind_of_port() {
    let sh = shared();
    let rec = Arc::new(Recorder::default());
    let nic = Arc::new(FakeNic::new(false, 9000));
    publish(
        &sh,
        vec![
            TestPort::interface(1, mac(1), Arc::new(Recorder::default())),
            TestPort::link(3, rec.clone()),
            TestPort::interface(4, mac(4), Arc::new(NicPort(nic.clone()))),
        ],
        vec![route(mac(9), 3), route(mac(4), 4)],
    );
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40000)]).unwrap();
    // Short (all of it fits the copied head), long, and long to a NIC that reads every byte.
    let frames = [
        (0x1000u64, frame(mac(9), mac(1), 60)),
        (0x2000, frame(mac(9), mac(1), 3000)),
        (0x8000, frame(mac(4), mac(1), 5000)),
    ];
    for (a, f) in &frames {
        mem.write_slice(f, GuestAddress(*a)).unwrap();
    }
    let slices: Vec<_> = frames
        .iter()
        .map(|(a, f)| mem.get_slice(GuestAddress(*a), f.len()).unwrap())
        .collect();
    let batch: Vec<(VirtioNetHdr, GuestFrame<'_>)> = slices
        .iter()
        .map(|s| (VirtioNetHdr::default(), GuestFrame::Shared(*s)))
        .collect();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    ingress.forward_guest(&mut FwdCtx::new(), &batch);
    let got = rec.take();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].bytes, frames[0].1);
    assert_eq!(got[1].bytes, frames[1].1);
    assert!(frames[1].1.len() > GUEST_HEAD);
    let w = nic.take();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].1, frames[2].1);
}

#[test]
fn a_frame_whose_offload_needs_its_bytes_is_copied_whole() {
    // A TSO frame in guest memory to a guest without offloads: it must be cut, so read.
    let sh = shared();
    let nic = Arc::new(FakeNic::new(false, 1500));
    let (f, vh) = tso_frame(8000, false);
    let src = MacAddr::from_bytes(&f[6..12]);
    let dst = MacAddr::from_bytes(&f[..6]);
    publish(
        &sh,
        vec![
            TestPort::interface(1, src, Arc::new(Recorder::default())),
            TestPort::interface(2, dst, Arc::new(NicPort(nic.clone()))),
        ],
        vec![route(dst, 2)],
    );
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
    mem.write_slice(&f, GuestAddress(0)).unwrap();
    let s = mem.get_slice(GuestAddress(0), f.len()).unwrap();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    ingress.forward_guest(&mut FwdCtx::new(), &[(vh, GuestFrame::Shared(s))]);
    let w = nic.take();
    assert_eq!(w.len(), 8000usize.div_ceil(vh.gso_size as usize));
    assert!(w.iter().all(|(_, s)| valid(s)));
}
