//! The virtio-net header (`struct virtio_net_hdr`, virtio 1.x section 5.1.6, little-endian):
//! what travels in front of every frame between vnet and a guest (TAP's `IFF_VNET_HDR`,
//! vhost-user rings) to say how the frame's checksum and segmentation are left to the
//! receiver. Here, beside the headers it describes, so the offloads, the TAP reader and the
//! vhost-user device read and write it one way.
//!
//! [`VirtioNetHeader`] is the view; [`VirtioNetHdr`] is the repr (the values, named as the C
//! struct is, which the data path passes around with every frame).

use crate::{need, WireError};

/// Length of `struct virtio_net_hdr` (without `num_buffers`), as TAP's `IFF_VNET_HDR` uses.
pub const VIRTIO_NET_HDR_LEN: usize = 10;
/// With `num_buffers` (`VIRTIO_NET_F_MRG_RXBUF`, or any virtio 1.x device): vhost-user.
pub const VIRTIO_NET_HDR_MRG_RXBUF_LEN: usize = 12;

/// A view of a virtio-net header.
#[derive(Debug, Clone, Copy)]
pub struct VirtioNetHeader<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> VirtioNetHeader<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        VirtioNetHeader { buf }
    }

    /// The buffer holds the 10-byte header (`num_buffers` is read only if it holds 12).
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        need(buf.as_ref().len(), VIRTIO_NET_HDR_LEN)?;
        Ok(VirtioNetHeader { buf })
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    fn u16_le(&self, i: usize) -> u16 {
        let b = self.buf.as_ref();
        u16::from_le_bytes([b[i], b[i + 1]])
    }

    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[0]
    }

    pub fn gso_type(&self) -> u8 {
        self.buf.as_ref()[1]
    }

    pub fn hdr_len(&self) -> u16 {
        self.u16_le(2)
    }

    pub fn gso_size(&self) -> u16 {
        self.u16_le(4)
    }

    pub fn csum_start(&self) -> u16 {
        self.u16_le(6)
    }

    pub fn csum_offset(&self) -> u16 {
        self.u16_le(8)
    }

    /// How many receive buffers a merged frame spans, when the buffer holds the 12-byte header.
    pub fn num_buffers(&self) -> Option<u16> {
        (self.buf.as_ref().len() >= VIRTIO_NET_HDR_MRG_RXBUF_LEN).then(|| self.u16_le(10))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VirtioNetHeader<T> {
    fn set_u16_le(&mut self, i: usize, v: u16) {
        self.buf.as_mut()[i..i + 2].copy_from_slice(&v.to_le_bytes());
    }

    pub fn set_flags(&mut self, v: u8) {
        self.buf.as_mut()[0] = v;
    }

    pub fn set_gso_type(&mut self, v: u8) {
        self.buf.as_mut()[1] = v;
    }

    pub fn set_hdr_len(&mut self, v: u16) {
        self.set_u16_le(2, v);
    }

    pub fn set_gso_size(&mut self, v: u16) {
        self.set_u16_le(4, v);
    }

    pub fn set_csum_start(&mut self, v: u16) {
        self.set_u16_le(6, v);
    }

    pub fn set_csum_offset(&mut self, v: u16) {
        self.set_u16_le(8, v);
    }

    /// Writes `num_buffers`; the buffer must hold the 12-byte header (else `Truncated`).
    pub fn set_num_buffers(&mut self, v: u16) -> Result<(), WireError> {
        need(self.buf.as_ref().len(), VIRTIO_NET_HDR_MRG_RXBUF_LEN)?;
        self.set_u16_le(10, v);
        Ok(())
    }
}

/// `struct virtio_net_hdr`'s values: how a frame's checksum and segmentation are left to the
/// receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VirtioNetHdr {
    pub const F_NEEDS_CSUM: u8 = 1;
    pub const F_DATA_VALID: u8 = 2;
    pub const GSO_NONE: u8 = 0;
    pub const GSO_TCPV4: u8 = 1;
    pub const GSO_UDP: u8 = 3;
    pub const GSO_TCPV6: u8 = 4;
    pub const GSO_UDP_L4: u8 = 5;
    pub const GSO_ECN: u8 = 0x80;

    /// Reads the header at the start of `b` (at least [`VIRTIO_NET_HDR_LEN`] bytes).
    pub fn parse(b: &[u8]) -> Result<VirtioNetHdr, WireError> {
        Ok(Self::from_view(&VirtioNetHeader::new_checked(b)?))
    }

    pub fn from_view<T: AsRef<[u8]>>(h: &VirtioNetHeader<T>) -> VirtioNetHdr {
        VirtioNetHdr {
            flags: h.flags(),
            gso_type: h.gso_type(),
            hdr_len: h.hdr_len(),
            gso_size: h.gso_size(),
            csum_start: h.csum_start(),
            csum_offset: h.csum_offset(),
        }
    }

    /// Writes the six fields (not `num_buffers`) into a header.
    pub fn emit_into<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut VirtioNetHeader<T>) {
        h.set_flags(self.flags);
        h.set_gso_type(self.gso_type);
        h.set_hdr_len(self.hdr_len);
        h.set_gso_size(self.gso_size);
        h.set_csum_start(self.csum_start);
        h.set_csum_offset(self.csum_offset);
    }

    /// The 10-byte header.
    pub fn emit(&self) -> [u8; VIRTIO_NET_HDR_LEN] {
        let mut b = [0u8; VIRTIO_NET_HDR_LEN];
        self.emit_into(&mut VirtioNetHeader::new_unchecked(&mut b[..]));
        b
    }

    /// The 12-byte header with `num_buffers` (a frame in `num_buffers` receive buffers).
    pub fn emit_mrg_rxbuf(&self, num_buffers: u16) -> [u8; VIRTIO_NET_HDR_MRG_RXBUF_LEN] {
        let mut b = [0u8; VIRTIO_NET_HDR_MRG_RXBUF_LEN];
        self.emit_into(&mut VirtioNetHeader::new_unchecked(&mut b[..]));
        b[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        b
    }

    /// Nothing left to do: a complete, ordinary frame.
    pub fn is_plain(&self) -> bool {
        self.gso_kind() == Self::GSO_NONE && self.flags & Self::F_NEEDS_CSUM == 0
    }

    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !Self::GSO_ECN
    }

    pub fn needs_csum(&self) -> bool {
        self.flags & Self::F_NEEDS_CSUM != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_and_roundtrip() {
        let h = VirtioNetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 74,
            gso_size: 1428,
            csum_start: 54,
            csum_offset: 16,
        };
        // virtio 1.x: u8 flags, u8 gso_type, then le16 fields.
        assert_eq!(h.emit(), [1, 4, 74, 0, 0x94, 0x05, 54, 0, 16, 0]);
        assert_eq!(VirtioNetHdr::parse(&h.emit()).unwrap(), h);
        assert!(!h.is_plain());
        assert!(VirtioNetHdr::default().is_plain());
        assert!(VirtioNetHdr::parse(&[0; 9]).is_err());
        let m = h.emit_mrg_rxbuf(3);
        let v = VirtioNetHeader::new_checked(&m[..]).unwrap();
        assert_eq!((VirtioNetHdr::from_view(&v), v.num_buffers()), (h, Some(3)));
        assert_eq!(
            VirtioNetHeader::new_checked(&h.emit()[..])
                .unwrap()
                .num_buffers(),
            None
        );
        let mut short = h.emit();
        assert!(VirtioNetHeader::new_unchecked(&mut short[..])
            .set_num_buffers(1)
            .is_err());
    }

    proptest! {
        #[test]
        fn roundtrip(f in any::<u8>(), g in any::<u8>(), a in any::<u16>(), b in any::<u16>(),
                     c in any::<u16>(), d in any::<u16>(), n in any::<u16>()) {
            let h = VirtioNetHdr { flags: f, gso_type: g, hdr_len: a, gso_size: b, csum_start: c,
                                   csum_offset: d };
            let m = h.emit_mrg_rxbuf(n);
            prop_assert_eq!(VirtioNetHdr::parse(&m), Ok(h));
            prop_assert_eq!(VirtioNetHeader::new_checked(&m[..]).unwrap().num_buffers(), Some(n));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..16)) {
            if let Ok(h) = VirtioNetHeader::new_checked(&b[..]) {
                let _ = (VirtioNetHdr::from_view(&h), h.num_buffers());
            }
        }
    }
}
