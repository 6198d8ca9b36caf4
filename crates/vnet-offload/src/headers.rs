//! Just enough of Ethernet, IPv4, IPv6, TCP and UDP to segment and coalesce.

use crate::OffloadError;
use vnet_wire::checksum::sum;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    V4,
    V6,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    Tcp,
    Udp,
}

/// Where the headers of a TCP or UDP frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub l2_len: usize,
    pub l3: L3,
    pub l3_len: usize,
    pub l4: L4,
    pub l4_len: usize,
    /// End of the IP packet within the frame (Ethernet padding excluded).
    pub ip_end: usize,
}

impl Layout {
    pub fn l4_off(&self) -> usize {
        self.l2_len + self.l3_len
    }

    pub fn hdr_len(&self) -> usize {
        self.l2_len + self.l3_len + self.l4_len
    }

    /// Offset of the L4 checksum field from the start of the L4 header.
    pub fn csum_offset(&self) -> usize {
        match self.l4 {
            L4::Tcp => 16,
            L4::Udp => 6,
        }
    }

    pub fn proto(&self) -> u8 {
        match self.l4 {
            L4::Tcp => 6,
            L4::Udp => 17,
        }
    }

    /// The running sum of the TCP/UDP pseudo-header for an L4 length of `l4_total`.
    pub fn pseudo_sum(&self, frame: &[u8], l4_total: usize) -> u64 {
        let l3 = self.l2_len;
        match self.l3 {
            L3::V4 => {
                let s = sum(&frame[l3 + 12..l3 + 20], 0);
                s + self.proto() as u64 + l4_total as u64
            }
            L3::V6 => {
                let s = sum(&frame[l3 + 8..l3 + 40], 0);
                s + self.proto() as u64 + (l4_total as u64 & 0xffff) + ((l4_total as u64) >> 16)
            }
        }
    }
}

/// Finds the headers of an (optionally VLAN-tagged) IPv4/IPv6 TCP or UDP frame. Fragments,
/// IPv6 extension headers and everything else are `Unsupported`.
pub fn parse_l3l4(frame: &[u8]) -> Result<Layout, OffloadError> {
    if frame.len() < 14 {
        return Err(OffloadError::Truncated);
    }
    let mut l2 = 14;
    let mut et = u16::from_be_bytes([frame[12], frame[13]]);
    if et == 0x8100 {
        if frame.len() < 18 {
            return Err(OffloadError::Truncated);
        }
        et = u16::from_be_bytes([frame[16], frame[17]]);
        l2 = 18;
    }
    let ip = frame.get(l2..).ok_or(OffloadError::Truncated)?;
    let (l3, l3_len, proto, ip_len) = match et {
        0x0800 => {
            if ip.len() < 20 || ip[0] >> 4 != 4 {
                return Err(OffloadError::Truncated);
            }
            let ihl = (ip[0] & 0x0f) as usize * 4;
            let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
            let frag = u16::from_be_bytes([ip[6], ip[7]]);
            if ihl < 20 || frag & 0x3fff != 0 {
                return Err(OffloadError::Unsupported);
            }
            (L3::V4, ihl, ip[9], total)
        }
        0x86dd => {
            if ip.len() < 40 || ip[0] >> 4 != 6 {
                return Err(OffloadError::Truncated);
            }
            let payload = u16::from_be_bytes([ip[4], ip[5]]) as usize;
            (L3::V6, 40, ip[6], 40 + payload)
        }
        _ => return Err(OffloadError::Unsupported),
    };
    let (l4, l4_min) = match proto {
        6 => (L4::Tcp, 20),
        17 => (L4::Udp, 8),
        _ => return Err(OffloadError::Unsupported),
    };
    let l4_off = l2 + l3_len;
    if frame.len() < l4_off + l4_min {
        return Err(OffloadError::Truncated);
    }
    let l4_len = match l4 {
        L4::Tcp => (frame[l4_off + 12] >> 4) as usize * 4,
        L4::Udp => 8,
    };
    if l4_len < l4_min || frame.len() < l4_off + l4_len {
        return Err(OffloadError::Truncated);
    }
    // A 64 KB TSO frame's IP length field may say 0 (or be stale); trust the frame then.
    let ip_end = if ip_len >= l3_len + l4_len && l2 + ip_len <= frame.len() {
        l2 + ip_len
    } else {
        frame.len()
    };
    Ok(Layout {
        l2_len: l2,
        l3,
        l3_len,
        l4,
        l4_len,
        ip_end,
    })
}

/// The length an IPv4/IPv6 frame's own headers claim for it (L2 header plus the IP length
/// field), whatever the buffer holds; `None` for other frames.
pub fn claimed_frame_len(frame: &[u8]) -> Option<usize> {
    let (l2, et) = match frame.get(12..14)? {
        [0x81, 0x00] => (18, u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?])),
        b => (14, u16::from_be_bytes([b[0], b[1]])),
    };
    let ip = frame.get(l2..)?;
    match et {
        0x0800 if ip.len() >= 4 && ip[0] >> 4 == 4 => {
            Some(l2 + u16::from_be_bytes([ip[2], ip[3]]) as usize)
        }
        0x86dd if ip.len() >= 6 && ip[0] >> 4 == 6 => {
            Some(l2 + 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize)
        }
        _ => None,
    }
}
