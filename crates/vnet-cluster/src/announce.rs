//! The frame a host sends into the overlay when a MAC has just arrived there (migration), so
//! learning switches and peers on the path relearn where it lives at once.
//!
//! The RARP form is what QEMU sends after a live migration (`announce-self`): it needs no IP
//! address. When the guest's IPv4 address is known, a gratuitous ARP also refreshes the ARP
//! caches of the other guests.

use std::net::Ipv4Addr;

use vnet_wire::{MacAddr, ETHERNET_HEADER_LEN};

pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_RARP: u16 = 0x8035;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Both frames are padded to the Ethernet minimum (60 bytes without the FCS).
pub const ANNOUNCE_FRAME_LEN: usize = 60;

const ARP_LEN: usize = 28;
const HTYPE_ETHERNET: u16 = 1;
const OP_ARP_REQUEST: u16 = 1;
const OP_RARP_REQUEST: u16 = 3;

/// A broadcast ARP/RARP packet in Ethernet, from `mac`.
fn arp_frame(
    ethertype: u16,
    op: u16,
    mac: MacAddr,
    sender_ip: Ipv4Addr,
    target_mac: MacAddr,
    target_ip: Ipv4Addr,
) -> [u8; ANNOUNCE_FRAME_LEN] {
    let mut f = [0u8; ANNOUNCE_FRAME_LEN];
    f[0..6].copy_from_slice(&MacAddr::BROADCAST.0);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let p = &mut f[ETHERNET_HEADER_LEN..ETHERNET_HEADER_LEN + ARP_LEN];
    p[0..2].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
    p[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    p[4] = 6; // hardware address length
    p[5] = 4; // protocol address length
    p[6..8].copy_from_slice(&op.to_be_bytes());
    p[8..14].copy_from_slice(&mac.0);
    p[14..18].copy_from_slice(&sender_ip.octets());
    p[18..24].copy_from_slice(&target_mac.0);
    p[24..28].copy_from_slice(&target_ip.octets());
    f
}

/// A gratuitous RARP ("request reverse", sender and target hardware address both `mac`,
/// protocol addresses zero), broadcast from `mac`: QEMU's announcement.
pub fn gratuitous_rarp(mac: MacAddr) -> [u8; ANNOUNCE_FRAME_LEN] {
    arp_frame(
        ETHERTYPE_RARP,
        OP_RARP_REQUEST,
        mac,
        Ipv4Addr::UNSPECIFIED,
        mac,
        Ipv4Addr::UNSPECIFIED,
    )
}

/// A gratuitous ARP request (RFC 5227 announcement: sender and target IP both `ip`, target
/// hardware address zero), broadcast from `mac`.
pub fn gratuitous_arp(mac: MacAddr, ip: Ipv4Addr) -> [u8; ANNOUNCE_FRAME_LEN] {
    arp_frame(ETHERTYPE_ARP, OP_ARP_REQUEST, mac, ip, MacAddr::ZERO, ip)
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
    use vnet_wire::EthernetFrame;

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
