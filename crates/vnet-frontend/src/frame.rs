//! Test frames and the virtio-net header: IPv4/UDP frames with correct checksums, and IPv4/TCP
//! TSO frames (partial checksum, GSO_TCPV4) for sizes above the MTU.

use anyhow::{bail, Result};
use std::net::Ipv4Addr;

/// Size of `virtio_net_hdr_v1` (VERSION_1: num_buffers is always present).
pub const VNET_HDR_LEN: usize = 12;
pub const ETH_HLEN: usize = 14;
const IP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const TCP_HLEN: usize = 20;
/// Smallest frame we build: Ethernet + IPv4 + UDP headers.
pub const MIN_FRAME: usize = ETH_HLEN + IP_HLEN + UDP_HLEN;
/// Largest frame: an IPv4 datagram of 65535 bytes plus the Ethernet header.
pub const MAX_FRAME: usize = ETH_HLEN + 65535;

pub const HDR_F_NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;

/// `virtio_net_hdr_v1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
}

impl VirtioNetHdr {
    pub fn to_bytes(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; VNET_HDR_LEN]) -> Self {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
            num_buffers: u(10),
        }
    }
}

/// What to put into test frames.
#[derive(Clone, Debug)]
pub struct FrameSpec {
    /// Ethernet frame size including the 14-byte Ethernet header (no FCS).
    pub size: usize,
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    /// IP MTU: frames up to `mtu + 14` are plain UDP, larger ones need `tso`.
    pub mtu: usize,
    /// TSO allowed (HOST_TSO4 + CSUM negotiated).
    pub tso: bool,
    /// Segment size for TSO frames.
    pub mss: u16,
}

impl Default for FrameSpec {
    fn default() -> Self {
        FrameSpec {
            size: 64,
            dst_mac: [0xff; 6],
            src_mac: [0x02, 0x00, 0x00, 0x00, 0x00, 0x01],
            src_ip: Ipv4Addr::new(10, 99, 0, 1),
            dst_ip: Ipv4Addr::new(10, 99, 0, 2),
            src_port: 40000,
            dst_port: 9,
            mtu: 1500,
            tso: false,
            mss: 1448,
        }
    }
}

/// Parses "aa:bb:cc:dd:ee:ff".
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        bail!("bad MAC address {s:?}");
    }
    let mut m = [0u8; 6];
    for (o, p) in m.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16).map_err(|_| anyhow::anyhow!("bad MAC address {s:?}"))?;
    }
    Ok(m)
}

/// One's complement sum of `data` (big-endian 16-bit words) added to `acc`, not folded.
pub fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        acc += (*last as u64) << 8;
    }
    acc
}

/// Folds a sum to 16 bits (not complemented).
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum of `data` (complemented).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(ones_sum(data, 0))
}

/// Sum of the IPv4 pseudo header for a transport segment of `len` bytes.
pub fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: u32) -> u64 {
    let mut acc = ones_sum(&src.octets(), 0);
    acc = ones_sum(&dst.octets(), acc);
    acc + proto as u64 + (len & 0xffff) as u64 + (len >> 16) as u64
}

fn ipv4_header(spec: &FrameSpec, proto: u8, total_len: u16, id: u16) -> [u8; IP_HLEN] {
    let mut h = [0u8; IP_HLEN];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total_len.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&spec.src_ip.octets());
    h[16..20].copy_from_slice(&spec.dst_ip.octets());
    let c = checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

fn payload_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(7)
}

/// Builds one test frame and the virtio-net header to send it with.
pub fn build_frame(spec: &FrameSpec) -> Result<(VirtioNetHdr, Vec<u8>)> {
    if spec.size < MIN_FRAME {
        bail!(
            "frame size {} below the minimum of {MIN_FRAME} (Ethernet+IPv4+UDP)",
            spec.size
        );
    }
    if spec.size > MAX_FRAME {
        bail!("frame size {} above the maximum of {MAX_FRAME}", spec.size);
    }
    let mut f = Vec::with_capacity(spec.size);
    f.extend_from_slice(&spec.dst_mac);
    f.extend_from_slice(&spec.src_mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = spec.size - ETH_HLEN;
    if spec.size <= spec.mtu + ETH_HLEN {
        // Plain UDP, all checksums filled in.
        let udp_len = ip_len - IP_HLEN;
        f.extend_from_slice(&ipv4_header(spec, 17, ip_len as u16, 1));
        let mut udp = Vec::with_capacity(udp_len);
        udp.extend_from_slice(&spec.src_port.to_be_bytes());
        udp.extend_from_slice(&spec.dst_port.to_be_bytes());
        udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend((0..udp_len - UDP_HLEN).map(payload_byte));
        let mut c = !fold(ones_sum(
            &udp,
            pseudo_sum(spec.src_ip, spec.dst_ip, 17, udp_len as u32),
        ));
        if c == 0 {
            c = 0xffff;
        }
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&udp);
        return Ok((VirtioNetHdr::default(), f));
    }
    if !spec.tso {
        bail!(
            "frame size {} exceeds the MTU ({} + 14): needs --offload (HOST_TSO4 and CSUM)",
            spec.size,
            spec.mtu
        );
    }
    if spec.size < ETH_HLEN + IP_HLEN + TCP_HLEN + 1 {
        bail!("frame too small for TSO");
    }
    // TSO: IPv4 + TCP, the TCP checksum field holds the pseudo-header sum (partial checksum,
    // the device finishes it per segment).
    let tcp_len = ip_len - IP_HLEN;
    f.extend_from_slice(&ipv4_header(spec, 6, ip_len as u16, 1));
    let mut tcp = [0u8; TCP_HLEN];
    tcp[0..2].copy_from_slice(&spec.src_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&spec.dst_port.to_be_bytes());
    tcp[4..8].copy_from_slice(&1u32.to_be_bytes()); // seq
    tcp[8..12].copy_from_slice(&1u32.to_be_bytes()); // ack
    tcp[12] = (TCP_HLEN as u8 / 4) << 4;
    tcp[13] = 0x18; // PSH|ACK
    tcp[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    let partial = fold(pseudo_sum(spec.src_ip, spec.dst_ip, 6, tcp_len as u32));
    tcp[16..18].copy_from_slice(&partial.to_be_bytes());
    f.extend_from_slice(&tcp);
    f.extend((0..tcp_len - TCP_HLEN).map(payload_byte));
    let hdr = VirtioNetHdr {
        flags: HDR_F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: (ETH_HLEN + IP_HLEN + TCP_HLEN) as u16,
        gso_size: spec.mss,
        csum_start: (ETH_HLEN + IP_HLEN) as u16,
        csum_offset: 16,
        num_buffers: 0,
    };
    Ok((hdr, f))
}

/// Checks an IPv4/UDP or IPv4/TCP frame's checksums as a receiving stack would. For a frame
/// sent with NEEDS_CSUM, pass `partial` = true: then the transport checksum must hold the
/// pseudo-header sum instead.
pub fn verify_frame(f: &[u8], partial: bool) -> Result<()> {
    if f.len() < MIN_FRAME || f[12..14] != [0x08, 0x00] {
        bail!("not an IPv4 frame");
    }
    let ip = &f[ETH_HLEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ip[0] >> 4 != 4 || ihl < IP_HLEN || ip.len() < ihl {
        bail!("bad IPv4 header");
    }
    if fold(ones_sum(&ip[..ihl], 0)) != 0xffff {
        bail!("bad IPv4 header checksum");
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if total != ip.len() {
        bail!("IPv4 length {total} != {}", ip.len());
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let l4 = &ip[ihl..];
    let ps = pseudo_sum(src, dst, ip[9], l4.len() as u32);
    match (ip[9], partial) {
        (17, false) => {
            if u16::from_be_bytes([l4[4], l4[5]]) as usize != l4.len() {
                bail!("bad UDP length");
            }
            if fold(ones_sum(l4, ps)) != 0xffff {
                bail!("bad UDP checksum");
            }
        }
        (6, false) => {
            if fold(ones_sum(l4, ps)) != 0xffff {
                bail!("bad TCP checksum");
            }
        }
        (6, true) => {
            if u16::from_be_bytes([l4[16], l4[17]]) != fold(ps) {
                bail!("TCP partial checksum is not the pseudo-header sum");
            }
        }
        (p, _) => bail!("unexpected protocol {p}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a frame of `size` bytes (`tso`: a TSO one) is refused.
    fn refused(size: usize, tso: bool) -> bool {
        build_frame(&FrameSpec {
            size,
            tso,
            ..Default::default()
        })
        .is_err()
    }

    #[test]
    fn known_checksum() {
        // The classic IPv4 header example (checksum 0xb861).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
        assert_eq!(fold(0x1_fffe), 0xffff);
        assert_eq!(ones_sum(&[1], 0), 0x100);
    }

    #[test]
    fn udp_frames_verify() {
        for size in [42, 60, 64, 65, 512, 1500, 1514] {
            let spec = FrameSpec {
                size,
                ..Default::default()
            };
            let (h, f) = build_frame(&spec).expect("build");
            assert_eq!(f.len(), size);
            assert_eq!(h, VirtioNetHdr::default());
            verify_frame(&f, false).unwrap_or_else(|e| panic!("size {size}: {e}"));
        }
        assert!(refused(1515, false));
        assert!(refused(41, false));
    }

    #[test]
    fn tso_frame() {
        let spec = FrameSpec {
            size: 65536,
            tso: true,
            ..Default::default()
        };
        let (h, f) = build_frame(&spec).expect("build");
        assert_eq!(f.len(), 65536);
        assert_eq!(h.gso_type, GSO_TCPV4);
        assert_eq!(h.flags, HDR_F_NEEDS_CSUM);
        assert_eq!((h.csum_start, h.csum_offset, h.hdr_len), (34, 16, 54));
        assert_eq!(h.gso_size, 1448);
        verify_frame(&f, true).expect("partial checksum");
        // Finishing the checksum as the device would gives a valid TCP segment.
        let mut done = f.clone();
        let start = h.csum_start as usize;
        let c = checksum(&done[start..]);
        let at = start + h.csum_offset as usize;
        done[at..at + 2].copy_from_slice(&c.to_be_bytes());
        verify_frame(&done, false).expect("completed checksum");
        assert!(refused(MAX_FRAME + 1, true));
    }

    #[test]
    fn header_bytes() {
        let h = VirtioNetHdr {
            flags: 1,
            gso_type: 1,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 3,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 1, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 3, 0]);
        assert_eq!(VirtioNetHdr::from_bytes(&b), h);
        assert_eq!(
            parse_mac("02:00:00:aa:bb:cc").expect("mac"),
            [2, 0, 0, 0xaa, 0xbb, 0xcc]
        );
        assert!(parse_mac("02:00").is_err());
    }
}
