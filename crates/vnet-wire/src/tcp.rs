//! TCP headers (RFC 9293): the view the offloads read and rewrite (sequence numbers, flags
//! and checksums of the segments they cut from a guest's TSO frame or merge for a guest) and a
//! small repr for building segments (tests, known vectors). Options are carried as bytes.

use crate::checksum::{fold, sum};
use crate::field::{set_u16, set_u32, u16_at, u32_at};
use crate::{need, WireError};

pub const TCP_HEADER_LEN: usize = 20;
/// The most a data offset can say: 15 words.
const TCP_HEADER_MAX: usize = 60;

/// The flags in byte 13 of the header.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// A view of a TCP segment.
#[derive(Debug, Clone, Copy)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        TcpPacket { buf }
    }

    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buf);
        p.check_len()?;
        Ok(p)
    }

    /// The buffer holds the whole header its data offset claims (at least 20 bytes).
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buf.as_ref().len();
        need(len, TCP_HEADER_LEN)?;
        let hl = self.header_len();
        if hl < TCP_HEADER_LEN {
            return Err(WireError::BadHeaderLen(hl));
        }
        need(len, hl)
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

    pub fn seq_number(&self) -> u32 {
        u32_at(self.buf.as_ref(), 4)
    }

    pub fn ack_number(&self) -> u32 {
        u32_at(self.buf.as_ref(), 8)
    }

    /// The header's length in bytes (data offset times 4).
    pub fn header_len(&self) -> usize {
        (self.buf.as_ref()[12] >> 4) as usize * 4
    }

    /// Byte 13: CWR, ECE, URG, ACK, PSH, RST, SYN, FIN (see [`tcp_flags`]).
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[13]
    }

    pub fn window_len(&self) -> u16 {
        u16_at(self.buf.as_ref(), 14)
    }

    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), 16)
    }

    pub fn urgent_at(&self) -> u16 {
        u16_at(self.buf.as_ref(), 18)
    }

    pub fn options(&self) -> &[u8] {
        &self.buf.as_ref()[TCP_HEADER_LEN..self.header_len()]
    }

    /// The bytes after the header, to the buffer's end (TCP has no length field).
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.header_len()..]
    }

    /// Whether the whole buffer (the segment) checks under the IP pseudo-header sum `pseudo`.
    pub fn verify_checksum(&self, pseudo: u64) -> bool {
        fold(sum(self.buf.as_ref(), pseudo)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 0, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 2, v);
    }

    pub fn set_seq_number(&mut self, v: u32) {
        set_u32(self.buf.as_mut(), 4, v);
    }

    pub fn set_ack_number(&mut self, v: u32) {
        set_u32(self.buf.as_mut(), 8, v);
    }

    /// The data offset for a header of `len` bytes (a multiple of 4, 20 to 60); the reserved
    /// bits and NS are cleared.
    pub fn set_header_len(&mut self, len: usize) {
        self.buf.as_mut()[12] = ((len / 4) as u8) << 4;
    }

    pub fn set_flags(&mut self, v: u8) {
        self.buf.as_mut()[13] = v;
    }

    pub fn set_window_len(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 14, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 16, v);
    }

    pub fn set_urgent_at(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), 18, v);
    }

    /// Computes the checksum of the whole buffer under `pseudo` and writes it.
    pub fn fill_checksum(&mut self, pseudo: u64) {
        self.set_checksum(0);
        let c = !fold(sum(self.buf.as_ref(), pseudo));
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buf.as_mut()[hl..]
    }
}

/// A TCP header, its options as bytes (padded to a multiple of 4 by whoever made them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq_number: u32,
    pub ack_number: u32,
    pub flags: u8,
    pub window_len: u16,
    pub options: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Reads a segment whose checksum verifies under `pseudo`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &TcpPacket<&'a T>,
        pseudo: u64,
    ) -> Result<TcpRepr<'a>, WireError> {
        p.check_len()?;
        if !p.verify_checksum(pseudo) {
            return Err(WireError::BadChecksum);
        }
        let b: &'a [u8] = T::as_ref(p.buf);
        Ok(TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window_len: p.window_len(),
            options: &b[TCP_HEADER_LEN..p.header_len()],
        })
    }

    /// Bytes of the header with its options.
    pub fn header_len(&self) -> usize {
        TCP_HEADER_LEN + self.options.len()
    }

    /// Writes the header over a buffer of exactly header and payload (the payload already in
    /// place) and the checksum under `pseudo`. Options longer than 40 bytes, or not a multiple
    /// of 4, are refused.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut TcpPacket<T>,
        pseudo: u64,
    ) -> Result<(), WireError> {
        let hl = self.header_len();
        if hl > TCP_HEADER_MAX || !hl.is_multiple_of(4) {
            return Err(WireError::BadHeaderLen(hl));
        }
        need(p.buf.as_ref().len(), hl)?;
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq_number);
        p.set_ack_number(self.ack_number);
        p.set_header_len(hl);
        p.set_flags(self.flags);
        p.set_window_len(self.window_len);
        p.set_urgent_at(0);
        p.buf.as_mut()[TCP_HEADER_LEN..hl].copy_from_slice(self.options);
        p.fill_checksum(pseudo);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::l3;
    use crate::Ipv4Packet;
    use proptest::prelude::*;

    #[test]
    fn reads_and_rebuilds_the_kernels_segments() {
        let b = l3("tcp4_syn");
        let ip = Ipv4Packet::new_checked(&b[..]).unwrap();
        let pseudo = ip.pseudo_header_sum(ip.payload().len());
        let t = TcpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!((t.src_port(), t.dst_port()), (40001, 9998));
        assert_eq!(t.header_len(), 40);
        assert_eq!(t.flags(), tcp_flags::SYN);
        // MSS 1240: the path MTU of 1280 the kernel had just learned from R's ICMP error.
        assert_eq!(&t.options()[..4], &[2, 4, 0x04, 0xd8]);
        assert!(t.payload().is_empty());
        assert!(t.verify_checksum(pseudo));
        let r = TcpRepr::parse(&t, pseudo).unwrap();
        let mut again = vec![0u8; 40];
        r.emit(&mut TcpPacket::new_unchecked(&mut again[..]), pseudo)
            .unwrap();
        assert_eq!(again, ip.payload());

        let b = l3("tcp4_rst");
        let ip = Ipv4Packet::new_checked(&b[..]).unwrap();
        let t = TcpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(t.flags(), tcp_flags::RST | tcp_flags::ACK);
        assert_eq!(
            t.ack_number(),
            TcpRepr::parse(&t, ip.pseudo_header_sum(20))
                .unwrap()
                .ack_number
        );
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let b = l3("tcp4_syn");
        let seg = &b[20..];
        assert!(TcpPacket::new_checked(&seg[..19]).is_err());
        assert!(matches!(
            TcpPacket::new_checked(&seg[..39]),
            Err(WireError::Truncated { len: 39, need: 40 })
        ));
        let mut low = seg.to_vec();
        low[12] = 0x40;
        assert_eq!(
            TcpPacket::new_checked(&low[..]).unwrap_err(),
            WireError::BadHeaderLen(16)
        );
        let t = TcpPacket::new_checked(seg).unwrap();
        assert_eq!(TcpRepr::parse(&t, 0), Err(WireError::BadChecksum));
        let r = TcpRepr {
            options: &[1, 1, 1],
            ..TcpRepr::parse(
                &t,
                Ipv4Packet::new_checked(&b[..])
                    .unwrap()
                    .pseudo_header_sum(40),
            )
            .unwrap()
        };
        let mut out = [0u8; 40];
        assert!(r
            .emit(&mut TcpPacket::new_unchecked(&mut out[..]), 0)
            .is_err());
    }

    proptest! {
        #[test]
        fn roundtrip(sp in any::<u16>(), dp in any::<u16>(), seq in any::<u32>(), ack in any::<u32>(),
                     flags in any::<u8>(), win in any::<u16>(), opt_words in 0usize..=10,
                     pseudo in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let options: Vec<u8> = (0..opt_words * 4).map(|i| i as u8).collect();
            let r = TcpRepr { src_port: sp, dst_port: dp, seq_number: seq, ack_number: ack, flags,
                              window_len: win, options: &options };
            let mut b = vec![0u8; r.header_len()];
            b.extend_from_slice(&payload);
            r.emit(&mut TcpPacket::new_unchecked(&mut b[..]), pseudo as u64).unwrap();
            let p = TcpPacket::new_checked(&b[..]).unwrap();
            prop_assert_eq!(TcpRepr::parse(&p, pseudo as u64), Ok(r));
            prop_assert_eq!(p.payload(), &payload[..]);
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = TcpPacket::new_checked(&b[..]) {
                let _ = (p.seq_number(), p.ack_number(), p.flags(), p.window_len(), p.checksum(),
                         p.urgent_at(), p.options().len(), p.payload().len());
                let _ = TcpRepr::parse(&p, 0);
            }
        }
    }
}
