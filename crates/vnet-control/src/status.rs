//! What the daemon reports about itself: the typed answers behind every `show` (text and
//! JSON), and what metrics and the live view read. The data path fills these structs; their
//! text form is their `Display` (the tables are in `status/render_show.rs`), their JSON form
//! (serde) is what `show ... json` prints. A field renamed here is renamed everywhere at
//! compile time, instead of printing `null` where a key was read back by name: keep the JSON
//! keys and the text columns stable, scripts and tests read them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Serialize, Serializer};
use vnet_core::{MatrixEntry, PortCountersSnapshot};

use crate::command::{LinkKind, RateLimit};
use crate::model::{Config, DataPathSettings, Interface, Link};
use crate::routes::Route;

mod columns;
mod reach;
mod render_show;

pub use columns::{Col, Columns};
pub use reach::{ReachPeer, ReachReport};

/// Whether a port is one of this host's interfaces or a link to elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortRole {
    Interface,
    Link,
}

impl PortRole {
    pub fn as_str(&self) -> &'static str {
        match self {
            PortRole::Interface => "interface",
            PortRole::Link => "link",
        }
    }
}

/// Which data path serves a port: the kernel fast path (vnetd handles only what the kernel
/// hands it), or vnetd in user space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPathKind {
    Kernel,
    User,
}

impl DataPathKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            DataPathKind::Kernel => "kernel",
            DataPathKind::User => "user",
        }
    }
}

/// What the kernel fast path did for a port or link (already included in the port's
/// counters, which add up both paths).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelPortStatus {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames the kernel handed to vnetd (counted again by vnetd when it read them).
    pub punted_frames: u64,
    /// Frames vnetd sent through the kernel to the guest.
    pub from_vnetd_frames: u64,
    /// Frames to a link whose next hop was not resolved yet (sent by vnetd instead).
    pub neigh_miss: u64,
    /// Frames the kernel could not encapsulate (sent by vnetd instead).
    pub encap_fail: u64,
    /// Merged UDP datagrams from the underlay passed on to vnetd's socket.
    pub gro_passed: u64,
    /// Datagrams from a link whose outer IPv4 / UDP lengths disagree with their size, passed
    /// on to the stack (which trims or drops them) instead of decapsulated.
    pub bad_length: u64,
}

/// The kernel fast path as a whole (`show stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelPathStatus {
    pub mode: crate::command::FastPathMode,
    pub table_entries: u64,
    pub table_size: u64,
    /// Entries the full table could not take (their destinations go through vnetd).
    pub table_left_out: u64,
    pub matrix_size: u64,
    pub unknown_link: u64,
    pub not_vxlan: u64,
    pub fib_fail: u64,
    /// Forwarding decisions into another VNI (an inconsistent table), not followed.
    pub vni_mismatch: u64,
    pub table_full: u64,
}

/// One port's counters and state (`show stats`).
#[derive(Debug, Clone, Serialize)]
pub struct PortStatus {
    pub kind: PortRole,
    pub name: String,
    pub vni: u32,
    /// Which data path serves it.
    pub path: DataPathKind,
    /// Both paths' frames: vnetd's and, for a port the kernel serves, the kernel's.
    #[serde(flatten)]
    pub counters: PortCountersSnapshot,
    /// The kernel's share, when the kernel serves the port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelPortStatus>,
    /// State of the NIC behind an interface that has more than counters (vhost-user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<NicStatus>,
    /// Source-MAC and rate policy, with the token bucket's fill.
    pub policy: PolicyStatus,
}

/// NIC-specific state, tagged by the NIC's kind.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind")]
pub enum NicStatus {
    #[serde(rename = "vhost-user")]
    VhostUser(VhostUserStatus),
}

/// A vhost-user interface: its connection, the paths its frames took, its notifications.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VhostUserStatus {
    pub socket: String,
    pub connected: bool,
    pub broken: bool,
    pub connections: u64,
    pub queue_pairs: usize,
    pub queue_pairs_started: usize,
    pub protocol_errors: u64,
    /// Frontends dropped for cutting guest memory short under vnetd (SIGBUS survived).
    pub memory_faults: u64,
    pub bad_chains: u64,
    pub tx_cut_through: u64,
    pub tx_copied: u64,
    pub rx_cut_through: u64,
    pub rx_direct_fallback: u64,
    pub rx_direct: u64,
    pub rx_copied: u64,
    /// Frames waiting for the guest's receive buffers now. Above zero while no traffic comes:
    /// the guest has stopped taking frames (or vnetd missed its kick).
    pub rx_backlog: usize,
    pub kicks: u64,
    pub tx_notifications: u64,
    pub rx_notifications: u64,
    pub rx_early: u64,
    pub rx_early_masked: u64,
    pub rx_end_of_burst: u64,
    pub rx_skipped_cold: u64,
    pub rx_skipped_hot: u64,
    pub rx_early_found_nothing: u64,
    pub rx_frames: u64,
    pub rx_frames_per_notification: f64,
    pub rx_notifications_per_mb: f64,
}

/// A port's policy as it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyStatus {
    pub rate: Option<RateStatus>,
    /// Interfaces only: whether the guest may send with any source MAC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub any_source: Option<bool>,
}

/// A port's token bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateStatus {
    pub mbit: u32,
    pub burst_kb: u32,
    /// Bytes the bucket holds now (may be below zero by one frame).
    pub available_bytes: i64,
}

/// One dispatcher thread.
#[derive(Debug, Clone, Serialize)]
pub struct DispatcherStatus {
    pub index: usize,
    /// `polling` or `guest-driven`, as the thread runs now.
    pub mode: &'static str,
    pub switches: u64,
    pub wakeups: u64,
    pub frames: u64,
    pub frames_per_wakeup: f64,
    /// Descriptors it reads.
    pub sources: usize,
    /// Panics caught in its loop, each followed by a restart with fresh state (a bug: the
    /// log has the panic's message).
    pub restarts: u64,
}

/// Software offload and batching counters of the whole data path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OffloadStatus {
    pub gso_frames: u64,
    pub gso_segments: u64,
    pub udp_gso_sends: u64,
    pub udp_batch_sends: u64,
    pub gro_merged: u64,
    pub gro_frames: u64,
    pub partial_csum: u64,
    pub csum_completed: u64,
    pub tunnel_gso: u64,
}

/// The data path's settings and threads.
#[derive(Debug, Clone, Serialize)]
pub struct DispatchStatus {
    pub settings: DataPathSettings,
    pub dispatchers: Vec<DispatcherStatus>,
    pub offload: OffloadStatus,
    pub udp_gso: bool,
    pub udp_gro: bool,
}

/// Traffic that belongs to no port (datagrams from unknown peers, bad greetings, ...).
#[derive(Debug, Clone, Serialize)]
pub struct DaemonCounters {
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    pub drops: BTreeMap<String, u64>,
    pub control_errors: u64,
}

/// Whether the daemon's configuration is being saved (its state directory), what of it waits,
/// and who may control the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateStatus {
    /// The last write of the local configuration to the state directory failed: a change
    /// is refused until one succeeds.
    pub failing: bool,
    /// The running configuration has changes a restart would lose (the daemon keeps trying
    /// to save them).
    pub unsaved: bool,
    /// Writes to the state directory that failed.
    pub errors: u64,
    pub last_error: Option<String>,
    /// Routes of the local configuration waiting for their link (one the etcd agent
    /// derives): saved, not in effect (`show config` lists them).
    pub pending_routes: u64,
    /// The control port takes no token: every local user controls the daemon.
    pub control_without_token: bool,
}

/// `show stats json`.
#[derive(Debug, Clone, Serialize)]
pub struct StatsReport {
    pub ports: Vec<PortStatus>,
    pub daemon: DaemonCounters,
    pub state: StateStatus,
    pub dispatch: DispatchStatus,
    /// The kernel fast path (None when it is not loaded).
    pub kernel: Option<KernelPathStatus>,
}

/// Whether a link can carry frames now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkState {
    /// Connectionless, or connected (TCP), or with an established session (encrypted).
    Up,
    /// Dialing (TCP) or handshaking (encrypted).
    Connecting,
    /// Not running (a TCP link waiting to be accepted, or a link that failed to come up).
    Down,
}

impl LinkState {
    pub fn as_str(&self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Connecting => "connecting",
            LinkState::Down => "down",
        }
    }
}

/// An encrypted link's session and handshake counters.
#[derive(Debug, Clone, Serialize)]
pub struct CryptoStatus {
    pub peer_key: String,
    pub session: &'static str,
    pub session_age_ms: Option<u64>,
    pub session_sent: Option<u64>,
    pub session_received: Option<u64>,
    pub sealed: u64,
    pub opened: u64,
    pub initiations_sent: u64,
    pub responses_sent: u64,
    pub handshakes_received: u64,
    pub handshakes_completed: u64,
    pub rekeys: u64,
    pub initiations_replayed: u64,
    pub initiations_throttled: u64,
    pub bad_handshakes: u64,
}

/// One row of `show links`.
#[derive(Debug, Clone, Serialize)]
pub struct LinkStatus {
    pub name: String,
    /// `udp`, `tcp` or `direct`.
    pub kind: &'static str,
    /// The peer's address (udp, tcp).
    pub remote: Option<String>,
    /// The host device (direct).
    pub dev: Option<String>,
    pub vni: u32,
    pub state: LinkState,
    pub rate: Option<RateLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<CryptoStatus>,
    /// A reach link's path now (issue #31): how its datagrams go and the path's MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reach: Option<LinkReach>,
}

/// How a reach link's datagrams go now (`show links`' PATH column; `show reach` has more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinkReach {
    /// `direct`, `punched`, `relayed`, `tunneled`, `relayed-tcp`, or `unknown` (to the
    /// configured address until a path is known).
    pub path: String,
    /// Where they go: the peer's endpoint, the relay's or a tunnel's local end.
    pub to: Option<String>,
    /// The path's MTU (the largest outer IP packet), when known.
    pub mtu: Option<usize>,
}

impl LinkReach {
    /// The PATH column: `punched 1400`, `relayed -`.
    pub fn column(&self) -> String {
        match self.mtu {
            Some(m) => format!("{} {m}", self.path),
            None => format!("{} -", self.path),
        }
    }
}

impl LinkStatus {
    /// The row with a reach link's path.
    pub fn with_reach(mut self, reach: Option<LinkReach>) -> LinkStatus {
        self.reach = reach;
        self
    }

    /// The row of link `l`, whose state, rate limit and session are as given.
    pub fn new(
        l: &Link,
        state: LinkState,
        rate: Option<RateLimit>,
        encrypted: Option<CryptoStatus>,
    ) -> LinkStatus {
        let (remote, dev) = LinkStatus::endpoints(&l.kind);
        LinkStatus {
            name: l.name.clone(),
            kind: l.kind.keyword(),
            remote,
            dev,
            vni: l.vni,
            state,
            rate,
            encrypted,
            reach: None,
        }
    }

    /// The peer (remote address or device) as `show links` prints it.
    pub fn peer(&self) -> &str {
        self.remote
            .as_deref()
            .or(self.dev.as_deref())
            .unwrap_or("-")
    }

    /// The remote and device columns of a link of kind `kind`.
    pub fn endpoints(kind: &LinkKind) -> (Option<String>, Option<String>) {
        match kind {
            LinkKind::Udp(a) | LinkKind::TcpDial(a) => (Some(a.to_string()), None),
            LinkKind::TcpAccept(ip) => (Some(ip.to_string()), None),
            LinkKind::Direct(d) => (None, Some(d.clone())),
        }
    }
}

/// `show links`: one row per link.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct LinkTable(pub Vec<LinkStatus>);

/// One row of `show interfaces`: the interface's configuration and which data path serves it
/// (None while it has no port).
#[derive(Debug, Clone)]
pub struct InterfaceStatus {
    pub interface: Interface,
    pub path: Option<DataPathKind>,
}

impl Serialize for InterfaceStatus {
    /// The interface's configuration with a `path` key beside its own (keys in order).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::to_value(&self.interface).map_err(serde::ser::Error::custom)?;
        if let Some(p) = self.path {
            v["path"] = p.as_str().into();
        }
        v.serialize(s)
    }
}

/// `show interfaces`.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct InterfaceTable(pub Vec<InterfaceStatus>);

/// `show listeners`: the TCP listeners, each as `tcp ADDR`.
#[derive(Debug, Clone)]
pub struct ListenerTable(pub Vec<SocketAddr>);

impl Serialize for ListenerTable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|a| format!("tcp {a}")))
    }
}

/// One row of `show routes`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteStatus {
    pub src: String,
    pub dst: String,
    /// `interface` or `link`.
    pub to: String,
    pub name: String,
    pub vni: u32,
}

impl RouteStatus {
    /// The row of route `r` of configuration `cfg` (its VNI is its destination's).
    pub fn new(r: &Route, cfg: &Config) -> RouteStatus {
        RouteStatus::at(r, cfg.dest_vni(&r.to).unwrap_or(0))
    }

    /// The row of route `r` whose destination is in `vni` (a caller rendering every route
    /// looks the VNIs up once, not by scanning the ports for each route).
    pub fn at(r: &Route, vni: u32) -> RouteStatus {
        RouteStatus {
            src: r.src.to_string(),
            dst: r.dst.to_string(),
            to: r.to.kind.to_string(),
            name: r.to.name.clone(),
            vni,
        }
    }
}

/// `show routes`.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct RouteTable(pub Vec<RouteStatus>);

/// `show matrix json`.
#[derive(Debug, Clone, Serialize)]
pub struct MatrixReport {
    pub pairs: Vec<MatrixEntry>,
    /// Frames of pairs beyond the table's capacity.
    pub overflow: u64,
}

/// The etcd agent's state (`show cluster`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterStatus {
    pub overlay: String,
    pub host_id: String,
    pub connected: bool,
    /// The etcd endpoints, comma-separated.
    pub endpoints: String,
    /// The host's lease, in hex.
    pub lease: Option<String>,
    pub revision: i64,
    /// The overlay's link template as stored in etcd.
    pub policy: serde_json::Value,
    pub hosts: usize,
    pub interfaces: usize,
    pub operator_routes: usize,
    pub sessions: u64,
    pub syncs: u64,
    pub events: u64,
    pub bad_entries: u64,
    pub announcements: u64,
    /// The last error of a session (empty when none).
    pub last_error: String,
    /// What the derivation skipped, and why.
    pub conflicts: Vec<String>,
    /// Derived commands the running configuration refused (retried at the next change).
    pub failed: Vec<String>,
    pub host_id_in_use: bool,
}

/// `show cluster json`.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// None without `--etcd`.
    pub agent: Option<ClusterStatus>,
    /// The commands the agent applied, as script lines.
    pub derived: Vec<String>,
}
