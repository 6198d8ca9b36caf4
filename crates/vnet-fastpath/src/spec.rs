//! What a caller of the fast path hands it and reads back: the settings, the specs of ports
//! and links, counters and reports. Plain data, so they exist in the build without the
//! kernel fast path too (vnet-dataplane and vnetd name them either way).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use vnet_core::PortId;
use vnet_wire::MacAddr;

/// Load-time settings: every map's size, the VXLAN port, the outer-header cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastPathConfig {
    /// Fast-path ports (each has a slot in the port arrays).
    pub max_ports: u32,
    /// Plain udp links.
    pub max_links: u32,
    /// Entries of the forwarding table; beyond it destinations stay slow (counted).
    pub max_table: u32,
    /// (VNI, source, destination) pairs the traffic matrix holds. Entries are allocated as
    /// pairs appear, so an unused size costs nothing; once it is full, the frames of further
    /// pairs are counted (`GlobalCounters::matrix_full`), as vnetd's own matrix counts its
    /// overflow.
    pub max_matrix: u32,
    /// Pairs of members a relay forwards in the kernel; the pairs beyond stay with vnetd.
    pub max_relay_pairs: u32,
    /// The UDP port VXLAN arrives on and is decapsulated from (vnetd's `--udp-port`).
    pub vxlan_port: u16,
    /// How long each CPU keeps a link's outer next hop (MACs, egress device) before asking
    /// `bpf_fib_lookup` again; `None` asks for every packet.
    pub outer_cache: Option<Duration>,
    /// Where to pin the maps and links in bpffs, so forwarding outlives the process and the
    /// next one takes over (`None`: nothing is pinned).
    pub pin_dir: Option<PathBuf>,
}

impl Default for FastPathConfig {
    fn default() -> Self {
        FastPathConfig {
            max_ports: 256,
            max_links: 1024,
            max_table: 16384,
            max_matrix: 65536,
            max_relay_pairs: 16384,
            vxlan_port: 4789,
            outer_cache: Some(Duration::from_secs(1)),
            pin_dir: None,
        }
    }
}

/// How frames reach a fast-path port's guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// `bpf_redirect_peer`: straight into the ingress of the veth peer in the guest's
    /// namespace. Only for a veth whose peer is in another network namespace.
    Peer,
    /// `bpf_redirect` to the egress of the port's netdev (a TAP of a VM, a veth, any netdev).
    Egress,
}

/// A token bucket: `bits_per_sec`, holding up to `burst_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub bits_per_sec: u64,
    pub burst_bytes: u64,
}

/// What a port lets in (as `vnet_control::PortPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortPolicy {
    pub any_source: bool,
    pub rate: Option<Rate>,
}

/// A fast-path port: the host-side netdev of a guest and vnetd's punt TAP for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub id: PortId,
    /// The netdev the guest's frames arrive on (host end of its veth, or its TAP).
    pub ifindex: u32,
    /// vnetd's TAP (with `IFF_VNET_HDR`) for this port's slow path.
    pub punt_ifindex: u32,
    pub mac: MacAddr,
    pub vni: u32,
    pub mtu: u32,
    pub delivery: Delivery,
    pub policy: PortPolicy,
}

/// A plain IPv4 udp (VXLAN) link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    pub id: PortId,
    pub vni: u32,
    pub remote: Ipv4Addr,
    /// Our underlay address (the outer source); datagrams to another address are not taken.
    pub local: Ipv4Addr,
    /// The remote's VXLAN port.
    pub udp_port: u16,
    /// Rate limit on what arrives from the link.
    pub rate: Option<Rate>,
    /// Variant (a), kept for measurement: a collect-metadata VXLAN device to hand frames to
    /// instead of encapsulating in the program.
    pub via_device: Option<u32>,
    /// Every datagram leaves from this UDP port (the VXLAN socket's: a reach link, whose
    /// path may cross NATs), and the remote's come from `udp_port`: the link is found by
    /// (remote, port, VNI). None: the source port from the flow hash, found by (remote, VNI).
    pub src_port: Option<u16>,
    /// vnetd sends its frames (no path known yet, or a TCP tunnel's).
    pub punt: bool,
    /// The path goes through the relay at `remote`:`udp_port`: every datagram carries the relay
    /// header with this tag (the peer's), and the relay's datagrams with it are the link's.
    pub relay_tag: Option<[u8; 8]>,
    /// The path's MTU when vnetd learned one smaller than the route's (larger frames go to
    /// vnetd, which tells their senders).
    pub path_mtu: Option<u32>,
}

/// A pair of members a relay forwards in the kernel: datagrams from the source member's
/// endpoint `from` carrying the destination's tag go to the destination's binding `to`,
/// from `local` out of device `ifindex`, carrying the source's tag; within a token bucket of
/// `rate_bps` (bursts of `burst_bytes`) of their UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayPair {
    pub from: SocketAddrV4,
    pub dst_tag: [u8; 8],
    pub to: SocketAddrV4,
    pub src_tag: [u8; 8],
    pub local: Ipv4Addr,
    pub ifindex: u32,
    pub rate_bps: u64,
    pub burst_bytes: u64,
}

/// What the kernel did with a relay pair's datagrams (segments of an aggregate each count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayCounts {
    pub frames: u64,
    pub bytes: u64,
    /// Dropped over the pair's budget.
    pub rate_limited: u64,
}

/// The kernel path's counters of one port or link, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames the kernel took from the port (or decapsulated from the link) and forwarded.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames the kernel delivered to the port (or encapsulated onto the link).
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames handed to vnetd (its punt TAP, or the stack for a link): vnetd counts them again
    /// as it forwards them, so merge these as information, not as traffic.
    pub punted_frames: u64,
    pub punted_bytes: u64,
    /// Frames vnetd wrote to the punt TAP that the kernel delivered to the guest.
    pub slow_tx_frames: u64,
    pub slow_tx_bytes: u64,
    /// Drops by `vnet_core::DropReason` name: truncated, oversize, spoofed_src, rate_limited.
    pub drops: BTreeMap<&'static str, u64>,
    /// Outer next hop unresolved: punted so vnetd's own send resolves the neighbour.
    pub neigh_miss: u64,
    /// The kernel refused to add or remove the outer headers (or the frame is not IP, or
    /// too big for the underlay): punted.
    pub encap_fail: u64,
    /// Several datagrams merged by GRO or sent as one UDP GSO skb: passed to the stack whole.
    pub gro_passed: u64,
    /// Datagrams whose outer IPv4 / UDP lengths disagree with their size (trailing bytes, a
    /// short UDP length, a truncated datagram): passed to the stack, which trims or drops.
    pub bad_length: u64,
}

/// Counters of the fast path as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobalCounters {
    pub unknown_port: u64,
    pub not_vxlan: u64,
    pub unknown_link: u64,
    pub fib_fail: u64,
    /// Forwarding decisions into another VNI than the frame's (an inconsistent table): not
    /// followed, the frame went to vnetd.
    pub vni_mismatch: u64,
    /// Forwarding-table entries left out because the map was full (those destinations stay
    /// on the slow path), over the life of this `FastPath`.
    pub table_full: u64,
    /// Frames forwarded whose (VNI, source, destination) pair found no room in the traffic
    /// matrix (its map full): forwarded, but missing from [`crate::FastPath::matrix`].
    pub matrix_full: u64,
}

/// What one [`crate::FastPath::apply_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: usize,
    pub deleted: usize,
    pub left_out: usize,
}

/// One of the programs (for `FastPath::test_run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    PortIngress,
    UnderlayIngress,
    PuntIngress,
    TunnelIngress,
}

impl Program {
    /// Its name in bpf/fastpath.bpf.c.
    pub fn name(self) -> &'static str {
        match self {
            Program::PortIngress => "port_ingress",
            Program::UnderlayIngress => "underlay_ingress",
            Program::PuntIngress => "punt_ingress",
            Program::TunnelIngress => "tunnel_ingress",
        }
    }
}

/// The result of running a program once on a frame (`BPF_PROG_TEST_RUN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRun {
    /// The tcx verdict: -1 next, 0 pass, 2 drop, 7 redirect.
    pub verdict: i32,
    /// The frame as the program left it.
    pub data: Vec<u8>,
}

pub const TCX_NEXT: i32 = -1;
pub const TCX_PASS: i32 = 0;
pub const TCX_DROP: i32 = 2;
pub const TCX_REDIRECT: i32 = 7;
