//! The byte layouts of the BPF maps' keys and values, mirroring `bpf/fastpath.h` field for
//! field, so the loader writes and reads the maps without `unsafe` casts. Host-order integers
//! are native-endian (the programs run on this CPU); addresses and ports are network order.

#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use vnet_wire::MacAddr;

/// `PORT_*` flags.
pub const PORT_ANY_SOURCE: u32 = 1;
pub const PORT_DELIVER_PEER: u32 = 2;
pub const PORT_RATE: u32 = 4;
/// `LINK_*` flags.
pub const LINK_RATE: u16 = 4;

/// `ACT_*` kinds (top byte of an action).
pub const ACT_NONE: u32 = 0;
pub const ACT_SLOW: u32 = 1;
pub const ACT_PORT: u32 = 2;
pub const ACT_LINK: u32 = 3;

/// `FWD_*` key kinds, in rank order.
pub const FWD_SRC_DST: u16 = 0;
pub const FWD_DST: u16 = 1;
pub const FWD_SRC: u16 = 2;
pub const FWD_ANY: u16 = 3;
pub const FWDF_CHECK_SRC: u32 = 1;

/// Counter indexes of `enum vnet_counter`.
pub mod counter {
    pub const RX_FRAMES: usize = 0;
    pub const RX_BYTES: usize = 1;
    pub const TX_FRAMES: usize = 2;
    pub const TX_BYTES: usize = 3;
    pub const PUNT_FRAMES: usize = 4;
    pub const PUNT_BYTES: usize = 5;
    pub const SLOW_TX_FRAMES: usize = 6;
    pub const SLOW_TX_BYTES: usize = 7;
    pub const DROP_TRUNCATED: usize = 8;
    pub const DROP_OVERSIZE: usize = 9;
    pub const DROP_SPOOFED_SRC: usize = 10;
    pub const DROP_RATE_LIMITED: usize = 11;
    pub const NEIGH_MISS: usize = 12;
    pub const ENCAP_FAIL: usize = 13;
    pub const GRO_PASSED: usize = 14;
    pub const BAD_LENGTH: usize = 15;
    pub const COUNT: usize = 16;
}

/// Global counter indexes of `enum vnet_global`.
pub mod global {
    pub const UNKNOWN_PORT: usize = 0;
    pub const NOT_VXLAN: usize = 1;
    pub const UNKNOWN_LINK: usize = 2;
    pub const FIB_FAIL: usize = 3;
    pub const VNI_MISMATCH: usize = 4;
    pub const COUNT: usize = 8;
}

/// `struct port_val` (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortVal {
    pub slot: u32,
    pub vni: u32,
    pub mtu: u32,
    pub flags: u32,
    pub ifindex: u32,
    pub punt_ifindex: u32,
    pub mac: MacAddr,
}

impl PortVal {
    pub const SIZE: usize = 32;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        for (i, v) in [
            self.slot,
            self.vni,
            self.mtu,
            self.flags,
            self.ifindex,
            self.punt_ifindex,
        ]
        .iter()
        .enumerate()
        {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        b[24..30].copy_from_slice(&self.mac.0);
        b
    }

    /// Reads a value back (a map an earlier vnetd wrote).
    pub fn from_bytes(b: &[u8]) -> Option<PortVal> {
        let w = |i: usize| {
            Some(u32::from_ne_bytes(
                b.get(i * 4..i * 4 + 4)?.try_into().ok()?,
            ))
        };
        Some(PortVal {
            slot: w(0)?,
            vni: w(1)?,
            mtu: w(2)?,
            flags: w(3)?,
            ifindex: w(4)?,
            punt_ifindex: w(5)?,
            mac: MacAddr::from_bytes(b.get(24..30)?),
        })
    }
}

/// `struct link_key` (8 bytes).
pub fn link_key(remote: Ipv4Addr, vni: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&remote.octets());
    b[4..8].copy_from_slice(&vni.to_ne_bytes());
    b
}

/// `struct link_val` (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkVal {
    pub slot: u32,
    pub vni: u32,
    pub remote: Ipv4Addr,
    pub local: Ipv4Addr,
    pub udp_port: u16,
    pub flags: u16,
    pub via_ifindex: u32,
}

impl LinkVal {
    pub const SIZE: usize = 32;

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&self.slot.to_ne_bytes());
        b[4..8].copy_from_slice(&self.vni.to_ne_bytes());
        b[8..12].copy_from_slice(&self.remote.octets());
        b[12..16].copy_from_slice(&self.local.octets());
        b[16..18].copy_from_slice(&self.udp_port.to_be_bytes());
        b[18..20].copy_from_slice(&self.flags.to_ne_bytes());
        b[24..28].copy_from_slice(&self.via_ifindex.to_ne_bytes());
        b
    }

    /// Reads a value back (a map an earlier vnetd wrote); `None` for an unused slot.
    pub fn from_bytes(b: &[u8]) -> Option<LinkVal> {
        let w = |i: usize| Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let ip = |i: usize| -> Option<Ipv4Addr> {
            let o: [u8; 4] = b.get(i..i + 4)?.try_into().ok()?;
            Some(Ipv4Addr::from(o))
        };
        let v = LinkVal {
            slot: w(0)?,
            vni: w(4)?,
            remote: ip(8)?,
            local: ip(12)?,
            udp_port: u16::from_be_bytes(b.get(16..18)?.try_into().ok()?),
            flags: u16::from_ne_bytes(b.get(18..20)?.try_into().ok()?),
            via_ifindex: w(24)?,
        };
        (!v.remote.is_unspecified()).then_some(v)
    }
}

/// `struct link_cache` (32 bytes, per CPU): written by the programs; the loader only clears it.
pub const LINK_CACHE_SIZE: usize = 32;

/// `outer_epoch`'s value (a `__u32`): moved on to make every cached outer next hop stale.
pub const OUTER_EPOCH_SIZE: usize = 4;

/// `struct fwd_key` (20 bytes).
pub fn fwd_key(vni: u32, kind: u16, src: MacAddr, dst: MacAddr) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&vni.to_ne_bytes());
    b[4..6].copy_from_slice(&kind.to_ne_bytes());
    b[6..12].copy_from_slice(&src.0);
    b[12..18].copy_from_slice(&dst.0);
    b
}

/// `struct fwd_key` read back: (VNI, kind, source, destination).
pub fn fwd_key_parse(b: &[u8]) -> Option<(u32, u16, MacAddr, MacAddr)> {
    Some((
        u32::from_ne_bytes(b.get(0..4)?.try_into().ok()?),
        u16::from_ne_bytes(b.get(4..6)?.try_into().ok()?),
        MacAddr::from_bytes(b.get(6..12)?),
        MacAddr::from_bytes(b.get(12..18)?),
    ))
}

/// `struct fwd_val` read back: (action, flags).
pub fn fwd_val_parse(b: &[u8]) -> Option<(u32, u32)> {
    Some((
        u32::from_ne_bytes(b.get(0..4)?.try_into().ok()?),
        u32::from_ne_bytes(b.get(4..8)?.try_into().ok()?),
    ))
}

/// `struct fwd_val` (8 bytes).
pub fn fwd_val(action: u32, flags: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&action.to_ne_bytes());
    b[4..8].copy_from_slice(&flags.to_ne_bytes());
    b
}

/// An action word: kind in the top byte, slot below.
pub fn action(kind: u32, slot: u32) -> u32 {
    (kind << 24) | (slot & 0x00ff_ffff)
}

/// Units of the token count per byte (as `vnet_core::TokenBucket`).
pub const UNITS_PER_BYTE: i64 = 8_000_000_000;

/// `struct rate_val` (48 bytes) for a full bucket of `burst_bytes` refilled at `rate_bps`.
/// The spin lock's bytes are zero (the kernel never copies a lock from user space).
pub fn rate_val(rate_bps: u64, burst_bytes: u64, now_ns: u64) -> [u8; 48] {
    let rate = rate_bps.max(1);
    // Caps keep `elapsed * rate` and the unit count inside an i64 (1 GB burst, 1 Tbit/s).
    let burst = burst_bytes.clamp(1, 1 << 30) as i64;
    let cap = burst * UNITS_PER_BYTE;
    let fill_ns = (cap as u64).div_ceil(rate);
    let mut b = [0u8; 48];
    b[8..16].copy_from_slice(&rate.to_ne_bytes());
    b[16..24].copy_from_slice(&cap.to_ne_bytes());
    b[24..32].copy_from_slice(&fill_ns.to_ne_bytes());
    b[32..40].copy_from_slice(&cap.to_ne_bytes());
    b[40..48].copy_from_slice(&now_ns.to_ne_bytes());
    b
}

/// The settings of a `struct rate_val` (rate in bit/s, capacity in units), which tell whether a
/// bucket an earlier vnetd set is the one wanted now (then it keeps its tokens).
pub fn rate_params(b: &[u8]) -> Option<(u64, i64)> {
    Some((
        u64::from_ne_bytes(b.get(8..16)?.try_into().ok()?),
        i64::from_ne_bytes(b.get(16..24)?.try_into().ok()?),
    ))
}

/// The tokens (whole bytes, negative in debt) of a `struct rate_val` read back.
pub fn rate_available(b: &[u8]) -> Option<i64> {
    let t = i64::from_ne_bytes(b.get(32..40)?.try_into().ok()?);
    Some(t / UNITS_PER_BYTE)
}

/// `struct matrix_key` (16 bytes).
pub fn matrix_key_parse(b: &[u8]) -> Option<(u32, MacAddr, MacAddr)> {
    if b.len() < 16 {
        return None;
    }
    let vni = u32::from_ne_bytes(b[0..4].try_into().ok()?);
    Some((
        vni,
        MacAddr::from_bytes(&b[4..10]),
        MacAddr::from_bytes(&b[10..16]),
    ))
}

/// Reads the `n` native-endian u64s of a counter value.
pub fn u64s(b: &[u8], n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            b.get(i * 8..i * 8 + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_ne_bytes)
                .unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written() {
        let p = PortVal {
            slot: 3,
            vni: 7,
            mtu: 1450,
            flags: PORT_RATE | PORT_DELIVER_PEER,
            ifindex: 12,
            punt_ifindex: 13,
            mac: MacAddr([2, 0, 0, 0, 0, 9]),
        };
        assert_eq!(PortVal::from_bytes(&p.to_bytes()), Some(p));
        let l = LinkVal {
            slot: 4,
            vni: 7,
            remote: Ipv4Addr::new(10, 0, 0, 2),
            local: Ipv4Addr::new(10, 0, 0, 1),
            udp_port: 4789,
            flags: LINK_RATE,
            via_ifindex: 0,
        };
        assert_eq!(LinkVal::from_bytes(&l.to_bytes()), Some(l));
        assert_eq!(LinkVal::from_bytes(&[0u8; 32]), None, "an unused slot");
        let (src, dst) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        assert_eq!(
            fwd_key_parse(&fwd_key(7, FWD_SRC_DST, src, dst)),
            Some((7, FWD_SRC_DST, src, dst))
        );
        assert_eq!(
            fwd_val_parse(&fwd_val(action(ACT_PORT, 3), 1)),
            Some((action(ACT_PORT, 3), 1))
        );
        let r = rate_val(1_000_000, 1500, 5);
        assert_eq!(rate_params(&r), Some((1_000_000, 1500 * UNITS_PER_BYTE)));
        assert_eq!(PortVal::from_bytes(&[0u8; 8]), None, "too short");
    }

    #[test]
    fn layouts_match_the_c_header() {
        let p = PortVal {
            slot: 1,
            vni: 2,
            mtu: 1500,
            flags: PORT_ANY_SOURCE,
            ifindex: 7,
            punt_ifindex: 8,
            mac: MacAddr([1, 2, 3, 4, 5, 6]),
        }
        .to_bytes();
        assert_eq!(&p[8..12], &1500u32.to_ne_bytes());
        assert_eq!(&p[24..30], &[1, 2, 3, 4, 5, 6]);
        let k = fwd_key(5, FWD_DST, MacAddr::ZERO, MacAddr([9; 6]));
        assert_eq!(&k[12..18], &[9; 6]);
        assert_eq!(link_key(Ipv4Addr::new(10, 0, 0, 1), 3)[0..4], [10, 0, 0, 1]);
        let l = LinkVal {
            slot: 0,
            vni: 1,
            remote: Ipv4Addr::new(10, 0, 0, 2),
            local: Ipv4Addr::new(10, 0, 0, 1),
            udp_port: 4789,
            flags: 0,
            via_ifindex: 0,
        }
        .to_bytes();
        assert_eq!(&l[16..18], &[0x12, 0xb5]);
        assert_eq!(action(ACT_LINK, 5) >> 24, ACT_LINK);
    }

    #[test]
    fn rate_value_starts_full() {
        let r = rate_val(8_000_000, 10_000, 5);
        assert_eq!(rate_available(&r), Some(10_000));
        // fill time of 10 KB at 1 MB/s: 10 ms
        assert_eq!(
            u64::from_ne_bytes(r[24..32].try_into().unwrap()),
            10_000_000
        );
        assert_eq!(u64s(&r[8..16], 1), vec![8_000_000]);
    }
}
