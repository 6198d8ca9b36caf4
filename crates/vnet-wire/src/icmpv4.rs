//! ICMP for IPv4 (RFC 792): the view and the repr of the messages vnet builds for a guest,
//! above all "destination unreachable, fragmentation needed" (RFC 1191), which tells a guest
//! that a frame it sent with DF does not fit the path (issue 31: no silent black hole when the
//! path MTU shrinks, as the Linux kernel's VXLAN does), and echo, for tests and probes.

use crate::checksum::checksum;
use crate::field::{set_u16, u16_at};
use crate::{need, WireError};

pub const ICMPV4_HEADER_LEN: usize = 8;
/// The most of the invoking datagram an error quotes: as much as keeps the whole ICMP packet
/// within 576 bytes (RFC 1812 section 4.3.2.3), as Linux does.
pub const ICMPV4_ERROR_QUOTE_MAX: usize = 576 - 20 - ICMPV4_HEADER_LEN;

/// Message types.
pub mod icmpv4_type {
    pub const ECHO_REPLY: u8 = 0;
    pub const DST_UNREACHABLE: u8 = 3;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
}

/// Codes of "destination unreachable".
pub mod icmpv4_code {
    pub const NET_UNREACHABLE: u8 = 0;
    pub const HOST_UNREACHABLE: u8 = 1;
    pub const PROTO_UNREACHABLE: u8 = 2;
    pub const PORT_UNREACHABLE: u8 = 3;
    /// Fragmentation needed and DF set: the next-hop MTU is in bytes 6-7 (RFC 1191).
    pub const FRAG_NEEDED: u8 = 4;
}

/// A view of an ICMPv4 message.
#[derive(Debug, Clone, Copy)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Icmpv4Packet { buf }
    }

    /// The buffer holds the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        need(buf.as_ref().len(), ICMPV4_HEADER_LEN)?;
        Ok(Icmpv4Packet { buf })
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn msg_type(&self) -> u8 {
        self.buf.as_ref()[0]
    }

    pub fn msg_code(&self) -> u8 {
        self.buf.as_ref()[1]
    }

    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), 2)
    }

    /// Echo: the identifier.
    pub fn echo_ident(&self) -> u16 {
        u16_at(self.buf.as_ref(), 4)
    }

    /// Echo: the sequence number.
    pub fn echo_seq_no(&self) -> u16 {
        u16_at(self.buf.as_ref(), 6)
    }

    /// "Fragmentation needed": the MTU of the next hop.
    pub fn next_hop_mtu(&self) -> u16 {
        u16_at(self.buf.as_ref(), 6)
    }

    /// Whether the checksum over the whole buffer (the message) verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum(self.buf.as_ref()) == 0
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[ICMPV4_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    pub fn set_msg_type(&mut self, v: u8) {
        self.buf.as_mut()[0] = v;
    }

    pub fn set_msg_code(&mut self, v: u8) {
        self.buf.as_mut()[1] = v;
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 2, v);
    }

    /// Bytes 4-7, whose meaning depends on the type (echo: identifier and sequence number;
    /// "fragmentation needed": unused and the next-hop MTU).
    pub fn set_rest_of_header(&mut self, hi: u16, lo: u16) {
        set_u16(self.buf.as_mut(), 4, hi);
        set_u16(self.buf.as_mut(), 6, lo);
    }

    /// Computes the checksum over the whole buffer and writes it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum(self.buf.as_ref());
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[ICMPV4_HEADER_LEN..]
    }
}

/// The ICMPv4 messages vnet reads and builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    EchoRequest {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    EchoReply {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    /// Destination unreachable with `code`; for [`icmpv4_code::FRAG_NEEDED`], `next_hop_mtu`
    /// is the MTU that was exceeded (else 0). `data` is the start of the datagram that could
    /// not be delivered: its IP header and at least 8 bytes of its payload.
    DstUnreachable {
        code: u8,
        next_hop_mtu: u16,
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// "Fragmentation needed and DF set" for the IPv4 packet `invoking` (from its header on),
    /// which did not fit `mtu`: it quotes as much of the packet as RFC 1812 allows.
    pub fn frag_needed(invoking: &'a [u8], mtu: u16) -> Icmpv4Repr<'a> {
        Icmpv4Repr::DstUnreachable {
            code: icmpv4_code::FRAG_NEEDED,
            next_hop_mtu: mtu,
            data: &invoking[..invoking.len().min(ICMPV4_ERROR_QUOTE_MAX)],
        }
    }

    /// Reads a message whose checksum verifies; types other than the three are `Unsupported`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &Icmpv4Packet<&'a T>,
    ) -> Result<Icmpv4Repr<'a>, WireError> {
        let b: &'a [u8] = T::as_ref(p.buf);
        need(b.len(), ICMPV4_HEADER_LEN)?;
        if !p.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        let data = &b[ICMPV4_HEADER_LEN..];
        match (p.msg_type(), p.msg_code()) {
            (icmpv4_type::ECHO_REQUEST, 0) => Ok(Icmpv4Repr::EchoRequest {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            (icmpv4_type::ECHO_REPLY, 0) => Ok(Icmpv4Repr::EchoReply {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            (icmpv4_type::DST_UNREACHABLE, code) if code <= 15 => Ok(Icmpv4Repr::DstUnreachable {
                code,
                next_hop_mtu: if code == icmpv4_code::FRAG_NEEDED {
                    p.next_hop_mtu()
                } else {
                    0
                },
                data,
            }),
            _ => Err(WireError::Unsupported("ICMPv4 message type")),
        }
    }

    fn data(&self) -> &'a [u8] {
        match *self {
            Icmpv4Repr::EchoRequest { data, .. }
            | Icmpv4Repr::EchoReply { data, .. }
            | Icmpv4Repr::DstUnreachable { data, .. } => data,
        }
    }

    pub fn buffer_len(&self) -> usize {
        ICMPV4_HEADER_LEN + self.data().len()
    }

    /// Writes the message into the first [`Self::buffer_len`] bytes of the buffer, checksum
    /// included. A buffer shorter than that is `Truncated`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Icmpv4Packet<T>,
    ) -> Result<(), WireError> {
        let n = self.buffer_len();
        need(p.buf.as_ref().len(), n)?;
        let mut m = Icmpv4Packet::new_unchecked(&mut p.buf.as_mut()[..n]);
        let (ty, code, hi, lo) = match *self {
            Icmpv4Repr::EchoRequest { ident, seq_no, .. } => {
                (icmpv4_type::ECHO_REQUEST, 0, ident, seq_no)
            }
            Icmpv4Repr::EchoReply { ident, seq_no, .. } => {
                (icmpv4_type::ECHO_REPLY, 0, ident, seq_no)
            }
            Icmpv4Repr::DstUnreachable {
                code, next_hop_mtu, ..
            } => (icmpv4_type::DST_UNREACHABLE, code, 0, next_hop_mtu),
        };
        m.set_msg_type(ty);
        m.set_msg_code(code);
        m.set_rest_of_header(hi, lo);
        m.payload_mut().copy_from_slice(self.data());
        m.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::l3;
    use crate::{ip_protocol, Ipv4Packet, Ipv4Repr};
    use proptest::prelude::*;

    #[test]
    fn builds_the_kernels_fragmentation_needed() {
        // A sent 1400 bytes of UDP with DF; R's next hop has MTU 1280.
        let sent = l3("udp4_df_1400");
        let got = l3("icmp4_frag_needed");
        let ip = Ipv4Packet::new_checked(&got[..]).unwrap();
        assert_eq!(ip.protocol(), ip_protocol::ICMP);
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        let r = Icmpv4Repr::parse(&icmp).unwrap();
        assert_eq!(r, Icmpv4Repr::frag_needed(&sent, 1280));
        // Byte for byte what the kernel sent, checksum included.
        let mut ours = vec![0u8; r.buffer_len()];
        r.emit(&mut Icmpv4Packet::new_unchecked(&mut ours[..]))
            .unwrap();
        assert_eq!(ours, ip.payload());
        assert_eq!(ip.total_len(), 576);
    }

    #[test]
    fn builds_the_kernels_port_unreachable() {
        // B received A's datagram after R (TTL 63) and quoted all of it.
        let mut quoted = l3("udp4_small");
        let mut q = Ipv4Packet::new_checked(&mut quoted[..]).unwrap();
        q.set_hop_limit(63);
        q.fill_checksum();
        let got = l3("icmp4_port_unreachable");
        let ip = Ipv4Packet::new_checked(&got[..]).unwrap();
        let r = Icmpv4Repr::DstUnreachable {
            code: icmpv4_code::PORT_UNREACHABLE,
            next_hop_mtu: 0,
            data: &quoted,
        };
        assert_eq!(
            Icmpv4Repr::parse(&Icmpv4Packet::new_checked(ip.payload()).unwrap()),
            Ok(r)
        );
        let mut ours = vec![0u8; r.buffer_len()];
        r.emit(&mut Icmpv4Packet::new_unchecked(&mut ours[..]))
            .unwrap();
        assert_eq!(ours, ip.payload());
    }

    #[test]
    fn a_whole_error_frame_for_a_guest() {
        // What issue 31 sends back: Ethernet, IPv4 from the gateway, the ICMP error.
        let sent = l3("udp4_df_1400");
        let guest = Ipv4Packet::new_checked(&sent[..]).unwrap();
        let icmp = Icmpv4Repr::frag_needed(&sent, 1230);
        let ip = Ipv4Repr {
            src_addr: guest.dst_addr(),
            dst_addr: guest.src_addr(),
            protocol: ip_protocol::ICMP,
            payload_len: icmp.buffer_len(),
            hop_limit: 64,
        };
        let mut b = vec![0u8; ip.buffer_len()];
        let mut p = Ipv4Packet::new_unchecked(&mut b[..]);
        ip.emit(&mut p);
        icmp.emit(&mut Icmpv4Packet::new_unchecked(p.payload_mut()))
            .unwrap();
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Ok(ip));
        let m = Icmpv4Packet::new_checked(p.payload()).unwrap();
        assert!(m.verify_checksum());
        assert_eq!(m.next_hop_mtu(), 1230);
        assert_eq!(b.len(), 576);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(Icmpv4Packet::new_checked(&[3u8, 4, 0, 0, 0, 0, 5][..]).is_err());
        let got = l3("icmp4_frag_needed");
        let mut m = got[20..].to_vec();
        m[40] ^= 1;
        assert_eq!(
            Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&m[..]).unwrap()),
            Err(WireError::BadChecksum)
        );
        let mut redirect = [5u8, 0, 0, 0, 0, 0, 0, 0];
        Icmpv4Packet::new_unchecked(&mut redirect[..]).fill_checksum();
        assert!(matches!(
            Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&redirect[..]).unwrap()),
            Err(WireError::Unsupported(_))
        ));
        let r = Icmpv4Repr::EchoRequest {
            ident: 1,
            seq_no: 2,
            data: b"abc",
        };
        let mut short = [0u8; 10];
        assert!(r
            .emit(&mut Icmpv4Packet::new_unchecked(&mut short[..]))
            .is_err());
    }

    proptest! {
        #[test]
        fn roundtrip(kind in 0u8..3, a in any::<u16>(), b in any::<u16>(), code in 0u8..16,
                     data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let r = match kind {
                0 => Icmpv4Repr::EchoRequest { ident: a, seq_no: b, data: &data },
                1 => Icmpv4Repr::EchoReply { ident: a, seq_no: b, data: &data },
                _ => Icmpv4Repr::DstUnreachable {
                    code,
                    next_hop_mtu: if code == icmpv4_code::FRAG_NEEDED { b } else { 0 },
                    data: &data,
                },
            };
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv4Packet::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&buf[..]).unwrap()), Ok(r));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = Icmpv4Packet::new_checked(&b[..]) {
                let _ = (p.msg_type(), p.msg_code(), p.checksum(), p.echo_ident(),
                         p.next_hop_mtu(), p.payload().len());
                let _ = Icmpv4Repr::parse(&p);
            }
        }
    }
}
