//! The forwarding engine: owns the live ports, publishes an immutable [`Snapshot`] of them and
//! the route table for the forwarding threads, and moves frames between ports.
//!
//! Threads: one reader per TAP interface and per direct link, one for the shared UDP socket,
//! a writer (and a reader per connection) per TCP link, one per TCP listener. Every reader calls
//! [`Shared::forward`], which decides with the route cache and the snapshot and transmits
//! directly on the egress ports, so a frame is handled start to finish on the thread that read
//! it (no hand-off queues, no locks on the common path).

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use socket2::SockAddr;
use tracing::{info, warn};
use vnet_control::{Change, Config, DestKind, Interface, Link, LinkKind};
use vnet_core::{
    Decision, DropReason, ForwardingTable, LearnTable, MatrixEntry, PortCounters,
    PortCountersSnapshot, PortId, PortInfo, PortKind, RouteCache, RouteRule, TrafficMatrix,
};
use vnet_wire::{
    EthernetFrame, VxlanPacket, VxlanRepr, WireError, MAX_FRAME_LEN, VXLAN_HEADER_LEN,
};

use crate::packet::PacketSocket;
use crate::sys::{self, wait_readable, EventFd, Wake};
use crate::tap::Tap;
use crate::tcp::{self, TcpLink, TcpRole};
use crate::udp::VxlanSocket;
use crate::worker::Worker;

/// Largest buffer a reader needs: the largest frame plus room for a VXLAN header.
const RX_BUF: usize = MAX_FRAME_LEN + 64;
/// Frames a reader handles per wake-up before polling again (fairness between fds).
const RX_BATCH: usize = 64;
/// How often idle readers wake to flush their traffic-matrix counts.
const IDLE_TICK: Duration = Duration::from_millis(100);
const ROUTE_CACHE_SIZE: usize = 4096;

/// Errors from creating OS objects for a configuration change.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("interface {name}: {source}")]
    Interface { name: String, source: io::Error },
    #[error("link {name}: {source}")]
    Link { name: String, source: io::Error },
    #[error("listener {addr}: {source}")]
    Listener { addr: SocketAddr, source: io::Error },
    #[error("link {name}: {why}")]
    Unsupported { name: String, why: String },
}

/// How a frame leaves through a port.
enum PortTx {
    Tap(Arc<Tap>),
    Udp {
        sock: Arc<VxlanSocket>,
        to: SockAddr,
        header: [u8; VXLAN_HEADER_LEN],
    },
    Tcp(Arc<TcpLink>),
    Direct(Arc<PacketSocket>),
}

/// Largest frame a UDP link can carry: one UDP datagram holds at most 65507 bytes (IPv4).
const UDP_MAX_FRAME: usize = 65507 - VXLAN_HEADER_LEN;

impl PortTx {
    fn send(&self, frame: &[u8]) -> Result<(), DropReason> {
        match self {
            PortTx::Tap(t) => t.send(frame),
            PortTx::Udp { sock, to, header } => {
                if frame.len() > UDP_MAX_FRAME {
                    return Err(DropReason::Oversize);
                }
                sock.send(to, header, frame)
            }
            PortTx::Tcp(l) => l.send(frame),
            PortTx::Direct(p) => p.send(frame),
        }
    }
}

/// What the forwarding threads know of a port.
#[derive(Clone)]
pub struct PortEntry {
    info: PortInfo,
    tx: Arc<PortTx>,
    counters: Arc<PortCounters>,
}

/// An immutable view of the ports and routes, swapped whole on every change.
#[derive(Default)]
pub struct Snapshot {
    table: ForwardingTable,
    ports: HashMap<PortId, PortEntry>,
    udp_peers: HashMap<(IpAddr, u32), PortId>,
    udp_ips: HashSet<IpAddr>,
    tcp_accept: HashMap<(IpAddr, u32), Arc<TcpLink>>,
}

/// State shared by the engine and every forwarding thread.
pub struct Shared {
    snapshot: ArcSwap<Snapshot>,
    learning: AtomicBool,
    learn: RwLock<LearnTable>,
    matrix: Mutex<TrafficMatrix>,
    /// Counters for traffic that belongs to no port (unknown peers, bad greetings, ...).
    pub daemon: PortCounters,
    epoch: Instant,
}

/// Per-thread forwarding state: the route cache and a local slice of the traffic matrix,
/// merged into the shared one every few hundred frames or on idle.
pub struct RxCtx {
    cache: RouteCache,
    matrix: TrafficMatrix,
    pending: u32,
    last_flush: Instant,
}

impl Default for RxCtx {
    fn default() -> Self {
        Self::new()
    }
}

impl RxCtx {
    pub fn new() -> Self {
        RxCtx {
            cache: RouteCache::new(ROUTE_CACHE_SIZE),
            matrix: TrafficMatrix::new(ROUTE_CACHE_SIZE),
            pending: 0,
            last_flush: Instant::now(),
        }
    }

    pub fn flush(&mut self, shared: &Shared) {
        if self.pending > 0 {
            let mut m = shared.matrix.lock().unwrap_or_else(|p| p.into_inner());
            m.merge_from(&mut self.matrix);
            self.pending = 0;
        }
        self.last_flush = Instant::now();
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn port_counters(&self, id: PortId) -> Option<Arc<PortCounters>> {
        self.snapshot
            .load()
            .ports
            .get(&id)
            .map(|p| p.counters.clone())
    }

    pub fn tcp_accept_link(&self, peer: IpAddr, vni: u32) -> Option<Arc<TcpLink>> {
        self.snapshot.load().tcp_accept.get(&(peer, vni)).cloned()
    }

    /// Forwards one frame that arrived on `ingress`. Never panics on any input: a frame too
    /// short or too long is counted and dropped.
    pub fn forward(&self, ctx: &mut RxCtx, ingress: PortId, frame: &[u8]) {
        let snap = self.snapshot.load();
        let Some(inp) = snap.ports.get(&ingress) else {
            return; // the port was removed while this frame was in flight
        };
        inp.counters.rx(frame.len());
        let eth = match EthernetFrame::new_checked(frame) {
            Ok(e) => e,
            Err(WireError::Truncated { .. }) => {
                return inp.counters.count_drop(DropReason::Truncated)
            }
            Err(_) => return inp.counters.count_drop(DropReason::Oversize),
        };
        let (src, dst) = (eth.src(), eth.dst());
        let vni = inp.info.vni;
        let learning = self.learning.load(Relaxed);
        let mut learn_gen = 0;
        if learning {
            let now = self.now_ms();
            let fresh = self
                .learn
                .read()
                .map(|t| t.is_current(vni, src, ingress, now))
                .unwrap_or(true);
            if !fresh && src.is_unicast() {
                if let Ok(mut t) = self.learn.write() {
                    t.observe(vni, src, ingress, now);
                }
            }
            learn_gen = self.learn.read().map(|t| t.generation()).unwrap_or(0);
        }
        ctx.matrix.record(vni, src, dst, 1, frame.len() as u64);
        ctx.pending += 1;
        let decision = ctx.cache.lookup(
            (snap.table.generation(), learn_gen),
            (ingress, src, dst),
            || {
                let learned = if learning && dst.is_unicast() {
                    self.learn
                        .read()
                        .ok()
                        .and_then(|t| t.lookup(vni, dst, self.now_ms()))
                } else {
                    None
                };
                snap.table.decide(ingress, src, dst, learning, learned)
            },
        );
        match decision {
            Decision::Drop(r) => inp.counters.count_drop(*r),
            Decision::Forward(targets) => {
                for t in targets {
                    if let Some(out) = snap.ports.get(t) {
                        match out.tx.send(frame) {
                            Ok(()) => out.counters.tx(frame.len()),
                            Err(r) => out.counters.count_drop(r),
                        }
                    }
                }
            }
        }
        if ctx.pending >= 256 || ctx.last_flush.elapsed() >= IDLE_TICK {
            ctx.flush(self);
        }
    }

    /// Handles one datagram from the UDP socket.
    fn receive_datagram(&self, ctx: &mut RxCtx, data: &[u8], from: SocketAddr) {
        self.daemon.rx(data.len());
        let ip = from.ip().to_canonical();
        let snap = self.snapshot.load();
        if !snap.udp_ips.contains(&ip) {
            return self.daemon.count_drop(DropReason::UnknownPeer);
        }
        let pkt = match VxlanPacket::new_checked(data) {
            Ok(p) => p,
            Err(_) => return self.daemon.count_drop(DropReason::BadVxlan),
        };
        match snap.udp_peers.get(&(ip, pkt.vni())) {
            Some(&port) => {
                drop(snap);
                self.forward(ctx, port, pkt.payload())
            }
            None => self.daemon.count_drop(DropReason::UnknownVni),
        }
    }
}

struct PortRuntime {
    id: PortId,
    entry: PortEntry,
    /// Reader or writer threads; stopped (and the port's OS objects closed) when dropped.
    workers: Vec<Worker>,
    tcp: Option<Arc<TcpLink>>,
    udp_peer: Option<IpAddr>,
    tcp_accept_peer: Option<IpAddr>,
}

/// The status of one port, for `show stats`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PortStatus {
    pub kind: &'static str,
    pub name: String,
    pub vni: u32,
    #[serde(flatten)]
    pub counters: PortCountersSnapshot,
}

/// The live data path of one daemon.
pub struct Engine {
    shared: Arc<Shared>,
    udp: Arc<VxlanSocket>,
    ports: HashMap<(DestKind, String), PortRuntime>,
    listeners: HashMap<SocketAddr, Worker>,
    next_id: u32,
    generation: u64,
    _udp_reader: Worker,
}

impl Engine {
    /// Binds the VXLAN socket and starts its reader.
    pub fn new(udp_bind: SocketAddr) -> io::Result<Engine> {
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            learning: AtomicBool::new(false),
            learn: RwLock::new(LearnTable::default()),
            matrix: Mutex::new(TrafficMatrix::default()),
            daemon: PortCounters::default(),
            epoch: Instant::now(),
        });
        let udp = Arc::new(VxlanSocket::bind(udp_bind)?);
        info!(addr = %udp.local_addr(), "VXLAN socket bound");
        let (sh, sock) = (shared.clone(), udp.clone());
        let reader = Worker::spawn("udp-rx".into(), move |stop| udp_reader(sh, sock, stop))?;
        Ok(Engine {
            shared,
            udp,
            ports: HashMap::new(),
            listeners: HashMap::new(),
            next_id: 1,
            generation: 0,
            _udp_reader: reader,
        })
    }

    pub fn udp_local_addr(&self) -> SocketAddr {
        self.udp.local_addr()
    }

    fn alloc_id(&mut self) -> PortId {
        let id = PortId(self.next_id);
        self.next_id += 1;
        id
    }

    /// Creates or removes the OS objects one change calls for. Call [`Engine::rebuild`]
    /// afterwards (once per script) to publish the new forwarding table.
    pub fn apply(&mut self, change: &Change) -> Result<(), EngineError> {
        match change {
            Change::AddInterface(i) => self.add_interface(i),
            Change::DelInterface(i) => {
                self.remove_port(DestKind::Interface, &i.name);
                Ok(())
            }
            Change::AddLink(l) => self.add_link(l),
            Change::DelLink(l) => {
                self.remove_port(DestKind::Link, &l.name);
                Ok(())
            }
            Change::AddListener(a) => {
                let w = tcp::start_listener(self.shared.clone(), *a)
                    .map_err(|source| EngineError::Listener { addr: *a, source })?;
                self.listeners.insert(*a, w);
                Ok(())
            }
            Change::DelListener(a) => {
                self.listeners.remove(a);
                Ok(())
            }
            Change::Routes => Ok(()),
            Change::Learn(on) => {
                self.shared.learning.store(*on, Relaxed);
                if let Ok(mut t) = self.shared.learn.write() {
                    t.clear();
                }
                Ok(())
            }
        }
    }

    fn add_interface(&mut self, i: &Interface) -> Result<(), EngineError> {
        let err = |source| EngineError::Interface {
            name: i.name.clone(),
            source,
        };
        let tap = Arc::new(Tap::open(i).map_err(err)?);
        let id = self.alloc_id();
        let entry = PortEntry {
            info: PortInfo {
                vni: i.vni,
                kind: PortKind::Interface,
            },
            tx: Arc::new(PortTx::Tap(tap.clone())),
            counters: Arc::new(PortCounters::default()),
        };
        let sh = self.shared.clone();
        let reader = Worker::spawn(format!("tap-rx-{}", id.0), move |stop| {
            fd_reader(sh, id, stop, tap.fd(), |buf| {
                read_nonblocking(tap.fd(), buf)
            })
        })
        .map_err(err)?;
        info!(name = %i.name, ifname = %i.ifname, mac = %i.mac, vni = i.vni, netns = ?i.netns, "interface added");
        self.ports.insert(
            (DestKind::Interface, i.name.clone()),
            PortRuntime {
                id,
                entry,
                workers: vec![reader],
                tcp: None,
                udp_peer: None,
                tcp_accept_peer: None,
            },
        );
        Ok(())
    }

    fn add_link(&mut self, l: &Link) -> Result<(), EngineError> {
        let err = |source| EngineError::Link {
            name: l.name.clone(),
            source,
        };
        let id = self.alloc_id();
        let counters = Arc::new(PortCounters::default());
        let mut rt = PortRuntime {
            id,
            entry: PortEntry {
                info: PortInfo {
                    vni: l.vni,
                    kind: PortKind::OverlayLink,
                },
                // replaced below for every kind
                tx: Arc::new(PortTx::Udp {
                    sock: self.udp.clone(),
                    to: SockAddr::from(self.udp.local_addr()),
                    header: [0; VXLAN_HEADER_LEN],
                }),
                counters,
            },
            workers: vec![],
            tcp: None,
            udp_peer: None,
            tcp_accept_peer: None,
        };
        match &l.kind {
            LinkKind::Udp(to) => {
                if to.is_ipv6() != self.udp.local_addr().is_ipv6() && to.is_ipv6() {
                    return Err(EngineError::Unsupported {
                        name: l.name.clone(),
                        why: format!("{to} is IPv6 but the UDP socket is bound to IPv4 (start vnetd with --bind ::)"),
                    });
                }
                let to_sa = match (self.udp.local_addr().is_ipv6(), to) {
                    (true, SocketAddr::V4(v4)) => {
                        SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
                    }
                    _ => *to,
                };
                rt.entry.tx = Arc::new(PortTx::Udp {
                    sock: self.udp.clone(),
                    to: SockAddr::from(to_sa),
                    header: VxlanRepr { vni: l.vni }.header(),
                });
                rt.udp_peer = Some(to.ip().to_canonical());
            }
            LinkKind::TcpDial(addr) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Dial(*addr))
                        .map_err(err)?;
                rt.entry.tx = Arc::new(PortTx::Tcp(link.clone()));
                rt.tcp = Some(link);
                rt.workers.push(w);
            }
            LinkKind::TcpAccept(ip) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Accept).map_err(err)?;
                rt.entry.tx = Arc::new(PortTx::Tcp(link.clone()));
                rt.tcp = Some(link);
                rt.workers.push(w);
                rt.tcp_accept_peer = Some(ip.to_canonical());
            }
            LinkKind::Direct(dev) => {
                let sock = Arc::new(PacketSocket::open(dev).map_err(err)?);
                rt.entry.info.kind = PortKind::DirectLink;
                rt.entry.tx = Arc::new(PortTx::Direct(sock.clone()));
                let sh = self.shared.clone();
                let w = Worker::spawn(format!("direct-rx-{}", id.0), move |stop| {
                    let fd = sock.fd();
                    fd_reader(sh, id, stop, fd, |buf| sock.recv(buf))
                })
                .map_err(err)?;
                rt.workers.push(w);
            }
        }
        info!(name = %l.name, kind = %l.kind, vni = l.vni, "link added");
        self.ports.insert((DestKind::Link, l.name.clone()), rt);
        Ok(())
    }

    fn remove_port(&mut self, kind: DestKind, name: &str) {
        if let Some(mut rt) = self.ports.remove(&(kind, name.to_string())) {
            // Publish a table without the port first, so no thread sends to it any more.
            let mut snap = Snapshot::default();
            let old = self.shared.snapshot.load();
            snap.table = old.table.clone();
            snap.ports = old.ports.clone();
            snap.ports.remove(&rt.id);
            snap.udp_peers = old.udp_peers.clone();
            snap.udp_ips = old.udp_ips.clone();
            snap.tcp_accept = old.tcp_accept.clone();
            snap.tcp_accept
                .retain(|_, l| rt.tcp.as_ref().map(|t| !Arc::ptr_eq(t, l)).unwrap_or(true));
            snap.udp_peers.retain(|_, p| *p != rt.id);
            self.shared.snapshot.store(Arc::new(snap));
            for w in rt.workers.iter_mut() {
                w.stop();
            }
            if let Ok(mut t) = self.shared.learn.write() {
                t.remove_port(rt.id);
            }
            info!(
                name,
                "{} removed",
                if kind == DestKind::Interface {
                    "interface"
                } else {
                    "link"
                }
            );
        }
    }

    /// Publishes a new forwarding table for `cfg` (ports that exist, and the routes to them).
    pub fn rebuild(&mut self, cfg: &Config) {
        self.generation += 1;
        let mut snap = Snapshot::default();
        for rt in self.ports.values() {
            snap.ports.insert(rt.id, rt.entry.clone());
            if let Some(ip) = rt.udp_peer {
                snap.udp_peers.insert((ip, rt.entry.info.vni), rt.id);
                snap.udp_ips.insert(ip);
            }
            if let (Some(ip), Some(l)) = (rt.tcp_accept_peer, &rt.tcp) {
                snap.tcp_accept.insert((ip, rt.entry.info.vni), l.clone());
            }
        }
        let rules: Vec<RouteRule> = cfg
            .routes
            .iter()
            .filter_map(|r| {
                let rt = self.ports.get(&(r.to.kind, r.to.name.clone()))?;
                Some(RouteRule {
                    vni: rt.entry.info.vni,
                    src: r.src,
                    dst: r.dst,
                    dest: rt.id,
                })
            })
            .collect();
        snap.table = ForwardingTable::new(
            self.generation,
            snap.ports.iter().map(|(id, e)| (*id, e.info)),
            rules,
        );
        self.shared.snapshot.store(Arc::new(snap));
    }

    /// Counters of one port.
    pub fn port_status(&self, kind: DestKind, name: &str) -> Option<PortStatus> {
        let rt = self.ports.get(&(kind, name.to_string()))?;
        Some(PortStatus {
            kind: match kind {
                DestKind::Interface => "interface",
                DestKind::Link => "link",
            },
            name: name.to_string(),
            vni: rt.entry.info.vni,
            counters: rt.entry.counters.snapshot(),
        })
    }

    /// `up`, `connecting` or `down` (TCP links); other links are connectionless and always up.
    pub fn link_state(&self, name: &str) -> &'static str {
        match self.ports.get(&(DestKind::Link, name.to_string())) {
            Some(rt) => rt.tcp.as_ref().map(|t| t.state()).unwrap_or("up"),
            None => "down",
        }
    }

    pub fn daemon_counters(&self) -> PortCountersSnapshot {
        self.shared.daemon.snapshot()
    }

    pub fn matrix(&self) -> (Vec<MatrixEntry>, u64) {
        let m = self.shared.matrix.lock().unwrap_or_else(|p| p.into_inner());
        (m.entries(), m.overflow())
    }

    /// Stops every thread and closes every device (TAPs vnet created disappear).
    pub fn shutdown(&mut self) {
        self.listeners.clear();
        let names: Vec<(DestKind, String)> = self.ports.keys().cloned().collect();
        for (k, n) in names {
            self.remove_port(k, &n);
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn read_nonblocking(fd: std::os::fd::RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    match sys::read(fd, buf) {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The reader loop of a TAP or direct link: wait for the descriptor, then read and forward up
/// to `RX_BATCH` frames. (Issue #3 adds polling and adaptive modes here.)
fn fd_reader(
    shared: Arc<Shared>,
    id: PortId,
    stop: Arc<EventFd>,
    fd: std::os::fd::RawFd,
    mut recv: impl FnMut(&mut [u8]) -> io::Result<Option<usize>>,
) {
    let mut ctx = RxCtx::new();
    let mut buf = vec![0u8; RX_BUF];
    let mut errors = 0u32;
    loop {
        match wait_readable(fd, &stop, Some(IDLE_TICK)) {
            Ok(Wake::Stop) => break,
            Ok(Wake::Timeout) => {
                ctx.flush(&shared);
                continue;
            }
            Ok(Wake::Readable) => {}
            Err(e) => {
                warn!(port = id.0, "poll: {e}");
                std::thread::sleep(IDLE_TICK);
                continue;
            }
        }
        for _ in 0..RX_BATCH {
            match recv(&mut buf) {
                Ok(Some(n)) => {
                    errors = 0;
                    // A frame longer than the buffer (only possible on a packet socket, which
                    // reports the true length) is counted as oversize by forward().
                    let n = n.min(buf.len() + 1);
                    if n > buf.len() {
                        if let Some(c) = shared.port_counters(id) {
                            c.rx(n);
                            c.count_drop(DropReason::Oversize);
                        }
                        continue;
                    }
                    shared.forward(&mut ctx, id, &buf[..n]);
                }
                Ok(None) => break,
                Err(e) => {
                    errors += 1;
                    if errors == 1 || errors.is_multiple_of(1000) {
                        warn!(port = id.0, "read: {e} ({errors} in a row)");
                    }
                    // Back off so a device that errors persistently cannot spin a core.
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
    ctx.flush(&shared);
}

fn udp_reader(shared: Arc<Shared>, sock: Arc<VxlanSocket>, stop: Arc<EventFd>) {
    let mut ctx = RxCtx::new();
    let mut buf = vec![0u8; 65536];
    let mut last_expire = Instant::now();
    loop {
        match wait_readable(sock.fd(), &stop, Some(IDLE_TICK)) {
            Ok(Wake::Stop) => break,
            Ok(Wake::Timeout) => ctx.flush(&shared),
            Ok(Wake::Readable) => {
                for _ in 0..RX_BATCH {
                    match sock.recv(&mut buf) {
                        Ok(Some((n, from))) => shared.receive_datagram(&mut ctx, &buf[..n], from),
                        Ok(None) => break,
                        Err(e) => {
                            warn!("udp recv: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                warn!("udp poll: {e}");
                std::thread::sleep(IDLE_TICK);
            }
        }
        if last_expire.elapsed() >= Duration::from_secs(10) {
            last_expire = Instant::now();
            if shared.learning.load(Relaxed) {
                let now = shared.now_ms();
                if let Ok(mut t) = shared.learn.write() {
                    t.expire(now);
                }
            }
        }
    }
    ctx.flush(&shared);
}
