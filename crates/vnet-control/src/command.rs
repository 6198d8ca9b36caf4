//! The control language's commands as types. Parsing is in the submodules, one per command
//! family (`parse`: the line and its dispatch, `ports`: interfaces and links, `settings`:
//! `set`), over `words` (the word cursor and the value checks they all use).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use vnet_core::MacMatch;
use vnet_wire::MacAddr;

/// Longest accepted command line, in bytes.
pub const MAX_LINE_LEN: usize = 4096;
/// Most lines in one script (config file or batch).
pub const MAX_SCRIPT_LINES: usize = 100_000;
/// Largest CPU number `set cpus` takes: `CPU_SETSIZE - 1`, the last a `cpu_set_t` can name.
/// Whether the CPU exists and vnetd may run on it is the data path's check.
pub const MAX_CPU: u32 = 1023;

/// An enum written as one keyword a value: its `Display` is the word the parser takes, so the
/// two cannot drift apart.
pub(crate) trait Keyword: Copy + fmt::Display + 'static {
    /// Every value, in the order an error for an unknown word lists them.
    const ALL: &'static [Self];
}

/// `Keyword` and `Display` of an enum of unit variants, from its one list of keywords.
macro_rules! keywords {
    ($t:ident { $($v:ident => $k:literal,)+ }) => {
        impl Keyword for $t {
            const ALL: &'static [Self] = &[$($t::$v),+];
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(match self {
                    $($t::$v => $k,)+
                })
            }
        }
    };
}

/// A parsed command of the control language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    InterfaceAdd(InterfaceSpec),
    InterfaceDel(String),
    /// `interface set NAME ...`: the interface's source-MAC and rate policy, at run time.
    InterfaceSet(String, PolicyUpdate),
    LinkAdd(LinkSpec),
    LinkDel(String),
    /// `link set NAME ...`: the link's receive rate limit, at run time.
    LinkSet(String, PolicyUpdate),
    ListenAdd(SocketAddr),
    ListenDel(SocketAddr),
    Route(RouteOp, RouteSpec),
    Set(Setting),
    Show(ShowWhat, bool),
}

/// How dispatcher threads wait for work (VNET/P section 4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DispatchMode {
    /// Block until a descriptor is ready (the guest's notification wakes us): lowest latency
    /// for sparse traffic, no CPU when idle.
    GuestDriven,
    /// Busy-poll every descriptor: most frames per wake-up, a core per dispatcher.
    Polling,
    /// Guest-driven below `adaptive-low` pkt/s, polling above `adaptive-high`, measured over
    /// `adaptive-window-ms`.
    Adaptive,
}

keywords!(DispatchMode {
    GuestDriven => "guest-driven",
    Polling => "polling",
    Adaptive => "adaptive",
});

/// What a polling loop does when a pass found no work (VNET/P section 4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum YieldStrategy {
    /// `sched_yield`: give the core away only if someone else wants it.
    Immediate,
    /// Sleep `yield-sleep-us`.
    Timed,
    /// Immediate until idle for `yield-nowork-us`, then timed.
    Adaptive,
}

keywords!(YieldStrategy {
    Immediate => "immediate",
    Timed => "timed",
    Adaptive => "adaptive",
});

/// When a vhost-user device notifies the guest of received frames (VNET/P+ section 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyMode {
    /// Once per processed batch, when the guest asked (EVENT_IDX).
    Batch,
    /// Early when a burst begins, then at its end by receive density (α, β).
    Optimistic,
}

keywords!(NotifyMode {
    Batch => "batch",
    Optimistic => "optimistic",
});

/// One `set` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    Learn(bool),
    Mode(DispatchMode),
    Dispatchers(u32),
    Yield(YieldStrategy),
    YieldSleepUs(u32),
    YieldNoworkUs(u32),
    AdaptiveLow(u32),
    AdaptiveHigh(u32),
    AdaptiveWindowMs(u32),
    Cpus(Vec<u32>),
    CutThrough(bool),
    Notify(NotifyMode),
    NotifyAlphaMbps(u32),
    NotifyBetaMbps(u32),
    FastPath(FastPathMode),
}

/// Whether the kernel forwards what it can (`set fastpath kernel|off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FastPathMode {
    /// veth and netdev interfaces are forwarded by the kernel where the table decides.
    Kernel,
    /// Everything goes through vnetd (the kernel programs only hand frames over).
    Off,
}

keywords!(FastPathMode {
    Kernel => "kernel",
    Off => "off",
});

impl Command {
    /// Queries change nothing and are answered from the running state.
    pub fn is_query(&self) -> bool {
        matches!(self, Command::Show(..))
    }
}

/// What carries an interface's frames to its guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterfaceKind {
    /// A TAP device vnetd reads and writes (optionally moved into a namespace).
    Tap,
    /// A virtio-net device served to a VMM over a vhost-user socket.
    VhostUser,
    /// A veth pair vnetd creates, the guest's end in its namespace: forwarded in the kernel
    /// (the fast path) where the kernel allows it, else served like a TAP.
    Veth,
    /// An existing netdev someone else owns (a QEMU TAP with vhost-net, a container's veth):
    /// vnetd attaches to it and never deletes it.
    Netdev,
}

impl InterfaceKind {
    /// The keyword of `interface add NAME KIND`.
    pub fn keyword(&self) -> &'static str {
        match self {
            InterfaceKind::Tap => "tap",
            InterfaceKind::VhostUser => "vhost-user",
            InterfaceKind::Veth => "veth",
            InterfaceKind::Netdev => "netdev",
        }
    }
}

impl fmt::Display for InterfaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.keyword())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceSpec {
    pub name: String,
    pub kind: InterfaceKind,
    pub ifname: Option<String>,
    pub mac: Option<MacAddr>,
    pub mtu: Option<u32>,
    pub netns: Option<String>,
    pub vni: Option<u32>,
    pub queues: Option<u32>,
    pub offload: Option<bool>,
    /// `Some(path)` for a vhost-user interface (absent for a TAP).
    pub vhost_socket: Option<String>,
    /// vhost-user: connect to a VMM that listens, instead of listening.
    pub client: bool,
    /// `any-source`: let the guest send with source MACs other than its own.
    pub any_source: bool,
    /// `rate MBIT [burst KB]`: a token bucket on what the guest sends.
    pub rate: Option<RateLimit>,
}

/// A token-bucket limit on what a port receives (from its guest, or from its link's peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct RateLimit {
    /// Megabits (10^6 bits) per second.
    pub mbit: u32,
    /// Bucket size in kilobytes (1024 bytes).
    pub burst_kb: u32,
}

impl RateLimit {
    /// Most Mbit/s a `rate` may give (1 Tbit/s).
    pub const MAX_MBIT: u32 = 1_000_000;
    /// Largest bucket (1 GB).
    pub const MAX_BURST_KB: u32 = 1_048_576;

    /// The bucket size when none is given: 100 ms at the rate, and never under 1 MB. A limit
    /// drops (it does not queue), and TCP sends in bursts of 64 KB TSO frames: with a bucket
    /// of only a few such bursts it keeps losing whole bursts and gets far less than the rate
    /// (measured: 3 Mbit/s through 20 Mbit/s with 64 KB, 22 Mbit/s with 1 MB).
    pub fn default_burst_kb(mbit: u32) -> u32 {
        // 100 ms of `mbit` Mbit/s is mbit * 12500 bytes.
        let kb = (mbit as u64 * 12_500).div_ceil(1024);
        kb.clamp(1024, Self::MAX_BURST_KB as u64) as u32
    }

    pub fn rate_bps(&self) -> u64 {
        self.mbit as u64 * 1_000_000
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_kb as u64 * 1024
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate {} burst {}", self.mbit, self.burst_kb)
    }
}

/// What `interface set` / `link set` change; `None` leaves a setting as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PolicyUpdate {
    pub any_source: Option<bool>,
    /// `Some(None)`: `rate off`.
    pub rate: Option<Option<RateLimit>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// VXLAN over UDP to this address.
    Udp(SocketAddr),
    /// A framed TCP stream that this host dials.
    TcpDial(SocketAddr),
    /// A framed TCP stream that the peer at this address dials to one of our listeners.
    TcpAccept(IpAddr),
    /// Raw Ethernet on this host device.
    Direct(String),
}

impl LinkKind {
    pub fn keyword(&self) -> &'static str {
        match self {
            LinkKind::Udp(_) => "udp",
            LinkKind::TcpDial(_) => "tcp",
            LinkKind::TcpAccept(_) => "tcp-accept",
            LinkKind::Direct(_) => "direct",
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkKind::Udp(a) => write!(f, "udp {a}"),
            LinkKind::TcpDial(a) => write!(f, "tcp {a}"),
            LinkKind::TcpAccept(ip) => write!(f, "tcp accept {ip}"),
            LinkKind::Direct(dev) => write!(f, "direct {dev}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    pub name: String,
    pub kind: LinkKind,
    pub vni: Option<u32>,
    /// `encrypt PEER_KEY` (udp links): the peer host's static public key; the link then
    /// carries Noise-encrypted datagrams instead of plaintext VXLAN.
    pub encrypt: Option<vnet_wire::PublicKey>,
    /// `reach PEER_PROBE_KEY` (udp links): the peer host's probe key. vnetd then finds the
    /// link's path itself (its peer's endpoints, hole punching, relays: docs/design/reach.md),
    /// starting from the link's address.
    pub reach: Option<vnet_wire::PublicKey>,
    /// `rate MBIT [burst KB]`: a token bucket on what arrives from this link.
    pub rate: Option<RateLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOp {
    Add,
    Replace,
    Del,
}

keywords!(RouteOp {
    Add => "add",
    Replace => "replace",
    Del => "del",
});

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DestKind {
    Interface,
    Link,
}

keywords!(DestKind {
    Interface => "interface",
    Link => "link",
});

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DestRef {
    pub kind: DestKind,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub src: MacMatch,
    pub dst: MacMatch,
    pub to: DestRef,
}

impl fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {}",
            self.src, self.dst, self.to.kind, self.to.name
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShowWhat {
    Interfaces,
    Links,
    /// Every route, or (`show routes to MAC`) those whose destination matches MAC.
    Routes(Option<MacAddr>),
    Listeners,
    Stats,
    Matrix,
    Config,
    /// The etcd agent's state and what it derived (`vnetd --etcd`).
    Cluster,
    /// How this host is reached and how it reaches each peer host (`vnetd --etcd`).
    Reach,
}

/// A command line that is not valid in the language.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// A script that was refused, with the 1-based line number of the first bad line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ScriptError {
    pub line: usize,
    pub message: String,
}

mod parse;
mod ports;
mod settings;
#[cfg(test)]
mod tests;
mod words;

pub use parse::{parse_config, parse_line, parse_script};
