//! VXLAN (RFC 7348), the overlay's encapsulation on UDP links, wire-compatible with the Linux
//! kernel's: the view every receive path (the shared socket, vhost-user cut-through) reads the
//! VNI from, and the 8 header bytes every send path puts in front of a frame.

use crate::WireError;

pub const VXLAN_HEADER_LEN: usize = 8;
/// IANA port for VXLAN (RFC 7348), the Linux kernel's default with `dstport 4789`.
pub const VXLAN_PORT: u16 = 4789;
pub const VNI_MAX: u32 = (1 << 24) - 1;
/// The I flag: the VNI field is valid.
const FLAG_VNI: u8 = 0x08;

/// A read-only view of a VXLAN datagram (the UDP payload): 8-byte header, then an Ethernet frame.
///
/// As RFC 7348 asks, the reserved bits are ignored on receive and zero on send; a header without
/// the I flag is refused, as the Linux kernel refuses it.
#[derive(Debug, Clone, Copy)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
    /// Checks that the buffer holds the header and that its I flag is set.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let b = buf.as_ref();
        if b.len() < VXLAN_HEADER_LEN {
            return Err(WireError::Truncated {
                len: b.len(),
                need: VXLAN_HEADER_LEN,
            });
        }
        if b[0] & FLAG_VNI == 0 {
            return Err(WireError::VxlanFlags(b[0]));
        }
        Ok(VxlanPacket { buf })
    }

    pub fn vni(&self) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([0, b[4], b[5], b[6]])
    }

    /// The inner Ethernet frame (not yet checked).
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[VXLAN_HEADER_LEN..]
    }
}

/// The parts of a VXLAN header vnet sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanRepr {
    pub vni: u32,
}

impl VxlanRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &VxlanPacket<T>) -> VxlanRepr {
        VxlanRepr { vni: p.vni() }
    }

    /// The 8 header bytes, to be written in front of a frame (by scatter/gather, not by copying).
    pub fn header(&self) -> [u8; VXLAN_HEADER_LEN] {
        let v = (self.vni & VNI_MAX).to_be_bytes();
        [FLAG_VNI, 0, 0, 0, v[1], v[2], v[3], 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_layout() {
        // RFC 7348 section 5: flags 0x08, 24 reserved bits, 24-bit VNI, 8 reserved bits.
        assert_eq!(
            VxlanRepr { vni: 0x123456 }.header(),
            [0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0]
        );
    }

    #[test]
    fn refuses_bad() {
        assert!(VxlanPacket::new_checked(&[0x08u8, 0, 0][..]).is_err());
        assert_eq!(
            VxlanPacket::new_checked(&[0u8; 16][..]).unwrap_err(),
            WireError::VxlanFlags(0)
        );
        // An encrypted link's messages start with their type, 1 to 3: never the I flag.
        let mut h = VxlanRepr { vni: 7 }.header();
        h[0] = 3;
        assert_eq!(
            VxlanPacket::new_checked(&h[..]).unwrap_err(),
            WireError::VxlanFlags(3)
        );
        assert!(VxlanPacket::new_checked(&VxlanRepr { vni: 7 }.header()[..4]).is_err());
        let p = VxlanPacket::new_checked(VxlanRepr { vni: 8 }.header()).unwrap();
        assert_eq!(p.vni(), 8);
    }

    proptest! {
        #[test]
        fn roundtrip(vni in 0u32..=VNI_MAX, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = VxlanRepr { vni }.header().to_vec();
            d.extend_from_slice(&payload);
            let p = VxlanPacket::new_checked(&d[..]).unwrap();
            prop_assert_eq!(VxlanRepr::parse(&p), VxlanRepr { vni });
            prop_assert_eq!(p.payload(), &payload[..]);
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..32)) {
            if let Ok(p) = VxlanPacket::new_checked(&b[..]) {
                let _ = (p.vni(), p.payload().len());
            }
        }
    }
}
