//! The control side of the data path: the [`Engine`] creates and removes the OS objects a
//! configuration change calls for (each port kind through its module in [`crate::ports`]),
//! publishes an immutable [`Snapshot`] of ports and routes for the forwarding threads, and
//! hands the ports' descriptors to the dispatcher threads ([`crate::dispatch`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use socket2::SockAddr;
use tracing::info;
use vnet_control::status::{CryptoStatus, DispatchStatus, LinkState, PortRole, PortStatus};
use vnet_control::{Change, Config, DestKind, Interface, InterfaceKind, Link, LinkKind};
use vnet_core::{
    ForwardingTable, MatrixEntry, PortCounters, PortCountersSnapshot, PortId, PortInfo, PortKind,
    RouteRule,
};
use vnet_offload::VirtioNetHdr;
use vnet_wire::VxlanRepr;

use crate::batch::UdpLinkTx;
use crate::crypto::LinkCrypto;
use crate::dispatch::{DispatcherSet, Source};
use crate::forward::FwdCtx;
use crate::guard::PortGuard;
use crate::ingress::guest::Ingress;
use crate::ingress::packet::PacketReader;
use crate::ingress::tap::TapReader;
use crate::ingress::udp::VxlanReader;
use crate::nic::GuestNic;
use crate::packet::PacketSocket;
use crate::port::Port;
use crate::ports::nic::NicPort;
use crate::ports::tcp::{self, TcpLink, TcpRole};
use crate::shared::{PortEntry, Shared, Snapshot};
use crate::tap::Tap;
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

/// What opening a port gives the engine: how frames leave (`port`), the descriptors the
/// dispatchers read for it, its threads, and how datagrams and connections find it.
struct Opened {
    port: Arc<dyn Port>,
    kind: PortKind,
    counters: Arc<PortCounters>,
    sources: Vec<Arc<Source>>,
    workers: Vec<Worker>,
    udp_peer: Option<IpAddr>,
    tcp_accept_peer: Option<IpAddr>,
}

impl Opened {
    fn new(port: Arc<dyn Port>, kind: PortKind) -> Opened {
        Opened {
            port,
            kind,
            counters: Arc::new(PortCounters::default()),
            sources: vec![],
            workers: vec![],
            udp_peer: None,
            tcp_accept_peer: None,
        }
    }
}

struct PortRuntime {
    id: PortId,
    entry: PortEntry,
    /// Descriptors the dispatchers read (TAP queues, a packet socket).
    sources: Vec<Arc<Source>>,
    /// Threads of the port (TCP links, encrypted links' handshakes); stopped when dropped.
    workers: Vec<Worker>,
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

impl Engine {
    /// Lets the engine create NICs of kinds other than `tap`.
    pub fn set_nic_factory(&mut self, f: Box<dyn NicFactory>) {
        self.nic_factory = Some(f);
    }

    /// Binds the VXLAN socket and starts the dispatchers with default settings.
    pub fn new(udp_bind: SocketAddr) -> io::Result<Engine> {
        let udp = Arc::new(VxlanSocket::bind(udp_bind)?);
        info!(addr = %udp.local_addr(), gro = udp.gro_enabled(), "VXLAN socket bound");
        let shared = Arc::new(Shared::new(udp.clone()));
        let mut dispatchers = DispatcherSet::new(shared.clone(), Default::default())?;
        dispatchers.add(Arc::new(Source::new(Box::new(VxlanReader {
            sock: udp.clone(),
        }))));
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
                    rt.entry.port.configure(new);
                }
                self.dispatchers
                    .configure(new.clone())
                    .map_err(EngineError::Dispatchers)
            }
        }
    }

    /// Opens the interface's port by its kind (the registration of interface kinds).
    fn add_interface(&mut self, i: &Interface) -> Result<(), EngineError> {
        let id = PortId(self.next_id);
        let opened = match i.kind {
            InterfaceKind::Tap => self.open_tap(i, id),
            InterfaceKind::VhostUser => self.open_external(i, id),
        }
        .map_err(|source| EngineError::Interface {
            name: i.name.clone(),
            source,
        })?;
        self.next_id += 1;
        opened.port.configure(&self.dispatchers.settings());
        info!(name = %i.name, kind = %i.kind, ifname = %i.ifname, mac = %i.mac, vni = i.vni,
              netns = ?i.netns, socket = ?i.socket, queues = i.queues, offload = i.offload,
              "interface added");
        let guard = PortGuard::interface(i.mac, &i.policy());
        self.insert(DestKind::Interface, &i.name, id, i.vni, opened, guard);
        Ok(())
    }

    /// A TAP vnetd reads and writes: one dispatcher source per queue.
    fn open_tap(&self, i: &Interface, id: PortId) -> io::Result<Opened> {
        let tap = Arc::new(Tap::open(i)?);
        let mut o = Opened::new(Arc::new(NicPort(tap.clone())), PortKind::Interface);
        o.sources = (0..tap.queues())
            .map(|queue| {
                Arc::new(Source::new(Box::new(TapReader {
                    tap: tap.clone(),
                    queue,
                    port: id,
                })))
            })
            .collect();
        Ok(o)
    }

    /// A NIC the daemon's factory makes (vhost-user): it has its own thread.
    fn open_external(&self, i: &Interface, id: PortId) -> io::Result<Opened> {
        let Some(factory) = &self.nic_factory else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} interfaces are not available", i.kind),
            ));
        };
        let nic = factory.create(
            i,
            Ingress {
                shared: self.shared.clone(),
                port: id,
            },
        )?;
        Ok(Opened::new(Arc::new(NicPort(nic)), PortKind::Interface))
    }

    /// Opens the link's port by its kind (the registration of link kinds).
    fn add_link(&mut self, l: &Link) -> Result<(), EngineError> {
        let id = PortId(self.next_id);
        let err = |source| EngineError::Link {
            name: l.name.clone(),
            source,
        };
        let opened = match &l.kind {
            LinkKind::Udp(to) => self.open_udp(l, *to)?,
            LinkKind::TcpDial(addr) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Dial(*addr))
                        .map_err(err)?;
                let mut o = Opened::new(link, PortKind::OverlayLink);
                o.workers.push(w);
                o
            }
            LinkKind::TcpAccept(ip) => {
                let (link, w) =
                    TcpLink::start(self.shared.clone(), id, l.vni, TcpRole::Accept).map_err(err)?;
                let mut o = Opened::new(link, PortKind::OverlayLink);
                o.workers.push(w);
                o.tcp_accept_peer = Some(ip.to_canonical());
                o
            }
            LinkKind::Direct(dev) => {
                let sock = Arc::new(PacketSocket::open(dev).map_err(err)?);
                let mut o = Opened::new(sock.clone(), PortKind::DirectLink);
                o.sources.push(Arc::new(Source::new(Box::new(PacketReader {
                    sock,
                    port: id,
                }))));
                o
            }
        };
        self.next_id += 1;
        info!(name = %l.name, kind = %l.kind, vni = l.vni,
              encrypted = opened.port.as_udp().map(|u| u.crypto.is_some()).unwrap_or(false),
              "link added");
        // The rate, if any, comes with the Policy change that follows AddLink.
        let guard = PortGuard::link(&Default::default());
        self.insert(DestKind::Link, &l.name, id, l.vni, opened, guard);
        Ok(())
    }

    /// A udp link: datagrams on the shared VXLAN socket, sealed when it is encrypted.
    fn open_udp(&self, l: &Link, to: SocketAddr) -> Result<Opened, EngineError> {
        let local_v6 = self.udp.local_addr().is_ipv6();
        if to.is_ipv6() && !local_v6 {
            return Err(EngineError::Unsupported {
                name: l.name.clone(),
                why: format!(
                    "{to} is IPv6 but the UDP socket is bound to IPv4 (start vnetd with --bind ::)"
                ),
            });
        }
        let to_sa = match (local_v6, to) {
            (true, SocketAddr::V4(v4)) => {
                SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            _ => to,
        };
        let counters = Arc::new(PortCounters::default());
        let mut workers = Vec::new();
        let crypto = match l.encrypt {
            None => None,
            Some(peer_key) => {
                let Some(key) = self.static_key.clone() else {
                    return Err(EngineError::Unsupported {
                        name: l.name.clone(),
                        why:
                            "an encrypted link needs this host's key (start vnetd with --key-file)"
                                .into(),
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
                workers.push(c.start_timer().map_err(|source| EngineError::Link {
                    name: l.name.clone(),
                    source,
                })?);
                Some(c)
            }
        };
        let tx = UdpLinkTx {
            sock: self.udp.clone(),
            to: SockAddr::from(to_sa),
            header: VxlanRepr { vni: l.vni }.header(),
            gso_refused: AtomicUsize::new(usize::MAX),
            crypto,
            counters: counters.clone(),
        };
        let mut o = Opened::new(Arc::new(tx), PortKind::OverlayLink);
        o.counters = counters;
        o.workers = workers;
        o.udp_peer = Some(to.ip().to_canonical());
        Ok(o)
    }

    fn insert(
        &mut self,
        kind: DestKind,
        name: &str,
        id: PortId,
        vni: u32,
        o: Opened,
        guard: PortGuard,
    ) {
        self.ports.insert(
            (kind, name.to_string()),
            PortRuntime {
                id,
                entry: PortEntry {
                    info: PortInfo { vni, kind: o.kind },
                    port: o.port,
                    counters: o.counters,
                    guard: Arc::new(guard),
                },
                sources: o.sources,
                workers: o.workers,
                udp_peer: o.udp_peer,
                tcp_accept_peer: o.tcp_accept_peer,
            },
        );
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
        tcp_accept.retain(|_, p| *p != rt.id);
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
            if let Some(ip) = rt.tcp_accept_peer {
                snap.tcp_accept.insert((ip, rt.entry.info.vni), rt.id);
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
            nic: rt.entry.port.nic_status(),
            policy: rt.entry.guard.status(),
        })
    }

    /// Whether a link can carry frames now (TCP: connected; encrypted: a session); other
    /// links are connectionless and always up.
    pub fn link_state(&self, name: &str) -> LinkState {
        match self.ports.get(&(DestKind::Link, name.to_string())) {
            Some(rt) => rt.entry.port.state(),
            None => LinkState::Down,
        }
    }

    /// An encrypted link's session state and counters; `None` for other links.
    pub fn link_crypto(&self, name: &str) -> Option<CryptoStatus> {
        let rt = self.ports.get(&(DestKind::Link, name.to_string()))?;
        rt.entry
            .port
            .as_udp()
            .and_then(|u| u.crypto.as_ref())
            .map(|c| c.status())
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

#[cfg(test)]
mod tests {
    //! The control side without root: links and routes need no devices.
    use super::*;
    use vnet_control::status::LinkState;
    use vnet_control::Command;

    fn apply_script(e: &mut Engine, cfg: &mut Config, script: &str) {
        let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
        for (_, cmd) in vnet_control::parse_script(script).expect("script") {
            for ch in cfg.apply(&cmd, &mut gen).expect("valid") {
                e.apply(&ch).expect("engine");
            }
        }
        e.rebuild(cfg);
    }

    #[test]
    fn links_and_routes_reach_the_snapshot_and_go_again() {
        let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
        let mut cfg = Config::default();
        apply_script(
            &mut e,
            &mut cfg,
            "link add b udp 127.0.0.1:4799 vni 7\nlink add c tcp 127.0.0.1:1 vni 7\n\
             route add any 52:54:00:00:00:09 link b\n",
        );
        let snap = e.shared.snapshot.load_full();
        assert_eq!(snap.ports.len(), 2);
        assert_eq!(snap.udp_peers.len(), 1);
        assert!(snap
            .udp_ips
            .contains(&"127.0.0.1".parse::<IpAddr>().unwrap()));
        assert_eq!(e.link_state("b"), LinkState::Up);
        assert_ne!(e.link_state("c"), LinkState::Up, "nobody listens on port 1");
        assert_eq!(e.link_state("nope"), LinkState::Down);
        let st = e.port_status(DestKind::Link, "b").expect("status");
        assert_eq!((st.vni, st.kind), (7, PortRole::Link));
        assert!(e.link_crypto("b").is_none());
        assert!(!e.inject_from_interface("nope", &[]));
        let gen = snap.table.generation();
        // Removing a link takes it out of the snapshot at once, and its peer with it.
        let del = Command::LinkDel("b".into());
        let mut g = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
        for ch in cfg.apply(&del, &mut g).expect("valid") {
            e.apply(&ch).expect("engine");
        }
        e.rebuild(&cfg);
        let snap = e.shared.snapshot.load_full();
        assert_eq!(snap.ports.len(), 1);
        assert!(snap.udp_peers.is_empty());
        assert!(snap.table.generation() > gen);
        e.shutdown();
        assert!(e.shared.snapshot.load().ports.is_empty());
    }

    #[test]
    fn an_encrypted_link_needs_a_key() {
        let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
        let mut cfg = Config::default();
        let key = vnet_crypto::PrivateKey::generate().expect("key").public();
        let cmd = vnet_control::parse_line(&format!("link add s udp 127.0.0.1 encrypt {key}"))
            .expect("parse")
            .expect("a command");
        let mut g = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
        let ch = cfg.apply(&cmd, &mut g).expect("valid");
        assert!(matches!(
            e.apply(&ch[0]),
            Err(EngineError::Unsupported { .. })
        ));
    }
}
