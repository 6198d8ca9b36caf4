//! IPv6 headers (RFC 8200): the view the offloads read and rewrite (the payload length of
//! every segment they cut or merge) and the repr ICMPv6 errors for guests are sent in.
//! Extension headers are not walked: a packet whose next header is not the upper layer is
//! something the callers leave alone.

use std::net::Ipv6Addr;

use crate::checksum::sum;
use crate::field::{set_u16, set_u32, u16_at, u32_at};
use crate::{need, WireError};

pub const IPV6_HEADER_LEN: usize = 40;
/// Every IPv6 link carries packets of this size (RFC 8200 section 5).
pub const IPV6_MIN_MTU: usize = 1280;

/// A view of an IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Ipv6Packet { buf }
    }

    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buf);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds the fixed header, of version 6. The payload length is not held
    /// against the buffer (see [`Ipv6Packet::payload`]).
    pub fn check_len(&self) -> Result<(), WireError> {
        need(self.buf.as_ref().len(), IPV6_HEADER_LEN)?;
        match self.version() {
            6 => Ok(()),
            got => Err(WireError::BadIpVersion { got, want: 6 }),
        }
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn version(&self) -> u8 {
        self.buf.as_ref()[0] >> 4
    }

    pub fn traffic_class(&self) -> u8 {
        (u16_at(self.buf.as_ref(), 0) >> 4) as u8
    }

    pub fn flow_label(&self) -> u32 {
        u32_at(self.buf.as_ref(), 0) & 0x000f_ffff
    }

    pub fn payload_len(&self) -> u16 {
        u16_at(self.buf.as_ref(), 4)
    }

    pub fn next_header(&self) -> u8 {
        self.buf.as_ref()[6]
    }

    pub fn hop_limit(&self) -> u8 {
        self.buf.as_ref()[7]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf.as_ref()[8..24]);
        Ipv6Addr::from(a)
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf.as_ref()[24..40]);
        Ipv6Addr::from(a)
    }

    /// The running sum of the pseudo-header of this packet's upper-layer message of `l4_len`
    /// bytes, whose protocol is the next header (see [`crate::checksum`]).
    /// Sums the address bytes in place (the offloads call this per segment).
    pub fn pseudo_header_sum(&self, l4_len: usize) -> u64 {
        let l = l4_len as u64;
        sum(&self.buf.as_ref()[8..40], 0) + self.next_header() as u64 + (l & 0xffff) + (l >> 16)
    }

    /// The bytes after the fixed header, as many as the payload length says, or to the
    /// buffer's end when it says more than the buffer holds.
    pub fn payload(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let end = (IPV6_HEADER_LEN + self.payload_len() as usize).min(b.len());
        &b[IPV6_HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Version 6, the traffic class and the flow label in one.
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let v = (6 << 28) | ((traffic_class as u32) << 20) | (flow_label & 0x000f_ffff);
        set_u32(self.buf.as_mut(), 0, v);
    }

    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 4, v);
    }

    pub fn set_next_header(&mut self, v: u8) {
        self.buf.as_mut()[6] = v;
    }

    pub fn set_hop_limit(&mut self, v: u8) {
        self.buf.as_mut()[7] = v;
    }

    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buf.as_mut()[8..24].copy_from_slice(&a.octets());
    }

    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buf.as_mut()[24..40].copy_from_slice(&a.octets());
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[IPV6_HEADER_LEN..]
    }
}

/// An IPv6 header (traffic class and flow label zero on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src_addr: Ipv6Addr,
    pub dst_addr: Ipv6Addr,
    pub next_header: u8,
    pub payload_len: usize,
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Reads a packet whose payload length fits the buffer.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Ipv6Repr, WireError> {
        p.check_len()?;
        let len = p.buf.as_ref().len();
        let field = p.payload_len() as usize;
        if IPV6_HEADER_LEN + field > len {
            return Err(WireError::BadLength { field, len });
        }
        Ok(Ipv6Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: field,
            hop_limit: p.hop_limit(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN + self.payload_len
    }

    /// Writes the 40-byte header (the buffer holds at least that; `payload_len` fits 16 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv6Packet<T>) {
        p.set_version_class_flow(0, 0);
        p.set_payload_len(self.payload_len as u16);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip_protocol;
    use crate::vectors::l3;
    use proptest::prelude::*;

    #[test]
    fn reads_the_kernels_header() {
        let b = l3("udp6_1400");
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!((p.traffic_class(), p.flow_label()), (0, 0x4ca22));
        assert_eq!(p.payload_len(), 1408);
        assert_eq!((p.next_header(), p.hop_limit()), (ip_protocol::UDP, 64));
        assert_eq!(p.src_addr(), "fd99:1::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "fd99:2::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.payload().len(), 1408);
        assert_eq!(
            crate::checksum::fold(p.pseudo_header_sum(1408)),
            crate::checksum::fold(crate::checksum::pseudo_header_v6(
                p.src_addr(),
                p.dst_addr(),
                ip_protocol::UDP,
                1408
            ))
        );
        let r = Ipv6Repr::parse(&p).unwrap();
        let mut again = [0u8; 40];
        r.emit(&mut Ipv6Packet::new_unchecked(&mut again[..]));
        // The same but the flow label, which the repr leaves zero.
        assert_eq!(again[4..], b[4..40]);
        assert_eq!(again[..4], [0x60, 0, 0, 0]);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let b = l3("udp6_1400");
        assert!(Ipv6Packet::new_checked(&b[..39]).is_err());
        let mut v4 = b.clone();
        v4[0] = 0x45;
        assert_eq!(
            Ipv6Packet::new_checked(&v4[..]).unwrap_err(),
            WireError::BadIpVersion { got: 4, want: 6 }
        );
        let cut = Ipv6Packet::new_checked(&b[..100]).unwrap();
        assert_eq!(cut.payload().len(), 60);
        assert_eq!(
            Ipv6Repr::parse(&cut),
            Err(WireError::BadLength {
                field: 1408,
                len: 100
            })
        );
    }

    proptest! {
        #[test]
        fn roundtrip(src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(), nh in any::<u8>(),
                     hop in any::<u8>(), payload_len in 0usize..200) {
            let r = Ipv6Repr {
                src_addr: src.into(), dst_addr: dst.into(), next_header: nh, payload_len,
                hop_limit: hop,
            };
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Ipv6Packet::new_unchecked(&mut b[..]));
            prop_assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&b[..]).unwrap()), Ok(r));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Ipv6Packet::new_checked(&b[..]) {
                let _ = (p.traffic_class(), p.flow_label(), p.src_addr(), p.dst_addr(),
                         p.payload().len(), p.pseudo_header_sum(8));
                let _ = Ipv6Repr::parse(&p);
            }
        }
    }
}
