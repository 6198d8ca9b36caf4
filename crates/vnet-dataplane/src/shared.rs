//! What the forwarding threads share: the immutable [`Snapshot`] of ports and routes (swapped
//! whole on every configuration change), the learning table, the traffic matrix, and counters
//! that belong to no port. The control side ([`crate::Engine`]) writes these; the hot path
//! (`forward`, `ingress`, `ports`) only reads them, so this module sits below both and imports
//! neither.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use vnet_core::{
    DropReason, FastMap, FastSet, ForwardingTable, LearnTable, PortCounters, PortId, PortInfo,
    TrafficMatrix,
};
use vnet_reach::Tag;
use vnet_wire::MacAddr;

use crate::counters::OffloadCounters;
use crate::guard::PortGuard;
use crate::port::Port;
use crate::reach::ReachEdge;
use crate::vxlan_socket::VxlanSocket;

/// What the forwarding threads know of a port.
#[derive(Clone)]
pub struct PortEntry {
    pub info: PortInfo,
    /// How frames leave through it (one implementation per port kind, in `ports`).
    pub port: Arc<dyn Port>,
    pub counters: Arc<PortCounters>,
    /// Source-MAC and rate policy on what enters through the port.
    pub guard: Arc<PortGuard>,
}

/// An immutable view of the ports and routes, swapped whole on every change. The maps of
/// ports are shared (`Arc`) between snapshots: a publication of route changes alone
/// ([`Snapshot::with_table`]) copies none of them, so its cost is the routes that changed and
/// not the number of ports.
pub struct Snapshot {
    pub table: ForwardingTable,
    pub ports: Arc<FastMap<PortId, PortEntry>>,
    /// UDP links by (peer address, VNI): how a datagram finds its ingress port.
    pub udp_peers: Arc<FastMap<(IpAddr, u32), PortId>>,
    /// Every UDP link peer's address (datagrams from elsewhere are `unknown_peer`).
    pub udp_ips: Arc<FastSet<IpAddr>>,
    /// `tcp accept` links by (peer address, VNI), for the listeners.
    pub tcp_accept: Arc<FastMap<(IpAddr, u32), PortId>>,
    /// Reach links by (endpoint reach confirmed, VNI): looked up before `udp_peers`.
    pub reach_endpoints: Arc<FastMap<(SocketAddr, u32), PortId>>,
    /// Reach links by (peer tag, VNI), for datagrams a relay brings.
    pub reach_tags: Arc<FastMap<(Tag, u32), PortId>>,
    /// The relays this host's reach links go through now: relay datagrams from elsewhere are
    /// dropped.
    pub relays: Arc<FastSet<SocketAddr>>,
    pub udp: Arc<VxlanSocket>,
}

impl Snapshot {
    pub fn empty(udp: Arc<VxlanSocket>) -> Snapshot {
        Snapshot {
            table: ForwardingTable::default(),
            ports: Default::default(),
            udp_peers: Default::default(),
            udp_ips: Default::default(),
            tcp_accept: Default::default(),
            reach_endpoints: Default::default(),
            reach_tags: Default::default(),
            relays: Default::default(),
            udp,
        }
    }

    /// This snapshot's ports with another forwarding table: the port maps are shared, not
    /// copied.
    pub fn with_table(&self, table: ForwardingTable) -> Snapshot {
        Snapshot {
            table,
            ports: self.ports.clone(),
            udp_peers: self.udp_peers.clone(),
            udp_ips: self.udp_ips.clone(),
            tcp_accept: self.tcp_accept.clone(),
            reach_endpoints: self.reach_endpoints.clone(),
            reach_tags: self.reach_tags.clone(),
            relays: self.relays.clone(),
            udp: self.udp.clone(),
        }
    }

    /// Tells every port that a forwarding batch ended (a guest NIC's notification decision).
    pub fn end_of_burst(&self) {
        for p in self.ports.values() {
            p.port.end_of_burst();
        }
    }

    /// Counts a frame read on `port` that never reached forwarding.
    pub fn count_rx_drop(&self, port: PortId, len: usize, reason: DropReason) {
        if let Some(p) = self.ports.get(&port) {
            p.counters.rx(len);
            p.counters.count_drop(reason);
        }
    }
}

/// State shared by the engine and every forwarding thread.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub(crate) learning: AtomicBool,
    pub(crate) learn: RwLock<LearnTable>,
    pub(crate) matrix: Mutex<TrafficMatrix>,
    /// Counters for traffic that belongs to no port (unknown peers, bad greetings, ...).
    pub daemon: PortCounters,
    pub offload: OffloadCounters,
    /// Reach's hand-over to vnetd's reach thread and a relay's table.
    pub reach: ReachEdge,
    epoch: Instant,
}

impl Shared {
    pub fn new(udp: Arc<VxlanSocket>) -> Shared {
        Shared {
            snapshot: ArcSwap::from_pointee(Snapshot::empty(udp)),
            learning: AtomicBool::new(false),
            learn: RwLock::new(LearnTable::default()),
            matrix: Mutex::new(TrafficMatrix::default()),
            daemon: PortCounters::default(),
            offload: OffloadCounters::default(),
            reach: ReachEdge::default(),
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The data path's monotonic clock (ns since it started): a relay's table and vnetd's
    /// reach thread share it.
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn port_counters(&self, id: PortId) -> Option<Arc<PortCounters>> {
        self.snapshot
            .load()
            .ports
            .get(&id)
            .map(|p| p.counters.clone())
    }

    /// The `tcp accept` link for connections from `peer` in `vni`.
    pub fn tcp_accept_port(&self, peer: IpAddr, vni: u32) -> Option<Arc<dyn Port>> {
        let snap = self.snapshot.load();
        let id = snap.tcp_accept.get(&(peer, vni))?;
        snap.ports.get(id).map(|e| e.port.clone())
    }

    pub fn learning(&self) -> bool {
        self.learning.load(Relaxed)
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
