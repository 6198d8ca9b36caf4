//! A UDP payload from the wire: VXLAN header, then an Ethernet frame, then a routing decision.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_core::{ForwardingTable, PortId, PortInfo, PortKind};
use vnet_wire::{EthernetFrame, VxlanPacket};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = VxlanPacket::new_checked(data) else { return };
    let _ = p.vni();
    let Ok(eth) = EthernetFrame::new_checked(p.payload()) else { return };
    let _ = (eth.ethertype(), eth.payload().len());
    let table = ForwardingTable::new(
        1,
        vec![
            (PortId(1), PortInfo { vni: 1, kind: PortKind::OverlayLink }),
            (PortId(2), PortInfo { vni: 1, kind: PortKind::Interface }),
        ],
        vec![],
    );
    let _ = table.decide(PortId(1), eth.src(), eth.dst(), data.len() % 2 == 0, None);
});
