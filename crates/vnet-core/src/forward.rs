use std::sync::Arc;

use vnet_wire::MacAddr;

use crate::{DropReason, FastMap, PortId, RouteRule, RouteTable};

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
/// The daemon builds a new one on every configuration change and swaps it in; `generation`
/// tells the per-thread [`RouteCache`]s that their entries are stale.
#[derive(Debug, Clone, Default)]
pub struct ForwardingTable {
    generation: u64,
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

    /// Marks a changed copy as new, so the [`RouteCache`]s forget what they learnt.
    pub fn set_generation(&mut self, generation: u64) {
        self.generation = generation;
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

/// The hash route cache over the rule table (VNET/P section 4.2), one per forwarding thread so
/// lookups take no lock. It empties itself when the table's or the learning table's generation
/// changes, and when it holds `capacity` entries (a guest spraying random MACs cannot grow it).
#[derive(Debug)]
pub struct RouteCache {
    generation: (u64, u64),
    capacity: usize,
    map: FastMap<(PortId, MacAddr, MacAddr), Decision>,
    hits: u64,
    misses: u64,
}

impl RouteCache {
    pub fn new(capacity: usize) -> Self {
        RouteCache {
            generation: (u64::MAX, u64::MAX),
            capacity: capacity.max(1),
            map: FastMap::default(),
            hits: 0,
            misses: 0,
        }
    }

    /// The cached decision for the key, computing and remembering it on a miss.
    pub fn lookup(
        &mut self,
        generation: (u64, u64),
        key: (PortId, MacAddr, MacAddr),
        compute: impl FnOnce() -> Decision,
    ) -> &Decision {
        if generation != self.generation {
            self.map.clear();
            self.generation = generation;
        }
        if self.map.contains_key(&key) {
            self.hits += 1;
        } else {
            self.misses += 1;
            if self.map.len() >= self.capacity {
                self.map.clear();
            }
            self.map.insert(key, compute());
        }
        // The entry was just ensured above.
        &self.map[&key]
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
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

    #[test]
    fn cache_invalidates_on_generation() {
        let mut c = RouteCache::new(2);
        let k = (IF_A, mac(1), mac(2));
        assert_eq!(
            c.lookup((1, 0), k, || Decision::Forward(vec![IF_B])),
            &Decision::Forward(vec![IF_B])
        );
        assert_eq!(
            c.lookup((1, 0), k, || unreachable!()),
            &Decision::Forward(vec![IF_B])
        );
        assert_eq!(
            c.lookup((2, 0), k, || Decision::Forward(vec![LINK_X])),
            &Decision::Forward(vec![LINK_X])
        );
        assert_eq!(
            c.lookup((2, 1), k, || Decision::Drop(DropReason::NoRoute)),
            &Decision::Drop(DropReason::NoRoute)
        );
        assert_eq!((c.hits(), c.misses()), (1, 3));
        // bounded
        for i in 0..10 {
            c.lookup((2, 1), (IF_A, mac(i), mac(2)), || {
                Decision::Drop(DropReason::NoRoute)
            });
        }
        assert!(c.map.len() <= 2);
    }
}
