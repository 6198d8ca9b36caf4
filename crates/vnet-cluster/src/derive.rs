//! From the overlay's state to the links and routes one host needs, and from one derived set
//! to the next as control-language commands.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;

use vnet_control::{
    Command, Config, DestKind, DestRef, Link, LinkKind, LinkSpec, Route, RouteOp, RouteSpec,
};
use vnet_core::MacMatch;
use vnet_wire::MacAddr;

use crate::schema::{HostId, HostRecord, Policy, RouteId, CAP_TCP, CAP_VXLAN};
use crate::state::ClusterState;

/// Derived links are named `c-<host>-v<vni>`; local names should not start with this prefix.
pub const DERIVED_LINK_PREFIX: &str = "c-";

/// The name of the derived link to `host` for `vni` (at most 32 characters, a valid NAME).
pub fn derived_link_name(host: &HostId, vni: u32) -> String {
    format!("{DERIVED_LINK_PREFIX}{host}-v{vni}")
}

/// The links and routes derived for one host, sorted (links by name, routes by destination
/// MAC, source MAC, then target), so two derivations of the same state are equal and their
/// [`diff`] is stable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DerivedConfig {
    pub links: Vec<Link>,
    pub routes: Vec<Route>,
}

/// A derivation: the derived set, and what was left out of it and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derivation {
    pub config: DerivedConfig,
    pub conflicts: Vec<Conflict>,
}

/// Who won over a derived route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrider {
    /// A route of the local configuration.
    Local,
    /// An operator route from the store.
    Operator(RouteId),
}

/// Something the derivation skipped. None of these is fatal; the daemon logs them (and may
/// clean up the stale placements of its own host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// A local link has the derived link's name but another definition: the derived link,
    /// and the routes that would use it, are skipped.
    LinkName { name: String },
    /// A local link already reaches that host in that VNI: the derived link is skipped and
    /// its routes use the local link.
    LinkCovered { derived: String, local: String },
    /// Two hosts publish the same underlay address (a link per address and VNI is allowed):
    /// the later one by host id is not linked.
    SharedPeer { derived: String, other: String },
    /// This host and `host` have no transport in common (VXLAN, or TCP with a port).
    NoTransport { host: HostId },
    /// The star's proxy has no host record (not registered, or its lease expired).
    ProxyMissing { proxy: HostId },
    /// One of this host and `host` has an encryption key (capability `noise`) and the other
    /// has not, or their only transport is TCP: a host with a key links only encrypted, so
    /// they are not linked.
    EncryptionMismatch { host: HostId },
    /// A route with the same source and destination in that VNI won over a derived one.
    RouteOverridden {
        route: Route,
        vni: u32,
        by: Overrider,
    },
    /// A local interface whose placement names another host (it has moved, or is moving):
    /// no route to the local interface is derived; the MAC is routed to that host.
    PlacedElsewhere {
        interface: String,
        vni: u32,
        mac: MacAddr,
        host: HostId,
    },
    /// A placement names this host, but no local interface has that MAC in that VNI.
    StalePlacement { vni: u32, mac: MacAddr },
    /// An operator route whose destination does not exist on this host.
    UnresolvedRoute { id: RouteId, to: DestRef },
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::LinkName { name } => {
                write!(
                    f,
                    "local link {name} differs from the derived one; derived link skipped"
                )
            }
            Conflict::LinkCovered { derived, local } => {
                write!(
                    f,
                    "local link {local} reaches the peer of derived link {derived}; using it"
                )
            }
            Conflict::SharedPeer { derived, other } => {
                write!(
                    f,
                    "derived link {derived} has the same peer as {other}; skipped"
                )
            }
            Conflict::NoTransport { host } => {
                write!(f, "no transport in common with host {host}")
            }
            Conflict::ProxyMissing { proxy } => write!(f, "star proxy {proxy} is not registered"),
            Conflict::EncryptionMismatch { host } => write!(
                f,
                "host {host}: one side has an encryption key (capability noise) and the other \
                 not, or no udp transport: not linked (hosts with keys link only encrypted)"
            ),
            Conflict::RouteOverridden { route, vni, by } => {
                write!(
                    f,
                    "derived route {} {} {} {} (VNI {vni}) overridden by ",
                    route.src, route.dst, route.to.kind, route.to.name
                )?;
                match by {
                    Overrider::Local => write!(f, "the local configuration"),
                    Overrider::Operator(id) => write!(f, "operator route {id}"),
                }
            }
            Conflict::PlacedElsewhere {
                interface,
                vni,
                mac,
                host,
            } => write!(
                f,
                "local interface {interface} ({mac}, VNI {vni}) is placed on host {host}"
            ),
            Conflict::StalePlacement { vni, mac } => {
                write!(
                    f,
                    "placement of {mac} in VNI {vni} names this host, which has no such interface"
                )
            }
            Conflict::UnresolvedRoute { id, to } => {
                write!(f, "operator route {id}: no {} {} here", to.kind, to.name)
            }
        }
    }
}

/// How this host reaches `remote`: VXLAN when both speak it, else a TCP link that the host
/// with the smaller id dials. Without its own record this host is assumed to speak VXLAN only.
pub(crate) fn transport(
    local_id: &HostId,
    local: Option<&HostRecord>,
    remote: &HostRecord,
) -> Option<LinkKind> {
    let local_has = |cap: &str| local.map_or(cap == CAP_VXLAN, |r| r.has_capability(cap));
    if local_has(CAP_VXLAN) && remote.has_capability(CAP_VXLAN) {
        return Some(LinkKind::Udp(SocketAddr::new(remote.addr, remote.udp_port)));
    }
    if local_has(CAP_TCP) && remote.has_capability(CAP_TCP) {
        return if local_id < &remote.host_id {
            remote
                .tcp_port
                .map(|p| LinkKind::TcpDial(SocketAddr::new(remote.addr, p)))
        } else {
            Some(LinkKind::TcpAccept(remote.addr))
        };
    }
    None
}

/// The link to `rec`'s host for `vni`, or the conflict that prevents it. Encrypted exactly
/// when both hosts publish keys (a host with a key never links in plaintext; encryption is
/// for udp links only); a udp link finds its own path (`reach`) when both publish probe keys.
pub(crate) fn derived_link(
    local_host: &HostId,
    local_record: Option<&HostRecord>,
    rec: &HostRecord,
    vni: u32,
) -> Result<Link, Conflict> {
    let Some(kind) = transport(local_host, local_record, rec) else {
        return Err(Conflict::NoTransport {
            host: rec.host_id.clone(),
        });
    };
    let local_key = local_record.and_then(HostRecord::noise_key);
    let encrypt = match (local_key, rec.noise_key(), &kind) {
        (None, None, _) => None,
        (Some(_), Some(k), LinkKind::Udp(_)) => Some(k),
        _ => {
            return Err(Conflict::EncryptionMismatch {
                host: rec.host_id.clone(),
            })
        }
    };
    let local_probe = local_record.and_then(HostRecord::probe_key);
    let reach = match (local_probe, rec.probe_key(), &kind) {
        (Some(_), Some(k), LinkKind::Udp(_)) => Some(k),
        _ => None,
    };
    Ok(Link {
        name: derived_link_name(&rec.host_id, vni),
        kind,
        vni,
        encrypt,
        reach,
    })
}

/// Whether `Config` would refuse the two links side by side (the rule of `link add`): UDP
/// datagrams are demultiplexed by (source IP, VNI), a reach link's by (peer key, VNI), TCP
/// streams by peer and VNI.
pub(crate) fn same_peer(a: &Link, b: &Link) -> bool {
    match (&a.kind, &b.kind) {
        (LinkKind::Udp(x), LinkKind::Udp(y)) => {
            a.vni == b.vni
                && match (a.reach, b.reach) {
                    (None, None) => x.ip() == y.ip(),
                    (Some(p), Some(q)) => p == q,
                    _ => false,
                }
        }
        (LinkKind::TcpDial(x), LinkKind::TcpDial(y)) => x == y && a.vni == b.vni,
        (LinkKind::TcpAccept(x), LinkKind::TcpAccept(y)) => x == y && a.vni == b.vni,
        (LinkKind::Direct(x), LinkKind::Direct(y)) => x == y,
        _ => false,
    }
}

/// The peer of a derived link as `same_peer` compares it (udp: address and VNI, or the
/// reach key and VNI; tcp: the dialed socket address or the accepted address, and VNI).
/// Derived links are never direct.
fn derived_peer_key(l: &Link) -> Option<PeerKey> {
    match (&l.kind, l.reach) {
        (LinkKind::Udp(_), Some(k)) => Some(PeerKey::Reach(k.0, l.vni)),
        (LinkKind::Udp(a), None) => Some(PeerKey::Addr(0, a.ip(), 0, l.vni)),
        (LinkKind::TcpDial(a), _) => Some(PeerKey::Addr(1, a.ip(), a.port(), l.vni)),
        (LinkKind::TcpAccept(ip), _) => Some(PeerKey::Addr(2, *ip, 0, l.vni)),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum PeerKey {
    Addr(u8, std::net::IpAddr, u16, u32),
    Reach([u8; 32], u32),
}

pub(crate) type MatchKey = (u8, [u8; 6]);

fn match_key(m: &MacMatch) -> MatchKey {
    match m {
        MacMatch::Any => (0, [0; 6]),
        MacMatch::Exact(a) => (1, a.0),
        MacMatch::Not(a) => (2, a.0),
    }
}

fn dest_kind_key(k: DestKind) -> u8 {
    match k {
        DestKind::Interface => 0,
        DestKind::Link => 1,
    }
}

pub(crate) fn route_order(r: &Route) -> (MatchKey, MatchKey, u8, &str) {
    (
        match_key(&r.dst),
        match_key(&r.src),
        dest_kind_key(r.to.kind),
        &r.to.name,
    )
}

/// Routes with the same key in the same VNI rank equally, so they would all be used at once.
fn route_key(r: &Route, vni: u32) -> (u32, MatchKey, MatchKey) {
    (vni, match_key(&r.src), match_key(&r.dst))
}

pub(crate) fn route_to(dst: MacAddr, kind: DestKind, name: &str) -> Route {
    Route {
        src: MacMatch::Any,
        dst: MacMatch::Exact(dst),
        to: DestRef {
            kind,
            name: name.to_string(),
        },
    }
}

#[derive(PartialEq)]
enum Origin {
    Derived,
    Operator(RouteId),
}

struct Candidate {
    route: Route,
    vni: u32,
    origin: Origin,
}

/// Derives the links and routes `local_host` needs from the overlay's state.
///
/// `local` must be the host's local configuration only (config file and control port), never
/// the running one that already holds derived objects: local objects win over derived ones,
/// so passing the running configuration would make every derived object look local.
pub fn derive(local_host: &HostId, state: &ClusterState, local: &Config) -> Derivation {
    let policy = state.policy();
    let mut conflicts = Vec::new();
    let local_vnis: BTreeSet<u32> = local.interfaces.iter().map(|i| i.vni).collect();

    // The VNIs each remote host serves. A host without a record is unreachable (not
    // registered, or its lease expired and its interfaces are about to go too).
    let mut served: BTreeMap<&HostId, BTreeSet<u32>> = BTreeMap::new();
    for p in state.interfaces().values() {
        if &p.host_id != local_host && state.host(&p.host_id).is_some() {
            served.entry(&p.host_id).or_default().insert(p.vni);
        }
    }

    // Which (peer, VNI) pairs get a link, by the template.
    let mut wanted: BTreeSet<(&HostId, u32)> = BTreeSet::new();
    match &policy {
        Policy::Explicit => {}
        Policy::Mesh => {
            for (h, vnis) in &served {
                for v in vnis.intersection(&local_vnis) {
                    wanted.insert((h, *v));
                }
            }
        }
        Policy::Star { proxy } if proxy == local_host => {
            // The proxy links to every host of a VNI that at least two hosts use.
            for (h, vnis) in &served {
                for v in vnis {
                    let users = usize::from(local_vnis.contains(v))
                        + served.values().filter(|s| s.contains(v)).count();
                    if users >= 2 {
                        wanted.insert((h, *v));
                    }
                }
            }
        }
        Policy::Star { proxy } => {
            if state.host(proxy).is_none() {
                conflicts.push(Conflict::ProxyMissing {
                    proxy: proxy.clone(),
                });
            } else {
                for v in &local_vnis {
                    if served.values().any(|s| s.contains(v)) {
                        wanted.insert((proxy, *v));
                    }
                }
            }
        }
    }

    // The links, and the link name that reaches each (peer, VNI).
    let local_record = state.host(local_host);
    let mut links: Vec<Link> = Vec::new();
    let mut reach: BTreeMap<(&HostId, u32), String> = BTreeMap::new();
    let mut no_transport: BTreeSet<&HostId> = BTreeSet::new();
    // The first derived link to each peer (what `same_peer` compares), by its key.
    let mut first_by_peer: BTreeMap<PeerKey, usize> = BTreeMap::new();
    for (h, v) in wanted {
        let Some(rec) = state.host(h) else { continue };
        let link = match derived_link(local_host, local_record, rec, v) {
            Ok(l) => l,
            Err(c) => {
                if no_transport.insert(h) {
                    conflicts.push(c);
                }
                continue;
            }
        };
        if let Some(l) = local.link(&link.name) {
            if *l == link {
                reach.insert((h, v), link.name);
            } else {
                conflicts.push(Conflict::LinkName { name: link.name });
            }
        } else if let Some(l) = local.links.iter().find(|l| same_peer(l, &link)) {
            reach.insert((h, v), l.name.clone());
            conflicts.push(Conflict::LinkCovered {
                derived: link.name,
                local: l.name.clone(),
            });
        } else if let Some(&i) = derived_peer_key(&link).and_then(|k| first_by_peer.get(&k)) {
            conflicts.push(Conflict::SharedPeer {
                derived: link.name,
                other: links[i].name.clone(),
            });
        } else {
            reach.insert((h, v), link.name.clone());
            if let Some(k) = derived_peer_key(&link) {
                first_by_peer.insert(k, links.len());
            }
            links.push(link);
        }
    }

    let mut candidates: Vec<Candidate> = Vec::new();
    let mut derived = |route: Route, vni: u32| {
        candidates.push(Candidate {
            route,
            vni,
            origin: Origin::Derived,
        })
    };
    // Placement: local MACs to their interfaces, remote MACs to the link towards their host.
    for p in state.interfaces().values() {
        if &p.host_id == local_host
            && !local
                .interfaces
                .iter()
                .any(|i| i.vni == p.vni && i.mac == p.mac)
        {
            conflicts.push(Conflict::StalePlacement {
                vni: p.vni,
                mac: p.mac,
            });
        }
    }
    if policy != Policy::Explicit {
        for i in &local.interfaces {
            match state.placement(i.vni, i.mac) {
                Some(p) if &p.host_id != local_host => conflicts.push(Conflict::PlacedElsewhere {
                    interface: i.name.clone(),
                    vni: i.vni,
                    mac: i.mac,
                    host: p.host_id.clone(),
                }),
                _ => derived(route_to(i.mac, DestKind::Interface, &i.name), i.vni),
            }
        }
        for p in state.interfaces().values() {
            if &p.host_id == local_host || state.host(&p.host_id).is_none() {
                continue;
            }
            let via = match &policy {
                Policy::Star { proxy } if proxy != local_host => proxy,
                _ => &p.host_id,
            };
            if let Some(name) = reach.get(&(via, p.vni)) {
                derived(route_to(p.mac, DestKind::Link, name), p.vni);
            }
        }
    }
    // The star's proxy relays broadcasts: flooding would not, since a frame that came from an
    // overlay link is never flooded to another one (split horizon). Routes have no split
    // horizon, so only the proxy has them, and every port of the VNI is a destination (the
    // ingress port is left out by the forwarding decision).
    if matches!(&policy, Policy::Star { proxy } if proxy == local_host) {
        // Per VNI: (interface names, link names).
        let mut ports: BTreeMap<u32, (BTreeSet<&str>, BTreeSet<&str>)> = BTreeMap::new();
        for ((_, v), name) in &reach {
            ports.entry(*v).or_default().1.insert(name);
        }
        for (v, (ifaces, links)) in ports.iter_mut() {
            ifaces.extend(
                local
                    .interfaces
                    .iter()
                    .filter(|i| i.vni == *v)
                    .map(|i| i.name.as_str()),
            );
            links.extend(
                local
                    .links
                    .iter()
                    .filter(|l| l.vni == *v)
                    .map(|l| l.name.as_str()),
            );
        }
        for (v, (ifaces, links)) in &ports {
            if ifaces.len() + links.len() < 2 {
                continue;
            }
            for name in ifaces {
                derived(route_to(MacAddr::BROADCAST, DestKind::Interface, name), *v);
            }
            for name in links {
                derived(route_to(MacAddr::BROADCAST, DestKind::Link, name), *v);
            }
        }
    }
    // Operator routes, in every template, where their destination exists here.
    for r in state.routes().values() {
        if !r.applies_to(local_host) {
            continue;
        }
        let to = &r.spec.to;
        let vni = match to.kind {
            DestKind::Interface => local.interface(&to.name).map(|i| i.vni),
            DestKind::Link => local
                .link(&to.name)
                .or_else(|| links.iter().find(|l| l.name == to.name))
                .map(|l| l.vni),
        };
        let Some(vni) = vni else {
            conflicts.push(Conflict::UnresolvedRoute {
                id: r.id.clone(),
                to: to.clone(),
            });
            continue;
        };
        candidates.push(Candidate {
            route: Route {
                src: r.spec.src,
                dst: r.spec.dst,
                to: to.clone(),
            },
            vni,
            origin: Origin::Operator(r.id.clone()),
        });
    }

    // Local routes win over operator routes, which win over derived ones. An identical route
    // is not a conflict; it is simply there already.
    let mut local_keys = BTreeSet::new();
    for r in &local.routes {
        if let Some(v) = local.dest_vni(&r.to) {
            local_keys.insert(route_key(r, v));
        }
    }
    let mut operator_keys: BTreeMap<_, &RouteId> = BTreeMap::new();
    for c in &candidates {
        if let Origin::Operator(id) = &c.origin {
            operator_keys
                .entry(route_key(&c.route, c.vni))
                .or_insert(id);
        }
    }
    let mut routes: Vec<Route> = Vec::new();
    for c in &candidates {
        let key = route_key(&c.route, c.vni);
        let by_operator = c.origin == Origin::Derived && operator_keys.contains_key(&key);
        if local.routes.contains(&c.route)
            || (by_operator
                && candidates
                    .iter()
                    .any(|o| o.origin != Origin::Derived && o.route == c.route))
        {
            continue;
        }
        let by = if local_keys.contains(&key) {
            Some(Overrider::Local)
        } else if by_operator {
            Some(Overrider::Operator(operator_keys[&key].clone()))
        } else {
            None
        };
        match by {
            Some(by) => conflicts.push(Conflict::RouteOverridden {
                route: c.route.clone(),
                vni: c.vni,
                by,
            }),
            None => routes.push(c.route.clone()),
        }
    }
    let mut config = DerivedConfig { links, routes };
    config.normalize();
    Derivation { config, conflicts }
}

/// Why a command could not be applied to a [`DerivedConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DerivedApplyError {
    #[error("link {0} exists")]
    LinkExists(String),
    #[error("no link {0}")]
    NoLink(String),
    #[error("route {0} exists")]
    RouteExists(String),
    #[error("no route {0}")]
    NoRoute(String),
    #[error("not a command of a derived configuration")]
    Unsupported,
}

impl DerivedConfig {
    pub fn is_empty(&self) -> bool {
        self.links.is_empty() && self.routes.is_empty()
    }

    fn normalize(&mut self) {
        self.links.sort_by(|a, b| a.name.cmp(&b.name));
        self.routes
            .sort_by(|a, b| route_order(a).cmp(&route_order(b)));
        self.routes.dedup();
    }

    /// The commands that create this set from nothing.
    pub fn commands(&self) -> Vec<Command> {
        diff(&DerivedConfig::default(), self)
    }

    /// Applies one command of a [`diff`] with the meaning `Config::apply` gives it (deleting a
    /// link deletes the routes to it). The daemon applies each command to its running
    /// `Config` and, when that succeeded, to its record of what it applied, so that the next
    /// diff retries whatever failed.
    pub fn apply(&mut self, cmd: &Command) -> Result<(), DerivedApplyError> {
        // The lists stay sorted (links by name, routes by `route_order`), so each command
        // is a binary search, not a scan and a sort of the whole set.
        match cmd {
            Command::LinkAdd(spec) => {
                let Err(pos) = self.links.binary_search_by(|l| l.name.cmp(&spec.name)) else {
                    return Err(DerivedApplyError::LinkExists(spec.name.clone()));
                };
                self.links.insert(
                    pos,
                    Link {
                        name: spec.name.clone(),
                        kind: spec.kind.clone(),
                        vni: spec.vni.unwrap_or(1),
                        encrypt: spec.encrypt,
                        reach: spec.reach,
                    },
                );
            }
            Command::LinkDel(name) => {
                let Ok(pos) = self.links.binary_search_by(|l| l.name.cmp(name)) else {
                    return Err(DerivedApplyError::NoLink(name.clone()));
                };
                self.links.remove(pos);
                self.routes
                    .retain(|r| !(r.to.kind == DestKind::Link && &r.to.name == name));
            }
            Command::Route(op, spec) => {
                let route = Route {
                    src: spec.src,
                    dst: spec.dst,
                    to: spec.to.clone(),
                };
                let pos = self
                    .routes
                    .binary_search_by(|r| route_order(r).cmp(&route_order(&route)));
                match (op, pos) {
                    (RouteOp::Add, Err(p)) => self.routes.insert(p, route),
                    (RouteOp::Add, Ok(_)) => {
                        return Err(DerivedApplyError::RouteExists(spec.to_string()))
                    }
                    (RouteOp::Del, Ok(p)) => {
                        self.routes.remove(p);
                    }
                    (RouteOp::Del, Err(_)) => {
                        return Err(DerivedApplyError::NoRoute(spec.to_string()))
                    }
                    (RouteOp::Replace, _) => return Err(DerivedApplyError::Unsupported),
                }
            }
            _ => return Err(DerivedApplyError::Unsupported),
        }
        Ok(())
    }

    /// Keeps only what `running` really holds. Objects the running configuration lost
    /// without this set knowing (a local `interface del` takes the routes to it along, a
    /// command the OS refused) would otherwise make the next diff try to delete them again.
    pub fn retain_present(&mut self, running: &Config) {
        self.links.retain(|l| running.link(&l.name) == Some(l));
        self.routes.retain(|r| running.routes.contains(r));
    }
}

pub(crate) fn link_add_command(l: &Link) -> Command {
    Command::LinkAdd(LinkSpec {
        name: l.name.clone(),
        kind: l.kind.clone(),
        vni: Some(l.vni),
        encrypt: l.encrypt,
        reach: l.reach,
        rate: None,
    })
}

pub(crate) fn route_command(op: RouteOp, r: &Route) -> Command {
    Command::Route(
        op,
        RouteSpec {
            src: r.src,
            dst: r.dst,
            to: r.to.clone(),
        },
    )
}

/// The commands that turn `old` into `new`: route deletions, link deletions, link additions,
/// route additions, in that order, so every command is valid when it comes. A link whose
/// definition changed (its host moved to another address) is deleted and added again, with the
/// routes over it.
pub fn diff(old: &DerivedConfig, new: &DerivedConfig) -> Vec<Command> {
    let old_links: BTreeMap<&str, &Link> = old.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let new_links: BTreeMap<&str, &Link> = new.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let gone: BTreeSet<&str> = old_links
        .iter()
        .filter(|(n, l)| new_links.get(*n) != Some(*l))
        .map(|(n, _)| *n)
        .collect();
    let over_gone = |r: &Route| r.to.kind == DestKind::Link && gone.contains(r.to.name.as_str());
    // Membership by the routes' total order (every field), not by scanning the lists.
    let old_routes: BTreeSet<_> = old.routes.iter().map(route_order).collect();
    let new_routes: BTreeSet<_> = new.routes.iter().map(route_order).collect();
    let mut out = Vec::new();
    for r in &old.routes {
        if !new_routes.contains(&route_order(r)) || over_gone(r) {
            out.push(route_command(RouteOp::Del, r));
        }
    }
    for n in &gone {
        out.push(Command::LinkDel(n.to_string()));
    }
    for (n, l) in &new_links {
        if old_links.get(n) != Some(l) {
            out.push(link_add_command(l));
        }
    }
    for r in &new.routes {
        if !old_routes.contains(&route_order(r)) || over_gone(r) {
            out.push(route_command(RouteOp::Add, r));
        }
    }
    out
}

/// A command of a derived configuration as a line of the control language (links and routes;
/// `None` for anything else).
pub fn render_command(cmd: &Command) -> Option<String> {
    Some(match cmd {
        Command::LinkAdd(s) => {
            let mut t = match s.vni {
                Some(v) => format!("link add {} {} vni {v}", s.name, s.kind),
                None => format!("link add {} {}", s.name, s.kind),
            };
            if let Some(k) = &s.encrypt {
                t.push_str(&format!(" encrypt {k}"));
            }
            if let Some(k) = &s.reach {
                t.push_str(&format!(" reach {k}"));
            }
            t
        }
        Command::LinkDel(n) => format!("link del {n}"),
        Command::Route(op, spec) => {
            let op = match op {
                RouteOp::Add => "add",
                RouteOp::Replace => "replace",
                RouteOp::Del => "del",
            };
            format!("route {op} {spec}")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
