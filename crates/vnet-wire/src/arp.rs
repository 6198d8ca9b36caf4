//! ARP and RARP packets (RFC 826, RFC 903): the view and the repr the migration
//! announcements (`vnet-cluster`'s gratuitous ARP and QEMU-style RARP) are built with. The
//! view reads any hardware/protocol lengths; the repr is Ethernet/IPv4, the only kind vnet
//! makes or needs to read.

use std::net::Ipv4Addr;

use crate::field::{set_u16, u16_at};
use crate::{ethertype, need, MacAddr, WireError};

/// Bytes of an ARP packet for Ethernet and IPv4.
pub const ARP_ETHERNET_IPV4_LEN: usize = 28;
/// The fixed part: hardware and protocol types, their lengths, the operation.
const ARP_FIXED_LEN: usize = 8;
const HTYPE_ETHERNET: u16 = 1;

/// The operation field (RFC 826: 1, 2; RFC 903: 3, 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    Request,
    Reply,
    /// "Request reverse": what QEMU's announcement after a migration sends.
    RarpRequest,
    RarpReply,
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            3 => ArpOperation::RarpRequest,
            4 => ArpOperation::RarpReply,
            v => ArpOperation::Unknown(v),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(o: ArpOperation) -> u16 {
        match o {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::RarpRequest => 3,
            ArpOperation::RarpReply => 4,
            ArpOperation::Unknown(v) => v,
        }
    }
}

/// A view of an ARP (or RARP) packet.
#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        ArpPacket { buf }
    }

    /// The buffer holds the fixed part and the four addresses its lengths claim.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buf);
        let len = p.buf.as_ref().len();
        need(len, ARP_FIXED_LEN)?;
        need(
            len,
            ARP_FIXED_LEN + 2 * (p.hardware_len() as usize + p.protocol_len() as usize),
        )?;
        Ok(p)
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn hardware_type(&self) -> u16 {
        u16_at(self.buf.as_ref(), 0)
    }

    pub fn protocol_type(&self) -> u16 {
        u16_at(self.buf.as_ref(), 2)
    }

    pub fn hardware_len(&self) -> u8 {
        self.buf.as_ref()[4]
    }

    pub fn protocol_len(&self) -> u8 {
        self.buf.as_ref()[5]
    }

    pub fn operation(&self) -> ArpOperation {
        u16_at(self.buf.as_ref(), 6).into()
    }

    /// The four addresses' offsets: sender hardware, sender protocol, target hardware,
    /// target protocol, then the end.
    fn offsets(&self) -> [usize; 5] {
        let (h, p) = (self.hardware_len() as usize, self.protocol_len() as usize);
        let s = ARP_FIXED_LEN;
        [s, s + h, s + h + p, s + 2 * h + p, s + 2 * (h + p)]
    }

    pub fn source_hardware_addr(&self) -> &[u8] {
        let o = self.offsets();
        &self.buf.as_ref()[o[0]..o[1]]
    }

    pub fn source_protocol_addr(&self) -> &[u8] {
        let o = self.offsets();
        &self.buf.as_ref()[o[1]..o[2]]
    }

    pub fn target_hardware_addr(&self) -> &[u8] {
        let o = self.offsets();
        &self.buf.as_ref()[o[2]..o[3]]
    }

    pub fn target_protocol_addr(&self) -> &[u8] {
        let o = self.offsets();
        &self.buf.as_ref()[o[3]..o[4]]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    /// Writes the fixed part for Ethernet and IPv4 (types and lengths) and `op`.
    pub fn set_ethernet_ipv4(&mut self, op: ArpOperation) {
        let b = self.buf.as_mut();
        set_u16(b, 0, HTYPE_ETHERNET);
        set_u16(b, 2, ethertype::IPV4);
        b[4] = 6;
        b[5] = 4;
        set_u16(b, 6, op.into());
    }
}

/// An ARP/RARP packet for Ethernet and IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub operation: ArpOperation,
    pub source_hardware_addr: MacAddr,
    pub source_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: MacAddr,
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Reads an Ethernet/IPv4 packet; any other kind is `Unsupported`.
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<ArpRepr, WireError> {
        need(p.buf.as_ref().len(), ARP_ETHERNET_IPV4_LEN)?;
        if p.hardware_type() != HTYPE_ETHERNET
            || p.protocol_type() != ethertype::IPV4
            || p.hardware_len() != 6
            || p.protocol_len() != 4
        {
            return Err(WireError::Unsupported("ARP not for Ethernet and IPv4"));
        }
        let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        Ok(ArpRepr {
            operation: p.operation(),
            source_hardware_addr: MacAddr::from_bytes(p.source_hardware_addr()),
            source_protocol_addr: ip(p.source_protocol_addr()),
            target_hardware_addr: MacAddr::from_bytes(p.target_hardware_addr()),
            target_protocol_addr: ip(p.target_protocol_addr()),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        ARP_ETHERNET_IPV4_LEN
    }

    /// Writes the packet into the first [`ARP_ETHERNET_IPV4_LEN`] bytes of the buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ArpPacket<T>) {
        p.set_ethernet_ipv4(self.operation);
        let b = p.buf.as_mut();
        b[8..14].copy_from_slice(&self.source_hardware_addr.0);
        b[14..18].copy_from_slice(&self.source_protocol_addr.octets());
        b[18..24].copy_from_slice(&self.target_hardware_addr.0);
        b[24..28].copy_from_slice(&self.target_protocol_addr.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::l3;
    use proptest::prelude::*;

    #[test]
    fn reads_and_rebuilds_the_kernels_request_and_reply() {
        let req = l3("arp_request");
        let p = ArpPacket::new_checked(&req[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            ArpRepr {
                operation: ArpOperation::Request,
                source_hardware_addr: MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]),
                source_protocol_addr: Ipv4Addr::new(10, 99, 1, 1),
                target_hardware_addr: MacAddr::ZERO,
                target_protocol_addr: Ipv4Addr::new(10, 99, 1, 2),
            }
        );
        let mut again = [0u8; ARP_ETHERNET_IPV4_LEN];
        r.emit(&mut ArpPacket::new_unchecked(&mut again[..]));
        assert_eq!(again[..], req[..]);
        let rep = l3("arp_reply");
        let r = ArpRepr::parse(&ArpPacket::new_checked(&rep[..]).unwrap()).unwrap();
        assert_eq!(r.operation, ArpOperation::Reply);
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 99, 1, 1));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let req = l3("arp_request");
        assert!(ArpPacket::new_checked(&req[..7]).is_err());
        assert!(matches!(
            ArpPacket::new_checked(&req[..27]),
            Err(WireError::Truncated { len: 27, need: 28 })
        ));
        // Hardware lengths of 255 claim more than any buffer here.
        let mut long = req.clone();
        long[4] = 255;
        assert!(ArpPacket::new_checked(&long[..]).is_err());
        // A view reads any lengths; the repr only Ethernet/IPv4.
        let mut ib = req.clone();
        ib[1] = 32; // InfiniBand
        ib[4] = 4;
        let p = ArpPacket::new_checked(&ib[..]).unwrap();
        assert_eq!(p.source_hardware_addr().len(), 4);
        assert!(matches!(ArpRepr::parse(&p), Err(WireError::Unsupported(_))));
        assert_eq!(ArpOperation::from(9), ArpOperation::Unknown(9));
        assert_eq!(u16::from(ArpOperation::Unknown(9)), 9);
    }

    proptest! {
        #[test]
        fn roundtrip(op in any::<u16>(), sha in any::<[u8; 6]>(), spa in any::<[u8; 4]>(),
                     tha in any::<[u8; 6]>(), tpa in any::<[u8; 4]>()) {
            let r = ArpRepr {
                operation: op.into(), source_hardware_addr: MacAddr(sha),
                source_protocol_addr: spa.into(), target_hardware_addr: MacAddr(tha),
                target_protocol_addr: tpa.into(),
            };
            let mut b = [0u8; ARP_ETHERNET_IPV4_LEN];
            r.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
            prop_assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()), Ok(r));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = ArpPacket::new_checked(&b[..]) {
                let _ = (p.operation(), p.source_hardware_addr().len(),
                         p.source_protocol_addr().len(), p.target_hardware_addr().len(),
                         p.target_protocol_addr().len());
                let _ = ArpRepr::parse(&p);
            }
        }
    }
}
