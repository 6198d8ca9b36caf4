//! A guest's frames handed over in place (vhost-user cut-through) or copied.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vnet_core::PortId;
use vnet_offload::test_frames::{tso_frame, valid};
use vnet_offload::VirtioNetHdr;
use vnet_wire::MacAddr;

use super::{GuestFrame, Ingress, GUEST_HEAD};
use crate::forward::FwdCtx;
use crate::ports::nic::NicPort;
use crate::testing::*;

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

#[test]
fn empty_and_runt_guest_frames_are_counted() {
    let sh = shared();
    publish(
        &sh,
        vec![TestPort::interface(
            1,
            mac(1),
            Arc::new(Recorder::default()),
        )],
        vec![],
    );
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
    let runt = mem.get_slice(GuestAddress(0), 10).unwrap();
    let empty = mem.get_slice(GuestAddress(0), 0).unwrap();
    let ingress = Ingress {
        shared: sh.clone(),
        port: PortId(1),
    };
    ingress.forward_guest(
        &mut FwdCtx::new(),
        &[
            (VirtioNetHdr::default(), GuestFrame::Shared(runt)),
            (VirtioNetHdr::default(), GuestFrame::Shared(empty)),
        ],
    );
    let c = counters(&sh, 1);
    assert_eq!(c.drops.get("truncated"), Some(&1));
    assert_eq!(c.rx_frames, 1, "an empty frame is no frame");
}
