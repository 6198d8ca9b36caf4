//! UDP headers (RFC 768): the view the offloads read and rewrite (a UDP GSO segment's length
//! and checksum). The length field is not held against the buffer by `new_checked`, for the
//! same reason as IPv4's total length (a large segment's may be stale); [`UdpRepr::parse`]
//! holds it.

use crate::checksum::{fold, sum};
use crate::field::{set_u16, u16_at};
use crate::{need, WireError};

pub const UDP_HEADER_LEN: usize = 8;

/// A view of a UDP datagram.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        UdpPacket { buf }
    }

    /// The buffer holds the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        need(buf.as_ref().len(), UDP_HEADER_LEN)?;
        Ok(UdpPacket { buf })
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn src_port(&self) -> u16 {
        u16_at(self.buf.as_ref(), 0)
    }

    pub fn dst_port(&self) -> u16 {
        u16_at(self.buf.as_ref(), 2)
    }

    /// The length field: header and payload.
    pub fn len(&self) -> u16 {
        u16_at(self.buf.as_ref(), 4)
    }

    pub fn is_empty(&self) -> bool {
        self.len() as usize <= UDP_HEADER_LEN
    }

    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), 6)
    }

    /// The bytes after the header, up to the length field when it is consistent, else to
    /// the buffer's end.
    pub fn payload(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let l = self.len() as usize;
        let end = if (UDP_HEADER_LEN..=b.len()).contains(&l) {
            l
        } else {
            b.len()
        };
        &b[UDP_HEADER_LEN..end]
    }

    /// Whether the whole buffer (the datagram) checks under the IP pseudo-header sum `pseudo`
    /// (see `Ipv4Packet::pseudo_header_sum`). A zero checksum (none sent, IPv4 only) does not.
    pub fn verify_checksum(&self, pseudo: u64) -> bool {
        fold(sum(self.buf.as_ref(), pseudo)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 0, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 2, v);
    }

    pub fn set_len(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 4, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 6, v);
    }

    /// Computes the checksum of the whole buffer under `pseudo` and writes it (0 goes out as
    /// 0xffff: zero means "no checksum").
    pub fn fill_checksum(&mut self, pseudo: u64) {
        self.set_checksum(0);
        let c = match !fold(sum(self.buf.as_ref(), pseudo)) {
            0 => 0xffff,
            c => c,
        };
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[UDP_HEADER_LEN..]
    }
}

/// A UDP header's ports (the length and checksum follow from the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
}

impl UdpRepr {
    /// Reads a datagram whose length field matches the buffer and whose checksum verifies
    /// under `pseudo` (a zero checksum is taken as "none", as IPv4 allows).
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>, pseudo: u64) -> Result<UdpRepr, WireError> {
        let len = p.buf.as_ref().len();
        let field = p.len() as usize;
        if field < UDP_HEADER_LEN || field != len {
            return Err(WireError::BadLength { field, len });
        }
        if p.checksum() != 0 && !p.verify_checksum(pseudo) {
            return Err(WireError::BadChecksum);
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
        })
    }

    /// Writes the header over a buffer of exactly header and payload (the payload already in
    /// place) and the checksum under `pseudo`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut UdpPacket<T>, pseudo: u64) {
        let len = p.buf.as_ref().len();
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len as u16);
        p.fill_checksum(pseudo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::l3;
    use crate::{Ipv4Packet, Ipv6Packet};
    use proptest::prelude::*;

    #[test]
    fn reads_and_rebuilds_the_kernels_datagrams() {
        for (name, v6) in [
            ("udp4_small", false),
            ("udp4_df_1400", false),
            ("udp6_1400", true),
        ] {
            let b = l3(name);
            let (pseudo, off) = if v6 {
                let ip = Ipv6Packet::new_checked(&b[..]).unwrap();
                (ip.pseudo_header_sum(ip.payload().len()), 40)
            } else {
                let ip = Ipv4Packet::new_checked(&b[..]).unwrap();
                (ip.pseudo_header_sum(ip.payload().len()), 20)
            };
            let d = &b[off..];
            let u = UdpPacket::new_checked(d).unwrap();
            assert_eq!(
                u.dst_port(),
                if name == "udp4_small" { 9997 } else { 9999 },
                "{name}"
            );
            assert_eq!(u.len() as usize, d.len());
            assert!(u.verify_checksum(pseudo), "{name}");
            let r = UdpRepr::parse(&u, pseudo).unwrap();
            let mut again = d.to_vec();
            again[..8].fill(0);
            r.emit(&mut UdpPacket::new_unchecked(&mut again[..]), pseudo);
            assert_eq!(again, d, "{name}");
        }
        let small = l3("udp4_small");
        assert_eq!(
            UdpPacket::new_checked(&small[20..]).unwrap().payload(),
            b"vnet-wire known vector"
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(UdpPacket::new_checked(&[0u8; 7][..]).is_err());
        let b = l3("udp4_small");
        let d = &b[20..];
        assert!(matches!(
            UdpRepr::parse(&UdpPacket::new_checked(&d[..20]).unwrap(), 0),
            Err(WireError::BadLength { .. })
        ));
        let mut bad = d.to_vec();
        bad[10] ^= 1;
        let ip = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            UdpRepr::parse(
                &UdpPacket::new_checked(&bad[..]).unwrap(),
                ip.pseudo_header_sum(30)
            ),
            Err(WireError::BadChecksum)
        );
    }

    proptest! {
        #[test]
        fn roundtrip(sp in any::<u16>(), dp in any::<u16>(), pseudo in any::<u32>(),
                     payload in proptest::collection::vec(any::<u8>(), 0..100)) {
            let r = UdpRepr { src_port: sp, dst_port: dp };
            let mut b = vec![0u8; 8];
            b.extend_from_slice(&payload);
            r.emit(&mut UdpPacket::new_unchecked(&mut b[..]), pseudo as u64);
            let p = UdpPacket::new_checked(&b[..]).unwrap();
            prop_assert!(p.checksum() != 0);
            prop_assert_eq!(UdpRepr::parse(&p, pseudo as u64), Ok(r));
            prop_assert_eq!(p.payload(), &payload[..]);
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(p) = UdpPacket::new_checked(&b[..]) {
                let _ = (p.src_port(), p.dst_port(), p.len(), p.checksum(), p.payload().len(),
                         p.verify_checksum(0));
                let _ = UdpRepr::parse(&p, 0);
            }
        }
    }
}
