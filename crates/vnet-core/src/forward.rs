//! The forwarding decision of one frame ([`ForwardingTable::decide`]: route, flood, learn or
//! drop) over an immutable table of ports and rules, and what each publication of the table
//! changed ([`Touched`], kept for the last [`CHANGE_LOG_DEPTH`] publications), so that the
//! per-thread route caches (`cache.rs`) forget only the decisions a change can alter.
//!
//! A table is changed in place by its owner between publications (ports come and go, rules
//! are inserted and removed: the maps are shared between copies and copied on write) and
//! published with [`ForwardingTable::publish`], which numbers it and records what changed.

use std::collections::VecDeque;
use std::sync::Arc;

use vnet_wire::MacAddr;

use crate::{DropReason, FastMap, MacMatch, PortId, RouteRule, RouteTable};

/// How many publications back a table remembers what changed; a route cache older than that
/// forgets everything.
pub const CHANGE_LOG_DEPTH: usize = 64;

/// Where the rules changed: those of one exact destination of a VNI, or the VNI's wildcard
/// rules (which bear on every destination of the VNI). A route cache forgets the decisions
/// for that destination, or for the whole VNI; the kernel's table recompiles the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Touched {
    Dst(u32, MacAddr),
    Wild(u32),
}

impl Touched {
    /// Where a rule with this VNI and destination bears.
    pub fn of(rule: &RouteRule) -> Touched {
        match rule.dst {
            MacMatch::Exact(d) => Touched::Dst(rule.vni, d),
            _ => Touched::Wild(rule.vni),
        }
    }

    /// Whether a decision for a frame to `dst` entering in `vni` may have changed.
    pub fn bears_on(&self, vni: u32, dst: MacAddr) -> bool {
        match *self {
            Touched::Dst(v, d) => v == vni && d == dst,
            Touched::Wild(v) => v == vni,
        }
    }
}

/// What one publication changed: some destinations, or everything (ports came or went,
/// which changes floods, or learning was switched).
#[derive(Debug, Clone)]
pub enum TableChange {
    Some(Arc<[Touched]>),
    All,
}

/// What a port is, as far as forwarding cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortKind {
    /// A local VM's NIC.
    Interface,
    /// A UDP or TCP link to another vnet host (or a kernel VXLAN peer).
    OverlayLink,
    /// The local-network exit/entry point (raw Ethernet on a host NIC).
    DirectLink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    pub vni: u32,
    pub kind: PortKind,
}

pub type Targets = Vec<PortId>;

/// The fate of one frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Forward(Targets),
    Drop(DropReason),
}

/// An immutable snapshot of everything forwarding needs: the ports and the route rules.
/// The engine changes a copy and publishes it ([`ForwardingTable::publish`]); `generation`
/// and the change log tell the per-thread [`crate::RouteCache`]s which of their entries are
/// stale.
#[derive(Debug, Clone, Default)]
pub struct ForwardingTable {
    generation: u64,
    /// What the last publications changed, oldest first: (generation, change).
    log: Arc<VecDeque<(u64, TableChange)>>,
    /// The ports, shared between copies of the table: a copy that changes routes only (a
    /// route event's publication) does not copy them.
    ports: Arc<FastMap<PortId, PortInfo>>,
    vni_ports: Arc<FastMap<u32, Vec<PortId>>>,
    routes: RouteTable,
}

impl ForwardingTable {
    pub fn new(
        generation: u64,
        ports: impl IntoIterator<Item = (PortId, PortInfo)>,
        rules: impl IntoIterator<Item = RouteRule>,
    ) -> Self {
        let mut by_id: FastMap<PortId, PortInfo> = FastMap::default();
        let mut by_vni: FastMap<u32, Vec<PortId>> = FastMap::default();
        for (id, info) in ports {
            by_id.insert(id, info);
            by_vni.entry(info.vni).or_default().push(id);
        }
        for v in by_vni.values_mut() {
            v.sort();
        }
        let mut t = ForwardingTable {
            generation,
            log: Default::default(),
            ports: Arc::new(by_id),
            vni_ports: Arc::new(by_vni),
            routes: RouteTable::default(),
        };
        for r in rules {
            // A rule whose destination is not a port of its VNI can never be used.
            if t.ports.get(&r.dest).map(|p| p.vni) == Some(r.vni) {
                t.routes.insert(r);
            }
        }
        t
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Marks a changed copy as new, numbered `generation`, and records what changed since
    /// the table it was copied from, so the route caches forget only that.
    pub fn publish(&mut self, generation: u64, change: TableChange) {
        self.generation = generation;
        let log = Arc::make_mut(&mut self.log);
        if log.len() >= CHANGE_LOG_DEPTH {
            log.pop_front();
        }
        log.push_back((generation, change));
    }

    /// What changed after generation `since` up to this table's, publication by publication;
    /// `None` when the log does not reach back that far or the tables are not related (the
    /// caller forgets everything).
    pub fn changes_since(&self, since: u64) -> Option<impl Iterator<Item = &TableChange>> {
        let first = if since == self.generation {
            self.log.len()
        } else {
            // Generations follow one another: the one after `since` must be in the log.
            let first = self.log.iter().position(|(g, _)| *g > since)?;
            if self.log[first].0 != since + 1 {
                return None;
            }
            first
        };
        Some(self.log.iter().skip(first).map(|(_, c)| c))
    }

    /// Adds a port (no rule names it yet).
    pub fn insert_port(&mut self, id: PortId, info: PortInfo) {
        if let Some(old) = Arc::make_mut(&mut self.ports).insert(id, info) {
            remove_from_vni(&mut self.vni_ports, old.vni, id);
        }
        let v = Arc::make_mut(&mut self.vni_ports)
            .entry(info.vni)
            .or_default();
        if let Err(at) = v.binary_search(&id) {
            v.insert(at, id);
        }
    }

    /// Removes a port and the rules that name it (the configuration took them out before,
    /// so normally there are none); returns where those rules bore.
    pub fn remove_port(&mut self, id: PortId) -> Vec<Touched> {
        let Some(info) = Arc::make_mut(&mut self.ports).remove(&id) else {
            return Vec::new();
        };
        remove_from_vni(&mut self.vni_ports, info.vni, id);
        self.routes
            .remove_dest(info.vni, id)
            .iter()
            .map(Touched::of)
            .collect()
    }

    /// Adds a rule, as [`ForwardingTable::new`] would have: false (and nothing added) when its
    /// destination is not a port of its VNI.
    pub fn insert_route(&mut self, r: RouteRule) -> bool {
        if self.ports.get(&r.dest).map(|p| p.vni) != Some(r.vni) {
            return false;
        }
        self.routes.insert(r);
        true
    }

    /// Removes a rule; false when the table has none equal to it.
    pub fn remove_route(&mut self, r: &RouteRule) -> bool {
        self.routes.remove(r)
    }

    /// The rules, by VNI and destination.
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    pub fn port(&self, id: PortId) -> Option<PortInfo> {
        self.ports.get(&id).copied()
    }

    /// Decides where a frame from `ingress` with (src, dst) goes.
    ///
    /// `learned` is where `dst` was last seen (only consulted when `learning` is on). Rules
    /// always win; without one, multicast floods, learned unicast goes where it was seen,
    /// unknown unicast floods when learning, and everything else is dropped. Floods use split
    /// horizon: a frame that came from an overlay link is never flooded to another overlay link,
    /// so a full mesh of hosts cannot loop a broadcast.
    pub fn decide(
        &self,
        ingress: PortId,
        src: MacAddr,
        dst: MacAddr,
        learning: bool,
        learned: Option<PortId>,
    ) -> Decision {
        let Some(inp) = self.ports.get(&ingress).copied() else {
            return Decision::Drop(DropReason::NoRoute);
        };
        let from_lan = inp.kind == PortKind::DirectLink;
        let unroutable = if from_lan {
            DropReason::NotForOverlay
        } else {
            DropReason::NoRoute
        };
        let mut routed = self.routes.lookup(inp.vni, src, dst);
        if !routed.is_empty() {
            routed.retain(|p| *p != ingress);
            return if routed.is_empty() {
                Decision::Drop(unroutable)
            } else {
                Decision::Forward(routed)
            };
        }
        if dst.is_unicast() {
            if learning {
                if let Some(p) = learned {
                    let same_vni = self.ports.get(&p).map(|i| i.vni) == Some(inp.vni);
                    return if p != ingress && same_vni {
                        Decision::Forward(vec![p])
                    } else {
                        Decision::Drop(unroutable)
                    };
                }
            }
            // A LAN's unicast chatter never floods into the overlay.
            if !learning || from_lan {
                return Decision::Drop(unroutable);
            }
        }
        let flood = self.flood_targets(ingress, inp);
        if flood.is_empty() {
            Decision::Drop(unroutable)
        } else {
            Decision::Forward(flood)
        }
    }

    pub fn ports(&self) -> impl Iterator<Item = (PortId, PortInfo)> + '_ {
        self.ports.iter().map(|(id, p)| (*id, *p))
    }

    fn flood_targets(&self, ingress: PortId, inp: PortInfo) -> Targets {
        let from_overlay = inp.kind == PortKind::OverlayLink;
        self.vni_ports
            .get(&inp.vni)
            .map(|ports| {
                ports
                    .iter()
                    .copied()
                    .filter(|p| *p != ingress)
                    .filter(|p| {
                        !(from_overlay
                            && self.ports.get(p).map(|i| i.kind) == Some(PortKind::OverlayLink))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn remove_from_vni(vni_ports: &mut Arc<FastMap<u32, Vec<PortId>>>, vni: u32, id: PortId) {
    let m = Arc::make_mut(vni_ports);
    if let Some(v) = m.get_mut(&vni) {
        v.retain(|p| *p != id);
        if v.is_empty() {
            m.remove(&vni);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mac;
    use crate::MacMatch;

    const IF_A: PortId = PortId(1);
    const IF_B: PortId = PortId(2);
    const LINK_X: PortId = PortId(3);
    const LINK_Y: PortId = PortId(4);
    const LAN: PortId = PortId(5);
    const IF_V2: PortId = PortId(6);

    fn table(rules: Vec<RouteRule>) -> ForwardingTable {
        let i = |kind| PortInfo { vni: 1, kind };
        ForwardingTable::new(
            7,
            vec![
                (IF_A, i(PortKind::Interface)),
                (IF_B, i(PortKind::Interface)),
                (LINK_X, i(PortKind::OverlayLink)),
                (LINK_Y, i(PortKind::OverlayLink)),
                (LAN, i(PortKind::DirectLink)),
                (
                    IF_V2,
                    PortInfo {
                        vni: 2,
                        kind: PortKind::Interface,
                    },
                ),
            ],
            rules,
        )
    }

    fn to(dst: MacAddr, dest: PortId) -> RouteRule {
        RouteRule {
            vni: 1,
            src: MacMatch::Any,
            dst: MacMatch::Exact(dst),
            dest,
        }
    }

    #[test]
    fn routes_unicast_by_rule() {
        let t = table(vec![to(mac(2), LINK_X)]);
        assert_eq!(
            t.decide(IF_A, mac(1), mac(2), false, None),
            Decision::Forward(vec![LINK_X])
        );
        assert_eq!(
            t.decide(IF_A, mac(1), mac(3), false, None),
            Decision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn never_back_out_the_ingress() {
        let t = table(vec![to(mac(2), LINK_X)]);
        assert_eq!(
            t.decide(LINK_X, mac(1), mac(2), false, None),
            Decision::Drop(DropReason::NoRoute)
        );
        let t = table(vec![to(mac(2), LAN)]);
        assert_eq!(
            t.decide(LAN, mac(1), mac(2), false, None),
            Decision::Drop(DropReason::NotForOverlay)
        );
    }

    #[test]
    fn broadcast_floods_with_split_horizon_inside_the_vni() {
        let t = table(vec![]);
        let from_if = t.decide(IF_A, mac(1), MacAddr::BROADCAST, false, None);
        assert_eq!(from_if, Decision::Forward(vec![IF_B, LINK_X, LINK_Y, LAN]));
        let from_link = t.decide(LINK_X, mac(1), MacAddr::BROADCAST, false, None);
        assert_eq!(from_link, Decision::Forward(vec![IF_A, IF_B, LAN]));
        let from_v2 = t.decide(IF_V2, mac(1), MacAddr::BROADCAST, false, None);
        assert_eq!(from_v2, Decision::Drop(DropReason::NoRoute));
    }

    #[test]
    fn a_rule_overrides_flooding() {
        let t = table(vec![to(MacAddr::BROADCAST, LINK_Y)]);
        assert_eq!(
            t.decide(IF_A, mac(1), MacAddr::BROADCAST, false, None),
            Decision::Forward(vec![LINK_Y])
        );
    }

    #[test]
    fn learning() {
        let t = table(vec![]);
        assert_eq!(
            t.decide(IF_A, mac(1), mac(9), true, Some(LINK_X)),
            Decision::Forward(vec![LINK_X])
        );
        // unknown unicast floods when learning, not otherwise
        assert_eq!(
            t.decide(IF_A, mac(1), mac(9), true, None),
            Decision::Forward(vec![IF_B, LINK_X, LINK_Y, LAN])
        );
        assert_eq!(
            t.decide(IF_A, mac(1), mac(9), false, Some(LINK_X)),
            Decision::Drop(DropReason::NoRoute)
        );
        // learned in another VNI is not used
        assert_eq!(
            t.decide(IF_A, mac(1), mac(9), true, Some(IF_V2)),
            Decision::Drop(DropReason::NoRoute)
        );
        // the LAN's unknown unicast stays on the LAN
        assert_eq!(
            t.decide(LAN, mac(1), mac(9), true, None),
            Decision::Drop(DropReason::NotForOverlay)
        );
    }

    #[test]
    fn rules_to_other_vnis_are_ignored() {
        let bad = RouteRule {
            vni: 1,
            src: MacMatch::Any,
            dst: MacMatch::Any,
            dest: IF_V2,
        };
        let t = table(vec![bad]);
        assert_eq!(
            t.decide(IF_A, mac(1), mac(2), false, None),
            Decision::Drop(DropReason::NoRoute)
        );
    }
}
