//! Where the headers of a TCP or UDP frame are, found through `vnet-wire`'s views (Ethernet
//! with one optional 802.1Q tag, IPv4 or IPv6, TCP or UDP): the offloads need them as offsets
//! into the frame, because they copy header ranges and rewrite fields in the copies.

use vnet_wire::{
    ethertype, ip_protocol, EthernetFrame, Ipv4Packet, Ipv6Packet, TcpPacket, UdpPacket, WireError,
    IPV6_HEADER_LEN, UDP_HEADER_LEN,
};

use crate::OffloadError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    V4,
    V6,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    Tcp,
    Udp,
}

/// Where the headers of a TCP or UDP frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub l2_len: usize,
    pub l3: L3,
    pub l3_len: usize,
    pub l4: L4,
    pub l4_len: usize,
    /// End of the IP packet within the frame (Ethernet padding excluded).
    pub ip_end: usize,
}

impl Layout {
    pub fn l4_off(&self) -> usize {
        self.l2_len + self.l3_len
    }

    pub fn hdr_len(&self) -> usize {
        self.l2_len + self.l3_len + self.l4_len
    }

    /// Offset of the L4 checksum field from the start of the L4 header.
    pub fn csum_offset(&self) -> usize {
        match self.l4 {
            L4::Tcp => 16,
            L4::Udp => 6,
        }
    }

    pub fn proto(&self) -> u8 {
        match self.l4 {
            L4::Tcp => ip_protocol::TCP,
            L4::Udp => ip_protocol::UDP,
        }
    }

    /// The running sum of the TCP/UDP pseudo-header for an L4 length of `l4_total`, from the
    /// IP header in `frame` (the frame, or a copy of its headers).
    pub fn pseudo_sum(&self, frame: &[u8], l4_total: usize) -> u64 {
        let ip = &frame[self.l2_len..];
        match self.l3 {
            L3::V4 => Ipv4Packet::new_unchecked(ip).pseudo_header_sum(l4_total),
            L3::V6 => Ipv6Packet::new_unchecked(ip).pseudo_header_sum(l4_total),
        }
    }

    /// The TCP/UDP checksum field of `frame` (the frame, or a copy of its headers).
    pub fn l4_checksum(&self, frame: &[u8]) -> u16 {
        let l4 = &frame[self.l4_off()..];
        match self.l4 {
            L4::Tcp => TcpPacket::new_unchecked(l4).checksum(),
            L4::Udp => UdpPacket::new_unchecked(l4).checksum(),
        }
    }

    /// Writes the TCP/UDP checksum field of `frame`.
    pub fn set_l4_checksum(&self, frame: &mut [u8], c: u16) {
        let l4 = &mut frame[self.l4_off()..];
        match self.l4 {
            L4::Tcp => TcpPacket::new_unchecked(l4).set_checksum(c),
            L4::Udp => UdpPacket::new_unchecked(l4).set_checksum(c),
        }
    }

    /// Whether the IPv4 header checksum verifies (an IPv6 header has none: true).
    pub fn ip_checksum_ok(&self, frame: &[u8]) -> bool {
        match self.l3 {
            L3::V4 => {
                Ipv4Packet::new_unchecked(&frame[self.l2_len..self.l4_off()]).verify_checksum()
            }
            L3::V6 => true,
        }
    }
}

/// Finds the headers of an (optionally VLAN-tagged) IPv4/IPv6 TCP or UDP frame. Fragments,
/// IPv6 extension headers and everything else are `Unsupported`; a header cut short (or an IP
/// version that is not its EtherType's) is `Truncated`.
pub fn parse_l3l4(frame: &[u8]) -> Result<Layout, OffloadError> {
    let (l2, et) = EthernetFrame::new_unchecked(frame)
        .network_header()
        .map_err(|_| OffloadError::Truncated)?;
    let ip = &frame[l2..];
    let (l3, l3_len, proto, ip_len) = match et {
        ethertype::IPV4 => {
            let p = Ipv4Packet::new_checked(ip).map_err(|e| match e {
                WireError::BadHeaderLen(_) => OffloadError::Unsupported,
                _ => OffloadError::Truncated,
            })?;
            if p.is_fragment() {
                return Err(OffloadError::Unsupported);
            }
            (L3::V4, p.header_len(), p.protocol(), p.total_len() as usize)
        }
        ethertype::IPV6 => {
            let p = Ipv6Packet::new_checked(ip).map_err(|_| OffloadError::Truncated)?;
            (
                L3::V6,
                IPV6_HEADER_LEN,
                p.next_header(),
                IPV6_HEADER_LEN + p.payload_len() as usize,
            )
        }
        _ => return Err(OffloadError::Unsupported),
    };
    let l4_off = l2 + l3_len;
    let (l4, l4_len) = match proto {
        ip_protocol::TCP => {
            let t =
                TcpPacket::new_checked(&frame[l4_off..]).map_err(|_| OffloadError::Truncated)?;
            (L4::Tcp, t.header_len())
        }
        ip_protocol::UDP => {
            UdpPacket::new_checked(&frame[l4_off..]).map_err(|_| OffloadError::Truncated)?;
            (L4::Udp, UDP_HEADER_LEN)
        }
        _ => return Err(OffloadError::Unsupported),
    };
    // A 64 KB TSO frame's IP length field may say 0 (or be stale); trust the frame then.
    let ip_end = if ip_len >= l3_len + l4_len && l2 + ip_len <= frame.len() {
        l2 + ip_len
    } else {
        frame.len()
    };
    Ok(Layout {
        l2_len: l2,
        l3,
        l3_len,
        l4,
        l4_len,
        ip_end,
    })
}

/// The length an IPv4/IPv6 frame's own headers claim for it (L2 header plus the IP length
/// field), whatever the buffer holds; `None` for other frames. Only the length field must be
/// there: a datagram cut short still says how long it was meant to be.
pub fn claimed_frame_len(frame: &[u8]) -> Option<usize> {
    let (l2, et) = EthernetFrame::new_unchecked(frame).network_header().ok()?;
    let ip = &frame[l2..];
    match et {
        ethertype::IPV4 if ip.len() >= 4 => {
            let p = Ipv4Packet::new_unchecked(ip);
            (p.version() == 4).then(|| l2 + p.total_len() as usize)
        }
        ethertype::IPV6 if ip.len() >= 6 => {
            let p = Ipv6Packet::new_unchecked(ip);
            (p.version() == 6).then(|| l2 + IPV6_HEADER_LEN + p.payload_len() as usize)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The header finder as it was before the views (raw offsets), kept as the reference the
    /// views must agree with on any input.
    fn parse_l3l4_raw(frame: &[u8]) -> Result<Layout, OffloadError> {
        if frame.len() < 14 {
            return Err(OffloadError::Truncated);
        }
        let mut l2 = 14;
        let mut et = u16::from_be_bytes([frame[12], frame[13]]);
        if et == 0x8100 {
            if frame.len() < 18 {
                return Err(OffloadError::Truncated);
            }
            et = u16::from_be_bytes([frame[16], frame[17]]);
            l2 = 18;
        }
        let ip = frame.get(l2..).ok_or(OffloadError::Truncated)?;
        let (l3, l3_len, proto, ip_len) = match et {
            0x0800 => {
                if ip.len() < 20 || ip[0] >> 4 != 4 {
                    return Err(OffloadError::Truncated);
                }
                let ihl = (ip[0] & 0x0f) as usize * 4;
                let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
                let frag = u16::from_be_bytes([ip[6], ip[7]]);
                if ihl < 20 || frag & 0x3fff != 0 {
                    return Err(OffloadError::Unsupported);
                }
                (L3::V4, ihl, ip[9], total)
            }
            0x86dd => {
                if ip.len() < 40 || ip[0] >> 4 != 6 {
                    return Err(OffloadError::Truncated);
                }
                let payload = u16::from_be_bytes([ip[4], ip[5]]) as usize;
                (L3::V6, 40, ip[6], 40 + payload)
            }
            _ => return Err(OffloadError::Unsupported),
        };
        let (l4, l4_min) = match proto {
            6 => (L4::Tcp, 20),
            17 => (L4::Udp, 8),
            _ => return Err(OffloadError::Unsupported),
        };
        let l4_off = l2 + l3_len;
        if frame.len() < l4_off + l4_min {
            return Err(OffloadError::Truncated);
        }
        let l4_len = match l4 {
            L4::Tcp => (frame[l4_off + 12] >> 4) as usize * 4,
            L4::Udp => 8,
        };
        if l4_len < l4_min || frame.len() < l4_off + l4_len {
            return Err(OffloadError::Truncated);
        }
        let ip_end = if ip_len >= l3_len + l4_len && l2 + ip_len <= frame.len() {
            l2 + ip_len
        } else {
            frame.len()
        };
        Ok(Layout {
            l2_len: l2,
            l3,
            l3_len,
            l4,
            l4_len,
            ip_end,
        })
    }

    /// Frames that reach every branch: an Ethernet header (tagged or not) with IPv4/IPv6 and
    /// TCP/UDP headers whose bytes are arbitrary, cut anywhere.
    fn frame_strategy() -> impl Strategy<Value = Vec<u8>> {
        (
            any::<bool>(),
            prop_oneof![Just(0x0800u16), Just(0x86dd), any::<u16>()],
            prop_oneof![Just(0x45u8), Just(0x46), Just(0x60), any::<u8>()],
            prop_oneof![Just(6u8), Just(17), any::<u8>()],
            proptest::collection::vec(any::<u8>(), 0..120),
            any::<usize>(),
        )
            .prop_map(|(tag, et, v, proto, rest, cut)| {
                let mut f = vec![0x52u8; 12];
                if tag {
                    f.extend_from_slice(&[0x81, 0x00, 0, 5]);
                }
                f.extend_from_slice(&et.to_be_bytes());
                f.push(v);
                f.extend_from_slice(&rest);
                let p = f.len() - 1 - rest.len();
                // the protocol / next-header byte, where IPv4 and IPv6 keep it
                let at = if v >> 4 == 6 { p + 6 } else { p + 9 };
                if at < f.len() {
                    f[at] = proto;
                }
                if v >> 4 == 4 && p + 7 < f.len() && rest.first().is_some_and(|b| b & 1 == 0) {
                    f[p + 6] &= 0x40; // mostly unfragmented
                    f[p + 7] = 0;
                }
                // often an honest IP length (sometimes with Ethernet padding after it), so the
                // packet's end is found from it
                if cut % 3 == 0 {
                    let ip_len = (f.len() - p).saturating_sub(cut / 3 % 4);
                    match v >> 4 {
                        4 if f.len() >= p + 4 => {
                            f[p + 2..p + 4].copy_from_slice(&(ip_len as u16).to_be_bytes())
                        }
                        6 if f.len() >= p + 6 => f[p + 4..p + 6]
                            .copy_from_slice(&(ip_len.saturating_sub(40) as u16).to_be_bytes()),
                        _ => {}
                    }
                }
                if cut % 2 == 1 {
                    let n = f.len();
                    f.truncate(cut / 2 % (n + 1));
                }
                f
            })
    }

    proptest! {
        #[test]
        fn agrees_with_the_raw_offsets(f in frame_strategy()) {
            prop_assert_eq!(parse_l3l4(&f).ok(), parse_l3l4_raw(&f).ok());
            if let (Ok(a), Ok(b)) = (parse_l3l4(&f), parse_l3l4_raw(&f)) {
                prop_assert_eq!(a, b);
            }
            if let Ok(l) = parse_l3l4(&f) {
                let raw = match l.l3 {
                    L3::V4 => {
                        let s = crate::sum(&f[l.l2_len + 12..l.l2_len + 20], 0);
                        s + l.proto() as u64 + 1000
                    }
                    L3::V6 => crate::sum(&f[l.l2_len + 8..l.l2_len + 40], 0) + l.proto() as u64 + 1000,
                };
                prop_assert_eq!(crate::fold(l.pseudo_sum(&f, 1000)), crate::fold(raw));
                let co = l.l4_off() + l.csum_offset();
                prop_assert_eq!(l.l4_checksum(&f), u16::from_be_bytes([f[co], f[co + 1]]));
            }
        }

        #[test]
        fn the_same_error_kind_as_the_raw_offsets(f in frame_strategy()) {
            // Only the order of two checks differs: an IPv4 fragment whose IHL runs past the
            // buffer was `Unsupported` and is now `Truncated` (both mean BadOffload upstream).
            if let (Err(a), Err(b)) = (parse_l3l4(&f), parse_l3l4_raw(&f)) {
                let frag_past_end = b == OffloadError::Unsupported && a == OffloadError::Truncated;
                prop_assert!(a == b || frag_past_end, "{:?} vs {:?}", a, b);
            }
        }
    }

    #[test]
    fn garbage_is_refused_and_a_padded_datagram_ends_at_its_ip_length() {
        assert_eq!(parse_l3l4(&[0xffu8; 42]), Err(OffloadError::Unsupported));
        // An empty UDP datagram padded to the Ethernet minimum: the IP length ends it.
        let mut padded = vec![0u8; 60];
        padded[12..14].copy_from_slice(&[0x08, 0x00]);
        padded[14] = 0x45;
        padded[16..18].copy_from_slice(&28u16.to_be_bytes());
        padded[23] = 17;
        let l = parse_l3l4(&padded).unwrap();
        assert_eq!((l.l4, l.hdr_len(), l.ip_end), (L4::Udp, 42, 42));
        assert_eq!(parse_l3l4_raw(&padded), Ok(l));
    }
}
