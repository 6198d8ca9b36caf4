use crate::{MacAddr, WireError};

pub const ETHERNET_HEADER_LEN: usize = 14;
/// The largest frame vnet carries: a 65535-byte MTU (as in VNET/P) plus the Ethernet header.
pub const MAX_FRAME_LEN: usize = 65535 + ETHERNET_HEADER_LEN;

/// A read-only view of an Ethernet II frame (no FCS, as TAP and VXLAN carry them).
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Checks that the buffer holds at least a header and at most [`MAX_FRAME_LEN`] bytes.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let len = buf.as_ref().len();
        if len < ETHERNET_HEADER_LEN {
            return Err(WireError::Truncated {
                len,
                need: ETHERNET_HEADER_LEN,
            });
        }
        if len > MAX_FRAME_LEN {
            return Err(WireError::Oversize {
                len,
                max: MAX_FRAME_LEN,
            });
        }
        Ok(EthernetFrame { buf })
    }

    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf.as_ref()[0..6])
    }

    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf.as_ref()[6..12])
    }

    pub fn ethertype(&self) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[12], b[13]])
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[ETHERNET_HEADER_LEN..]
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn len(&self) -> usize {
        self.buf.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_header() {
        let mut f = vec![0xffu8; 6];
        f.extend_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x08, 0x06]);
        f.extend_from_slice(&[1, 2, 3]);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(e.dst().is_broadcast());
        assert_eq!(e.src().to_string(), "52:54:00:00:00:01");
        assert_eq!(e.ethertype(), 0x0806);
        assert_eq!(e.payload(), &[1, 2, 3]);
    }

    #[test]
    fn bounds() {
        assert!(matches!(
            EthernetFrame::new_checked(&[0u8; 13][..]),
            Err(WireError::Truncated { len: 13, .. })
        ));
        assert!(EthernetFrame::new_checked(&[0u8; 14][..]).is_ok());
        let big = vec![0u8; MAX_FRAME_LEN + 1];
        assert!(matches!(
            EthernetFrame::new_checked(&big[..]),
            Err(WireError::Oversize { .. })
        ));
    }

    proptest! {
        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(e) = EthernetFrame::new_checked(&b[..]) {
                let _ = (e.src(), e.dst(), e.ethertype(), e.payload().len());
            }
        }
    }
}
