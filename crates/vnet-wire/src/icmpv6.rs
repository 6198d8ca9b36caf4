//! ICMPv6 (RFC 4443): the view and the repr of the messages vnet builds for a guest, above all
//! "packet too big", which tells a guest that a frame it sent does not fit the path (issue 31;
//! IPv6 routers never fragment, so without it a shrunk path MTU is a black hole), and echo.
//! The checksum covers an IPv6 pseudo-header, so parse and emit take both addresses.

use std::net::Ipv6Addr;

use crate::checksum::{checksum_with, fold, pseudo_header_v6, sum};
use crate::field::{set_u16, set_u32, u16_at, u32_at};
use crate::{ip_protocol, need, WireError, IPV6_MIN_MTU};

pub const ICMPV6_HEADER_LEN: usize = 8;
/// The most of the invoking packet an error quotes: as much as keeps the whole packet within
/// the minimum IPv6 MTU (RFC 4443 section 2.4 (c)), as Linux does.
pub const ICMPV6_ERROR_QUOTE_MAX: usize = IPV6_MIN_MTU - 40 - ICMPV6_HEADER_LEN;

/// Message types.
pub mod icmpv6_type {
    pub const DST_UNREACHABLE: u8 = 1;
    pub const PKT_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAM_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
}

/// Codes of "destination unreachable".
pub mod icmpv6_code {
    pub const NO_ROUTE: u8 = 0;
    pub const ADMIN_PROHIBITED: u8 = 1;
    pub const ADDR_UNREACHABLE: u8 = 3;
    pub const PORT_UNREACHABLE: u8 = 4;
}

/// A view of an ICMPv6 message.
#[derive(Debug, Clone, Copy)]
pub struct Icmpv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Icmpv6Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Icmpv6Packet { buf }
    }

    /// The buffer holds the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        need(buf.as_ref().len(), ICMPV6_HEADER_LEN)?;
        Ok(Icmpv6Packet { buf })
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

    /// "Packet too big": the MTU of the next hop.
    pub fn pkt_too_big_mtu(&self) -> u32 {
        u32_at(self.buf.as_ref(), 4)
    }

    /// Echo: the identifier.
    pub fn echo_ident(&self) -> u16 {
        u16_at(self.buf.as_ref(), 4)
    }

    /// Echo: the sequence number.
    pub fn echo_seq_no(&self) -> u16 {
        u16_at(self.buf.as_ref(), 6)
    }

    /// Whether the checksum over the whole buffer (the message) verifies under the
    /// pseudo-header of `src` and `dst`.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let b = self.buf.as_ref();
        let pseudo = pseudo_header_v6(src, dst, ip_protocol::ICMPV6, b.len() as u32);
        fold(sum(b, pseudo)) == 0xffff
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[ICMPV6_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv6Packet<T> {
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
    /// "packet too big": the MTU; errors otherwise: unused).
    pub fn set_rest_of_header(&mut self, v: u32) {
        set_u32(self.buf.as_mut(), 4, v);
    }

    /// Computes the checksum over the whole buffer under the pseudo-header of `src` and
    /// `dst` and writes it.
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let b = self.buf.as_ref();
        let pseudo = pseudo_header_v6(src, dst, ip_protocol::ICMPV6, b.len() as u32);
        let c = checksum_with(pseudo, b);
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[ICMPV6_HEADER_LEN..]
    }
}

/// The ICMPv6 messages vnet reads and builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv6Repr<'a> {
    /// Destination unreachable with `code`; `data` is the start of the packet that could not
    /// be delivered.
    DstUnreachable { code: u8, data: &'a [u8] },
    /// The packet that starts with `data` did not fit the next hop's `mtu`.
    PktTooBig { mtu: u32, data: &'a [u8] },
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
}

impl<'a> Icmpv6Repr<'a> {
    /// "Packet too big" for the IPv6 packet `invoking` (from its header on), which did not fit
    /// `mtu`: it quotes as much of the packet as RFC 4443 allows.
    pub fn packet_too_big(invoking: &'a [u8], mtu: u32) -> Icmpv6Repr<'a> {
        Icmpv6Repr::PktTooBig {
            mtu,
            data: &invoking[..invoking.len().min(ICMPV6_ERROR_QUOTE_MAX)],
        }
    }

    /// Reads a message from `src` to `dst` whose checksum verifies; other types are
    /// `Unsupported`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        src: Ipv6Addr,
        dst: Ipv6Addr,
        p: &Icmpv6Packet<&'a T>,
    ) -> Result<Icmpv6Repr<'a>, WireError> {
        let b: &'a [u8] = T::as_ref(p.buf);
        need(b.len(), ICMPV6_HEADER_LEN)?;
        if !p.verify_checksum(src, dst) {
            return Err(WireError::BadChecksum);
        }
        let data = &b[ICMPV6_HEADER_LEN..];
        match (p.msg_type(), p.msg_code()) {
            (icmpv6_type::DST_UNREACHABLE, code) if code <= 7 => {
                Ok(Icmpv6Repr::DstUnreachable { code, data })
            }
            (icmpv6_type::PKT_TOO_BIG, 0) => Ok(Icmpv6Repr::PktTooBig {
                mtu: p.pkt_too_big_mtu(),
                data,
            }),
            (icmpv6_type::ECHO_REQUEST, 0) => Ok(Icmpv6Repr::EchoRequest {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            (icmpv6_type::ECHO_REPLY, 0) => Ok(Icmpv6Repr::EchoReply {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            _ => Err(WireError::Unsupported("ICMPv6 message type")),
        }
    }

    fn data(&self) -> &'a [u8] {
        match *self {
            Icmpv6Repr::DstUnreachable { data, .. }
            | Icmpv6Repr::PktTooBig { data, .. }
            | Icmpv6Repr::EchoRequest { data, .. }
            | Icmpv6Repr::EchoReply { data, .. } => data,
        }
    }

    pub fn buffer_len(&self) -> usize {
        ICMPV6_HEADER_LEN + self.data().len()
    }

    /// Writes the message from `src` to `dst` into the first [`Self::buffer_len`] bytes of
    /// the buffer, checksum included. A buffer shorter than that is `Truncated`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        p: &mut Icmpv6Packet<T>,
    ) -> Result<(), WireError> {
        let n = self.buffer_len();
        need(p.buf.as_ref().len(), n)?;
        let mut m = Icmpv6Packet::new_unchecked(&mut p.buf.as_mut()[..n]);
        let (ty, code, rest) = match *self {
            Icmpv6Repr::DstUnreachable { code, .. } => (icmpv6_type::DST_UNREACHABLE, code, 0),
            Icmpv6Repr::PktTooBig { mtu, .. } => (icmpv6_type::PKT_TOO_BIG, 0, mtu),
            Icmpv6Repr::EchoRequest { ident, seq_no, .. } => (
                icmpv6_type::ECHO_REQUEST,
                0,
                (ident as u32) << 16 | seq_no as u32,
            ),
            Icmpv6Repr::EchoReply { ident, seq_no, .. } => (
                icmpv6_type::ECHO_REPLY,
                0,
                (ident as u32) << 16 | seq_no as u32,
            ),
        };
        m.set_msg_type(ty);
        m.set_msg_code(code);
        m.set_rest_of_header(rest);
        m.payload_mut().copy_from_slice(self.data());
        m.fill_checksum(src, dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::l3;
    use crate::{Ipv6Packet, Ipv6Repr};
    use proptest::prelude::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn builds_the_kernels_packet_too_big() {
        // A sent 1400 bytes of UDP to fd99:2::1; R's next hop has MTU 1280.
        let sent = l3("udp6_1400");
        let got = l3("icmp6_packet_too_big");
        let ip = Ipv6Packet::new_checked(&got[..]).unwrap();
        assert_eq!(ip.next_header(), ip_protocol::ICMPV6);
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        assert_eq!((src, dst), (a("fd99:1::2"), a("fd99:1::1")));
        let m = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        let r = Icmpv6Repr::parse(src, dst, &m).unwrap();
        assert_eq!(r, Icmpv6Repr::packet_too_big(&sent, 1280));
        let mut ours = vec![0u8; r.buffer_len()];
        r.emit(src, dst, &mut Icmpv6Packet::new_unchecked(&mut ours[..]))
            .unwrap();
        assert_eq!(
            ours,
            ip.payload(),
            "byte for byte the kernel's, checksum included"
        );
        assert_eq!(got.len(), IPV6_MIN_MTU);
        // The kernel's neighbour advertisement verifies too (another type: not read here).
        let na = l3("ndp_advert");
        let ip = Ipv6Packet::new_checked(&na[..]).unwrap();
        let m = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        assert!(m.verify_checksum(ip.src_addr(), ip.dst_addr()));
        assert!(matches!(
            Icmpv6Repr::parse(ip.src_addr(), ip.dst_addr(), &m),
            Err(WireError::Unsupported(_))
        ));
    }

    #[test]
    fn a_whole_error_packet_for_a_guest() {
        let sent = l3("udp6_1400");
        let guest = Ipv6Packet::new_checked(&sent[..]).unwrap();
        let icmp = Icmpv6Repr::packet_too_big(&sent, 1230);
        let ip = Ipv6Repr {
            src_addr: a("fd99:2::fe"),
            dst_addr: guest.src_addr(),
            next_header: ip_protocol::ICMPV6,
            payload_len: icmp.buffer_len(),
            hop_limit: 64,
        };
        let mut b = vec![0u8; ip.buffer_len()];
        let mut p = Ipv6Packet::new_unchecked(&mut b[..]);
        ip.emit(&mut p);
        icmp.emit(
            ip.src_addr,
            ip.dst_addr,
            &mut Icmpv6Packet::new_unchecked(p.payload_mut()),
        )
        .unwrap();
        assert_eq!(b.len(), IPV6_MIN_MTU);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        let m = Icmpv6Packet::new_checked(p.payload()).unwrap();
        assert_eq!(Icmpv6Repr::parse(p.src_addr(), p.dst_addr(), &m), Ok(icmp));
        // The checksum covers the addresses: from elsewhere it does not verify.
        assert!(!m.verify_checksum(a("fd99:2::fd"), p.dst_addr()));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(Icmpv6Packet::new_checked(&[2u8, 0, 0][..]).is_err());
        let got = l3("icmp6_packet_too_big");
        let mut m = got[40..].to_vec();
        m[100] ^= 1;
        assert_eq!(
            Icmpv6Repr::parse(
                a("fd99:1::2"),
                a("fd99:1::1"),
                &Icmpv6Packet::new_checked(&m[..]).unwrap()
            ),
            Err(WireError::BadChecksum)
        );
        let r = Icmpv6Repr::EchoReply {
            ident: 1,
            seq_no: 2,
            data: b"abc",
        };
        let mut short = [0u8; 10];
        assert!(r
            .emit(
                a("::1"),
                a("::1"),
                &mut Icmpv6Packet::new_unchecked(&mut short[..])
            )
            .is_err());
    }

    proptest! {
        #[test]
        fn roundtrip(kind in 0u8..4, x in any::<u32>(), code in 0u8..8, src in any::<[u8; 16]>(),
                     dst in any::<[u8; 16]>(), data in proptest::collection::vec(any::<u8>(), 0..80)) {
            let (ident, seq_no) = ((x >> 16) as u16, x as u16);
            let r = match kind {
                0 => Icmpv6Repr::DstUnreachable { code, data: &data },
                1 => Icmpv6Repr::PktTooBig { mtu: x, data: &data },
                2 => Icmpv6Repr::EchoRequest { ident, seq_no, data: &data },
                _ => Icmpv6Repr::EchoReply { ident, seq_no, data: &data },
            };
            let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(src, dst, &mut Icmpv6Packet::new_unchecked(&mut buf[..])).unwrap();
            let p = Icmpv6Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Icmpv6Repr::parse(src, dst, &p), Ok(r));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = Icmpv6Packet::new_checked(&b[..]) {
                let _ = (p.msg_type(), p.msg_code(), p.checksum(), p.pkt_too_big_mtu(),
                         p.echo_ident(), p.echo_seq_no(), p.payload().len());
                let _ = Icmpv6Repr::parse(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, &p);
            }
        }
    }
}
