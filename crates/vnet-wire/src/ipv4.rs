//! IPv4 headers (RFC 791): the view the offloads read and rewrite (lengths, IDs, the header
//! checksum of every segment they cut or merge) and the repr ICMP errors for guests are sent
//! in.
//!
//! A checked view holds a whole header of version 4 as its IHL says; the total length field is
//! *not* held against the buffer, because a guest's 64 KB TSO frame may carry 0 or a stale
//! value there ([`Ipv4Packet::payload`] clamps). [`Ipv4Repr::parse`] is strict: consistent
//! length, valid checksum, no fragment.

use std::net::Ipv4Addr;

use crate::checksum::{checksum, sum};
use crate::field::{set_u16, u16_at};
use crate::{need, WireError};

pub const IPV4_HEADER_LEN: usize = 20;
const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Ipv4Packet { buf }
    }

    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buf);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds a fixed header of version 4 and the whole header its IHL claims (at
    /// least 20 bytes).
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buf.as_ref().len();
        need(len, IPV4_HEADER_LEN)?;
        if self.version() != 4 {
            return Err(WireError::BadIpVersion {
                got: self.version(),
                want: 4,
            });
        }
        let hl = self.header_len();
        if hl < IPV4_HEADER_LEN {
            return Err(WireError::BadHeaderLen(hl));
        }
        need(len, hl)
    }

    pub fn into_inner(self) -> T {
        self.buf
    }

    pub fn version(&self) -> u8 {
        self.buf.as_ref()[0] >> 4
    }

    /// The header's length in bytes (IHL times 4).
    pub fn header_len(&self) -> usize {
        (self.buf.as_ref()[0] & 0x0f) as usize * 4
    }

    pub fn dscp_ecn(&self) -> u8 {
        self.buf.as_ref()[1]
    }

    pub fn total_len(&self) -> u16 {
        u16_at(self.buf.as_ref(), 2)
    }

    pub fn ident(&self) -> u16 {
        u16_at(self.buf.as_ref(), 4)
    }

    pub fn dont_frag(&self) -> bool {
        u16_at(self.buf.as_ref(), 6) & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        u16_at(self.buf.as_ref(), 6) & FLAG_MF != 0
    }

    /// The fragment offset in bytes.
    pub fn frag_offset(&self) -> usize {
        (u16_at(self.buf.as_ref(), 6) & FRAG_OFFSET) as usize * 8
    }

    /// Part of a fragmented datagram (more fragments follow, or not the first).
    pub fn is_fragment(&self) -> bool {
        u16_at(self.buf.as_ref(), 6) & (FLAG_MF | FRAG_OFFSET) != 0
    }

    pub fn hop_limit(&self) -> u8 {
        self.buf.as_ref()[8]
    }

    pub fn protocol(&self) -> u8 {
        self.buf.as_ref()[9]
    }

    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), 10)
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.buf.as_ref();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.buf.as_ref();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.buf.as_ref()[..self.header_len()]) == 0
    }

    /// The running sum of the pseudo-header of this packet's TCP/UDP message of `l4_len`
    /// bytes (see [`crate::checksum`]).
    /// Sums the address bytes in place (the offloads call this per segment).
    pub fn pseudo_header_sum(&self, l4_len: usize) -> u64 {
        let l = l4_len as u64;
        sum(&self.buf.as_ref()[12..20], 0) + self.protocol() as u64 + (l & 0xffff) + (l >> 16)
    }

    /// The bytes after the header, up to the total length when it is consistent (at least
    /// the header, at most the buffer), else to the buffer's end.
    pub fn payload(&self) -> &[u8] {
        let b = self.buf.as_ref();
        let hl = self.header_len();
        let total = self.total_len() as usize;
        let end = if total >= hl && total <= b.len() {
            total
        } else {
            b.len()
        };
        &b[hl..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Version 4 and a header of `len` bytes (a multiple of 4, 20 to 60).
    pub fn set_version_and_header_len(&mut self, len: usize) {
        self.buf.as_mut()[0] = 0x40 | ((len / 4) as u8 & 0x0f);
    }

    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buf.as_mut()[1] = v;
    }

    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 2, v);
    }

    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 4, v);
    }

    /// Flags and fragment offset: an unfragmented datagram, DF as given.
    pub fn set_unfragmented(&mut self, dont_frag: bool) {
        set_u16(self.buf.as_mut(), 6, if dont_frag { FLAG_DF } else { 0 });
    }

    /// Flags and fragment offset of a fragment without DF: `offset` in bytes (a multiple of
    /// 8, below 65,536), `more` when more fragments follow.
    pub fn set_fragment(&mut self, more: bool, offset: usize) {
        let mf = if more { FLAG_MF } else { 0 };
        set_u16(
            self.buf.as_mut(),
            6,
            mf | ((offset / 8) as u16 & FRAG_OFFSET),
        );
    }

    pub fn set_hop_limit(&mut self, v: u8) {
        self.buf.as_mut()[8] = v;
    }

    pub fn set_protocol(&mut self, v: u8) {
        self.buf.as_mut()[9] = v;
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 10, v);
    }

    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buf.as_mut()[12..16].copy_from_slice(&a.octets());
    }

    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buf.as_mut()[16..20].copy_from_slice(&a.octets());
    }

    /// Computes the header checksum over the header as it stands and writes it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum(&self.buf.as_ref()[..hl]);
        self.set_checksum(c);
    }

    /// The bytes after the header, to the buffer's end.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buf.as_mut()[hl..]
    }
}

/// An unfragmented IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: usize,
    pub hop_limit: u8,
}

impl Ipv4Repr {
    /// Reads a whole, valid, unfragmented packet: the total length within the buffer, the
    /// header checksum verified. Options are skipped.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Ipv4Repr, WireError> {
        p.check_len()?;
        let len = p.buf.as_ref().len();
        let total = p.total_len() as usize;
        if total < p.header_len() || total > len {
            return Err(WireError::BadLength { field: total, len });
        }
        if !p.verify_checksum() {
            return Err(WireError::BadChecksum);
        }
        if p.is_fragment() {
            return Err(WireError::Unsupported("IPv4 fragment"));
        }
        Ok(Ipv4Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: total - p.header_len(),
            hop_limit: p.hop_limit(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN + self.payload_len
    }

    /// Writes a 20-byte header (ID 0, DF set, as smoltcp does) with its checksum. The buffer
    /// holds at least the header; `payload_len` is at most 65515.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv4Packet<T>) {
        p.set_version_and_header_len(IPV4_HEADER_LEN);
        p.set_dscp_ecn(0);
        p.set_total_len((IPV4_HEADER_LEN + self.payload_len) as u16);
        p.set_ident(0);
        p.set_unfragmented(true);
        p.set_hop_limit(self.hop_limit);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
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
        let b = l3("udp4_df_1400");
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.header_len(), p.total_len()), (4, 20, 1428));
        assert_eq!(
            crate::checksum::fold(p.pseudo_header_sum(1408)),
            crate::checksum::fold(crate::checksum::pseudo_header_v4(
                p.src_addr(),
                p.dst_addr(),
                ip_protocol::UDP,
                1408
            ))
        );
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        assert_eq!((p.hop_limit(), p.protocol()), (64, ip_protocol::UDP));
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 99, 1, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(10, 99, 2, 1));
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 1408);
        let r = Ipv4Repr::parse(&p).unwrap();
        assert_eq!(r.payload_len, 1408);
        // The kernel's header (ID 0, DF) is exactly what the repr emits.
        let mut again = vec![0u8; 20];
        r.emit(&mut Ipv4Packet::new_unchecked(&mut again[..]));
        assert_eq!(again, b[..20]);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let b = l3("udp4_small");
        assert!(matches!(
            Ipv4Packet::new_checked(&b[..19]),
            Err(WireError::Truncated { .. })
        ));
        let mut v6 = b.clone();
        v6[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&v6[..]).unwrap_err(),
            WireError::BadIpVersion { got: 6, want: 4 }
        );
        let mut short_ihl = b.clone();
        short_ihl[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&short_ihl[..]).unwrap_err(),
            WireError::BadHeaderLen(16)
        );
        let mut long_ihl = b.clone();
        long_ihl[0] = 0x4f;
        assert!(Ipv4Packet::new_checked(&long_ihl[..40]).is_err());
        // A repr needs a valid checksum, a consistent length and no fragment.
        let mut bad = b.clone();
        bad[8] ^= 1;
        let p = Ipv4Packet::new_checked(&bad[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::BadChecksum));
        assert!(matches!(
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&b[..40]).unwrap()),
            Err(WireError::BadLength { field: 50, len: 40 })
        ));
        let mut frag = b.clone();
        frag[6] = 0x20; // MF
        let mut p = Ipv4Packet::new_checked(&mut frag[..]).unwrap();
        p.fill_checksum();
        assert!(p.is_fragment());
        assert!(matches!(
            Ipv4Repr::parse(&p),
            Err(WireError::Unsupported(_))
        ));
    }

    #[test]
    fn payload_is_clamped_when_the_total_length_is_not_honest() {
        // A TSO frame's total length may be 0: the payload runs to the buffer's end.
        let mut b = l3("udp4_small");
        b[2..4].fill(0);
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap().payload().len(), 30);
        b[2..4].copy_from_slice(&9999u16.to_be_bytes());
        assert_eq!(Ipv4Packet::new_checked(&b[..]).unwrap().payload().len(), 30);
    }

    proptest! {
        #[test]
        fn roundtrip(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), proto in any::<u8>(),
                     hop in any::<u8>(), payload_len in 0usize..200) {
            let r = Ipv4Repr {
                src_addr: src.into(), dst_addr: dst.into(), protocol: proto, payload_len,
                hop_limit: hop,
            };
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]));
            let p = Ipv4Packet::new_checked(&b[..]).unwrap();
            prop_assert!(p.verify_checksum());
            prop_assert_eq!(Ipv4Repr::parse(&p), Ok(r));
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Ipv4Packet::new_checked(&b[..]) {
                let _ = (p.total_len(), p.ident(), p.frag_offset(), p.checksum(), p.src_addr(),
                         p.dst_addr(), p.verify_checksum(), p.payload().len(),
                         p.pseudo_header_sum(8), p.dscp_ecn());
                let _ = Ipv4Repr::parse(&p);
            }
        }
    }
}
