//! The frame a host sends into the overlay when a MAC has just arrived there (migration), so
//! learning switches and peers on the path relearn where it lives at once.
//!
//! The RARP form is what QEMU sends after a live migration (`announce-self`): it needs no IP
//! address. When the guest's IPv4 address is known, a gratuitous ARP also refreshes the ARP
//! caches of the other guests. Both are built with `vnet-wire`'s Ethernet and ARP reprs.

use std::net::Ipv4Addr;

use vnet_wire::{
    ethertype, ArpOperation, ArpPacket, ArpRepr, EthernetFrame, EthernetRepr, MacAddr,
};

pub const ETHERTYPE_ARP: u16 = ethertype::ARP;
pub const ETHERTYPE_RARP: u16 = ethertype::RARP;
pub const ETHERTYPE_IPV4: u16 = ethertype::IPV4;
/// Both frames are padded to the Ethernet minimum (60 bytes without the FCS).
pub const ANNOUNCE_FRAME_LEN: usize = 60;

/// A broadcast frame from `arp.source_hardware_addr` carrying `arp` (ARP or RARP, as
/// `ethertype` says), zero-padded.
fn arp_frame(ethertype: u16, arp: ArpRepr) -> [u8; ANNOUNCE_FRAME_LEN] {
    let mut f = [0u8; ANNOUNCE_FRAME_LEN];
    let mut eth = EthernetFrame::new_unchecked(&mut f[..]);
    EthernetRepr {
        src: arp.source_hardware_addr,
        dst: MacAddr::BROADCAST,
        ethertype,
    }
    .emit(&mut eth);
    arp.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    f
}

/// A gratuitous RARP ("request reverse", sender and target hardware address both `mac`,
/// protocol addresses zero), broadcast from `mac`: QEMU's announcement.
pub fn gratuitous_rarp(mac: MacAddr) -> [u8; ANNOUNCE_FRAME_LEN] {
    arp_frame(
        ETHERTYPE_RARP,
        ArpRepr {
            operation: ArpOperation::RarpRequest,
            source_hardware_addr: mac,
            source_protocol_addr: Ipv4Addr::UNSPECIFIED,
            target_hardware_addr: mac,
            target_protocol_addr: Ipv4Addr::UNSPECIFIED,
        },
    )
}

/// A gratuitous ARP request (RFC 5227 announcement: sender and target IP both `ip`, target
/// hardware address zero), broadcast from `mac`.
pub fn gratuitous_arp(mac: MacAddr, ip: Ipv4Addr) -> [u8; ANNOUNCE_FRAME_LEN] {
    arp_frame(
        ETHERTYPE_ARP,
        ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: mac,
            source_protocol_addr: ip,
            target_hardware_addr: MacAddr::ZERO,
            target_protocol_addr: ip,
        },
    )
}

/// The announcement for `mac`: a gratuitous ARP when its IPv4 address is known, else RARP.
pub fn announce_frame(mac: MacAddr, ip: Option<Ipv4Addr>) -> [u8; ANNOUNCE_FRAME_LEN] {
    match ip {
        Some(ip) => gratuitous_arp(mac, ip),
        None => gratuitous_rarp(mac),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x00, 0x0a, 0x01]);

    #[test]
    fn rarp_bytes() {
        let f = gratuitous_rarp(MAC);
        #[rustfmt::skip]
        let want: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // destination: broadcast
            0x52, 0x54, 0x00, 0x00, 0x0a, 0x01, // source
            0x80, 0x35,                         // RARP
            0x00, 0x01, 0x08, 0x00, 6, 4,       // Ethernet, IPv4, lengths
            0x00, 0x03,                         // request reverse
            0x52, 0x54, 0x00, 0x00, 0x0a, 0x01, 0, 0, 0, 0,
            0x52, 0x54, 0x00, 0x00, 0x0a, 0x01, 0, 0, 0, 0,
        ];
        assert_eq!(&f[..42], &want);
        assert!(f[42..].iter().all(|b| *b == 0));
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(e.dst().is_broadcast());
        assert_eq!((e.src(), e.ethertype()), (MAC, ETHERTYPE_RARP));
        assert_eq!(announce_frame(MAC, None), f);
        let arp = ArpRepr::parse(&ArpPacket::new_checked(e.payload()).unwrap()).unwrap();
        assert_eq!(arp.operation, ArpOperation::RarpRequest);
    }

    #[test]
    fn arp_bytes() {
        let ip = Ipv4Addr::new(192, 168, 50, 11);
        let f = gratuitous_arp(MAC, ip);
        #[rustfmt::skip]
        let want: [u8; 42] = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x52, 0x54, 0x00, 0x00, 0x0a, 0x01,
            0x08, 0x06,                         // ARP
            0x00, 0x01, 0x08, 0x00, 6, 4,
            0x00, 0x01,                         // request
            0x52, 0x54, 0x00, 0x00, 0x0a, 0x01, 192, 168, 50, 11,
            0, 0, 0, 0, 0, 0,                   192, 168, 50, 11,
        ];
        assert_eq!(&f[..42], &want);
        assert_eq!(f.len(), ANNOUNCE_FRAME_LEN);
        assert_eq!(announce_frame(MAC, Some(ip)), f);
    }
}
