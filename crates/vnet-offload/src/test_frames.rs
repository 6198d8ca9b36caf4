//! Frames for tests of code that handles offloads (here and in the data path): a guest's TSO
//! frame as it arrives with its virtio-net header, and the receiver's checksum check. Built
//! only for tests (`cfg(test)`, or the `test-frames` feature other crates' tests enable).

use vnet_wire::checksum::{checksum, fold, sum};
use vnet_wire::VirtioNetHdr;

use crate::headers::{parse_l3l4, L3};

/// A TCP/IPv4 frame as a guest's TSO hands it over: pseudo-header sum in the checksum field.
pub fn tso_frame(payload: usize, v6: bool) -> (Vec<u8>, VirtioNetHdr) {
    let mut f = vec![0x52, 0x54, 0, 0, 0, 2, 0x52, 0x54, 0, 0, 0, 1];
    let l3_len = if v6 { 40 } else { 20 };
    if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&((32 + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&0u16.to_be_bytes()); // as TSO leaves it
        f.extend_from_slice(&[
            0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 192, 168, 1, 1, 192, 168, 1, 2,
        ]);
    }
    // TCP: ports, seq, ack, doff 8 (12 bytes of options), flags ACK|PSH, window
    f.extend_from_slice(&[
        0x13, 0x88, 0xc0, 0x00, 0, 0, 0x10, 0, 0, 0, 0, 1, 0x80, 0x18, 0x01, 0xf5, 0, 0, 0, 0,
    ]);
    f.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    for i in 0..payload {
        f.push((i * 7 + 3) as u8);
    }
    let hl = 14 + l3_len + 32;
    let layout = parse_l3l4(&f).unwrap();
    let ps = fold(layout.pseudo_sum(&f, 32 + payload));
    f[14 + l3_len + 16..14 + l3_len + 18].copy_from_slice(&ps.to_be_bytes());
    let vh = VirtioNetHdr {
        flags: VirtioNetHdr::F_NEEDS_CSUM,
        gso_type: if v6 {
            VirtioNetHdr::GSO_TCPV6
        } else {
            VirtioNetHdr::GSO_TCPV4
        },
        hdr_len: hl as u16,
        gso_size: 1448,
        csum_start: (14 + l3_len) as u16,
        csum_offset: 16,
    };
    (f, vh)
}

/// An ordinary TCP/IPv4 frame whose checksum the guest left partial: [`tso_frame`] without
/// the GSO, its IP header complete (total length and header checksum set).
pub fn partial_csum_frame(payload: usize) -> (Vec<u8>, VirtioNetHdr) {
    let (mut f, mut vh) = tso_frame(payload, false);
    vh.gso_type = VirtioNetHdr::GSO_NONE;
    let tot = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&tot.to_be_bytes());
    let c = checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    (f, vh)
}

/// Checks a wire frame's IPv4 header and TCP checksums the way a receiver would.
pub fn valid(frame: &[u8]) -> bool {
    let l = parse_l3l4(frame).unwrap();
    let ip_ok = l.l3 == L3::V6 || checksum(&frame[14..14 + l.l3_len]) == 0;
    let s = l.pseudo_sum(frame, l.ip_end - l.l4_off()) + sum(&frame[l.l4_off()..l.ip_end], 0);
    ip_ok && fold(s) == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::{claimed_frame_len, L4};

    /// The header parser on the frames these builders make (here, not in `headers`, so that
    /// the parser's module does not depend on its test frames).
    #[test]
    fn known_frames() {
        let (f, _) = tso_frame(100, false);
        let l = parse_l3l4(&f).unwrap();
        assert_eq!(
            (l.l2_len, l.l3, l.l3_len, l.l4, l.l4_len),
            (14, L3::V4, 20, L4::Tcp, 32)
        );
        assert_eq!(
            l.ip_end,
            f.len(),
            "a TSO frame's total length 0: the frame's end"
        );
        let (p, _) = partial_csum_frame(100);
        assert!(parse_l3l4(&p).unwrap().ip_checksum_ok(&p));
        assert!(
            !l.ip_checksum_ok(&f),
            "a TSO frame's IP checksum is left to us"
        );
        let (f6, _) = tso_frame(100, true);
        let l6 = parse_l3l4(&f6).unwrap();
        assert_eq!((l6.l3, l6.l3_len, l6.ip_end), (L3::V6, 40, f6.len()));
        assert_eq!(claimed_frame_len(&f6), Some(f6.len()));
        assert_eq!(
            claimed_frame_len(&f6[..20]),
            Some(f6.len()),
            "a cut datagram says its length"
        );
        assert_eq!(claimed_frame_len(&f6[..19]), None);
    }
}
