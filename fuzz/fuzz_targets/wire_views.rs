//! Bytes from a guest or the wire read through every view of vnet-wire up to layer 4
//! (Ethernet, IPv4, IPv6, UDP, TCP, ARP, ICMPv4, ICMPv6, the virtio-net header): nothing may
//! panic, and whatever parses as a repr emits back to bytes that parse to the same repr.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_wire::{
    ArpPacket, ArpRepr, EthernetFrame, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr,
    Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpPacket, TcpRepr, UdpPacket, UdpRepr,
    VirtioNetHdr, VirtioNetHeader,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = VirtioNetHeader::new_checked(data) {
        let r = VirtioNetHdr::from_view(&h);
        assert_eq!(VirtioNetHdr::parse(&r.emit()), Ok(r));
        let _ = h.num_buffers();
    }
    // The frame: an Ethernet header (maybe tagged), then whatever its EtherType says.
    let eth = EthernetFrame::new_unchecked(data);
    let l3 = match eth.network_header() {
        Ok((off, _)) => &data[off..],
        Err(_) => data,
    };
    if let Ok(p) = ArpPacket::new_checked(l3) {
        let _ = (p.operation(), p.source_hardware_addr(), p.target_protocol_addr());
        if let Ok(r) = ArpRepr::parse(&p) {
            let mut b = [0u8; 28];
            r.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
            assert_eq!(ArpRepr::parse(&ArpPacket::new_unchecked(&b[..])), Ok(r));
        }
    }
    if let Ok(p) = Ipv4Packet::new_checked(l3) {
        let _ = (p.verify_checksum(), p.frag_offset(), p.src_addr(), p.dst_addr());
        let pseudo = p.pseudo_header_sum(p.payload().len());
        l4(p.payload(), pseudo);
        if let Ok(r) = Ipv4Repr::parse(&p) {
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]));
            assert_eq!(Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&b[..])), Ok(r));
        }
        if let Ok(m) = Icmpv4Packet::new_checked(p.payload()) {
            if let Ok(r) = Icmpv4Repr::parse(&m) {
                let mut b = vec![0u8; r.buffer_len()];
                r.emit(&mut Icmpv4Packet::new_unchecked(&mut b[..])).unwrap();
                assert_eq!(Icmpv4Repr::parse(&Icmpv4Packet::new_unchecked(&b[..])), Ok(r));
            }
        }
    }
    if let Ok(p) = Ipv6Packet::new_checked(l3) {
        let _ = (p.flow_label(), p.traffic_class());
        let pseudo = p.pseudo_header_sum(p.payload().len());
        l4(p.payload(), pseudo);
        if let Ok(r) = Ipv6Repr::parse(&p) {
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Ipv6Packet::new_unchecked(&mut b[..]));
            assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&b[..])), Ok(r));
        }
        if let Ok(m) = Icmpv6Packet::new_checked(p.payload()) {
            let (s, d) = (p.src_addr(), p.dst_addr());
            if let Ok(r) = Icmpv6Repr::parse(s, d, &m) {
                let mut b = vec![0u8; r.buffer_len()];
                r.emit(s, d, &mut Icmpv6Packet::new_unchecked(&mut b[..])).unwrap();
                assert_eq!(Icmpv6Repr::parse(s, d, &Icmpv6Packet::new_unchecked(&b[..])), Ok(r));
            }
        }
    }
});

/// The IP payload as TCP and as UDP.
fn l4(b: &[u8], pseudo: u64) {
    if let Ok(t) = TcpPacket::new_checked(b) {
        let _ = (t.seq_number(), t.flags(), t.options().len(), t.payload().len());
        if let Ok(r) = TcpRepr::parse(&t, pseudo) {
            let mut out = b.to_vec();
            r.emit(&mut TcpPacket::new_unchecked(&mut out[..]), pseudo).unwrap();
            assert_eq!(TcpRepr::parse(&TcpPacket::new_unchecked(&out[..]), pseudo), Ok(r));
        }
    }
    if let Ok(u) = UdpPacket::new_checked(b) {
        let _ = (u.len(), u.payload().len(), u.verify_checksum(pseudo));
        if let Ok(r) = UdpRepr::parse(&u, pseudo) {
            let mut out = b.to_vec();
            r.emit(&mut UdpPacket::new_unchecked(&mut out[..]), pseudo);
            assert_eq!(UdpRepr::parse(&UdpPacket::new_unchecked(&out[..]), pseudo), Ok(r));
        }
    }
}
