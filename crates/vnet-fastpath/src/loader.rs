//! The loader: loads and verifies the BPF programs, attaches them with tcx, and keeps their
//! maps in step with what vnetd says (ports, links, the compiled forwarding table).
//!
//! With a pin directory ([`FastPathConfig::pin_dir`], what vnetd uses) the maps and the tcx
//! links are pinned in bpffs ([`crate::pin`]): they outlive the process, so the kernel goes
//! on forwarding while no vnetd runs, and the next [`FastPath`] reuses the maps, takes the
//! ports and links back to the slots they had ([`crate::takeover`]), holds every write of the
//! forwarding table and every program swap until [`FastPath::commit`] (the kernel forwards by
//! the earlier state meanwhile), then writes only what differs and swaps its programs into the
//! pinned links. Only [`FastPath::teardown`] removes what is pinned. Without a pin directory
//! every object is owned by a descriptor: dropping the [`FastPath`], or the process dying,
//! detaches and frees everything.
//!
//! The IPv4 `forwarding` it turns on for ports' devices is put back on detach, on teardown,
//! and on drop when nothing is pinned; [`FastPath::forwarding_originals`] is for a later
//! process (a pinned fast path keeps the devices forwarding until a teardown).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, PrintLevel};
use vnet_core::{MatrixEntry, PortId};
use vnet_wire::MacAddr;

use crate::compile::{plan_update, Action, CompiledTable, FwdEntry, FwdKey};
use crate::layout::{self, counter, global};
use crate::pin;
use crate::takeover::{self, Earlier};
use crate::{Error, Unavailable};

/// The compiled programs (build.rs).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fastpath.bpf.o"));

/// Load-time settings: every map's size, the VXLAN port, the outer-header cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastPathConfig {
    /// Fast-path ports (each has a slot in the port arrays).
    pub max_ports: u32,
    /// Plain udp links.
    pub max_links: u32,
    /// Entries of the forwarding table; beyond it destinations stay slow (counted).
    pub max_table: u32,
    /// (VNI, source, destination) pairs of the traffic matrix (an LRU: old pairs make room).
    pub max_matrix: u32,
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
}

/// What one [`FastPath::apply_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: usize,
    pub deleted: usize,
    pub left_out: usize,
}

/// One of the programs, for [`FastPath::test_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    PortIngress,
    UnderlayIngress,
    PuntIngress,
    TunnelIngress,
}

impl Program {
    fn name(self) -> &'static str {
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

struct PortState {
    spec: PortSpec,
    slot: u32,
    /// The tcx links of `port_ingress` and `punt_ingress`.
    links: [OwnedFd; 2],
}

struct LinkState {
    spec: LinkSpec,
    slot: u32,
}

struct Maps {
    ports: MapHandle,
    port_slots: MapHandle,
    punts: MapHandle,
    links_rx: MapHandle,
    links: MapHandle,
    link_cache: MapHandle,
    outer_epoch: MapHandle,
    fwd: MapHandle,
    rates: MapHandle,
    counters: MapHandle,
    global: MapHandle,
    matrix: MapHandle,
}

/// The maps that are pinned (the object's internal .rodata and .bss are not: each process
/// has its own).
const PINNED_MAPS: [&str; 12] = [
    "ports",
    "port_slots",
    "punts",
    "links_rx",
    "links",
    "link_cache",
    "outer_epoch",
    "fwd",
    "rates",
    "counters",
    "global",
    "matrix",
];

/// The pin directory and what an earlier vnetd left in it.
struct Pins {
    dir: PathBuf,
    /// The earlier vnetd's state (empty when there was none), taken back as ports and links
    /// attach.
    earlier: Earlier,
    /// Its pinned tcx links by pin name, until claimed.
    held: BTreeMap<String, OwnedFd>,
    /// Taking over: no write of the forwarding table and no program swap until `commit`.
    holding: bool,
    /// The maps are this process's own (the pinned ones were absent or of another layout):
    /// pinned at `commit`, when the links run programs that use them.
    maps_to_pin: bool,
}

impl Pins {
    fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }

    fn link_path(&self, name: &str) -> PathBuf {
        self.dir.join("links").join(name)
    }
}

/// The pin name of the tcx link of `prog` on `ifindex`.
fn link_pin_name(prog: Program, ifindex: u32) -> String {
    let role = match prog {
        Program::PortIngress => "port",
        Program::PuntIngress => "punt",
        Program::UnderlayIngress => "underlay",
        Program::TunnelIngress => "tunnel",
    };
    format!("{role}-{ifindex}")
}

/// vnet's kernel fast path, loaded and verified. See the crate documentation for the call
/// sequence.
pub struct FastPath {
    cfg: FastPathConfig,
    // Attachments are declared before the object: they go first when dropped.
    ports: BTreeMap<PortId, PortState>,
    links: BTreeMap<PortId, LinkState>,
    underlays: BTreeMap<u32, (Program, OwnedFd)>,
    table: CompiledTable,
    current: BTreeMap<FwdKey, FwdEntry>,
    table_full: u64,
    /// IPv4 `forwarding` of the ports' devices before the fast path turned it on, by ifindex.
    forwarding: BTreeMap<u32, ForwardingOriginal>,
    epoch: OuterCacheInvalidator,
    /// Pinned maps and links (None: nothing outlives the process).
    pins: Option<Pins>,
    maps: Maps,
    obj: Object,
}

/// A device's IPv4 `forwarding` sysctl as it was before the fast path turned it on (see
/// [`FastPath::forwarding_originals`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardingOriginal {
    pub ifindex: u32,
    /// The device's name when the value was recorded: restored only while it still has it.
    pub ifname: String,
    pub enabled: bool,
}

/// Makes every CPU's cached outer next hops stale at once (the programs compare each entry's
/// epoch with `outer_epoch`). Cheap, thread-safe and independent of the [`FastPath`]'s
/// lifetime: vnetd's netlink watcher holds one.
#[derive(Debug, Clone)]
pub struct OuterCacheInvalidator {
    epoch: Arc<Mutex<MapHandle>>,
}

impl OuterCacheInvalidator {
    pub fn invalidate(&self) -> Result<(), Error> {
        let map = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
        let key = 0u32.to_ne_bytes();
        let now = map
            .lookup(&key, MapFlags::ANY)
            .map_err(map_err("outer_epoch"))?
            .and_then(|v| v.get(..layout::OUTER_EPOCH_SIZE)?.try_into().ok())
            .map_or(0, u32::from_ne_bytes);
        map.update(&key, &now.wrapping_add(1).to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("outer_epoch"))
    }
}

impl std::fmt::Debug for FastPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastPath")
            .field("cfg", &self.cfg)
            .field("ports", &self.ports.keys().collect::<Vec<_>>())
            .field("links", &self.links.keys().collect::<Vec<_>>())
            .field("underlays", &self.underlays.keys().collect::<Vec<_>>())
            .field("table_entries", &self.current.len())
            .finish()
    }
}

/// libbpf's messages while loading (its print callback is process-wide and takes a plain fn).
static LOAD_LOG: Mutex<String> = Mutex::new(String::new());

fn collect_log(_level: PrintLevel, msg: String) {
    let mut log = LOAD_LOG.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a verifier log can be long; keep its end, where the reason is.
    if log.len() > 256 * 1024 {
        let cut = log.len() - 128 * 1024;
        let cut = (cut..log.len())
            .find(|i| log.is_char_boundary(*i))
            .unwrap_or(0);
        log.replace_range(..cut, "");
    }
    log.push_str(&msg);
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// (major, minor) of a kernel release string such as "6.18.44-fc".
fn release_version(rel: &str) -> Option<(u32, u32)> {
    let mut it = rel.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Whether this process has the capabilities BPF needs (CAP_BPF 39 or CAP_SYS_ADMIN 21, and
/// CAP_NET_ADMIN 12), from /proc/self/status.
fn has_bpf_caps() -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let eff = s
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |bit: u32| eff & (1u64 << bit) != 0;
    (has(39) || has(21)) && has(12)
}

fn invalid_data(msg: impl Into<String>) -> libbpf_rs::Error {
    libbpf_rs::Error::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        msg.into(),
    ))
}

fn map_err(map: &'static str) -> impl FnOnce(libbpf_rs::Error) -> Error {
    move |source| Error::Map { map, source }
}

fn ifname(ifindex: u32) -> Option<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `name`.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

fn forwarding_path(name: &str) -> String {
    format!("/proc/sys/net/ipv4/conf/{name}/forwarding")
}

/// Turns on IPv4 forwarding on a port's device: bpf_fib_lookup, which finds a link's outer
/// next hop, requires it of the device it looks up from. The stack never sees a frame of a
/// port's device (port_ingress takes them all), so this routes nothing; but a device left
/// with it and no program would let its guest route through the host, so the value found is
/// returned for [`FastPath::restore_forwarding`]. Without it, frames to links are punted
/// (counted `fib_fail`).
fn enable_forwarding(ifindex: u32) -> Option<ForwardingOriginal> {
    let name = ifname(ifindex)?;
    let path = forwarding_path(&name);
    let was = std::fs::read_to_string(&path).ok()?.trim() != "0";
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::warn!(%path, %e, "fast path: cannot enable forwarding; frames to links will be punted");
        return None;
    }
    Some(ForwardingOriginal {
        ifindex,
        ifname: name,
        enabled: was,
    })
}

/// Puts a device's forwarding back as `o` says, if the device still has the same name (also
/// for a teardown without a [`FastPath`]: vnetd keeps the values across restarts).
pub fn restore_forwarding(o: &ForwardingOriginal) {
    if ifname(o.ifindex).as_deref() != Some(o.ifname.as_str()) {
        return; // gone (or another device by now): nothing of ours to put back
    }
    let path = forwarding_path(&o.ifname);
    if let Err(e) = std::fs::write(&path, if o.enabled { "1" } else { "0" }) {
        tracing::warn!(%path, %e, "fast path: cannot restore forwarding");
    }
}

/// The tcx links pinned in `dir` that are still attached, by pin name; defunct ones (their
/// device went) are unpinned.
fn held_links(dir: &Path) -> BTreeMap<String, OwnedFd> {
    let mut held = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return held;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        match pin::open(&e.path()) {
            Ok(Some(fd)) if pin::tcx_link(fd.as_fd()).is_ok_and(|l| l.ifindex != 0) => {
                held.insert(name, fd);
            }
            _ => {
                let _ = pin::unpin(&e.path());
            }
        }
    }
    held
}

/// Attaches `prog` at the tcx ingress of `ifindex`; the link lives as long as the fd.
fn tcx_attach(prog: BorrowedFd<'_>, ifindex: u32) -> std::io::Result<OwnedFd> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    // SAFETY: `prog` is a valid program fd for the duration of the call and `opts` a fully
    // initialised options struct whose `sz` is its own size, as libbpf requires.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            ifindex as i32,
            libbpf_sys::BPF_TCX_INGRESS,
            &opts,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: bpf_link_create returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl FastPath {
    /// Loads and verifies every program with maps sized from `cfg`. Nothing is attached yet.
    pub fn open(cfg: &FastPathConfig) -> Result<FastPath, Unavailable> {
        let rel = kernel_release();
        if let Some(v) = release_version(&rel) {
            if v < (6, 6) {
                return Err(Unavailable::KernelTooOld(format!("running {rel}")));
            }
        }
        if cfg.max_ports == 0
            || cfg.max_links == 0
            || cfg.max_table == 0
            || cfg.max_matrix == 0
            || cfg.max_ports > 0x00ff_ffff
            || cfg.max_links > 0x00ff_ffff
        {
            return Err(Unavailable::Other(format!(
                "map sizes must be between 1 and 16777215: {cfg:?}"
            )));
        }
        let prev = libbpf_rs::get_print();
        LOAD_LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
        libbpf_rs::set_print(Some((PrintLevel::Info, collect_log)));
        let res = Self::load(cfg);
        libbpf_rs::set_print(prev);
        let log = std::mem::take(&mut *LOAD_LOG.lock().unwrap_or_else(|e| e.into_inner()));
        res.map_err(|e| classify(e, &log))
    }

    fn load(cfg: &FastPathConfig) -> Result<FastPath, libbpf_rs::Error> {
        let mut open = ObjectBuilder::default().open_memory(OBJECT)?;
        let counters = cfg.max_ports + cfg.max_links;
        let pin_dir = cfg.pin_dir.as_ref().and_then(|d| {
            match pin::ensure_dir(&d.join("maps")).and_then(|()| pin::ensure_dir(&d.join("links"))) {
                Ok(()) => Some(d.clone()),
                Err(e) => {
                    tracing::warn!(dir = %d.display(), "kernel fast path: cannot pin ({e}): forwarding stops whenever vnetd does");
                    None
                }
            }
        });
        for mut m in open.maps_mut() {
            let name = m.name().to_string_lossy().into_owned();
            let size = match name.as_str() {
                "ports" | "port_slots" | "punts" => Some(cfg.max_ports),
                "links_rx" | "links" | "link_cache" => Some(cfg.max_links),
                "fwd" => Some(cfg.max_table),
                "rates" | "counters" => Some(counters),
                "matrix" => Some(cfg.max_matrix),
                _ => None,
            };
            if let Some(n) = size {
                m.set_max_entries(n)?;
            }
            if name.ends_with(".rodata") {
                let v = m
                    .initial_value_mut()
                    .ok_or_else(|| invalid_data("no .rodata contents"))?;
                // struct fp_config at offset 0 (the only .rodata variable).
                if v.len() < 16 {
                    return Err(invalid_data("unexpected .rodata layout"));
                }
                let ns = cfg.outer_cache.map_or(0, |d| d.as_nanos().max(1) as u64);
                v[0..8].copy_from_slice(&ns.to_ne_bytes());
                v[8..12].copy_from_slice(&cfg.max_ports.to_ne_bytes());
                v[12..14].copy_from_slice(&cfg.vxlan_port.to_be_bytes());
            }
        }
        // An earlier vnetd's pinned maps are reused when every one is there with the layout
        // and size this object asks for; otherwise the maps are new (and the earlier ones go
        // once the links run programs that use the new ones).
        let mut reused = false;
        if let Some(dir) = &pin_dir {
            let mut found = Vec::new();
            for m in open.maps() {
                let name = m.name().to_string_lossy().into_owned();
                if !PINNED_MAPS.contains(&name.as_str()) {
                    continue;
                }
                let Ok(h) = MapHandle::from_pinned_path(dir.join("maps").join(&name)) else {
                    continue;
                };
                let same = h.map_type() == m.map_type()
                    && h.key_size() == m.key_size()
                    && h.value_size() == m.value_size()
                    && h.max_entries() == m.max_entries();
                found.push((name, h, same));
            }
            let all = found.len() == PINNED_MAPS.len() && found.iter().all(|(_, _, same)| *same);
            if all {
                for mut m in open.maps_mut() {
                    let name = m.name().to_string_lossy().into_owned();
                    if let Some((_, h, _)) = found.iter().find(|(n, _, _)| *n == name) {
                        m.reuse_fd(h.as_fd())?;
                    }
                }
                reused = true;
            } else if !found.is_empty() {
                tracing::warn!(
                    "kernel fast path: the pinned maps are of another layout or size (another version of vnet, or changed --fastpath-* sizes): new maps, filled before the programs switch to them"
                );
            }
        }
        let obj = open.load()?;
        let handle = |name: &str| -> Result<MapHandle, libbpf_rs::Error> {
            let m = obj
                .maps()
                .find(|m| m.name() == name)
                .ok_or_else(|| invalid_data(format!("no map {name}")))?;
            MapHandle::try_from(&m)
        };
        let maps = Maps {
            ports: handle("ports")?,
            port_slots: handle("port_slots")?,
            punts: handle("punts")?,
            links_rx: handle("links_rx")?,
            links: handle("links")?,
            link_cache: handle("link_cache")?,
            outer_epoch: handle("outer_epoch")?,
            fwd: handle("fwd")?,
            rates: handle("rates")?,
            counters: handle("counters")?,
            global: handle("global")?,
            matrix: handle("matrix")?,
        };
        let epoch = OuterCacheInvalidator {
            epoch: Arc::new(Mutex::new(MapHandle::try_from(&maps.outer_epoch)?)),
        };
        let pins = pin_dir.map(|dir| {
            let earlier = if reused {
                Earlier::read(&maps.ports, &maps.links, &maps.fwd, cfg.max_links)
            } else {
                Earlier::default()
            };
            let held = held_links(&dir.join("links"));
            let holding = !earlier.is_empty() || !held.is_empty();
            if holding {
                tracing::info!(
                    ports = earlier.ports.len(),
                    links = earlier.links.len(),
                    entries = earlier.fwd.len(),
                    attachments = held.len(),
                    maps = if reused { "reused" } else { "new" },
                    "kernel fast path taken over from an earlier vnetd (it forwarded meanwhile)"
                );
            }
            Pins {
                dir,
                earlier,
                held,
                holding,
                maps_to_pin: !reused,
            }
        });
        let mut fp = FastPath {
            cfg: cfg.clone(),
            ports: BTreeMap::new(),
            links: BTreeMap::new(),
            underlays: BTreeMap::new(),
            table: CompiledTable::default(),
            current: BTreeMap::new(),
            table_full: 0,
            forwarding: BTreeMap::new(),
            epoch,
            pins,
            maps,
            obj,
        };
        // Nothing earlier to take over: the maps are pinned at once.
        if fp
            .pins
            .as_ref()
            .is_some_and(|p| !p.holding && p.maps_to_pin)
        {
            fp.pin_maps().map_err(|e| invalid_data(e.to_string()))?;
        }
        Ok(fp)
    }

    /// Pins the maps (replacing an earlier vnetd's pins of other maps).
    fn pin_maps(&mut self) -> std::io::Result<()> {
        let Some(p) = &mut self.pins else {
            return Ok(());
        };
        for m in self.obj.maps() {
            let name = m.name().to_string_lossy().into_owned();
            if PINNED_MAPS.contains(&name.as_str()) {
                pin::pin(m.as_fd(), &p.map_path(&name))?;
            }
        }
        p.maps_to_pin = false;
        Ok(())
    }

    /// Whether the maps and links are pinned (forwarding outlives the process).
    pub fn pinned(&self) -> bool {
        self.pins.is_some()
    }

    pub fn config(&self) -> &FastPathConfig {
        &self.cfg
    }

    /// `prog`'s tcx link on `ifindex`: the one an earlier vnetd pinned there (its program
    /// swapped for ours now, or at `commit` while taking over), or a new one, pinned.
    fn attach(&mut self, p: Program, ifindex: u32) -> Result<OwnedFd, Error> {
        let prog = self
            .obj
            .progs()
            .find(|x| x.name() == p.name())
            .ok_or_else(|| Error::Invalid(format!("program {} missing", p.name())))?;
        let name = link_pin_name(p, ifindex);
        if let Some(pins) = &mut self.pins {
            if let Some(fd) = pins.held.remove(&name) {
                let on = pin::tcx_link(fd.as_fd()).map(|l| l.ifindex).unwrap_or(0);
                if on == ifindex {
                    if !pins.holding {
                        pin::update_link(fd.as_fd(), prog.as_fd())
                            .map_err(|source| Error::Attach { ifindex, source })?;
                    }
                    return Ok(fd);
                }
                // Defunct (its device went) or on another device by now: replaced.
                let _ = pin::unpin(&pins.link_path(&name));
            }
        }
        let fd = tcx_attach(prog.as_fd(), ifindex)
            .map_err(|source| Error::Attach { ifindex, source })?;
        if let Some(pins) = &self.pins {
            if let Err(e) = pin::pin(fd.as_fd(), &pins.link_path(&name)) {
                tracing::warn!(%name, "kernel fast path: cannot pin the attachment ({e}): it goes with this process");
            }
        }
        Ok(fd)
    }

    /// Lets go of a tcx link for good: its pin goes, then the descriptor (which detaches it).
    fn release_link(&self, p: Program, ifindex: u32, fd: OwnedFd) {
        if let Some(pins) = &self.pins {
            let _ = pin::unpin(&pins.link_path(&link_pin_name(p, ifindex)));
        }
        drop(fd);
    }

    fn attached_ifindexes(&self) -> BTreeSet<u32> {
        let mut s: BTreeSet<u32> = self.underlays.keys().copied().collect();
        for p in self.ports.values() {
            s.insert(p.spec.ifindex);
            s.insert(p.spec.punt_ifindex);
        }
        s
    }

    /// Attaches `underlay_ingress` to an underlay netdev (by ifindex): VXLAN for local
    /// fast-path ports is decapsulated there, the rest goes on to the stack untouched.
    pub fn attach_underlay(&mut self, ifindex: u32) -> Result<(), Error> {
        self.attach_device(Program::UnderlayIngress, ifindex)
    }

    /// Variant (a), kept for measurement: attaches `tunnel_ingress` to a collect-metadata
    /// VXLAN device, whose decapsulated frames it delivers to local fast-path ports.
    pub fn attach_tunnel_device(&mut self, ifindex: u32) -> Result<(), Error> {
        self.attach_device(Program::TunnelIngress, ifindex)
    }

    fn attach_device(&mut self, p: Program, ifindex: u32) -> Result<(), Error> {
        if self.attached_ifindexes().contains(&ifindex) {
            return Err(Error::AlreadyAttached(ifindex));
        }
        let fd = self.attach(p, ifindex)?;
        self.underlays.insert(ifindex, (p, fd));
        Ok(())
    }

    pub fn detach_underlay(&mut self, ifindex: u32) -> Result<(), Error> {
        let (p, fd) = self
            .underlays
            .remove(&ifindex)
            .ok_or(Error::UnknownUnderlay(ifindex))?;
        self.release_link(p, ifindex, fd);
        Ok(())
    }

    fn free_slot(
        used: impl Iterator<Item = u32>,
        max: u32,
        what: &'static str,
    ) -> Result<u32, Error> {
        let used: BTreeSet<u32> = used.collect();
        (0..max)
            .find(|s| !used.contains(s))
            .ok_or(Error::Full(what, max))
    }

    fn port_val(&self, spec: &PortSpec, slot: u32) -> layout::PortVal {
        let mut flags = 0;
        if spec.policy.any_source {
            flags |= layout::PORT_ANY_SOURCE;
        }
        if spec.delivery == Delivery::Peer {
            flags |= layout::PORT_DELIVER_PEER;
        }
        if spec.policy.rate.is_some() {
            flags |= layout::PORT_RATE;
        }
        layout::PortVal {
            slot,
            vni: spec.vni,
            mtu: spec.mtu,
            flags,
            ifindex: spec.ifindex,
            punt_ifindex: spec.punt_ifindex,
            mac: spec.mac,
        }
    }

    fn now_ns() -> u64 {
        // bpf_ktime_get_ns is CLOCK_MONOTONIC.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes only into the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn write_rate(&self, idx: u32, rate: Option<Rate>) -> Result<(), Error> {
        let v = match rate {
            Some(r) => layout::rate_val(r.bits_per_sec, r.burst_bytes, Self::now_ns()),
            None => [0u8; 48],
        };
        // Under the bucket's spin lock, as the programs update it (BPF_F_LOCK).
        self.maps
            .rates
            .update(&idx.to_ne_bytes(), &v, MapFlags::LOCK)
            .map_err(map_err("rates"))
    }

    fn zero_percpu(
        map: &MapHandle,
        name: &'static str,
        idx: u32,
        size: usize,
    ) -> Result<(), Error> {
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err(name))?;
        let zeros = vec![vec![0u8; size]; cpus];
        map.update_percpu(&idx.to_ne_bytes(), &zeros, MapFlags::ANY)
            .map_err(map_err(name))
    }

    /// Attaches a fast-path port: its policy and rate go into the maps, `port_ingress` onto
    /// its netdev and `punt_ingress` onto its punt TAP, and the forwarding table is re-applied
    /// so that rules to it now run in the kernel.
    pub fn attach_port(&mut self, spec: &PortSpec) -> Result<(), Error> {
        if self.ports.contains_key(&spec.id) {
            return Err(Error::PortExists(spec.id));
        }
        if spec.ifindex == 0 || spec.punt_ifindex == 0 || spec.ifindex == spec.punt_ifindex {
            return Err(Error::Invalid(format!(
                "port {:?}: ifindex {} and punt ifindex {} must be two devices",
                spec.id, spec.ifindex, spec.punt_ifindex
            )));
        }
        if !(68..=65535).contains(&spec.mtu) || spec.vni > 0x00ff_ffff {
            return Err(Error::Invalid(format!(
                "port {:?}: mtu {} / vni {} out of range",
                spec.id, spec.mtu, spec.vni
            )));
        }
        let taken = self.attached_ifindexes();
        for i in [spec.ifindex, spec.punt_ifindex] {
            if taken.contains(&i) {
                return Err(Error::AlreadyAttached(i));
            }
        }
        // The slot an earlier vnetd gave this device's port, if any: its counters, bucket and
        // forwarding entries carry on.
        let earlier = self
            .pins
            .as_mut()
            .and_then(|p| p.earlier.ports.remove(&spec.ifindex));
        let slot = match earlier {
            Some(e) => e.slot,
            None => Self::free_slot(
                self.ports
                    .values()
                    .map(|p| p.slot)
                    .chain(self.unclaimed_port_slots()),
                self.cfg.max_ports,
                "port",
            )?,
        };
        let val = self.port_val(spec, slot).to_bytes();
        if earlier.is_none() {
            Self::zero_percpu(&self.maps.counters, "counters", slot, counter::COUNT * 8)?;
        }
        if earlier.is_none() || !self.rate_is(slot, spec.policy.rate) {
            self.write_rate(slot, spec.policy.rate)?;
        }
        self.maps
            .port_slots
            .update(&slot.to_ne_bytes(), &val, MapFlags::ANY)
            .map_err(map_err("port_slots"))?;
        self.maps
            .ports
            .update(&spec.ifindex.to_ne_bytes(), &val, MapFlags::ANY)
            .map_err(map_err("ports"))?;
        self.maps
            .punts
            .update(
                &spec.punt_ifindex.to_ne_bytes(),
                &slot.to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(map_err("punts"))?;
        let original = enable_forwarding(spec.ifindex);
        let attached = match self.attach(Program::PortIngress, spec.ifindex) {
            Ok(a) => match self.attach(Program::PuntIngress, spec.punt_ifindex) {
                Ok(b) => Ok([a, b]),
                Err(e) => {
                    match (earlier.is_some(), &mut self.pins) {
                        // An earlier vnetd's attachment goes back to be claimed later.
                        (true, Some(p)) => {
                            p.held
                                .insert(link_pin_name(Program::PortIngress, spec.ifindex), a);
                        }
                        _ => self.release_link(Program::PortIngress, spec.ifindex, a),
                    }
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let links = match attached {
            Ok(l) => l,
            Err(e) => {
                if earlier.is_some() {
                    // An earlier vnetd's port stays as it was, for a later attempt.
                    return Err(e);
                }
                let _ = self.maps.ports.delete(&spec.ifindex.to_ne_bytes());
                let _ = self.maps.punts.delete(&spec.punt_ifindex.to_ne_bytes());
                let _ = self
                    .maps
                    .port_slots
                    .update(&slot.to_ne_bytes(), &[0u8; 32], MapFlags::ANY);
                if let Some(o) = self.forwarding.get(&spec.ifindex).or(original.as_ref()) {
                    restore_forwarding(o);
                }
                self.forwarding.remove(&spec.ifindex);
                return Err(e);
            }
        };
        // A value the caller knew (set_forwarding_original) wins over the one found now.
        if let Some(o) = original {
            self.forwarding.entry(spec.ifindex).or_insert(o);
        }
        self.ports.insert(
            spec.id,
            PortState {
                spec: *spec,
                slot,
                links,
            },
        );
        self.reapply()?;
        Ok(())
    }

    /// Slots of an earlier vnetd's ports and links nobody took back yet (not to be given to
    /// new ones before `commit` frees them).
    fn unclaimed_port_slots(&self) -> Vec<u32> {
        self.pins
            .as_ref()
            .map(|p| p.earlier.ports.values().map(|v| v.slot).collect())
            .unwrap_or_default()
    }

    fn unclaimed_link_slots(&self) -> Vec<u32> {
        self.pins
            .as_ref()
            .map(|p| p.earlier.links.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether the bucket at `idx` is already the one `rate` asks for.
    fn rate_is(&self, idx: u32, rate: Option<Rate>) -> bool {
        let Ok(Some(v)) = self.maps.rates.lookup(&idx.to_ne_bytes(), MapFlags::LOCK) else {
            return false;
        };
        let want = match rate {
            Some(r) => layout::rate_val(r.bits_per_sec, r.burst_bytes, 0),
            None => [0u8; 48],
        };
        layout::rate_params(&v) == layout::rate_params(&want)
    }

    /// Changes a port's policy (source check and rate) at run time. A changed rate starts
    /// with a full bucket; an unchanged one keeps its state.
    pub fn update_port(&mut self, id: PortId, policy: &PortPolicy) -> Result<(), Error> {
        let st = self.ports.get(&id).ok_or(Error::UnknownPort(id))?;
        let mut spec = st.spec;
        let slot = st.slot;
        if spec.policy.rate != policy.rate {
            self.write_rate(slot, policy.rate)?;
        }
        spec.policy = *policy;
        let val = self.port_val(&spec, slot).to_bytes();
        self.maps
            .port_slots
            .update(&slot.to_ne_bytes(), &val, MapFlags::ANY)
            .map_err(map_err("port_slots"))?;
        self.maps
            .ports
            .update(&spec.ifindex.to_ne_bytes(), &val, MapFlags::ANY)
            .map_err(map_err("ports"))?;
        if let Some(st) = self.ports.get_mut(&id) {
            st.spec = spec;
        }
        Ok(())
    }

    /// Detaches a port: rules to it fall back to the slow path first, then its programs and
    /// entries go.
    pub fn detach_port(&mut self, id: PortId) -> Result<(), Error> {
        let st = self.ports.remove(&id).ok_or(Error::UnknownPort(id))?;
        let res = self.reapply();
        // Put forwarding back first: the device is never left forwarding without a program.
        self.restore_forwarding(st.spec.ifindex);
        let [port, punt] = st.links;
        self.release_link(Program::PortIngress, st.spec.ifindex, port);
        self.release_link(Program::PuntIngress, st.spec.punt_ifindex, punt);
        let _ = self.maps.ports.delete(&st.spec.ifindex.to_ne_bytes());
        let _ = self.maps.punts.delete(&st.spec.punt_ifindex.to_ne_bytes());
        self.maps
            .port_slots
            .update(&st.slot.to_ne_bytes(), &[0u8; 32], MapFlags::ANY)
            .map_err(map_err("port_slots"))?;
        res.map(|_| ())
    }

    /// Adds or changes a plain udp link.
    pub fn set_link(&mut self, spec: &LinkSpec) -> Result<(), Error> {
        if spec.vni > 0x00ff_ffff || spec.remote.is_unspecified() || spec.udp_port == 0 {
            return Err(Error::Invalid(format!("link {:?}: {spec:?}", spec.id)));
        }
        let new_key = layout::link_key(spec.remote, spec.vni);
        if let Some((other, _)) = self.links.iter().find(|(id, l)| {
            **id != spec.id && layout::link_key(l.spec.remote, l.spec.vni) == new_key
        }) {
            return Err(Error::Invalid(format!(
                "link {:?}: ({}, VNI {}) is already link {other:?}",
                spec.id, spec.remote, spec.vni
            )));
        }
        // An earlier vnetd's link to the same (remote, VNI) keeps its slot.
        let earlier = match (self.links.contains_key(&spec.id), &mut self.pins) {
            (false, Some(p)) => {
                let found = p
                    .earlier
                    .links
                    .iter()
                    .find(|(_, l)| l.remote == spec.remote && l.vni == spec.vni)
                    .map(|(s, _)| *s);
                found.and_then(|s| p.earlier.links.remove(&s).map(|_| s))
            }
            _ => None,
        };
        let (slot, old) = match (self.links.get(&spec.id), earlier) {
            (Some(l), _) => (l.slot, Some(l.spec)),
            (None, Some(s)) => (s, None),
            (None, None) => (
                Self::free_slot(
                    self.links
                        .values()
                        .map(|l| l.slot)
                        .chain(self.unclaimed_link_slots()),
                    self.cfg.max_links,
                    "link",
                )?,
                None,
            ),
        };
        let idx = self.cfg.max_ports + slot;
        if old.is_none() && earlier.is_none() {
            Self::zero_percpu(&self.maps.counters, "counters", idx, counter::COUNT * 8)?;
        }
        let rate_kept = match old {
            Some(o) => o.rate == spec.rate,
            None => earlier.is_some() && self.rate_is(idx, spec.rate),
        };
        if !rate_kept {
            self.write_rate(idx, spec.rate)?;
        }
        let val = layout::LinkVal {
            slot,
            vni: spec.vni,
            remote: spec.remote,
            local: spec.local,
            udp_port: spec.udp_port,
            flags: if spec.rate.is_some() {
                layout::LINK_RATE
            } else {
                0
            },
            via_ifindex: spec.via_device.unwrap_or(0),
        };
        self.maps
            .links
            .update(&slot.to_ne_bytes(), &val.to_bytes(), MapFlags::ANY)
            .map_err(map_err("links"))?;
        if earlier.is_none() {
            Self::zero_percpu(
                &self.maps.link_cache,
                "link_cache",
                slot,
                layout::LINK_CACHE_SIZE,
            )?;
        }
        self.maps
            .links_rx
            .update(&new_key, &slot.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("links_rx"))?;
        if let Some(o) = old {
            let old_key = layout::link_key(o.remote, o.vni);
            if old_key != new_key {
                let _ = self.maps.links_rx.delete(&old_key);
            }
        }
        self.links.insert(spec.id, LinkState { spec: *spec, slot });
        if old.is_none() {
            self.reapply()?;
        }
        Ok(())
    }

    /// Removes a link: rules to it fall back to the slow path first.
    pub fn del_link(&mut self, id: PortId) -> Result<(), Error> {
        let st = self.links.remove(&id).ok_or(Error::UnknownLink(id))?;
        let res = self.reapply();
        let _ = self
            .maps
            .links_rx
            .delete(&layout::link_key(st.spec.remote, st.spec.vni));
        self.maps
            .links
            .update(&st.slot.to_ne_bytes(), &[0u8; 32], MapFlags::ANY)
            .map_err(map_err("links"))?;
        res.map(|_| ())
    }

    /// Forgets every cached outer next hop (each CPU asks bpf_fib_lookup again on the next
    /// packet): for vnetd to call when the underlay's routes or neighbours changed.
    pub fn invalidate_outer_cache(&self) -> Result<(), Error> {
        self.epoch.invalidate()
    }

    /// A handle to [`FastPath::invalidate_outer_cache`] for another thread.
    pub fn outer_cache_invalidator(&self) -> OuterCacheInvalidator {
        self.epoch.clone()
    }

    /// The IPv4 `forwarding` values of the devices the fast path turned it on for, as they
    /// were before (to keep across a restart of the process, with the programs pinned).
    pub fn forwarding_originals(&self) -> Vec<ForwardingOriginal> {
        self.forwarding.values().cloned().collect()
    }

    /// Records the original `forwarding` of a device (known from an earlier run that left it
    /// on): [`FastPath::attach_port`] keeps it instead of the value it finds, and a restore
    /// puts it back, whether or not a port is attached to the device.
    pub fn set_forwarding_original(&mut self, o: ForwardingOriginal) {
        self.forwarding.insert(o.ifindex, o);
    }

    /// Puts `forwarding` of `ifindex` back to its original value and forgets it (no-op for a
    /// device the fast path did not change).
    pub fn restore_forwarding(&mut self, ifindex: u32) {
        if let Some(o) = self.forwarding.remove(&ifindex) {
            restore_forwarding(&o);
        }
    }

    /// Puts every device's `forwarding` back (called when the FastPath is dropped; callable
    /// on its own for a process that leaves its programs attached but its devices restored).
    pub fn restore_forwarding_all(&mut self) {
        for (_, o) in std::mem::take(&mut self.forwarding) {
            restore_forwarding(&o);
        }
    }

    /// Whether a takeover waits for [`FastPath::commit`].
    pub fn taking_over(&self) -> bool {
        self.pins.as_ref().is_some_and(|p| p.holding)
    }

    /// Ends a takeover, once the restored configuration's ports and links are attached and its
    /// table applied: writes the difference between the earlier vnetd's table and this one
    /// (nothing, when nothing changed), swaps this process's programs into every link, lets
    /// go of what the earlier vnetd had and this one does not (ports, links, attachments; the
    /// devices' forwarding put back), and pins the maps if they are new. Until then the kernel
    /// forwarded by the earlier state, unchanged.
    pub fn commit(&mut self) -> Result<ApplyReport, Error> {
        let Some(p) = &mut self.pins else {
            return Ok(ApplyReport::default());
        };
        if !p.holding {
            return Ok(ApplyReport::default());
        }
        p.holding = false;
        let earlier = std::mem::take(&mut p.earlier);
        let held = std::mem::take(&mut p.held);
        let links_dir = p.dir.join("links");
        let port_slots: BTreeMap<u32, PortId> =
            self.ports.iter().map(|(id, st)| (st.slot, *id)).collect();
        let link_slots: BTreeMap<u32, PortId> =
            self.links.iter().map(|(id, st)| (st.slot, *id)).collect();
        let (known, stale) = takeover::known_entries(&earlier.fwd, &port_slots, &link_slots);
        self.current = known;
        let mut report = self.reapply()?;
        for k in stale {
            if !self.current.contains_key(&k) {
                let _ = self
                    .maps
                    .fwd
                    .delete(&layout::fwd_key(k.vni, k.kind.wire(), k.src, k.dst));
                report.deleted += 1;
            }
        }
        // Every link runs this process's programs from now on.
        let prog_fd = |p: Program| -> Option<OwnedFd> {
            let prog = self.obj.progs().find(|x| x.name() == p.name())?;
            prog.as_fd().try_clone_to_owned().ok()
        };
        let progs: BTreeMap<&'static str, OwnedFd> = [
            Program::PortIngress,
            Program::PuntIngress,
            Program::UnderlayIngress,
            Program::TunnelIngress,
        ]
        .into_iter()
        .filter_map(|p| Some((p.name(), prog_fd(p)?)))
        .collect();
        let mut swaps: Vec<(Program, u32, BorrowedFd<'_>)> = Vec::new();
        for st in self.ports.values() {
            swaps.push((Program::PortIngress, st.spec.ifindex, st.links[0].as_fd()));
            swaps.push((
                Program::PuntIngress,
                st.spec.punt_ifindex,
                st.links[1].as_fd(),
            ));
        }
        for (ifindex, (p, fd)) in &self.underlays {
            swaps.push((*p, *ifindex, fd.as_fd()));
        }
        for (p, ifindex, fd) in swaps {
            if let Some(prog) = progs.get(p.name()) {
                if let Err(e) = pin::update_link(fd, prog.as_fd()) {
                    tracing::warn!(
                        ifindex,
                        program = p.name(),
                        "kernel fast path: program swap failed: {e}"
                    );
                }
            }
        }
        // What the earlier vnetd had and this one has not.
        for (ifindex, pv) in &earlier.ports {
            let _ = self.maps.ports.delete(&ifindex.to_ne_bytes());
            let _ = self.maps.punts.delete(&pv.punt_ifindex.to_ne_bytes());
            let _ = self
                .maps
                .port_slots
                .update(&pv.slot.to_ne_bytes(), &[0u8; 32], MapFlags::ANY);
        }
        for (slot, lv) in &earlier.links {
            let _ = self
                .maps
                .links_rx
                .delete(&layout::link_key(lv.remote, lv.vni));
            let _ = self
                .maps
                .links
                .update(&slot.to_ne_bytes(), &[0u8; 32], MapFlags::ANY);
        }
        for (name, fd) in held {
            tracing::info!(%name, "kernel fast path: an attachment the configuration no longer has goes");
            let _ = pin::unpin(&links_dir.join(&name));
            drop(fd);
        }
        for ifindex in earlier.ports.keys() {
            self.restore_forwarding(*ifindex);
        }
        if self.pins.as_ref().is_some_and(|p| p.maps_to_pin) {
            self.pin_maps()
                .map_err(|e| Error::Invalid(format!("pinning the maps: {e}")))?;
        }
        tracing::info!(
            written = report.written,
            deleted = report.deleted,
            "kernel fast path: takeover complete"
        );
        Ok(report)
    }

    /// Removes everything: the tcx links (the programs leave the devices), the pins and their
    /// directory (the maps are freed), and puts the devices' forwarding back. What vnetd's
    /// teardown does; dropping a pinned [`FastPath`] leaves it all in place instead.
    pub fn teardown(mut self) {
        if let Some(p) = self.pins.take() {
            if let Err(e) = pin::remove_dir(&p.dir) {
                tracing::warn!(dir = %p.dir.display(), "kernel fast path: removing the pins: {e}");
            }
            drop(p.held);
        }
        self.ports.clear();
        self.underlays.clear();
        self.restore_forwarding_all();
    }

    /// Replaces the forwarding table with `table` with the fewest map writes: new and changed
    /// entries first, stale ones deleted last, so an entry in both tables is never missing.
    /// Targets that are not attached ports or set links are slow.
    pub fn apply_table(&mut self, table: &CompiledTable) -> Result<ApplyReport, Error> {
        self.table = table.clone();
        self.reapply()
    }

    fn reapply(&mut self) -> Result<ApplyReport, Error> {
        if self.pins.as_ref().is_some_and(|p| p.holding) {
            // Taking over: the kernel forwards by the earlier table until `commit`.
            return Ok(ApplyReport::default());
        }
        let mut t = self.table.clone();
        for e in t.entries.values_mut() {
            let known = match e.action {
                Action::Port(p) => self.ports.contains_key(&p),
                Action::Link(l) => self.links.contains_key(&l),
                _ => true,
            };
            if !known {
                e.action = Action::Slow;
            }
        }
        let plan = plan_update(&self.current, &t, self.cfg.max_table as usize);
        let mut report = ApplyReport {
            left_out: plan.left_out,
            ..Default::default()
        };
        self.table_full += plan.left_out as u64;
        for (k, e) in &plan.upserts {
            let key = layout::fwd_key(k.vni, k.kind.wire(), k.src, k.dst);
            let val = layout::fwd_val(self.action_word(e.action), e.flags());
            if let Err(err) = self.maps.fwd.update(&key, &val, MapFlags::ANY) {
                // Cannot happen within the planned room; if it does, the rest of the plan
                // still holds (every entry leads only to entries written before it).
                tracing::warn!(?k, %err, "fast path: forwarding entry not written");
                self.table_full += 1;
                continue;
            }
            self.current.insert(*k, *e);
            report.written += 1;
        }
        for k in &plan.deletes {
            let key = layout::fwd_key(k.vni, k.kind.wire(), k.src, k.dst);
            match self.maps.fwd.delete(&key) {
                Ok(()) => {}
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::Map {
                        map: "fwd",
                        source: e,
                    })
                }
            }
            self.current.remove(k);
            report.deleted += 1;
        }
        Ok(report)
    }

    fn action_word(&self, a: Action) -> u32 {
        match a {
            Action::None => layout::action(layout::ACT_NONE, 0),
            Action::Slow => layout::action(layout::ACT_SLOW, 0),
            Action::Port(p) => match self.ports.get(&p) {
                Some(st) => layout::action(layout::ACT_PORT, st.slot),
                None => layout::action(layout::ACT_SLOW, 0),
            },
            Action::Link(l) => match self.links.get(&l) {
                Some(st) => layout::action(layout::ACT_LINK, st.slot),
                None => layout::action(layout::ACT_SLOW, 0),
            },
        }
    }

    /// The number of entries in the kernel's forwarding table.
    pub fn table_len(&self) -> usize {
        self.current.len()
    }

    fn read_counters(&self, idx: u32) -> Result<Counters, Error> {
        let per_cpu = self
            .maps
            .counters
            .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("counters"))?
            .unwrap_or_default();
        let mut sum = [0u64; counter::COUNT];
        for cpu in per_cpu {
            for (s, v) in sum.iter_mut().zip(layout::u64s(&cpu, counter::COUNT)) {
                *s += v;
            }
        }
        let mut drops = BTreeMap::new();
        for (name, i) in [
            ("truncated", counter::DROP_TRUNCATED),
            ("oversize", counter::DROP_OVERSIZE),
            ("spoofed_src", counter::DROP_SPOOFED_SRC),
            ("rate_limited", counter::DROP_RATE_LIMITED),
        ] {
            if sum[i] > 0 {
                drops.insert(name, sum[i]);
            }
        }
        Ok(Counters {
            rx_frames: sum[counter::RX_FRAMES],
            rx_bytes: sum[counter::RX_BYTES],
            tx_frames: sum[counter::TX_FRAMES],
            tx_bytes: sum[counter::TX_BYTES],
            punted_frames: sum[counter::PUNT_FRAMES],
            punted_bytes: sum[counter::PUNT_BYTES],
            slow_tx_frames: sum[counter::SLOW_TX_FRAMES],
            slow_tx_bytes: sum[counter::SLOW_TX_BYTES],
            drops,
            neigh_miss: sum[counter::NEIGH_MISS],
            encap_fail: sum[counter::ENCAP_FAIL],
            gro_passed: sum[counter::GRO_PASSED],
            bad_length: sum[counter::BAD_LENGTH],
        })
    }

    pub fn port_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.ports.get(&id).ok_or(Error::UnknownPort(id))?;
        self.read_counters(st.slot)
    }

    pub fn link_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.links.get(&id).ok_or(Error::UnknownLink(id))?;
        self.read_counters(self.cfg.max_ports + st.slot)
    }

    /// A port's or link's token bucket fill in bytes (negative in debt), if it has a rate.
    pub fn rate_available(&self, id: PortId) -> Result<Option<i64>, Error> {
        let (idx, limited) = if let Some(p) = self.ports.get(&id) {
            (p.slot, p.spec.policy.rate.is_some())
        } else if let Some(l) = self.links.get(&id) {
            (self.cfg.max_ports + l.slot, l.spec.rate.is_some())
        } else {
            return Err(Error::UnknownPort(id));
        };
        if !limited {
            return Ok(None);
        }
        let v = self
            .maps
            .rates
            .lookup(&idx.to_ne_bytes(), MapFlags::LOCK)
            .map_err(map_err("rates"))?;
        Ok(v.and_then(|b| layout::rate_available(&b)))
    }

    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        let per_cpu = self
            .maps
            .global
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(map_err("global"))?
            .unwrap_or_default();
        let mut sum = [0u64; global::COUNT];
        for cpu in per_cpu {
            for (s, v) in sum.iter_mut().zip(layout::u64s(&cpu, global::COUNT)) {
                *s += v;
            }
        }
        Ok(GlobalCounters {
            unknown_port: sum[global::UNKNOWN_PORT],
            not_vxlan: sum[global::NOT_VXLAN],
            unknown_link: sum[global::UNKNOWN_LINK],
            fib_fail: sum[global::FIB_FAIL],
            vni_mismatch: sum[global::VNI_MISMATCH],
            table_full: self.table_full,
        })
    }

    /// The kernel's traffic matrix (what it forwarded), summed over CPUs.
    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        let mut out = Vec::new();
        for key in self.maps.matrix.keys() {
            let Some((vni, src, dst)) = layout::matrix_key_parse(&key) else {
                continue;
            };
            // An LRU entry may be evicted between the key walk and the lookup.
            let Some(per_cpu) = self
                .maps
                .matrix
                .lookup_percpu(&key, MapFlags::ANY)
                .map_err(map_err("matrix"))?
            else {
                continue;
            };
            let (mut frames, mut bytes) = (0, 0);
            for cpu in per_cpu {
                let v = layout::u64s(&cpu, 2);
                frames += v[0];
                bytes += v[1];
            }
            out.push(MatrixEntry {
                vni,
                src,
                dst,
                frames,
                bytes,
            });
        }
        out.sort_by_key(|e| (e.vni, e.src, e.dst));
        Ok(out)
    }

    /// Runs one program once on `frame` as if it arrived on `ifindex` (a device of the
    /// caller's network namespace), with `gso_size` set when non-zero (`BPF_PROG_TEST_RUN`:
    /// redirects are returned as verdicts, not done).
    pub fn test_run(
        &self,
        prog: Program,
        frame: &[u8],
        ifindex: u32,
        gso_size: u32,
    ) -> Result<TestRun, Error> {
        let p = self
            .obj
            .progs_mut()
            .find(|x| x.name() == prog.name())
            .ok_or_else(|| Error::Invalid(format!("program {} missing", prog.name())))?;
        // struct __sk_buff: ifindex at 40, gso_segs at 164, gso_size at 176 (192 bytes).
        let mut ctx = [0u8; 192];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        if gso_size > 0 {
            ctx[176..180].copy_from_slice(&gso_size.to_ne_bytes());
        }
        let mut out = vec![0u8; frame.len() + 256];
        let input = libbpf_rs::ProgramInput {
            data_in: Some(frame),
            data_out: Some(&mut out),
            context_in: Some(&mut ctx),
            ..Default::default()
        };
        let res = p.test_run(input).map_err(|source| Error::Map {
            map: "test_run",
            source,
        })?;
        let data = res.data.map(|d| d.to_vec()).unwrap_or_default();
        Ok(TestRun {
            verdict: res.return_value as i32,
            data,
        })
    }
}

impl Drop for FastPath {
    fn drop(&mut self) {
        // Unpinned, the programs go with the descriptors, and no device may keep forwarding
        // without one. Pinned, they stay (the devices keep forwarding, with their programs,
        // until a teardown).
        if self.pins.is_none() {
            self.restore_forwarding_all();
        }
    }
}

impl FwdEntry {
    fn flags(&self) -> u32 {
        if self.check_src {
            layout::FWDF_CHECK_SRC
        } else {
            0
        }
    }
}

/// Turns a load failure into words a user understands.
fn classify(e: libbpf_rs::Error, log: &str) -> Unavailable {
    let msg = e.to_string();
    if log.contains("BEGIN PROG LOAD LOG") {
        let program = log
            .lines()
            .find_map(|l| {
                let i = l.find("prog '")?;
                let rest = &l[i + 6..];
                Some(rest[..rest.find('\'')?].to_string())
            })
            .unwrap_or_else(|| "?".into());
        return Unavailable::Verifier {
            program,
            log: log.to_string(),
        };
    }
    match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            if !root || !has_bpf_caps() {
                Unavailable::NoPrivilege(msg)
            } else {
                let lockdown =
                    std::fs::read_to_string("/sys/kernel/security/lockdown").unwrap_or_default();
                Unavailable::Disallowed(format!("{msg}; lockdown: {}", lockdown.trim()))
            }
        }
        libbpf_rs::ErrorKind::Unsupported => {
            Unavailable::KernelTooOld(format!("{msg} (running {})", kernel_release()))
        }
        _ => {
            let tail: String = log
                .lines()
                .rev()
                .take(8)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            Unavailable::Other(format!("{msg}\n{tail}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_failures_are_told_in_words() {
        let log = "libbpf: prog 'port_ingress': BPF program load failed: Permission denied\n\
                   libbpf: prog 'port_ingress': -- BEGIN PROG LOAD LOG --\n\
                   misaligned stack access off 0+0+-154 size 4\n-- END PROG LOAD LOG --\n";
        let e = libbpf_rs::Error::from(std::io::Error::from_raw_os_error(libc::EACCES));
        match classify(e, log) {
            Unavailable::Verifier { program, log } => {
                assert_eq!(program, "port_ingress");
                assert!(log.contains("misaligned"));
            }
            other => panic!("{other:?}"),
        }
        let e = libbpf_rs::Error::from(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        assert!(matches!(classify(e, ""), Unavailable::KernelTooOld(_)));
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(release_version("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(release_version("5.10.0-28-amd64"), Some((5, 10)));
        assert!(release_version("6.18.44").unwrap() >= (6, 6));
        assert_eq!(release_version("garbage"), None);
    }
}
