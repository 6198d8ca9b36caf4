// The one definition of the interface between the BPF programs and the loader: the maps' keys
// and values, the load-time settings, the flags and kinds in them, and the counter indexes.
// One macro in src/layout.rs expands it into both sides: Rust types (`#[repr(C)]`, no implicit
// padding) and the C header fastpath_layout.h that build.rs writes and bpf/fastpath.bpf.c
// includes. To change a field, change it here; `cargo test` (no root) checks the compiled
// object's BTF against the Rust types (src/maps.rs).
//
// Integers are host order unless named *_be (network order). Field types: u8, u16, u32, u64,
// i64, [u8; N], BpfSpinLock. Counter indexes are a contract with the maps an earlier vnetd
// pinned: add at the end, never renumber.

bpf_layout! {
    consts {
        /// The guest may send with any source MAC (`port_val.flags`).
        PORT_ANY_SOURCE: u32 = 1;
        /// Deliver with bpf_redirect_peer (a veth whose peer is in another netns).
        PORT_DELIVER_PEER: u32 = 2;
        /// The port has a token bucket in `rates`.
        PORT_RATE: u32 = 4;
        /// The link has a token bucket in `rates`, for what arrives from it (`link_val.flags`).
        LINK_RATE: u16 = 4;
        /// vnetd sends the link's frames (its path goes through a relay, or is not known yet):
        /// punt (`link_val.flags`).
        LINK_PUNT: u16 = 8;
        /// The link's path goes through a relay: its datagrams go to the relay's endpoint with
        /// the relay header (`link_val.relay_tag`) between the UDP and the VXLAN headers
        /// (`link_val.flags`).
        LINK_RELAYED: u16 = 16;
        /// The relay header's first word: MSG_RELAY (0x22), version 1, two zero bytes (as
        /// vnet_reach::wire writes it).
        RELAY_WORD: u32 = 0x2201_0000;
        /// The relay header's length: that word and the 8-byte tag.
        RELAY_HLEN: u32 = 12;
        /// Forwarding action kinds, in the top byte of an action (`ACT_KIND << ACT_SHIFT | slot`):
        /// no rule of this rank, look at the next rank.
        ACT_NONE: u32 = 0;
        /// Only vnetd can decide: punt.
        ACT_SLOW: u32 = 1;
        /// Deliver to the fast-path port in the slot.
        ACT_PORT: u32 = 2;
        /// Encapsulate to the plain udp link in the slot.
        ACT_LINK: u32 = 3;
        /// Where the kind starts in an action word.
        ACT_SHIFT: u32 = 24;
        /// The slot bits of an action word.
        ACT_SLOT_MASK: u32 = 0xff_ffff;
        /// Forwarding key kinds, in rank order (see src/compile.rs): (source MAC, destination MAC).
        FWD_SRC_DST: u16 = 0;
        /// (any, destination MAC).
        FWD_DST: u16 = 1;
        /// (source MAC, any).
        FWD_SRC: u16 = 2;
        /// (any, any).
        FWD_ANY: u16 = 3;
        /// Exact-source entries exist at this destination rank: look first (`fwd_val.flags`).
        FWDF_CHECK_SRC: u32 = 1;
    }
    enums {
        /// Counter indexes (u64 each) in `counters`, per port slot or per (max_ports + link slot).
        vnet_counter as counter prefix C_ {
            /// Frames taken from the port / link by the kernel path.
            RX_FRAMES = 0,
            RX_BYTES = 1,
            /// Frames the kernel path delivered to the port / sent on the link.
            TX_FRAMES = 2,
            TX_BYTES = 3,
            /// Frames handed to vnetd (punt TAP for a port, the stack for a link).
            PUNT_FRAMES = 4,
            PUNT_BYTES = 5,
            /// Frames vnetd wrote to the punt TAP, delivered to the guest.
            SLOW_TX_FRAMES = 6,
            SLOW_TX_BYTES = 7,
            DROP_TRUNCATED = 8,
            DROP_OVERSIZE = 9,
            DROP_SPOOFED_SRC = 10,
            DROP_RATE_LIMITED = 11,
            /// Outer next hop unresolved: punted so vnetd's send resolves it.
            NEIGH_MISS = 12,
            /// The kernel refused to add or remove the outer headers: punted.
            ENCAP_FAIL = 13,
            /// A GRO/GSO aggregate of several UDP datagrams: passed to the stack.
            GRO_PASSED = 14,
            /// Outer IPv4 / UDP lengths disagree with the datagram: passed to the stack.
            BAD_LENGTH = 15,
            /// A power of two: indexes are masked with COUNT - 1.
            COUNT = 16,
        }
        /// Global counter indexes in `global`.
        vnet_global as global prefix G_ {
            /// A program ran on a device with no port / punt entry.
            UNKNOWN_PORT = 0,
            /// Underlay traffic that is not VXLAN to our port: passed.
            NOT_VXLAN = 1,
            /// VXLAN from an unknown (source IP, VNI): passed (vnetd counts it).
            UNKNOWN_LINK = 2,
            /// No route to a link's remote address: punted.
            FIB_FAIL = 3,
            /// A table decision into another VNI (a bug): punted / passed, not followed.
            VNI_MISMATCH = 4,
            /// Frames of a (VNI, source, destination) pair the traffic matrix had no room
            /// for (its map full): not in the matrix, counted here.
            MATRIX_FULL = 5,
            SPARE6 = 6,
            SPARE7 = 7,
            /// A power of two: indexes are masked with COUNT - 1.
            COUNT = 8,
        }
    }
    structs {
        /// Load-time settings (`.rodata`, written through the skeleton before load).
        fp_config as FpConfig {
            /// 0: bpf_fib_lookup for every packet; else cache outer headers this long.
            outer_cache_ns: u64,
            /// Link slot n uses counters/rates index max_ports + n.
            max_ports: u32,
            /// The VXLAN UDP port that underlay_ingress decapsulates.
            vxlan_port_be: u16,
            pad: u16,
        }
        /// A fast-path port (`ports` by ifindex, `port_slots` by slot).
        port_val as PortVal {
            /// Index of the port's counters, rate bucket and `port_slots` entry.
            slot: u32,
            vni: u32,
            mtu: u32,
            /// PORT_*.
            flags: u32,
            /// The port's host-side netdev.
            ifindex: u32,
            /// vnetd's punt TAP for this port.
            punt_ifindex: u32,
            /// The guest's MAC.
            mac: [u8; 6],
            pad: u16,
        }
        /// A link by what its datagrams carry (`links_rx`).
        link_key as LinkKey {
            /// Remote IPv4.
            remote_be: u32,
            vni: u32,
            /// The remote's UDP source port for a link whose datagrams leave from one port
            /// (a reach link: two hosts behind one NAT share its address); 0 for a link found
            /// by address (a kernel VXLAN peer picks its source port by flow hash).
            sport_be: u16,
            pad: u16,
        }
        /// A plain udp link (`links` by slot).
        link_val as LinkVal {
            slot: u32,
            vni: u32,
            remote_be: u32,
            /// Our address on the underlay (outer source).
            local_be: u32,
            /// The remote's VXLAN UDP port.
            dport_be: u16,
            /// LINK_*.
            flags: u16,
            /// The outer UDP source port, fixed (a reach link: through a NAT every datagram
            /// must leave from the port its mapping was made with, the VXLAN socket's); 0: from
            /// the flow hash, as the kernel's VXLAN picks it.
            sport_be: u16,
            reserved: u16,
            /// Variant (a): a collect-metadata VXLAN device; 0 = encapsulate here.
            via_ifindex: u32,
            /// The path's MTU as vnetd learned it (a reach link's: what ICMP or probing said,
            /// which the outer header cache may not know yet); 0: the route's alone. A frame
            /// that does not fit goes to vnetd, which tells its sender.
            path_mtu: u32,
            /// LINK_RELAYED: the tag the relay header carries (the peer's: the relay finds the
            /// destination by it, and writes the source's into what it forwards).
            relay_tag: [u8; 8],
        }
        /// A relayed link by what its datagrams carry (`relay_rx`): the relay's endpoint, the
        /// VNI and the tag the relay wrote (the peer's).
        relay_rx_key as RelayRxKey {
            relay_be: u32,
            vni: u32,
            relay_port_be: u16,
            pad: u16,
            tag: [u8; 8],
        }
        /// A relay's forwarding entry, by the endpoint a member's datagrams come from and the
        /// destination's tag they carry (`relay_fwd`).
        relay_fwd_key as RelayFwdKey {
            src_be: u32,
            src_port_be: u16,
            pad: u16,
            dst_tag: [u8; 8],
        }
        /// Where a relay sends a pair's datagrams, the pair's budget and what it forwarded.
        /// The first seven fields are a `rate_val` (the same token bucket code runs on both).
        relay_val as RelayVal {
            lock: BpfSpinLock,
            pad: u32,
            rate_bps: u64,
            cap: i64,
            fill_ns: u64,
            tokens: i64,
            last_ns: u64,
            /// The destination member's binding.
            dst_be: u32,
            dst_port_be: u16,
            pad2: u16,
            /// The source member's tag, written over the destination's.
            src_tag: [u8; 8],
            /// The relay's address towards the destination (the outer source).
            local_be: u32,
            /// The device towards the destination.
            ifindex: u32,
            /// Datagrams (segments) and their bytes forwarded, and dropped over the budget.
            frames: u64,
            bytes: u64,
            rate_limited: u64,
        }
        /// ONCache-style cached outer header state, per CPU, filled by the program from
        /// bpf_fib_lookup and expired after `outer_cache_ns`, or as soon as `outer_epoch` moves
        /// on. The loader only clears it.
        link_cache as LinkCache {
            expires_ns: u64,
            /// Egress device.
            ifindex: u32,
            /// Its MTU.
            mtu: u32,
            smac: [u8; 6],
            dmac: [u8; 6],
            /// The `outer_epoch` read before the lookup that filled it.
            epoch: u32,
        }
        /// A key of the forwarding map (`fwd`).
        fwd_key as FwdMapKey {
            vni: u32,
            /// FWD_*.
            kind: u16,
            /// Zero unless kind uses it.
            src: [u8; 6],
            dst: [u8; 6],
            pad: u16,
        }
        /// A forwarding decision.
        fwd_val as FwdVal {
            /// ACT_* << ACT_SHIFT | slot.
            action: u32,
            /// FWDF_*.
            flags: u32,
        }
        /// Token bucket, as vnet_core::TokenBucket: tokens in units of 1/8e9 byte, a frame
        /// passes while any token is left and takes its whole length (so a 64 KB GSO frame is
        /// never starved).
        rate_val as RateVal {
            lock: BpfSpinLock,
            pad: u32,
            /// Bits per second.
            rate_bps: u64,
            /// Burst in units (burst_bytes * 8e9).
            cap: i64,
            /// Time to fill an empty bucket: cap / rate_bps.
            fill_ns: u64,
            tokens: i64,
            last_ns: u64,
        }
        /// A (VNI, source, destination) pair of the traffic matrix.
        matrix_key as MatrixKey {
            vni: u32,
            src: [u8; 6],
            dst: [u8; 6],
        }
        /// What was forwarded for one pair (per CPU).
        matrix_val as MatrixVal {
            frames: u64,
            bytes: u64,
        }
    }
}
