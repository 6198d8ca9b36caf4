//! The Internet checksum (RFC 1071), 16 bytes at a time, and the pseudo-headers (RFC 768,
//! RFC 793, RFC 8200 section 8.1) that TCP, UDP and ICMPv6 checksums cover. Here, below every
//! view, because IPv4 headers, ICMP errors and the offloads' segments all need the same sum,
//! and the offloads need it fast (it is a pass over every payload byte of a TSO frame).
//! `#[inline]` because its callers are in other crates now: a 20-byte header or an 8-byte
//! address sum inlined into the caller folds to a few additions (measured: without it,
//! `vnet_offload::left_partial` took ~3 ns more per frame after the move from vnet-offload).

use std::net::{Ipv4Addr, Ipv6Addr};

/// Adds `data` to a running ones'-complement sum. `data` is taken to start at an even offset of
/// the checksummed region. The result is not folded; feed it to [`fold`].
#[inline]
pub fn sum(data: &[u8], initial: u64) -> u64 {
    // Add native-endian 32-bit words into four 64-bit lanes: no carries to propagate (2^32
    // words fit), and the compiler vectorizes it. The ones'-complement sum is byte-order
    // independent (RFC 1071, 2.B), so one swap after folding fixes the order.
    let mut lanes = [0u64; 4];
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        for (k, lane) in lanes.iter_mut().enumerate() {
            *lane +=
                u32::from_ne_bytes([c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]]) as u64;
        }
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 16];
    tail[..rest.len()].copy_from_slice(rest);
    for (k, lane) in lanes.iter_mut().enumerate() {
        *lane += u32::from_ne_bytes([
            tail[4 * k],
            tail[4 * k + 1],
            tail[4 * k + 2],
            tail[4 * k + 3],
        ]) as u64;
    }
    let folded = fold_native(lanes.iter().sum());
    let be = if cfg!(target_endian = "little") {
        folded.swap_bytes()
    } else {
        folded
    };
    initial + be as u64
}

#[inline]
fn fold_native(mut s: u64) -> u16 {
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// Folds a running sum to 16 bits (not complemented).
#[inline]
pub fn fold(s: u64) -> u16 {
    fold_native(s)
}

/// The checksum of `data` alone: the complement of its folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// The running sum of an IPv4 pseudo-header: both addresses, the protocol and the length of
/// the TCP/UDP/ICMP message (`len`, header included).
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, len: u32) -> u64 {
    let mut a = [0u8; 8];
    a[..4].copy_from_slice(&src.octets());
    a[4..].copy_from_slice(&dst.octets());
    sum(&a, 0) + protocol as u64 + (len as u64 & 0xffff) + ((len as u64) >> 16)
}

/// The running sum of an IPv6 pseudo-header: both addresses, the upper-layer length (32 bits)
/// and the next header.
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, len: u32) -> u64 {
    let mut a = [0u8; 32];
    a[..16].copy_from_slice(&src.octets());
    a[16..].copy_from_slice(&dst.octets());
    sum(&a, 0) + next_header as u64 + (len as u64 & 0xffff) + ((len as u64) >> 16)
}

/// The checksum of `data` under a pseudo-header sum, as it goes into a TCP/UDP/ICMPv6 field
/// that held zero while `data` was summed.
#[inline]
pub fn checksum_with(pseudo: u64, data: &[u8]) -> u16 {
    !fold(sum(data, pseudo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            s += w as u32;
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d, 0)), 0xddf2);
        // an IPv4 header with a correct checksum sums to 0
        let ip = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&ip), 0);
    }

    #[test]
    fn pseudo_headers() {
        // The same bytes summed as one block.
        let v4 = pseudo_header_v4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            17,
            0x1_0008,
        );
        let block = [10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 1, 0, 8];
        assert_eq!(fold(v4), fold(sum(&block, 0)));
        let a: Ipv6Addr = "fd00::1".parse().unwrap();
        let b: Ipv6Addr = "fd00::2".parse().unwrap();
        let mut block6 = a.octets().to_vec();
        block6.extend_from_slice(&b.octets());
        block6.extend_from_slice(&[0, 0, 0, 40, 0, 0, 0, 58]);
        assert_eq!(fold(pseudo_header_v6(a, b, 58, 40)), fold(sum(&block6, 0)));
    }

    proptest! {
        #[test]
        fn matches_reference(d in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(checksum(&d), reference(&d));
        }

        #[test]
        fn splits_at_even_offsets(d in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..150) {
            let cut = (cut * 2).min(d.len() & !1);
            let s = sum(&d[cut..], sum(&d[..cut], 0));
            prop_assert_eq!(!fold(s), reference(&d));
        }
    }
}
