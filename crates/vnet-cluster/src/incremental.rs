//! Incremental derivation: keeps one host's [`Derivation`] up to date from the keys a batch of
//! watch events changed, at a cost that grows with the size of the change, not with the size
//! of the overlay (issue #13: with a full [`derive()`] per event, every one of N agents spent
//! O(N x guests) per event, and the overlay stopped converging between 100 and 200 hosts).
//!
//! The result is always exactly what [`derive()`] gives for the same state and local
//! configuration (a property test checks this over random event sequences). The common case
//! is done incrementally: the mesh template, no operator routes, a local configuration of
//! interfaces only, and events about other hosts' records and about placements. Anything else
//! (a policy or operator-route change, a change of the local configuration or of this host's
//! own record, a star or explicit overlay, local links or routes) takes a full derivation,
//! counted in [`Deriver::full`].
//!
//! How: the derived routes are a function of one (VNI, MAC) at a time given the link that
//! reaches each (host, VNI); the links are a function of one group of hosts sharing an
//! underlay address (derive skips all but the first link to one peer, `SharedPeer`). An event
//! marks the (VNI, MAC) keys and address groups it touches; only those are recomputed, and the
//! routes over a link whose reachability or definition changed are recomputed with them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use vnet_control::{Command, Config, DestKind, Link, Route, RouteOp};
use vnet_wire::MacAddr;

use crate::derive::{
    derive, diff, link_add_command, route_command, route_order, route_to, Conflict, Derivation,
    DerivedConfig,
};
use crate::schema::{ClusterKey, HostId, HostRecord, Policy};
use crate::state::ClusterState;

/// What decides a link of this host to (host, VNI).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Link(Link),
    /// Not linked; the conflict derive reports at this pair, if any.
    Skipped(Option<Conflict>),
}

/// Keeps one host's derivation current. Build it with [`Deriver::new`] after a full read of
/// the store; feed it each batch of changed keys with [`Deriver::update`].
#[derive(Debug, Clone)]
pub struct Deriver {
    host: HostId,
    local: Config,
    derivation: Derivation,
    /// Whether the last state and local configuration allowed the incremental path.
    fast: bool,
    local_vnis: BTreeSet<u32>,
    /// Host records as last seen (other hosts).
    records: BTreeMap<HostId, HostRecord>,
    by_addr: BTreeMap<IpAddr, BTreeSet<HostId>>,
    /// Placements as last seen: (VNI, MAC) -> host.
    placed: BTreeMap<(u32, MacAddr), HostId>,
    /// (host, VNI) -> the MACs placed there.
    by_host: BTreeMap<(HostId, u32), BTreeSet<MacAddr>>,
    /// The link decision per (host, VNI) of `local_vnis`, for hosts with a record that serve it.
    outcomes: BTreeMap<(HostId, u32), Outcome>,
    /// The routes each (VNI, MAC) contributes.
    mac_routes: BTreeMap<(u32, MacAddr), Vec<Route>>,
    /// The conflicts among `outcomes` (kept apart so that listing them costs their number).
    link_conflicts: BTreeMap<(HostId, u32), Conflict>,
    stale: BTreeMap<(u32, MacAddr), Conflict>,
    /// Derivations done in full, and batches done incrementally.
    pub full: u64,
    pub incremental: u64,
}

fn is_simple(state: &ClusterState, local: &Config) -> bool {
    state.policy() == Policy::Mesh
        && state.routes().is_empty()
        && local.links.is_empty()
        && local.routes.is_empty()
}

impl Deriver {
    /// A full derivation of `state` for `host`.
    pub fn new(host: HostId, state: &ClusterState, local: &Config) -> Deriver {
        let mut d = Deriver {
            host,
            local: local.clone(),
            derivation: Derivation {
                config: DerivedConfig::default(),
                conflicts: Vec::new(),
            },
            fast: false,
            local_vnis: BTreeSet::new(),
            records: BTreeMap::new(),
            by_addr: BTreeMap::new(),
            placed: BTreeMap::new(),
            by_host: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            mac_routes: BTreeMap::new(),
            link_conflicts: BTreeMap::new(),
            stale: BTreeMap::new(),
            full: 0,
            incremental: 0,
        };
        d.rebuild(state, local);
        d
    }

    /// The current derivation (equal to `derive(host, state, local)`).
    pub fn derivation(&self) -> &Derivation {
        &self.derivation
    }

    pub fn host(&self) -> &HostId {
        &self.host
    }

    /// Brings the derivation up to date after the keys `changed` changed in `state` (and the
    /// local configuration is now `local`); returns the commands that turn the previous
    /// derived configuration into the new one, in an order in which each is valid.
    pub fn update(
        &mut self,
        state: &ClusterState,
        changed: &[ClusterKey],
        local: &Config,
    ) -> Vec<Command> {
        let structural = changed.iter().any(|k| match k {
            ClusterKey::Policy | ClusterKey::Route(_) => true,
            ClusterKey::Host(h) => h == &self.host,
            ClusterKey::Interface { .. } => false,
        });
        if !self.fast || structural || *local != self.local || !is_simple(state, local) {
            let old = std::mem::take(&mut self.derivation.config);
            self.rebuild(state, local);
            return diff(&old, &self.derivation.config);
        }
        self.incremental += 1;
        // Address groups to recompute, with the hosts that just left each (their old pairs go).
        let mut groups: BTreeMap<IpAddr, BTreeSet<HostId>> = BTreeMap::new();
        let mut keys: BTreeSet<(u32, MacAddr)> = BTreeSet::new();
        for k in changed {
            match k {
                ClusterKey::Host(h) => {
                    if let Some(old) = self.records.remove(h) {
                        groups.entry(old.addr).or_default().insert(h.clone());
                        if let Some(s) = self.by_addr.get_mut(&old.addr) {
                            s.remove(h);
                            if s.is_empty() {
                                self.by_addr.remove(&old.addr);
                            }
                        }
                    }
                    if let Some(new) = state.host(h) {
                        groups.entry(new.addr).or_default();
                        self.by_addr.entry(new.addr).or_default().insert(h.clone());
                        self.records.insert(h.clone(), new.clone());
                    }
                }
                ClusterKey::Interface { vni, mac } => {
                    keys.insert((*vni, *mac));
                    let old = self.placed.remove(&(*vni, *mac));
                    let new = state.placement(*vni, *mac).map(|p| p.host_id.clone());
                    if let Some(o) = &old {
                        let set = self.by_host.entry((o.clone(), *vni)).or_default();
                        set.remove(mac);
                        if set.is_empty() {
                            self.by_host.remove(&(o.clone(), *vni));
                            // The host stopped serving this VNI: its links may go.
                            if let Some(r) = self.records.get(o) {
                                groups.entry(r.addr).or_default();
                            }
                        }
                    }
                    if let Some(n) = &new {
                        let set = self.by_host.entry((n.clone(), *vni)).or_default();
                        if set.is_empty() {
                            if let Some(r) = self.records.get(n) {
                                groups.entry(r.addr).or_default();
                            }
                        }
                        set.insert(*mac);
                        self.placed.insert((*vni, *mac), n.clone());
                    }
                }
                ClusterKey::Policy | ClusterKey::Route(_) => {}
            }
        }

        // Links of the touched address groups; the routes over every link that changed.
        let mut link_dels = Vec::new();
        let mut link_adds = Vec::new();
        let mut relinked: BTreeSet<String> = BTreeSet::new();
        // First take every touched pair out (a host may have moved from one group to
        // another), then decide the groups anew.
        let mut old: BTreeMap<(HostId, u32), Outcome> = BTreeMap::new();
        let mut new: BTreeMap<(HostId, u32), Outcome> = BTreeMap::new();
        for (addr, left) in &groups {
            let hosts = self.group_hosts(*addr);
            for h in hosts.iter().chain(left) {
                let pairs: Vec<(HostId, u32)> = self
                    .outcomes
                    .range((h.clone(), 0)..=(h.clone(), u32::MAX))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in pairs {
                    self.link_conflicts.remove(&k);
                    if let Some(o) = self.outcomes.remove(&k) {
                        old.insert(k, o);
                    }
                }
            }
        }
        for addr in groups.keys() {
            let hosts = self.group_hosts(*addr);
            new.extend(self.group_outcomes(&hosts));
        }
        for k in old.keys().chain(new.keys()).collect::<BTreeSet<_>>() {
            let link = |o: Option<&Outcome>| match o {
                Some(Outcome::Link(l)) => Some(l.clone()),
                _ => None,
            };
            let (ol, nl) = (link(old.get(k)), link(new.get(k)));
            if ol != nl {
                if let Some(l) = ol {
                    relinked.insert(l.name.clone());
                    link_dels.push(l);
                }
                if let Some(l) = nl {
                    relinked.insert(l.name.clone());
                    link_adds.push(l);
                }
                if let Some(macs) = self.by_host.get(k) {
                    keys.extend(macs.iter().map(|m| (k.1, *m)));
                }
            }
        }
        self.set_outcomes(new);

        // Routes of the touched keys.
        let mut route_dels = Vec::new();
        let mut route_adds = Vec::new();
        for key in keys {
            let new = self.routes_of(state, key);
            let old = self.mac_routes.remove(&key).unwrap_or_default();
            let over_relinked =
                |r: &Route| r.to.kind == DestKind::Link && relinked.contains(&r.to.name);
            for r in &old {
                if !new.contains(r) || over_relinked(r) {
                    route_dels.push(r.clone());
                }
            }
            for r in &new {
                if !old.contains(r) || over_relinked(r) {
                    route_adds.push(r.clone());
                }
            }
            if !new.is_empty() {
                self.mac_routes.insert(key, new);
            }
            let stale = state
                .placement(key.0, key.1)
                .filter(|p| p.host_id == self.host)
                .filter(|_| {
                    !self
                        .local
                        .interfaces
                        .iter()
                        .any(|i| i.vni == key.0 && i.mac == key.1)
                })
                .map(|_| Conflict::StalePlacement {
                    vni: key.0,
                    mac: key.1,
                });
            match stale {
                Some(c) => self.stale.insert(key, c),
                None => self.stale.remove(&key),
            };
        }

        // The configuration and the commands, in diff's order: route deletions, link
        // deletions, link additions, route additions.
        let config = &mut self.derivation.config;
        let mut cmds = Vec::new();
        for r in route_dels {
            if let Ok(p) = config
                .routes
                .binary_search_by(|x| route_order(x).cmp(&route_order(&r)))
            {
                config.routes.remove(p);
            }
            cmds.push(route_command(RouteOp::Del, &r));
        }
        for l in link_dels {
            if let Ok(p) = config.links.binary_search_by(|x| x.name.cmp(&l.name)) {
                config.links.remove(p);
            }
            cmds.push(Command::LinkDel(l.name));
        }
        for l in link_adds {
            if let Err(p) = config.links.binary_search_by(|x| x.name.cmp(&l.name)) {
                config.links.insert(p, l.clone());
            }
            cmds.push(link_add_command(&l));
        }
        for r in route_adds {
            if let Err(p) = config
                .routes
                .binary_search_by(|x| route_order(x).cmp(&route_order(&r)))
            {
                config.routes.insert(p, r.clone());
            }
            cmds.push(route_command(RouteOp::Add, &r));
        }
        self.derivation.conflicts = self.conflicts(state);
        cmds
    }

    fn set_outcomes(&mut self, new: BTreeMap<(HostId, u32), Outcome>) {
        for (k, o) in new {
            if let Outcome::Skipped(Some(c)) = &o {
                self.link_conflicts.insert(k.clone(), c.clone());
            }
            self.outcomes.insert(k, o);
        }
    }

    fn group_hosts(&self, addr: IpAddr) -> Vec<HostId> {
        self.by_addr
            .get(&addr)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The link decisions of every (host, VNI) of one address group, in derive's order.
    fn group_outcomes(&self, hosts: &[HostId]) -> BTreeMap<(HostId, u32), Outcome> {
        let mut out = BTreeMap::new();
        let local_record = self.records.get(&self.host);
        // Pairs in (host, VNI) order; the first linked one per peer wins (SharedPeer).
        let mut first: Vec<Link> = Vec::new();
        for h in hosts {
            let Some(rec) = self.records.get(h) else {
                continue;
            };
            if h == &self.host {
                continue;
            }
            let mut host_conflict_done = false;
            for v in &self.local_vnis {
                if !self.by_host.contains_key(&(h.clone(), *v)) {
                    continue;
                }
                let outcome = match pair_link(&self.host, local_record, rec, *v) {
                    Err(c) => {
                        let c = (!host_conflict_done).then_some(c);
                        host_conflict_done = true;
                        Outcome::Skipped(c)
                    }
                    Ok(link) => match first.iter().find(|l| same_peer(l, &link)) {
                        Some(other) => Outcome::Skipped(Some(Conflict::SharedPeer {
                            derived: link.name,
                            other: other.name.clone(),
                        })),
                        None => {
                            first.push(link.clone());
                            Outcome::Link(link)
                        }
                    },
                };
                out.insert((h.clone(), *v), outcome);
            }
        }
        out
    }

    /// The routes one (VNI, MAC) contributes.
    fn routes_of(&self, state: &ClusterState, (vni, mac): (u32, MacAddr)) -> Vec<Route> {
        let mut out = Vec::new();
        let p = state.placement(vni, mac);
        for i in self
            .local
            .interfaces
            .iter()
            .filter(|i| i.vni == vni && i.mac == mac)
        {
            if p.is_none_or(|p| p.host_id == self.host) {
                out.push(route_to(mac, DestKind::Interface, &i.name));
            }
        }
        if let Some(p) = p.filter(|p| p.host_id != self.host) {
            if let Some(Outcome::Link(l)) = self.outcomes.get(&(p.host_id.clone(), vni)) {
                out.push(route_to(mac, DestKind::Link, &l.name));
            }
        }
        out
    }

    /// derive's conflicts, in its order: links, stale placements, moved local interfaces.
    fn conflicts(&self, state: &ClusterState) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = self.link_conflicts.values().cloned().collect();
        out.extend(self.stale.values().cloned());
        for i in &self.local.interfaces {
            if let Some(p) = state.placement(i.vni, i.mac) {
                if p.host_id != self.host {
                    out.push(Conflict::PlacedElsewhere {
                        interface: i.name.clone(),
                        vni: i.vni,
                        mac: i.mac,
                        host: p.host_id.clone(),
                    });
                }
            }
        }
        out
    }

    /// A full derivation, and the indexes rebuilt from it.
    fn rebuild(&mut self, state: &ClusterState, local: &Config) {
        self.full += 1;
        self.local = local.clone();
        self.derivation = derive(&self.host, state, local);
        self.fast = is_simple(state, local);
        self.local_vnis = local.interfaces.iter().map(|i| i.vni).collect();
        self.records = state.hosts().clone();
        self.by_addr.clear();
        for (h, r) in &self.records {
            self.by_addr.entry(r.addr).or_default().insert(h.clone());
        }
        self.placed.clear();
        self.by_host.clear();
        for ((vni, mac), p) in state.interfaces() {
            self.placed.insert((*vni, *mac), p.host_id.clone());
            self.by_host
                .entry((p.host_id.clone(), *vni))
                .or_default()
                .insert(*mac);
        }
        self.outcomes.clear();
        self.link_conflicts.clear();
        self.mac_routes.clear();
        self.stale.clear();
        if !self.fast {
            return;
        }
        let addrs: Vec<IpAddr> = self.by_addr.keys().copied().collect();
        for a in addrs {
            let hosts = self.group_hosts(a);
            let o = self.group_outcomes(&hosts);
            self.set_outcomes(o);
        }
        let keys: BTreeSet<(u32, MacAddr)> = state
            .interfaces()
            .keys()
            .copied()
            .chain(local.interfaces.iter().map(|i| (i.vni, i.mac)))
            .collect();
        for key in keys {
            let r = self.routes_of(state, key);
            if !r.is_empty() {
                self.mac_routes.insert(key, r);
            }
            if let Some(p) = state.placement(key.0, key.1) {
                if p.host_id == self.host
                    && !local
                        .interfaces
                        .iter()
                        .any(|i| i.vni == key.0 && i.mac == key.1)
                {
                    self.stale.insert(
                        key,
                        Conflict::StalePlacement {
                            vni: key.0,
                            mac: key.1,
                        },
                    );
                }
            }
        }
    }
}

/// The link to `rec`'s host for `vni`, or the conflict that prevents it (derive's rules).
fn pair_link(
    local_host: &HostId,
    local_record: Option<&HostRecord>,
    rec: &HostRecord,
    vni: u32,
) -> Result<Link, Conflict> {
    crate::derive::derived_link(local_host, local_record, rec, vni)
}

fn same_peer(a: &Link, b: &Link) -> bool {
    crate::derive::same_peer(a, b)
}

#[cfg(test)]
mod tests;
