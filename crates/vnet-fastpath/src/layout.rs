//! The layouts of the BPF maps' keys and values, the load-time settings, their flags and the
//! counter indexes, as Rust types, and the C header the programs include ([`c_header`]). Both
//! come from one expansion of their one definition, `src/layout_def.rs`: a field changed there
//! is changed on both sides, and the definition's grammar is written once (the macro below).
//! build.rs compiles this file too (through `#[path]`, with `src/layout_c.rs`) to write the
//! header before clang builds the programs. The types are `#[repr(C)]` without implicit
//! padding (zerocopy's derives refuse to compile otherwise), so the loader reads and writes the
//! maps with them and no `unsafe`; the test in `src/maps.rs` checks them against the BTF of the
//! compiled object (no root). Host-order integers are native-endian (the programs run on this
//! CPU); fields named `*_be` hold network order.
//!
//! Pure: no clang, no libbpf (the feature-less build has it too).

#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use vnet_wire::MacAddr;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A field of a struct of the interface, as Rust lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// A struct of the interface, as Rust lays it out: what the object's BTF must say too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructLayout {
    pub c_name: &'static str,
    pub size: usize,
    pub fields: &'static [FieldLayout],
}

/// A key or value type of a map: its size is `size_of::<Self>()`; a struct of the interface
/// also has its C name (checked against the map's BTF).
pub trait BpfType: FromBytes + IntoBytes + Immutable {
    const C_NAME: Option<&'static str>;
}

impl BpfType for u32 {
    const C_NAME: Option<&'static str> = None;
}

impl<const N: usize> BpfType for [u64; N] {
    const C_NAME: Option<&'static str> = None;
}

/// `struct bpf_spin_lock` of linux/bpf.h: zero as user space writes it (the kernel never
/// copies a lock from user space).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct BpfSpinLock {
    pub val: u32,
}

/// The expansion of `src/layout_def.rs`: its Rust types and constants, and [`c_header`], the
/// same definition written in C.
macro_rules! bpf_layout {
    (
        consts { $( $(#[doc = $cdoc:literal])* $cname:ident : $cty:ty = $cval:expr ; )* }
        enums { $(
            $(#[doc = $edoc:literal])*
            $ename:ident as $emod:ident prefix $epre:ident {
                $( $(#[doc = $vdoc:literal])* $vname:ident = $vval:literal ),* $(,)?
            }
        )* }
        structs { $(
            $(#[doc = $sdoc:literal])*
            $sname:ident as $rname:ident {
                $( $(#[doc = $fdoc:literal])* $fname:ident : $fty:ty ),* $(,)?
            }
        )* }
    ) => {
        $(
            $(#[doc = $cdoc])*
            pub const $cname: $cty = $cval;
        )*
        $(
            $(#[doc = $edoc])*
            #[doc = concat!("\n\nC: `enum ", stringify!($ename), "`, `", stringify!($epre), "*`.")]
            pub mod $emod {
                $(
                    $(#[doc = $vdoc])*
                    pub const $vname: usize = $vval;
                )*
            }
        )*
        $(
            $(#[doc = $sdoc])*
            #[doc = concat!("\n\nC: `struct ", stringify!($sname), "`.")]
            #[repr(C)]
            #[derive(
                Debug, Clone, Copy, Default, PartialEq, Eq,
                FromBytes, IntoBytes, Immutable, KnownLayout,
            )]
            pub struct $rname {
                $(
                    $(#[doc = $fdoc])*
                    pub $fname: $fty,
                )*
            }

            impl BpfType for $rname {
                const C_NAME: Option<&'static str> = Some(stringify!($sname));
            }
        )*

        /// Every constant of the interface, by name (for the layout's hash).
        pub const CONSTS: &[(&str, u64)] = &[$( (stringify!($cname), ($cval) as u64), )*];

        /// Every value of the enums: (enum, name, value) (for the layout's hash).
        pub const ENUM_VALUES: &[(&str, &str, usize)] = &[$( $(
            (stringify!($ename), stringify!($vname), $vval),
        )* )*];

        /// Every struct of the interface as Rust lays it out (for the check against BTF).
        pub const STRUCTS: &[StructLayout] = &[$(
            StructLayout {
                c_name: stringify!($sname),
                size: std::mem::size_of::<$rname>(),
                fields: &[$(
                    FieldLayout {
                        name: stringify!($fname),
                        offset: std::mem::offset_of!($rname, $fname),
                        size: std::mem::size_of::<$fty>(),
                    },
                )*],
            },
        )*];

        /// The C header `fastpath_layout.h` (what build.rs writes for the programs): the
        /// constants as `#define`s, the counter enums, the structs, with their doc comments.
        pub fn c_header() -> String {
            use crate::layout_c::{c_define, c_doc, c_field};
            let mut h = String::from(
                "/* Generated by build.rs from src/layout_def.rs (the one definition of the\n \
                 * interface; src/layout.rs is its Rust side): do not edit. */\n\
                 #ifndef VNET_FASTPATH_LAYOUT_H\n#define VNET_FASTPATH_LAYOUT_H\n\n",
            );
            $(
                c_doc(&mut h, "", &[$($cdoc),*]);
                h.push_str(&c_define(stringify!($cname), stringify!($cty), ($cval) as u64));
            )*
            h.push('\n');
            $(
                c_doc(&mut h, "", &[$($edoc),*]);
                h.push_str(&format!("enum {} {{\n", stringify!($ename)));
                $(
                    c_doc(&mut h, "\t", &[$($vdoc),*]);
                    h.push_str(&format!(
                        "\t{}{} = {},\n",
                        stringify!($epre),
                        stringify!($vname),
                        $vval
                    ));
                )*
                h.push_str("};\n\n");
            )*
            $(
                c_doc(&mut h, "", &[$($sdoc),*]);
                h.push_str(&format!("struct {} {{\n", stringify!($sname)));
                $(
                    c_doc(&mut h, "\t", &[$($fdoc),*]);
                    h.push_str(&format!("\t{};\n", c_field(stringify!($fname), stringify!($fty))));
                )*
                h.push_str("};\n\n");
            )*
            h.push_str("#endif\n");
            h
        }
    };
}

include!("layout_def.rs");

const _: () = assert!(counter::COUNT.is_power_of_two() && global::COUNT.is_power_of_two());

/// The layout in words, one line per struct field, constant and enum value, with `maps` (which
/// map holds which types, `maps.rs`) after them: what a map pinned by one version of vnet
/// means to another. Comments and names of no field are left out, so only a change to what
/// the bytes mean changes it.
pub fn signature(maps: &str) -> String {
    let mut s = String::new();
    for st in STRUCTS {
        s.push_str(&format!("struct {} {}\n", st.c_name, st.size));
        for f in st.fields {
            s.push_str(&format!(" {} {} {}\n", f.name, f.offset, f.size));
        }
    }
    for (name, value) in CONSTS {
        s.push_str(&format!("const {name} {value}\n"));
    }
    for (e, name, value) in ENUM_VALUES {
        s.push_str(&format!("enum {e} {name} {value}\n"));
    }
    s.push_str(maps);
    s
}

/// The layout's hash (FNV-1a, 64 bits, of [`signature`]): in the name of the directory the
/// maps are pinned in, so a vnet of another layout never reuses them (issue #32).
pub fn layout_hash(maps: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in signature(maps).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hash of the layout every vnet had before pinned maps carried one (they are in `maps/`,
/// with no hash): such maps are reused only by a vnet whose layout hashes the same.
pub const UNHASHED_LAYOUT: u64 = 0x7260_971b_887a_e19d;

/// Where a pin directory's maps of layout `hash` are: `maps-HASH`.
pub fn maps_dir_name(hash: u64) -> String {
    format!("maps-{hash:016x}")
}

/// The directories of a pin directory whose maps a vnet of layout `hash` may reuse, best
/// first: its own, then `maps/` (pinned by a vnet from before the hash) when its layout is
/// the one every such vnet had.
pub fn reusable_maps_dirs(hash: u64) -> Vec<String> {
    let mut v = vec![maps_dir_name(hash)];
    if hash == UNHASHED_LAYOUT {
        v.push("maps".to_string());
    }
    v
}

/// An action word: kind in the top byte, slot below.
pub fn action(kind: u32, slot: u32) -> u32 {
    (kind << ACT_SHIFT) | (slot & ACT_SLOT_MASK)
}

/// The kind (`ACT_*`) and the slot of an action word.
pub fn action_parts(word: u32) -> (u32, u32) {
    (word >> ACT_SHIFT, word & ACT_SLOT_MASK)
}

/// An IPv4 address as a `*_be` field holds it.
pub fn ip_be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// The IPv4 address of a `*_be` field.
pub fn ip_of_be(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v.to_ne_bytes())
}

impl LinkKey {
    /// The key of datagrams from `remote` in `vni`; from its UDP port `sport` when the link
    /// is found by port too (0: any port).
    pub fn new(remote: Ipv4Addr, sport: u16, vni: u32) -> LinkKey {
        LinkKey {
            remote_be: ip_be(remote),
            vni,
            sport_be: sport.to_be(),
            pad: 0,
        }
    }

    /// The receive key of link value `v`: its remote's address, and its port when the link's
    /// source port is fixed (a reach link's peer sends from the port we send to).
    pub fn of(v: &LinkVal) -> LinkKey {
        let sport = match v.sport_be {
            0 => 0,
            _ => u16::from_be(v.dport_be),
        };
        LinkKey::new(v.remote(), sport, v.vni)
    }
}

impl RelayRxKey {
    /// The key of datagrams a relay at `relay`:`port` sends in `vni` from the peer tagged
    /// `tag`.
    pub fn new(relay: Ipv4Addr, port: u16, vni: u32, tag: [u8; 8]) -> RelayRxKey {
        RelayRxKey {
            relay_be: ip_be(relay),
            vni,
            relay_port_be: port.to_be(),
            pad: 0,
            tag,
        }
    }
}

impl RelayFwdKey {
    /// The key of relay datagrams from `src`:`port` for the member tagged `dst_tag`.
    pub fn new(src: Ipv4Addr, port: u16, dst_tag: [u8; 8]) -> RelayFwdKey {
        RelayFwdKey {
            src_be: ip_be(src),
            src_port_be: port.to_be(),
            pad: 0,
            dst_tag,
        }
    }
}

impl LinkVal {
    pub fn remote(&self) -> Ipv4Addr {
        ip_of_be(self.remote_be)
    }

    /// Whether the slot holds a link (an unused slot is all zero).
    pub fn is_set(&self) -> bool {
        self.remote_be != 0
    }
}

impl FwdMapKey {
    pub fn new(vni: u32, kind: u16, src: MacAddr, dst: MacAddr) -> FwdMapKey {
        FwdMapKey {
            vni,
            kind,
            src: src.0,
            dst: dst.0,
            pad: 0,
        }
    }
}

/// Units of the token count per byte (as `vnet_core::TokenBucket`).
pub const UNITS_PER_BYTE: i64 = 8_000_000_000;

impl RateVal {
    /// A full bucket of `burst_bytes` refilled at `rate_bps`.
    pub fn full(rate_bps: u64, burst_bytes: u64, now_ns: u64) -> RateVal {
        let rate = rate_bps.max(1);
        // Caps keep `elapsed * rate` and the unit count inside an i64 (1 GB burst, 1 Tbit/s).
        let burst = burst_bytes.clamp(1, 1 << 30) as i64;
        let cap = burst * UNITS_PER_BYTE;
        RateVal {
            rate_bps: rate,
            cap,
            fill_ns: (cap as u64).div_ceil(rate),
            tokens: cap,
            last_ns: now_ns,
            ..RateVal::default()
        }
    }

    /// The settings (rate in bit/s, capacity in units), which tell whether a bucket an earlier
    /// vnetd set is the one wanted now (then it keeps its tokens).
    pub fn params(&self) -> (u64, i64) {
        (self.rate_bps, self.cap)
    }

    /// The tokens in whole bytes (negative in debt).
    pub fn available(&self) -> i64 {
        self.tokens / UNITS_PER_BYTE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_order_fields_hold_network_order() {
        // BTF tells sizes and offsets, not byte order: these are checked here.
        let k = LinkKey::new(Ipv4Addr::new(10, 0, 0, 1), 0, 3);
        assert_eq!(&k.as_bytes()[0..4], &[10, 0, 0, 1]);
        assert_eq!(&k.as_bytes()[4..8], &3u32.to_ne_bytes());
        let l = LinkVal {
            remote_be: ip_be(Ipv4Addr::new(10, 0, 0, 2)),
            dport_be: 4789u16.to_be(),
            ..LinkVal::default()
        };
        assert_eq!(&l.as_bytes()[16..18], &[0x12, 0xb5]);
        assert_eq!(l.remote(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(l.is_set());
        assert!(!LinkVal::default().is_set(), "an unused slot");
    }

    #[test]
    fn values_read_back_as_written() {
        let (src, dst) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        let k = FwdMapKey::new(7, FWD_SRC_DST, src, dst);
        assert_eq!(FwdMapKey::read_from_bytes(k.as_bytes()).ok(), Some(k));
        assert_eq!(&k.as_bytes()[12..18], &dst.0);
        let p = PortVal {
            slot: 3,
            mac: [1, 2, 3, 4, 5, 6],
            ..PortVal::default()
        };
        assert_eq!(PortVal::read_from_bytes(p.as_bytes()).ok(), Some(p));
        assert!(PortVal::read_from_bytes(&[0u8; 8]).is_err(), "too short");
    }

    #[test]
    fn the_c_header_declares_what_the_rust_side_has() {
        let h = c_header();
        for s in STRUCTS {
            assert!(
                h.contains(&format!("struct {} {{\n", s.c_name)),
                "{}",
                s.c_name
            );
        }
        assert!(h.contains("#define ACT_SHIFT 24u\n"));
        assert!(h.contains("\tC_RX_FRAMES = 0,\n"));
        assert!(h.starts_with("/* Generated") && h.ends_with("#endif\n"));
    }

    #[test]
    fn the_hash_follows_what_the_bytes_mean() {
        let h = layout_hash("map ports\n");
        assert_eq!(h, layout_hash("map ports\n"), "stable");
        assert_ne!(h, layout_hash("map ports2\n"), "the maps are part of it");
        let sig = signature("");
        assert!(sig.contains("struct port_val 32\n slot 0 4\n"), "{sig}");
        assert!(sig.contains("const ACT_SHIFT 24\n"));
        assert!(sig.contains("enum vnet_counter RX_FRAMES 0\n"));
        assert!(!sig.contains("//"), "comments are not the layout");
    }

    #[test]
    fn unhashed_maps_are_reused_only_under_the_layout_they_had() {
        assert_eq!(
            reusable_maps_dirs(UNHASHED_LAYOUT),
            vec![maps_dir_name(UNHASHED_LAYOUT), "maps".to_string()]
        );
        assert_eq!(
            reusable_maps_dirs(1),
            vec!["maps-0000000000000001".to_string()]
        );
    }

    #[test]
    fn action_words() {
        let w = action(ACT_LINK, 5);
        assert_eq!(action_parts(w), (ACT_LINK, 5));
        assert_eq!(action_parts(action(ACT_PORT, 0x0100_0003)), (ACT_PORT, 3));
    }

    #[test]
    fn rate_value_starts_full() {
        let r = RateVal::full(8_000_000, 10_000, 5);
        assert_eq!(r.available(), 10_000);
        // fill time of 10 KB at 1 MB/s: 10 ms
        assert_eq!(r.fill_ns, 10_000_000);
        assert_eq!(r.params(), (8_000_000, 10_000 * UNITS_PER_BYTE));
        assert_eq!(r.lock, BpfSpinLock::default(), "the lock's bytes are zero");
    }
}
