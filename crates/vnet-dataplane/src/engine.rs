//! The forwarding engine: owns the live ports, publishes an immutable [`Snapshot`] of them and
//! of the route table for the forwarding threads, and hands the ports' descriptors to the
//! dispatcher threads ([`crate::dispatch`]) that move the frames ([`crate::forward`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use socket2::SockAddr;
use tracing::info;
use vnet_control::status::{CryptoStatus, DispatchStatus, LinkState, PortRole, PortStatus};
use vnet_control::{
    Change, Config, DataPathSettings, DestKind, Interface, InterfaceKind, Link, LinkKind,
};
use vnet_core::{
    Decision, FastMap, FastSet, ForwardingTable, LearnTable, MatrixEntry, PortCounters,
    PortCountersSnapshot, PortId, PortInfo, PortKind, RouteRule, TrafficMatrix,
};
use vnet_offload::VirtioNetHdr;
use vnet_wire::{MacAddr, VxlanRepr, VXLAN_HEADER_LEN};

use crate::crypto::LinkCrypto;
use crate::dispatch::{DispatcherSet, Source, SourceKind};
use crate::forward::{process, FwdCtx, OffloadCounters, Origin, TxBatch};
use crate::guard::PortGuard;
use crate::nic::GuestNic;
use crate::packet::PacketSocket;
use crate::tap::Tap;
use crate::tcp::{self, TcpLink, TcpRole};
use crate::udp::VxlanSocket;
use crate::worker::Worker;

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
    #[error("dispatchers: {0}")]
    Dispatchers(io::Error),
}

/// How a frame leaves through a port.
pub enum PortTx {
    /// A guest's NIC: a TAP, or a vhost-user device.
    Nic(Arc<dyn GuestNic>),
    Udp(UdpLinkTx),
    Tcp(Arc<TcpLink>),
    Direct(Arc<PacketSocket>),
}

/// A UDP link a vhost-user interface receives from directly (see [`Ingress::direct_links`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectLink {
    pub port: PortId,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub vni: u32,
}

/// The sending side of a udp link.
pub struct UdpLinkTx {
    pub sock: Arc<VxlanSocket>,
    pub to: SockAddr,
    pub header: [u8; VXLAN_HEADER_LEN],
    /// Smallest datagram size the kernel refused to segment (larger than the path MTU);
    /// runs of that size or more go one datagram at a time.
    pub gso_refused: AtomicUsize,
    /// Set for an encrypted link: datagrams are sealed, handshakes run.
    pub crypto: Option<Arc<LinkCrypto>>,
    /// The link's port counters (for drops found only when the batch is sent).
    pub counters: Arc<PortCounters>,
}

/// What the forwarding threads know of a port.
#[derive(Clone)]
pub struct PortEntry {
    pub info: PortInfo,
    pub tx: Arc<PortTx>,
    pub counters: Arc<PortCounters>,
    /// Source-MAC and rate policy on what enters through the port.
    pub guard: Arc<PortGuard>,
}

/// An immutable view of the ports and routes, swapped whole on every change.
pub struct Snapshot {
    pub table: ForwardingTable,
    pub ports: FastMap<PortId, PortEntry>,
    pub udp_peers: FastMap<(IpAddr, u32), PortId>,
    pub udp_ips: FastSet<IpAddr>,
    pub tcp_accept: FastMap<(IpAddr, u32), Arc<TcpLink>>,
    pub udp: Arc<VxlanSocket>,
}

impl Snapshot {
    /// Tells every guest NIC that a forwarding batch ended (its notification decision).
    pub fn end_of_burst(&self) {
        for p in self.ports.values() {
            if let PortTx::Nic(n) = &*p.tx {
                n.end_of_burst();
            }
        }
    }

    /// Counts a frame read on `port` that never reached forwarding.
    pub fn count_rx_drop(&self, port: PortId, len: usize, reason: vnet_core::DropReason) {
        if let Some(p) = self.ports.get(&port) {
            p.counters.rx(len);
            p.counters.count_drop(reason);
        }
    }

    fn empty(udp: Arc<VxlanSocket>) -> Snapshot {
        Snapshot {
            table: ForwardingTable::default(),
            ports: FastMap::default(),
            udp_peers: FastMap::default(),
            udp_ips: FastSet::default(),
            tcp_accept: FastMap::default(),
            udp,
        }
    }
}

/// State shared by the engine and every forwarding thread.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    learning: AtomicBool,
    learn: RwLock<LearnTable>,
    pub(crate) matrix: Mutex<TrafficMatrix>,
    /// Counters for traffic that belongs to no port (unknown peers, bad greetings, ...).
    pub daemon: PortCounters,
    pub offload: OffloadCounters,
    epoch: Instant,
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

    /// With learning on: records where `src` was seen and returns the learning generation
    /// (for route caches); `None` when learning is off.
    pub(crate) fn learn_observe(&self, vni: u32, src: MacAddr, port: PortId) -> Option<u64> {
        if !self.learning.load(Relaxed) {
            return None;
        }
        let now = self.now_ms();
        let fresh = self
            .learn
            .read()
            .map(|t| t.is_current(vni, src, port, now))
            .unwrap_or(true);
        if !fresh && src.is_unicast() {
            if let Ok(mut t) = self.learn.write() {
                t.observe(vni, src, port, now);
            }
        }
        Some(self.learn.read().map(|t| t.generation()).unwrap_or(0))
    }

    pub(crate) fn learned(&self, vni: u32, mac: MacAddr) -> Option<PortId> {
        self.learn
            .read()
            .ok()
            .and_then(|t| t.lookup(vni, mac, self.now_ms()))
    }

    /// Drops learned MACs not seen for a while (called now and then by a dispatcher).
    pub(crate) fn expire_learned(&self) {
        if self.learning.load(Relaxed) {
            let now = self.now_ms();
            if let Ok(mut t) = self.learn.write() {
                t.expire(now);
            }
        }
    }
}

struct PortRuntime {
    id: PortId,
    entry: PortEntry,
    /// Descriptors the dispatchers read (TAP queues, a packet socket).
    sources: Vec<Arc<Source>>,
    /// Threads of TCP links; stopped when dropped.
    workers: Vec<Worker>,
    tcp: Option<Arc<TcpLink>>,
    udp_peer: Option<IpAddr>,
    tcp_accept_peer: Option<IpAddr>,
}

/// The live data path of one daemon.
pub struct Engine {
    shared: Arc<Shared>,
    udp: Arc<VxlanSocket>,
    ports: HashMap<(DestKind, String), PortRuntime>,
    listeners: HashMap<SocketAddr, Worker>,
    dispatchers: DispatcherSet,
    next_id: u32,
    generation: u64,
    /// Makes the guest NICs that are not TAPs (vhost-user), when the daemon provides one.
    nic_factory: Option<Box<dyn NicFactory>>,
    /// This host's static key, for encrypted links (`vnetd --key-file`).
    static_key: Option<vnet_crypto::PrivateKey>,
}

/// Creates guest NICs of kinds this crate does not implement itself (vhost-user, in
/// `vnet-vhost`). The NIC feeds its guest's frames into the overlay through `ingress`.
pub trait NicFactory: Send + Sync {
    fn create(&self, iface: &Interface, ingress: Ingress) -> io::Result<Arc<dyn GuestNic>>;
}

/// How a NIC that is not read by the dispatchers (vhost-user) hands its guest's frames to the
/// overlay, on its own thread.
#[derive(Clone)]
pub struct Ingress {
    shared: Arc<Shared>,
    port: PortId,
}

impl Ingress {
    /// Forwards frames the guest sent, each with its virtio-net header, as one batch. A
    /// partial checksum of an ordinary frame is completed in place first.
    pub fn forward(&self, ctx: &mut FwdCtx, frames: &mut [(VirtioNetHdr, Vec<u8>)]) {
        let snap = self.shared.snapshot.load_full();
        let mut ready: Vec<(VirtioNetHdr, &[u8])> = Vec::with_capacity(frames.len());
        for (vh, f) in frames.iter_mut() {
            if vh.gso_kind() == VirtioNetHdr::GSO_NONE && vh.needs_csum() {
                match vnet_offload::complete_checksum(f, vh) {
                    Ok(()) => vh.flags = VirtioNetHdr::F_DATA_VALID,
                    Err(_) => {
                        snap.count_rx_drop(self.port, f.len(), vnet_core::DropReason::BadOffload);
                        continue;
                    }
                }
            }
            ready.push((*vh, &f[..]));
        }
        self.forward_slices(ctx, &ready);
    }

    /// Forwards frames that may live in guest memory (vhost-user cut-through): nothing here
    /// writes to them. A partial checksum (`NEEDS_CSUM`) is completed where the frame leaves
    /// (in a copy of its headers), or handed on to a guest that takes partial checksums.
    pub fn forward_slices(&self, ctx: &mut FwdCtx, frames: &[(VirtioNetHdr, &[u8])]) {
        let snap = self.shared.snapshot.load_full();
        let mut batch = TxBatch::default();
        for (vh, f) in frames {
            if !f.is_empty() {
                process(
                    &self.shared,
                    &snap,
                    ctx,
                    self.port,
                    *vh,
                    f,
                    Origin::Local,
                    &mut batch,
                );
            }
        }
        batch.flush(&self.shared, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
    }

    /// The snapshot generation: it changes whenever ports or routes do.
    pub fn generation(&self) -> u64 {
        self.shared.snapshot.load().table.generation()
    }

    /// The UDP links this interface may receive from directly (vhost-user cut-through):
    /// those of its VNI, when it is the only interface in that VNI and learning is off, so
    /// that every frame from such a link is either for it or not for this host at all.
    pub fn direct_links(&self) -> Vec<DirectLink> {
        let snap = self.shared.snapshot.load();
        if self.shared.learning.load(Relaxed) {
            return vec![];
        }
        let Some(me) = snap.ports.get(&self.port) else {
            return vec![];
        };
        let vni = me.info.vni;
        let others = snap.ports.iter().any(|(id, p)| {
            *id != self.port && p.info.vni == vni && p.info.kind != PortKind::OverlayLink
        });
        if others {
            return vec![];
        }
        let local = snap.udp.local_addr();
        // Encrypted links never take the cut-through path (it reads plaintext VXLAN straight
        // into the guest), nor does any link to a peer address an encrypted link shares: the
        // connected socket would take that link's datagrams too.
        let encrypted_peers: Vec<Option<SocketAddr>> = snap
            .ports
            .values()
            .filter_map(|p| match &*p.tx {
                PortTx::Udp(l) if l.crypto.is_some() => Some(l.to.as_socket()),
                _ => None,
            })
            .collect();
        snap.ports
            .iter()
            .filter(|(_, p)| p.info.vni == vni)
            .filter_map(|(id, p)| match &*p.tx {
                PortTx::Udp(l) if l.crypto.is_some() => None,
                PortTx::Udp(l) if encrypted_peers.contains(&l.to.as_socket()) => None,
                PortTx::Udp(l) => l.to.as_socket().map(|peer| DirectLink {
                    port: *id,
                    peer,
                    local,
                    vni,
                }),
                _ => None,
            })
            .collect()
    }

    /// A frame that arrived on `link` straight into this interface's guest buffers: true
    /// (and counted on both ports and in the traffic matrix) when the route table sends it
    /// to this interface alone; false when it must take the ordinary path
    /// ([`Self::forward_from`]).
    pub fn accept_direct(
        &self,
        ctx: &mut FwdCtx,
        link: PortId,
        dst: MacAddr,
        src: MacAddr,
        len: usize,
    ) -> bool {
        let snap = self.shared.snapshot.load();
        // A rate-limited link's frames take the ordinary path, where the limit applies.
        match snap.ports.get(&link) {
            Some(l) if !l.guard.is_limited() => {}
            _ => return false,
        }
        let ok = matches!(
            snap.table.decide(link, src, dst, false, None),
            Decision::Forward(t) if t.len() == 1 && t[0] == self.port
        );
        if ok {
            if let (Some(l), Some(me)) = (snap.ports.get(&link), snap.ports.get(&self.port)) {
                l.counters.rx(len);
                me.counters.tx(len);
                ctx.record(me.info.vni, src, dst, len);
            }
        }
        ok
    }

    /// Frames that arrived on `link` but are not for this interface alone: the ordinary path.
    pub fn forward_from(&self, ctx: &mut FwdCtx, link: PortId, frames: &[Vec<u8>]) {
        let snap = self.shared.snapshot.load_full();
        let mut batch = TxBatch::default();
        for f in frames {
            process(
                &self.shared,
                &snap,
                ctx,
                link,
                VirtioNetHdr::default(),
                f,
                Origin::Local,
                &mut batch,
            );
        }
        batch.flush(&self.shared, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
    }

    /// Counts a frame from the guest that never became a frame (a bad descriptor chain).
    pub fn count_drop(&self, reason: vnet_core::DropReason) {
        if let Some(c) = self.shared.port_counters(self.port) {
            c.rx(0);
            c.count_drop(reason);
        }
    }

    /// Counts a datagram received on `link` that was dropped before forwarding.
    pub fn count_link_drop(&self, link: PortId, len: usize, reason: vnet_core::DropReason) {
        if let Some(c) = self.shared.port_counters(link) {
            c.rx(len);
            c.count_drop(reason);
        }
    }
}

impl Engine {
    /// Lets the engine create NICs of kinds other than `tap`.
    pub fn set_nic_factory(&mut self, f: Box<dyn NicFactory>) {
        self.nic_factory = Some(f);
    }

    /// Binds the VXLAN socket and starts the dispatchers with default settings.
    pub fn new(udp_bind: SocketAddr) -> io::Result<Engine> {
        let udp = Arc::new(VxlanSocket::bind(udp_bind)?);
        info!(addr = %udp.local_addr(), gro = udp.gro_enabled(), "VXLAN socket bound");
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::empty(udp.clone())),
            learning: AtomicBool::new(false),
            learn: RwLock::new(LearnTable::default()),
            matrix: Mutex::new(TrafficMatrix::default()),
            daemon: PortCounters::default(),
            offload: OffloadCounters::default(),
            epoch: Instant::now(),
        });
        let mut dispatchers = DispatcherSet::new(shared.clone(), DataPathSettings::default())?;
        dispatchers.add(Arc::new(Source::new(None, SourceKind::Udp(udp.clone()))));
        Ok(Engine {
            shared,
            udp,
            ports: HashMap::new(),
            listeners: HashMap::new(),
            dispatchers,
            next_id: 1,
            generation: 0,
            nic_factory: None,
            static_key: None,
        })
    }

    /// Sets this host's static key; encrypted links need one.
    pub fn set_static_key(&mut self, key: vnet_crypto::PrivateKey) {
        self.static_key = Some(key);
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
            Change::Policy {
                kind, name, new, ..
            } => {
                // A port that failed to come up has no guard to change: nothing to do.
                if let Some(rt) = self.ports.get(&(*kind, name.clone())) {
                    rt.entry.guard.set(new);
                    info!(kind = %kind, name = %name, any_source = new.any_source,
                          rate = ?new.rate, "policy changed");
                }
                Ok(())
            }
            Change::Learn(on) => {
                self.shared.learning.store(*on, Relaxed);
                if let Ok(mut t) = self.shared.learn.write() {
                    t.clear();
                }
                Ok(())
            }
            Change::Settings { new, .. } => {
                for rt in self.ports.values() {
                    if let PortTx::Nic(n) = &*rt.entry.tx {
                        n.configure(new);
                    }
                }
                self.dispatchers
                    .configure(new.clone())
                    .map_err(EngineError::Dispatchers)
            }
        }
    }

    fn add_interface(&mut self, i: &Interface) -> Result<(), EngineError> {
        let err = |source| EngineError::Interface {
            name: i.name.clone(),
            source,
        };
        if i.kind != InterfaceKind::Tap {
            return self.add_external_interface(i);
        }
        let tap = Arc::new(Tap::open(i).map_err(err)?);
        let id = self.alloc_id();
        let entry = PortEntry {
            info: PortInfo {
                vni: i.vni,
                kind: PortKind::Interface,
            },
            tx: Arc::new(PortTx::Nic(tap.clone())),
            counters: Arc::new(PortCounters::default()),
            guard: Arc::new(PortGuard::interface(i.mac, &i.policy())),
        };
        let sources: Vec<Arc<Source>> = (0..tap.queues())
            .map(|q| {
                Arc::new(Source::new(
                    Some(id),
                    SourceKind::Tap {
                        tap: tap.clone(),
                        queue: q,
                    },
                ))
            })
            .collect();
        info!(name = %i.name, ifname = %i.ifname, mac = %i.mac, vni = i.vni, netns = ?i.netns,
              queues = i.queues, offload = i.offload, "interface added");
        self.ports.insert(
            (DestKind::Interface, i.name.clone()),
            PortRuntime {
                id,
                entry,
                sources,
                workers: vec![],
                tcp: None,
                udp_peer: None,
                tcp_accept_peer: None,
            },
        );
        Ok(())
    }

    fn add_external_interface(&mut self, i: &Interface) -> Result<(), EngineError> {
        let err = |source| EngineError::Interface {
            name: i.name.clone(),
            source,
        };
        let Some(factory) = &self.nic_factory else {
            return Err(err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} interfaces are not available", i.kind),
            )));
        };
        let id = PortId(self.next_id);
        let nic = factory
            .create(
                i,
                Ingress {
                    shared: self.shared.clone(),
                    port: id,
                },
            )
            .map_err(err)?;
        nic.configure(&self.dispatchers.settings());
        self.next_id += 1;
        info!(name = %i.name, kind = %i.kind, socket = ?i.socket, mac = %i.mac, vni = i.vni, "interface added");
        self.ports.insert(
            (DestKind::Interface, i.name.clone()),
            PortRuntime {
                id,
                entry: PortEntry {
                    info: PortInfo {
                        vni: i.vni,
                        kind: PortKind::Interface,
                    },
                    tx: Arc::new(PortTx::Nic(nic)),
                    counters: Arc::new(PortCounters::default()),
                    guard: Arc::new(PortGuard::interface(i.mac, &i.policy())),
                },
                sources: vec![],
                workers: vec![],
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
        let mut kind = PortKind::OverlayLink;
        let mut sources = Vec::new();
        let mut workers = Vec::new();
        let (mut tcp, mut udp_peer, mut tcp_accept_peer) = (None, None, None);
        let counters = Arc::new(PortCounters::default());
        let mut crypto = None;
        let tx = match &l.kind {
            LinkKind::Udp(to) => {
                let local_v6 = self.udp.local_addr().is_ipv6();
                if to.is_ipv6() && !local_v6 {
                    return Err(EngineError::Unsupported {
                        name: l.name.clone(),
                        why: format!("{to} is IPv6 but the UDP socket is bound to IPv4 (start vnetd with --bind ::)"),
                    });
                }
                let to_sa = match (local_v6, to) {
                    (true, SocketAddr::V4(v4)) => {
                        SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
                    }
                    _ => *to,
                };
                udp_peer = Some(to.ip().to_canonical());
                if let Some(peer_key) = l.encrypt {
                    let Some(key) = self.static_key.clone() else {
                        return Err(EngineError::Unsupported {
                            name: l.name.clone(),
                            why: "an encrypted link needs this host's key (start vnetd with --key-file)".into(),
                        });
                    };
                    let c = Arc::new(LinkCrypto::new(
                        &l.name,
                        key,
                        peer_key,
                        l.vni,
                        self.udp.clone(),
                        SockAddr::from(to_sa),
                    ));
                    workers.push(c.start_timer().map_err(err)?);
                    crypto = Some(c);
                }
                PortTx::Udp(UdpLinkTx {
                    sock: self.udp.clone(),
                    to: SockAddr::from(to_sa),
                    header: VxlanRepr { vni: l.vni }.header(),
                    gso_refused: AtomicUsize::new(usize::MAX),
                    crypto: crypto.clone(),
                    counters: counters.clone(),
                })
            }
            LinkKind::TcpDial(addr) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Dial(*addr))
                        .map_err(err)?;
                tcp = Some(link.clone());
                workers.push(w);
                PortTx::Tcp(link)
            }
            LinkKind::TcpAccept(ip) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Accept).map_err(err)?;
                tcp = Some(link.clone());
                workers.push(w);
                tcp_accept_peer = Some(ip.to_canonical());
                PortTx::Tcp(link)
            }
            LinkKind::Direct(dev) => {
                let sock = Arc::new(PacketSocket::open(dev).map_err(err)?);
                kind = PortKind::DirectLink;
                sources.push(Arc::new(Source::new(
                    Some(id),
                    SourceKind::Direct(sock.clone()),
                )));
                PortTx::Direct(sock)
            }
        };
        info!(name = %l.name, kind = %l.kind, vni = l.vni, encrypted = crypto.is_some(), "link added");
        self.ports.insert(
            (DestKind::Link, l.name.clone()),
            PortRuntime {
                id,
                entry: PortEntry {
                    info: PortInfo { vni: l.vni, kind },
                    tx: Arc::new(tx),
                    counters,
                    // The rate, if any, comes with the Policy change that follows AddLink.
                    guard: Arc::new(PortGuard::link(&Default::default())),
                },
                sources,
                workers,
                tcp,
                udp_peer,
                tcp_accept_peer,
            },
        );
        Ok(())
    }

    fn remove_port(&mut self, kind: DestKind, name: &str) {
        let Some(mut rt) = self.ports.remove(&(kind, name.to_string())) else {
            return;
        };
        // Stop reading the port first (the dispatchers confirm), then publish a table without
        // it so no thread sends to it, then close it.
        for s in &rt.sources {
            self.dispatchers.remove(s);
        }
        let old = self.shared.snapshot.load_full();
        let mut ports = old.ports.clone();
        ports.remove(&rt.id);
        let mut udp_peers = old.udp_peers.clone();
        udp_peers.retain(|_, p| *p != rt.id);
        let mut tcp_accept = old.tcp_accept.clone();
        tcp_accept.retain(|_, l| rt.tcp.as_ref().map(|t| !Arc::ptr_eq(t, l)).unwrap_or(true));
        self.shared.snapshot.store(Arc::new(Snapshot {
            table: old.table.clone(),
            ports,
            udp_peers,
            udp_ips: old.udp_ips.clone(),
            tcp_accept,
            udp: self.udp.clone(),
        }));
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

    /// Publishes a new forwarding table for `cfg` (ports that exist, and the routes to them),
    /// and starts reading ports the dispatchers do not read yet.
    pub fn rebuild(&mut self, cfg: &Config) {
        self.generation += 1;
        let mut snap = Snapshot::empty(self.udp.clone());
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
        for rt in self.ports.values() {
            for s in &rt.sources {
                if !self.dispatchers.contains(s) {
                    self.dispatchers.add(s.clone());
                }
            }
        }
    }

    /// Counters of one port.
    pub fn port_status(&self, kind: DestKind, name: &str) -> Option<PortStatus> {
        let rt = self.ports.get(&(kind, name.to_string()))?;
        Some(PortStatus {
            kind: match kind {
                DestKind::Interface => PortRole::Interface,
                DestKind::Link => PortRole::Link,
            },
            name: name.to_string(),
            vni: rt.entry.info.vni,
            counters: rt.entry.counters.snapshot(),
            nic: match &*rt.entry.tx {
                PortTx::Nic(n) => n.stats(),
                _ => None,
            },
            policy: rt.entry.guard.status(),
        })
    }

    /// Whether a link can carry frames now (TCP: connected; encrypted: a session); other
    /// links are connectionless and always up.
    pub fn link_state(&self, name: &str) -> LinkState {
        match self.ports.get(&(DestKind::Link, name.to_string())) {
            Some(rt) => match &*rt.entry.tx {
                PortTx::Udp(UdpLinkTx {
                    crypto: Some(c), ..
                }) if !c.established() => LinkState::Connecting,
                _ => rt.tcp.as_ref().map(|t| t.state()).unwrap_or(LinkState::Up),
            },
            None => LinkState::Down,
        }
    }

    /// An encrypted link's session state and counters; `None` for other links.
    pub fn link_crypto(&self, name: &str) -> Option<CryptoStatus> {
        let rt = self.ports.get(&(DestKind::Link, name.to_string()))?;
        match &*rt.entry.tx {
            PortTx::Udp(UdpLinkTx {
                crypto: Some(c), ..
            }) => Some(c.status()),
            _ => None,
        }
    }

    pub fn daemon_counters(&self) -> PortCountersSnapshot {
        self.shared.daemon.snapshot()
    }

    /// The dispatchers' modes and counters, and the offload counters.
    pub fn dispatch_status(&self) -> DispatchStatus {
        DispatchStatus {
            settings: self.dispatchers.settings(),
            dispatchers: self.dispatchers.status(),
            offload: self.shared.offload.snapshot(),
            udp_gso: self.udp.gso_enabled(),
            udp_gro: self.udp.gro_enabled(),
        }
    }

    /// Forwards frames as if the guest behind interface `name` had sent them (the gratuitous
    /// RARP/ARP a host sends after a migration). False when there is no such interface.
    pub fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        let Some(rt) = self.ports.get(&(DestKind::Interface, name.to_string())) else {
            return false;
        };
        let ingress = Ingress {
            shared: self.shared.clone(),
            port: rt.id,
        };
        let mut batch: Vec<(VirtioNetHdr, Vec<u8>)> = frames
            .iter()
            .map(|f| (VirtioNetHdr::default(), f.clone()))
            .collect();
        ingress.forward(&mut FwdCtx::new(), &mut batch);
        true
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
        self.dispatchers.stop();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
