//! Ethernet II frames (no FCS, as TAP, vhost-user and VXLAN carry them): the view every
//! ingress reads the two MACs and the EtherType from, one optional 802.1Q tag, and the repr the
//! announcements and ICMP errors are built with.

use crate::field::{set_u16, u16_at};
use crate::{need, MacAddr, WireError};

pub const ETHERNET_HEADER_LEN: usize = 14;
/// The largest frame vnet carries: a 65535-byte MTU (as in VNET/P) plus the Ethernet header.
pub const MAX_FRAME_LEN: usize = 65535 + ETHERNET_HEADER_LEN;
/// Length of an 802.1Q tag (TPID and TCI) between the source MAC and the EtherType.
const VLAN_TAG_LEN: usize = 4;

/// EtherType values vnet reads or writes (IEEE 802 numbers).
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const RARP: u16 = 0x8035;
    /// An 802.1Q tag: the real EtherType follows 4 bytes later.
    pub const VLAN: u16 = 0x8100;
    pub const IPV6: u16 = 0x86dd;
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// A view whose length is the caller's business (see the crate header).
    pub const fn new_unchecked(buf: T) -> Self {
        EthernetFrame { buf }
    }

    /// Checks that the buffer holds at least a header and at most [`MAX_FRAME_LEN`] bytes.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let len = buf.as_ref().len();
        need(len, ETHERNET_HEADER_LEN)?;
        if len > MAX_FRAME_LEN {
            return Err(WireError::Oversize {
                len,
                max: MAX_FRAME_LEN,
            });
        }
        Ok(EthernetFrame { buf })
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf.as_ref()[0..6])
    }

    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf.as_ref()[6..12])
    }

    pub fn ethertype(&self) -> u16 {
        u16_at(self.buf.as_ref(), 12)
    }

    /// Where the network-layer header starts and its EtherType, past one 802.1Q tag if the
    /// frame has one. Checks the length itself (a tag cut short is `Truncated`).
    pub fn network_header(&self) -> Result<(usize, u16), WireError> {
        let b = self.buf.as_ref();
        need(b.len(), ETHERNET_HEADER_LEN)?;
        match u16_at(b, 12) {
            ethertype::VLAN => {
                need(b.len(), ETHERNET_HEADER_LEN + VLAN_TAG_LEN)?;
                Ok((ETHERNET_HEADER_LEN + VLAN_TAG_LEN, u16_at(b, 16)))
            }
            t => Ok((ETHERNET_HEADER_LEN, t)),
        }
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

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, m: MacAddr) {
        self.buf.as_mut()[0..6].copy_from_slice(&m.0);
    }

    pub fn set_src(&mut self, m: MacAddr) {
        self.buf.as_mut()[6..12].copy_from_slice(&m.0);
    }

    pub fn set_ethertype(&mut self, t: u16) {
        set_u16(self.buf.as_mut(), 12, t);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut()[ETHERNET_HEADER_LEN..]
    }
}

/// The header of an untagged Ethernet II frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub src: MacAddr,
    pub dst: MacAddr,
    pub ethertype: u16,
}

impl EthernetRepr {
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> EthernetRepr {
        EthernetRepr {
            src: f.src(),
            dst: f.dst(),
            ethertype: f.ethertype(),
        }
    }

    /// Bytes of a frame with this header and `payload_len` bytes of payload.
    pub const fn buffer_len(payload_len: usize) -> usize {
        ETHERNET_HEADER_LEN + payload_len
    }

    /// Writes the header (the frame's buffer holds at least [`ETHERNET_HEADER_LEN`] bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, f: &mut EthernetFrame<T>) {
        f.set_dst(self.dst);
        f.set_src(self.src);
        f.set_ethertype(self.ethertype);
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
        assert_eq!(e.network_header(), Ok((14, ethertype::ARP)));
    }

    #[test]
    fn kernel_frame_and_vlan_tag() {
        let f = crate::vectors::frame("arp_reply");
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        let r = EthernetRepr::parse(&e);
        assert_eq!(r.src, MacAddr([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(r.dst, MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]));
        assert_eq!(r.ethertype, ethertype::ARP);
        let mut again = f.clone();
        again[..14].fill(0);
        r.emit(&mut EthernetFrame::new_unchecked(&mut again[..]));
        assert_eq!(again, f);
        // One 802.1Q tag (VLAN 5) in front of IPv4.
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00, 0x45]);
        let e = EthernetFrame::new_checked(&tagged[..]).unwrap();
        assert_eq!(e.network_header(), Ok((18, ethertype::IPV4)));
        assert!(matches!(
            EthernetFrame::new_unchecked(&tagged[..16]).network_header(),
            Err(WireError::Truncated { len: 16, need: 18 })
        ));
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
        assert!(EthernetFrame::new_unchecked(&[0u8; 13][..])
            .network_header()
            .is_err());
    }

    proptest! {
        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(e) = EthernetFrame::new_checked(&b[..]) {
                let _ = (e.src(), e.dst(), e.ethertype(), e.payload().len());
            }
            let _ = EthernetFrame::new_unchecked(&b[..]).network_header();
        }

        #[test]
        fn roundtrip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), et in any::<u16>()) {
            let r = EthernetRepr { src: MacAddr(src), dst: MacAddr(dst), ethertype: et };
            let mut b = [0u8; 20];
            r.emit(&mut EthernetFrame::new_unchecked(&mut b[..]));
            prop_assert_eq!(EthernetRepr::parse(&EthernetFrame::new_checked(&b[..]).unwrap()), r);
        }
    }
}
