//! The control side of the data path: the [`Engine`] creates and removes the OS objects a
//! configuration change calls for (each port kind through its module in [`crate::ports`]),
//! publishes an immutable [`Snapshot`] of ports and routes for the forwarding threads, and
//! hands the ports' descriptors to the dispatcher threads ([`crate::dispatch`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tracing::{info, warn};
use vnet_control::status::{
    CryptoStatus, DataPathKind, DispatchStatus, KernelPathStatus, KernelPortStatus, LinkState,
    PortRole, PortStatus,
};
use vnet_control::{
    Change, Config, DestKind, FastPathMode, Interface, InterfaceKind, Link, LinkKind, RouteChange,
};
use vnet_core::{
    FastMap, FastSet, ForwardingTable, MacMatch, MatrixEntry, PortCountersSnapshot, PortId,
    PortInfo, PortKind, RouteRule,
};
use vnet_fastpath::{FastPathConfig, Touched};
use vnet_offload::VirtioNetHdr;

use crate::dispatch::DispatcherSet;
use crate::forward::FwdCtx;
use crate::guard::PortGuard;
use crate::ingress::guest::Ingress;
use crate::ingress::udp::VxlanReader;
use crate::ingress::Source;
use crate::kernel::KernelPath;
use crate::made::{Made, MadeDevice};
use crate::nic::GuestNic;
use crate::ports::nic::NicPort;
use crate::ports::tcp;
use crate::ports::{self, OpenError, Opened};
use crate::reach::LinkPath;
use crate::shared::{PortEntry, Shared, Snapshot};
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
    #[error("set cpus: {0}")]
    Cpus(#[from] crate::dispatch::CpuError),
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
    /// A reach link: its peer's probe key and its configured address (socket form).
    reach: Option<(vnet_crypto::PublicKey, SocketAddr)>,
    /// Whether the kernel fast path serves it.
    kernel: bool,
    /// Devices vnetd made for the port, removed when it goes for good.
    owned: Vec<Box<dyn Made>>,
}

/// What happens to the devices vnetd made when a port goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// They stay: vnetd stops and the next one adopts them.
    Keep,
    /// They go: the port is deleted, or everything is torn down.
    Remove,
}

/// The live data path of one daemon.
pub struct Engine {
    shared: Arc<Shared>,
    udp: Arc<VxlanSocket>,
    /// The VXLAN port's second socket, which sets DF: reach links and their probes send on it.
    udp_df: Arc<VxlanSocket>,
    ports: HashMap<(DestKind, String), PortRuntime>,
    listeners: HashMap<SocketAddr, Worker>,
    dispatchers: DispatcherSet,
    next_id: u32,
    generation: u64,
    /// Makes the guest NICs that are not TAPs (vhost-user), when the daemon provides one.
    nic_factory: Option<Box<dyn NicFactory>>,
    /// This host's static key, for encrypted links (`vnetd --key-file`).
    static_key: Option<vnet_crypto::PrivateKey>,
    /// The kernel fast path, when loaded.
    kernel: Option<KernelPath>,
    /// The forwarding table with the route changes not yet published
    /// ([`Engine::publish_routes`]), and the destinations they touched.
    pending: Option<ForwardingTable>,
    touched: Vec<Touched>,
    /// Where reach says each peer's links go (by the peer's probe key).
    reach_paths: HashMap<vnet_crypto::PublicKey, ReachPath>,
}

/// Where reach says a peer's links go now (vnetd's reach thread decides; `vnet-reach`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReachPath {
    /// Straight to this endpoint of the peer.
    pub direct: Option<SocketAddr>,
    /// Else through the relay at this endpoint, the header naming the peer by its tag. With
    /// neither, the links send to their configured address.
    pub relay: Option<SocketAddr>,
    /// Datagrams from these endpoints are the peer's.
    pub accept: Vec<SocketAddr>,
    /// The path's MTU (the largest outer IP packet), when known: a guest's frame that does
    /// not fit is not sent, and its sender is told.
    pub mtu: Option<usize>,
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
        let udp_df = Arc::new(VxlanSocket::bind_df(&udp)?);
        info!(addr = %udp.local_addr(), gro = udp.gro_enabled(), "VXLAN socket bound");
        let shared = Arc::new(Shared::new(udp.clone()));
        let mut dispatchers = DispatcherSet::new(shared.clone(), Default::default())?;
        for sock in [&udp, &udp_df] {
            dispatchers.add(Arc::new(Source::new(Box::new(VxlanReader {
                sock: sock.clone(),
            }))));
        }
        Ok(Engine {
            shared,
            udp,
            udp_df,
            ports: HashMap::new(),
            listeners: HashMap::new(),
            dispatchers,
            next_id: 1,
            generation: 0,
            nic_factory: None,
            static_key: None,
            kernel: None,
            pending: None,
            touched: Vec::new(),
            reach_paths: HashMap::new(),
        })
    }

    /// The shared state of the forwarding threads (vnetd's reach thread takes its inbox and
    /// sets the relay table there).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The VXLAN port's socket that sets DF (reach's pings and pongs go out on it, as reach
    /// links' data does: a NAT's mapping is the data's, and a padded ping probes the path).
    pub fn udp_socket(&self) -> &Arc<VxlanSocket> {
        &self.udp_df
    }

    /// Reach chose a path for the links to the peer with probe key `peer`: their datagrams
    /// go there from the next batch on, and datagrams from `accept` are theirs.
    pub fn set_reach_path(&mut self, peer: vnet_crypto::PublicKey, path: ReachPath) {
        if self.reach_paths.get(&peer) == Some(&path) {
            return;
        }
        let mut in_kernel = Vec::new();
        for rt in self.ports.values() {
            if rt.reach.map(|(k, _)| k) == Some(peer) {
                self.realize_reach_path(rt, &path);
                if rt.kernel {
                    in_kernel.push((rt.id, rt.reach.map(|(_, c)| c)));
                }
            }
        }
        if let Some(k) = &mut self.kernel {
            for (id, configured) in in_kernel {
                // A relay's path goes through vnetd; no path known yet: the configured address.
                let to = match (path.direct, path.relay) {
                    // A TCP tunnel's local end (loopback) goes through vnetd, as a relay does.
                    (Some(ep), _) if !ep.ip().is_loopback() => Some(ep),
                    (Some(_), _) | (None, Some(_)) => None,
                    (None, None) => configured,
                };
                k.set_link_path(id, to, path.mtu);
            }
        }
        info!(peer = %vnet_reach::Tag::of(&peer), direct = ?path.direct, relay = ?path.relay,
              accept = ?path.accept, "reach path");
        self.reach_paths.insert(peer, path);
        let old = self.shared.snapshot.load_full();
        let mut snap = old.with_table(old.table.clone());
        self.set_reach_maps(&mut snap);
        self.shared.snapshot.store(Arc::new(snap));
    }

    /// Points a reach link's sending side at `path`.
    fn realize_reach_path(&self, rt: &PortRuntime, path: &ReachPath) {
        let (Some((key, configured)), Some(tx)) = (rt.reach, rt.entry.port.as_udp()) else {
            return;
        };
        let v6 = self.udp.local_addr().is_ipv6();
        let (to, outer_v6) = match (path.direct, path.relay) {
            (Some(ep), _) => (
                LinkPath::direct(crate::reach::for_socket(ep, v6)),
                ep.is_ipv6(),
            ),
            (None, Some(relay)) => (
                LinkPath::relayed(
                    crate::reach::for_socket(relay, v6),
                    vnet_reach::Tag::of(&key),
                ),
                relay.is_ipv6(),
            ),
            (None, None) => (LinkPath::direct(configured), false),
        };
        let extra = if tx.crypto.is_some() {
            vnet_crypto::DATA_OVERHEAD
        } else {
            0
        };
        tx.path
            .store(Arc::new(to.with_mtu(path.mtu, outer_v6, extra)));
        // What the last path refused to segment says nothing about this one.
        tx.gso_refused.store(usize::MAX, Relaxed);
    }

    /// The reach maps of a snapshot from the reach links and their peers' paths.
    fn set_reach_maps(&self, snap: &mut Snapshot) {
        let mut endpoints: FastMap<(SocketAddr, u32), PortId> = FastMap::default();
        let mut tags: FastMap<(vnet_reach::Tag, u32), PortId> = FastMap::default();
        let mut relays: FastSet<SocketAddr> = FastSet::default();
        for rt in self.ports.values() {
            let Some((key, _)) = rt.reach else { continue };
            let vni = rt.entry.info.vni;
            tags.insert((vnet_reach::Tag::of(&key), vni), rt.id);
            if let Some(p) = self.reach_paths.get(&key) {
                for ep in &p.accept {
                    endpoints.insert((vnet_reach::canonical(*ep), vni), rt.id);
                }
                if let Some(r) = p.relay {
                    relays.insert(vnet_reach::canonical(r));
                }
            }
        }
        snap.reach_endpoints = Arc::new(endpoints);
        snap.reach_tags = Arc::new(tags);
        snap.relays = Arc::new(relays);
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
                self.remove_port(DestKind::Interface, &i.name, Leave::Remove);
                Ok(())
            }
            Change::AddLink(l) => self.add_link(l),
            Change::DelLink(l) => {
                self.remove_port(DestKind::Link, &l.name, Leave::Remove);
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
            Change::Route(rc) => {
                self.change_route(rc);
                Ok(())
            }
            Change::Policy {
                kind, name, new, ..
            } => {
                // A port that failed to come up has no guard to change: nothing to do.
                if let Some(rt) = self.ports.get(&(*kind, name.clone())) {
                    rt.entry.guard.set(new);
                    if let (true, Some(k)) = (rt.kernel, &mut self.kernel) {
                        k.set_policy(rt.id, new);
                    }
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
            Change::Settings { old, new } => {
                // Checked before anything changes; an unchanged list is not checked again (the
                // affinity may have shrunk since, which must not block other settings).
                if old.cpus != new.cpus {
                    crate::dispatch::check_cpus_here(&new.cpus)?;
                }
                for rt in self.ports.values() {
                    rt.entry.port.configure(new);
                }
                if let Some(k) = &mut self.kernel {
                    if k.mode() != new.fastpath {
                        info!(mode = %new.fastpath, "kernel fast path");
                    }
                    k.set_mode(new.fastpath);
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
        let kernel = self.kernel.is_some();
        let opened = match i.kind {
            InterfaceKind::Tap => ports::nic::open_tap(i, id),
            InterfaceKind::VhostUser => self.open_external(i, id),
            InterfaceKind::Veth => ports::veth::open(i, id, kernel),
            InterfaceKind::Netdev => ports::netdev::open(i, id, kernel),
        }
        .map_err(|source| EngineError::Interface {
            name: i.name.clone(),
            source,
        })?;
        self.next_id += 1;
        opened.port.configure(&self.dispatchers.settings());
        info!(name = %i.name, kind = %i.kind, ifname = %i.ifname, mac = %i.mac, vni = i.vni,
              netns = ?i.netns, socket = ?i.socket, queues = i.queues, offload = i.offload,
              kernel = opened.kernel.is_some(), "interface added");
        let guard = PortGuard::interface(i.mac, &i.policy());
        self.insert(
            DestKind::Interface,
            &i.name,
            id,
            i.vni,
            opened,
            guard,
            &i.policy(),
        )
        .map_err(|why| EngineError::Interface {
            name: i.name.clone(),
            source: io::Error::other(format!("the kernel fast path refused it: {why}")),
        })
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
        let err = |e: OpenError| match e {
            OpenError::Io(source) => EngineError::Link {
                name: l.name.clone(),
                source,
            },
            OpenError::Unsupported(why) => EngineError::Unsupported {
                name: l.name.clone(),
                why,
            },
        };
        let opened = match &l.kind {
            LinkKind::Udp(to) => {
                // A reach link's datagrams carry DF (its path MTU is learned); a plain link's
                // may be fragmented (a kernel VXLAN peer expects that).
                let sock = if l.reach.is_some() {
                    &self.udp_df
                } else {
                    &self.udp
                };
                let mut o =
                    ports::udp::open(l, *to, sock, self.static_key.as_ref()).map_err(err)?;
                let v6 = self.udp.local_addr().is_ipv6();
                o.reach = l.reach.map(|k| (k, crate::reach::for_socket(*to, v6)));
                o
            }
            LinkKind::TcpDial(_) | LinkKind::TcpAccept(_) => {
                ports::tcp::open(&self.shared, id, l).map_err(|e| err(e.into()))?
            }
            LinkKind::Direct(dev) => ports::direct::open(dev, id).map_err(|e| err(e.into()))?,
        };
        self.next_id += 1;
        info!(name = %l.name, kind = %l.kind, vni = l.vni,
              encrypted = opened.port.as_udp().map(|u| u.crypto.is_some()).unwrap_or(false),
              "link added");
        // The rate, if any, comes with the Policy change that follows AddLink.
        let guard = PortGuard::link(&Default::default());
        self.insert(
            DestKind::Link,
            &l.name,
            id,
            l.vni,
            opened,
            guard,
            &Default::default(),
        )
        .map_err(|why| EngineError::Unsupported {
            name: l.name.clone(),
            why,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        kind: DestKind,
        name: &str,
        id: PortId,
        vni: u32,
        o: Opened,
        guard: PortGuard,
        policy: &vnet_control::PortPolicy,
    ) -> Result<(), String> {
        let kernel = match (&mut self.kernel, &o.kernel) {
            (Some(k), Some(what)) => match k.attach(id, vni, what, policy) {
                Ok(served) => served,
                Err(e) if o.kernel_required => return Err(e),
                Err(e) => {
                    warn!(name, "the kernel fast path could not take this port ({e}); its frames go through vnetd");
                    false
                }
            },
            _ => false,
        };
        // A port the kernel serves is charged by the kernel before anything reaches vnetd:
        // an interface's frames by port_ingress, a link's datagrams by underlay_ingress (all
        // of them, those it passes on to vnetd too: the kernel takes a link only when its
        // datagrams cross that program). One bucket, so the configured rate holds in total.
        if kernel {
            guard.set_rate_enforced(false);
        }
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
                reach: o.reach,
                kernel,
                owned: o.owned,
            },
        );
        // A new link to a peer whose path reach already knows takes it at once.
        if let Some((key, _)) = o.reach {
            if let Some(p) = self.reach_paths.remove(&key) {
                self.set_reach_path(key, p);
            }
        }
        Ok(())
    }

    fn remove_port(&mut self, kind: DestKind, name: &str, leave: Leave) {
        let Some(mut rt) = self.ports.remove(&(kind, name.to_string())) else {
            return;
        };
        // The kernel lets go of it first (its frames go to vnetd until the port is gone), then
        // the dispatchers stop reading it (they confirm), then a table without it is published
        // so no thread sends to it, then it is closed and what vnetd made for it removed. A
        // port left for the next vnetd stays in the kernel (pinned, it forwards meanwhile).
        if rt.kernel && leave == Leave::Remove {
            if let Some(k) = &mut self.kernel {
                k.detach(rt.id);
            }
        }
        for s in &rt.sources {
            self.dispatchers.remove(s);
        }
        let old = self.shared.snapshot.load_full();
        let mut snap = old.with_table(old.table.clone());
        let mut ports = (*old.ports).clone();
        ports.remove(&rt.id);
        snap.ports = Arc::new(ports);
        if old.udp_peers.values().any(|p| *p == rt.id) {
            let mut udp_peers = (*old.udp_peers).clone();
            udp_peers.retain(|_, p| *p != rt.id);
            snap.udp_peers = Arc::new(udp_peers);
        }
        if old.tcp_accept.values().any(|p| *p == rt.id) {
            let mut tcp_accept = (*old.tcp_accept).clone();
            tcp_accept.retain(|_, p| *p != rt.id);
            snap.tcp_accept = Arc::new(tcp_accept);
        }
        if rt.reach.is_some() {
            self.set_reach_maps(&mut snap);
        }
        self.shared.snapshot.store(Arc::new(snap));
        for w in rt.workers.iter_mut() {
            w.stop();
        }
        if leave == Leave::Remove {
            for m in rt.owned.iter_mut() {
                m.remove();
            }
        }
        rt.owned.clear();
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

    /// A route's rule, when its destination port is up (a rule to a port that failed to
    /// come up is left out, as [`Engine::rebuild`] leaves it out).
    fn rule(&self, r: &vnet_control::Route) -> Option<RouteRule> {
        let rt = self.ports.get(&(r.to.kind, r.to.name.clone()))?;
        Some(RouteRule {
            vni: rt.entry.info.vni,
            src: r.src,
            dst: r.dst,
            dest: rt.id,
        })
    }

    /// Applies one route change to the table to publish: the rule goes from or to its
    /// destination's place, nothing else is looked at.
    fn change_route(&mut self, rc: &RouteChange) {
        let (gone, new) = rc.parts();
        let rules = [
            gone.and_then(|r| self.rule(r)),
            new.and_then(|r| self.rule(r)),
        ];
        let table = self
            .pending
            .get_or_insert_with(|| self.shared.snapshot.load().table.clone());
        for (k, rule) in rules.iter().enumerate() {
            let Some(rule) = rule else { continue };
            let changed = if k == 0 {
                table.remove_route(rule)
            } else {
                table.insert_route(*rule)
            };
            if changed {
                self.touched.push(match rule.dst {
                    MacMatch::Exact(d) => Touched::Dst(rule.vni, d),
                    _ => Touched::Wild(rule.vni),
                });
            }
        }
    }

    /// Publishes the route changes applied since the last publication (the ports unchanged):
    /// a table that differs at the touched destinations, for the forwarding threads and the
    /// kernel, which recompiles and writes those destinations only.
    pub fn publish_routes(&mut self) {
        let Some(mut table) = self.pending.take() else {
            return;
        };
        let touched = std::mem::take(&mut self.touched);
        self.generation += 1;
        table.set_generation(self.generation);
        let learning = self.shared.learning();
        if let Some(k) = &mut self.kernel {
            k.apply_routes(&table, &touched, learning);
        }
        let snap = self.shared.snapshot.load().with_table(table);
        self.shared.snapshot.store(Arc::new(snap));
    }

    /// Publishes a new forwarding table for `cfg` (ports that exist, and the routes to them),
    /// and starts reading ports the dispatchers do not read yet.
    pub fn rebuild(&mut self, cfg: &Config) {
        self.pending = None;
        self.touched.clear();
        self.generation += 1;
        let mut ports: FastMap<PortId, PortEntry> = FastMap::default();
        let mut udp_peers: FastMap<(IpAddr, u32), PortId> = FastMap::default();
        let mut udp_ips: FastSet<IpAddr> = FastSet::default();
        let mut tcp_accept: FastMap<(IpAddr, u32), PortId> = FastMap::default();
        for rt in self.ports.values() {
            ports.insert(rt.id, rt.entry.clone());
            if let Some(ip) = rt.udp_peer {
                udp_peers.insert((ip, rt.entry.info.vni), rt.id);
                udp_ips.insert(ip);
            }
            if let Some(ip) = rt.tcp_accept_peer {
                tcp_accept.insert((ip, rt.entry.info.vni), rt.id);
            }
        }
        let rules: Vec<RouteRule> = cfg.routes.iter().filter_map(|r| self.rule(r)).collect();
        if let Some(k) = &mut self.kernel {
            let ports: Vec<(PortId, u32)> = ports.iter().map(|(id, e)| (*id, e.info.vni)).collect();
            k.apply(&ports, &rules, self.shared.learning());
        }
        let table = ForwardingTable::new(
            self.generation,
            ports.iter().map(|(id, e)| (*id, e.info)),
            rules,
        );
        let mut snap = Snapshot {
            table,
            ports: Arc::new(ports),
            udp_peers: Arc::new(udp_peers),
            udp_ips: Arc::new(udp_ips),
            tcp_accept: Arc::new(tcp_accept),
            reach_endpoints: Default::default(),
            reach_tags: Default::default(),
            relays: Default::default(),
            udp: self.udp.clone(),
        };
        self.set_reach_maps(&mut snap);
        self.shared.snapshot.store(Arc::new(snap));
        for rt in self.ports.values() {
            for s in &rt.sources {
                if !self.dispatchers.contains(s) {
                    self.dispatchers.add(s.clone());
                }
            }
        }
    }

    /// The generation of the published forwarding table (one more per publication).
    pub fn snapshot_generation(&self) -> u64 {
        self.shared.snapshot.load().table.generation()
    }

    /// Counters of one port.
    pub fn port_status(&self, kind: DestKind, name: &str) -> Option<PortStatus> {
        let rt = self.ports.get(&(kind, name.to_string()))?;
        let mut counters = rt.entry.counters.snapshot();
        let mut policy = rt.entry.guard.status();
        let kernel = match (rt.kernel, &self.kernel) {
            (true, Some(k)) => k.counters(rt.id).map(|c| {
                merge_kernel_counters(&mut counters, &c);
                KernelPortStatus {
                    rx_frames: c.rx_frames,
                    rx_bytes: c.rx_bytes,
                    tx_frames: c.tx_frames,
                    tx_bytes: c.tx_bytes,
                    punted_frames: c.punted_frames,
                    from_vnetd_frames: c.slow_tx_frames,
                    neigh_miss: c.neigh_miss,
                    encap_fail: c.encap_fail,
                    gro_passed: c.gro_passed,
                    bad_length: c.bad_length,
                }
            }),
            _ => None,
        };
        if kernel.is_some() {
            // The kernel's bucket is the one that counts for what the kernel forwards.
            if let (Some(r), Some(Some(avail))) = (
                policy.rate.as_mut(),
                self.kernel.as_ref().map(|k| k.rate_available(rt.id)),
            ) {
                r.available_bytes = avail;
            }
        }
        Some(PortStatus {
            kind: match kind {
                DestKind::Interface => PortRole::Interface,
                DestKind::Link => PortRole::Link,
            },
            name: name.to_string(),
            vni: rt.entry.info.vni,
            path: if kernel.is_some() && self.kernel_mode() == FastPathMode::Kernel {
                DataPathKind::Kernel
            } else {
                DataPathKind::User
            },
            counters,
            kernel,
            nic: rt.entry.port.nic_status(),
            policy,
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

    /// The traffic matrix: vnetd's own, with the kernel's share merged in; and the frames of
    /// pairs either had no room for.
    pub fn matrix(&self) -> (Vec<MatrixEntry>, u64) {
        let m = self.shared.matrix.lock().unwrap_or_else(|p| p.into_inner());
        let (mut entries, mut overflow) = (m.entries(), m.overflow());
        drop(m);
        if let Some(k) = &self.kernel {
            merge_matrix(&mut entries, k.matrix());
            overflow += k.global().map_or(0, |g| g.matrix_full);
        }
        (entries, overflow)
    }

    /// Loads the kernel fast path (`vnet-fastpath`): veth and netdev interfaces and plain udp
    /// links opened from now on are forwarded in the kernel where the table decides. The error
    /// says why the kernel cannot (vnetd then runs everything in user space).
    pub fn enable_kernel_path(&mut self, mut cfg: FastPathConfig) -> Result<(), String> {
        cfg.vxlan_port = self.udp.local_addr().port();
        let k = KernelPath::open(&cfg, self.udp.local_addr().ip()).map_err(|e| e.to_string())?;
        self.kernel = Some(k);
        Ok(())
    }

    /// Whether the kernel fast path is loaded, and its mode.
    pub fn kernel_mode(&self) -> FastPathMode {
        match &self.kernel {
            Some(k) => k.mode(),
            None => FastPathMode::Off,
        }
    }

    /// The kernel fast path's state for `show stats`.
    pub fn kernel_status(&self) -> Option<KernelPathStatus> {
        let k = self.kernel.as_ref()?;
        let g = k.global();
        let c = k.config();
        Some(KernelPathStatus {
            mode: k.mode(),
            table_entries: k.table_len() as u64,
            table_size: c.max_table as u64,
            table_left_out: k.left_out as u64,
            matrix_size: c.max_matrix as u64,
            unknown_link: g.as_ref().map(|g| g.unknown_link).unwrap_or(0),
            not_vxlan: g.as_ref().map(|g| g.not_vxlan).unwrap_or(0),
            fib_fail: g.as_ref().map(|g| g.fib_fail).unwrap_or(0),
            vni_mismatch: g.as_ref().map(|g| g.vni_mismatch).unwrap_or(0),
            table_full: g.as_ref().map(|g| g.table_full).unwrap_or(0),
        })
    }

    /// Stops every thread and closes every descriptor. With [`Leave::Keep`] (a daemon that
    /// stops, to be started again) the devices vnetd made stay, so the guests keep their NICs
    /// and the next vnetd adopts them; with [`Leave::Remove`] (a teardown) they go too.
    pub fn shutdown(&mut self, leave: Leave) {
        self.listeners.clear();
        let names: Vec<(DestKind, String)> = self.ports.keys().cloned().collect();
        for (k, n) in names {
            self.remove_port(k, &n, leave);
        }
        self.dispatchers.stop();
        match (self.kernel.take(), leave) {
            (Some(k), Leave::Remove) => k.teardown(),
            // Dropped: pinned, the kernel goes on forwarding; unpinned, it stops with us.
            (k, _) => drop(k),
        }
    }

    /// Ends a takeover of an earlier vnetd's kernel fast path, once the restored configuration
    /// is realized: see [`vnet_fastpath::FastPath::commit`].
    pub fn commit_kernel_takeover(&mut self) {
        if let Some(k) = &mut self.kernel {
            k.commit();
        }
    }

    /// Whether the kernel fast path is pinned: forwarding between fast-path ports and plain
    /// udp links goes on while no vnetd runs.
    pub fn kernel_pinned(&self) -> bool {
        self.kernel.as_ref().is_some_and(|k| k.pinned())
    }

    /// The `forwarding` sysctls the kernel fast path changed, as they were before.
    pub fn kernel_forwarding_originals(&self) -> Vec<vnet_fastpath::ForwardingOriginal> {
        self.kernel
            .as_ref()
            .map(|k| k.forwarding_originals())
            .unwrap_or_default()
    }

    /// Hands the kernel fast path the `forwarding` values an earlier vnetd recorded.
    pub fn set_kernel_forwarding_originals(&mut self, o: Vec<vnet_fastpath::ForwardingOriginal>) {
        if let Some(k) = &mut self.kernel {
            k.set_forwarding_originals(o);
        }
    }

    /// The devices vnetd made for the ports it has now (what the next vnetd adopts).
    pub fn made_devices(&self) -> Vec<MadeDevice> {
        let mut v: Vec<MadeDevice> = self
            .ports
            .values()
            .flat_map(|rt| rt.owned.iter().flat_map(|m| m.devices()))
            .collect();
        v.sort();
        v
    }
}

/// Adds what the kernel forwarded itself to a port's counters (as if one data path did it all);
/// frames it punted are counted by vnetd when it reads them.
fn merge_kernel_counters(c: &mut PortCountersSnapshot, k: &vnet_fastpath::Counters) {
    c.rx_frames += k.rx_frames;
    c.rx_bytes += k.rx_bytes;
    c.tx_frames += k.tx_frames;
    c.tx_bytes += k.tx_bytes;
    for (reason, n) in &k.drops {
        if *n > 0 {
            *c.drops.entry(reason.to_string()).or_default() += n;
        }
    }
}

/// Adds the kernel's pairs to vnetd's (the same pair from both sums).
fn merge_matrix(entries: &mut Vec<MatrixEntry>, kernel: Vec<MatrixEntry>) {
    for k in kernel {
        match entries
            .iter_mut()
            .find(|e| e.vni == k.vni && e.src == k.src && e.dst == k.dst)
        {
            Some(e) => {
                e.frames += k.frames;
                e.bytes += k.bytes;
            }
            None => entries.push(k),
        }
    }
}

impl Drop for Engine {
    /// Never removes what vnetd made: only an explicit teardown does (a guest must not lose
    /// its NIC because the daemon's process ended).
    fn drop(&mut self) {
        self.shutdown(Leave::Keep);
    }
}

#[cfg(test)]
mod tests;
