use crate::OffloadError;

/// Length of `struct virtio_net_hdr` (without `num_buffers`), as TAP's `IFF_VNET_HDR` uses.
pub const VIRTIO_NET_HDR_LEN: usize = 10;

/// `struct virtio_net_hdr` (virtio 1.x, little-endian): how a frame's checksum and segmentation
/// are left to the receiver.
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

    pub fn parse(b: &[u8]) -> Result<VirtioNetHdr, OffloadError> {
        if b.len() < VIRTIO_NET_HDR_LEN {
            return Err(OffloadError::Truncated);
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    pub fn emit(&self) -> [u8; VIRTIO_NET_HDR_LEN] {
        let mut b = [0u8; VIRTIO_NET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
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

    #[test]
    fn roundtrip() {
        let h = VirtioNetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 74,
            gso_size: 1428,
            csum_start: 54,
            csum_offset: 16,
        };
        assert_eq!(VirtioNetHdr::parse(&h.emit()).unwrap(), h);
        assert!(!h.is_plain());
        assert!(VirtioNetHdr::default().is_plain());
        assert!(VirtioNetHdr::parse(&[0; 9]).is_err());
    }
}
