//! The control side of the data path: the [`Engine`] creates and removes the OS objects a
//! configuration change calls for (each port kind through its module in [`crate::ports`]),
//! and hands the ports' descriptors to the dispatcher threads ([`crate::dispatch`]). Each
//! change updates what it touches: how the forwarding table and the kernel's follow is in
//! `engine/publish.rs`, what readers see in `engine/status.rs`, reach's paths in
//! `engine/reach.rs`. One owner changes an engine (vnetd's owner thread); readers hold an
//! [`EngineStatus`].

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tracing::{info, warn};
use vnet_control::{Change, DestKind, Interface, InterfaceKind, Link, LinkKind};
use vnet_core::{ForwardingTable, PortId, PortInfo, PortKind, Touched};

use crate::dispatch::DispatcherSet;
use crate::guard::PortGuard;
use crate::ingress::guest::Ingress;
use crate::ingress::vxlan_reader::VxlanReader;
use crate::ingress::Source;
use crate::kernel::KernelPath;
use crate::made::{Made, MadeDevice};
use crate::nic::GuestNic;
use crate::ports::nic::NicPort;
use crate::ports::tcp;
use crate::ports::{self, OpenError, Opened};
use crate::shared::{PortEntry, Shared};
use crate::vxlan_socket::VxlanSocket;
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
    /// The forwarding table with the changes not yet published ([`Engine::publish`]), the
    /// destinations they touched, and whether they bear on every decision (ports came or
    /// went, learning switched).
    pending: Option<ForwardingTable>,
    touched: Vec<Touched>,
    table_all: bool,
    /// The kernel's table is compiled whole at the next publication (learning or the fast
    /// path's mode switched).
    kernel_full: bool,
    /// What readers see of the ports, until they change ([`Engine::status`]).
    ports_status: Option<Arc<status::PortsStatus>>,
    kernel_readout: Option<Arc<vnet_fastpath::Readout>>,
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
    /// What reach calls the path (`direct`, `punched`, `relayed`, `tunneled`, `relayed-tcp`),
    /// for `show links`.
    pub kind: &'static str,
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
            table_all: false,
            kernel_full: false,
            ports_status: None,
            kernel_readout: None,
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

    /// Sets this host's static key; encrypted links need one.
    pub fn set_static_key(&mut self, key: vnet_crypto::PrivateKey) {
        self.static_key = Some(key);
    }

    pub fn udp_local_addr(&self) -> SocketAddr {
        self.udp.local_addr()
    }

    /// Creates or removes the OS objects one change calls for, and changes the forwarding
    /// table where it bears. Call [`Engine::publish`] afterwards (once per script) to swap
    /// the table in.
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
                // A port that failed to come up has no guard to change: nothing to do. No
                // decision changes: the guard's atomics and the kernel's port or link entry
                // are all that is written.
                let Some(rt) = self.ports.get(&(*kind, name.clone())) else {
                    return Ok(());
                };
                rt.entry.guard.set(new);
                info!(kind = %kind, name = %name, any_source = new.any_source,
                      rate = ?new.rate, "policy changed");
                if let (true, Some(k)) = (rt.kernel, &mut self.kernel) {
                    k.set_policy(rt.id, new);
                    // Whether the kernel keeps a bucket for it (what readers read) changed.
                    self.ports_changed();
                }
                Ok(())
            }
            Change::Learn(on) => {
                self.shared.learning.store(*on, Relaxed);
                if let Ok(mut t) = self.shared.learn.write() {
                    t.clear();
                }
                // Unknown unicast floods or not; the kernel leaves everything to vnetd while
                // learning.
                self.touch_all(true);
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
                        k.set_mode(new.fastpath);
                        // Off: an empty table, all to vnetd; on: compiled again.
                        self.kernel_full = true;
                    }
                }
                // The dispatchers may restart: readers read the new ones.
                self.ports_changed();
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
                    ports::udp_link::open(l, *to, sock, self.static_key.as_ref()).map_err(err)?;
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
        let info = PortInfo { vni, kind: o.kind };
        let entry = PortEntry {
            info,
            port: o.port,
            counters: o.counters,
            guard: Arc::new(guard),
        };
        let (udp_peer, tcp_accept_peer, sources) = (o.udp_peer, o.tcp_accept_peer, o.sources);
        self.ports.insert(
            (kind, name.to_string()),
            PortRuntime {
                id,
                entry: entry.clone(),
                sources: sources.clone(),
                workers: o.workers,
                udp_peer,
                tcp_accept_peer,
                reach: o.reach,
                kernel,
                owned: o.owned,
            },
        );
        // In the snapshot at once (ports first, then the table that names it), then read.
        self.table_mut().insert_port(id, info);
        self.table_all = true;
        self.store(|snap| {
            let mut ports = (*snap.ports).clone();
            ports.insert(id, entry);
            snap.ports = Arc::new(ports);
            if let Some(ip) = udp_peer {
                let mut udp_peers = (*snap.udp_peers).clone();
                udp_peers.insert((ip, vni), id);
                snap.udp_peers = Arc::new(udp_peers);
                let mut udp_ips = (*snap.udp_ips).clone();
                udp_ips.insert(ip);
                snap.udp_ips = Arc::new(udp_ips);
            }
            if let Some(ip) = tcp_accept_peer {
                let mut tcp_accept = (*snap.tcp_accept).clone();
                tcp_accept.insert((ip, vni), id);
                snap.tcp_accept = Arc::new(tcp_accept);
            }
        });
        // A new link to a peer whose path reach already knows takes it at once.
        if let Some((key, _)) = o.reach {
            match self.reach_paths.remove(&key) {
                Some(p) => self.set_reach_path(key, p),
                None => self.refresh_reach_maps(),
            }
        }
        for s in &sources {
            if !self.dispatchers.contains(s) {
                self.dispatchers.add(s.clone());
            }
        }
        self.ports_changed();
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
        let touched = self.table_mut().remove_port(rt.id);
        self.touched.extend(touched);
        self.table_all = true;
        let id = rt.id;
        self.store(|snap| {
            let mut ports = (*snap.ports).clone();
            ports.remove(&id);
            snap.ports = Arc::new(ports);
            if snap.udp_peers.values().any(|p| *p == id) {
                let mut udp_peers = (*snap.udp_peers).clone();
                udp_peers.retain(|_, p| *p != id);
                snap.udp_ips = Arc::new(udp_peers.keys().map(|(ip, _)| *ip).collect());
                snap.udp_peers = Arc::new(udp_peers);
            }
            if snap.tcp_accept.values().any(|p| *p == id) {
                let mut tcp_accept = (*snap.tcp_accept).clone();
                tcp_accept.retain(|_, p| *p != id);
                snap.tcp_accept = Arc::new(tcp_accept);
            }
        });
        if rt.reach.is_some() {
            self.refresh_reach_maps();
        }
        self.ports_changed();
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

    /// Stops every thread and closes every descriptor. With [`Leave::Keep`] (a daemon that
    /// stops, to be started again) the devices vnetd made stay, so the guests keep their NICs
    /// and the next vnetd adopts them; with [`Leave::Remove`] (a teardown) they go too.
    pub fn shutdown(&mut self, leave: Leave) {
        self.remove_all_ports(leave);
        self.dispatchers.stop();
        match (self.kernel.take(), leave) {
            (Some(k), Leave::Remove) => k.teardown(),
            // Dropped: pinned, the kernel goes on forwarding; unpinned, it stops with us.
            (k, _) => drop(k),
        }
    }

    /// Closes every listener and port. With [`Leave::Keep`] the kernel's table is left as it
    /// is: pinned, the kernel forwards by it until the next vnetd takes it over and writes the
    /// difference, so the ports' going (which takes their routes from the table, destination
    /// by destination) must not reach it.
    fn remove_all_ports(&mut self, leave: Leave) {
        self.listeners.clear();
        let kept = match leave {
            Leave::Keep => self.kernel.take(),
            Leave::Remove => None,
        };
        let names: Vec<(DestKind, String)> = self.ports.keys().cloned().collect();
        for (k, n) in names {
            self.remove_port(k, &n, leave);
        }
        if kept.is_some() {
            self.kernel = kept;
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

impl Drop for Engine {
    /// Never removes what vnetd made: only an explicit teardown does (a guest must not lose
    /// its NIC because the daemon's process ended).
    fn drop(&mut self) {
        self.shutdown(Leave::Keep);
    }
}

mod kernel;
mod publish;
mod reach;
mod status;
#[cfg(test)]
mod tests;

pub use status::EngineStatus;
