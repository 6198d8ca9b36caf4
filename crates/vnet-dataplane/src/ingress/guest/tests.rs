//! A guest's frames handed over in place (vhost-user cut-through) or copied.

use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vnet_core::PortId;
use vnet_offload::VirtioNetHdr;

use super::{GuestFrame, Ingress};
use crate::forward::FwdCtx;
use crate::testing::*;

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
