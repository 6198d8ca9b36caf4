//! Route rules on (source MAC, destination MAC) and the table that holds them per VNI and by
//! destination ([`RouteTable`]), with the ranking of VNET/P section 4.2 (destination
//! specificity first, then source): a frame's candidates are the rules of its destination and
//! the VNI's wildcards, and a route change touches one destination's entry.

use std::fmt;
use std::sync::Arc;

use vnet_wire::MacAddr;

use crate::PortId;

/// One side of a route rule: a MAC, any MAC, or any MAC but one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MacMatch {
    Any,
    Exact(MacAddr),
    Not(MacAddr),
}

impl MacMatch {
    pub fn matches(&self, mac: MacAddr) -> bool {
        match self {
            MacMatch::Any => true,
            MacMatch::Exact(m) => *m == mac,
            MacMatch::Not(m) => *m != mac,
        }
    }

    /// Specificity: exact 3, not 2, any 1 (see docs/control-language.md, "Which route wins").
    pub fn score(&self) -> u8 {
        match self {
            MacMatch::Exact(_) => 3,
            MacMatch::Not(_) => 2,
            MacMatch::Any => 1,
        }
    }
}

impl fmt::Display for MacMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MacMatch::Any => write!(f, "any"),
            MacMatch::Exact(m) if m.is_broadcast() => write!(f, "broadcast"),
            MacMatch::Exact(m) => write!(f, "{m}"),
            MacMatch::Not(m) if m.is_broadcast() => write!(f, "not broadcast"),
            MacMatch::Not(m) => write!(f, "not {m}"),
        }
    }
}

/// A route rule as the forwarding core sees it: its VNI is that of its destination port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRule {
    pub vni: u32,
    pub src: MacMatch,
    pub dst: MacMatch,
    pub dest: PortId,
}

impl RouteRule {
    fn rank(&self) -> (u8, u8) {
        (self.dst.score(), self.src.score())
    }
}

/// Shards of a VNI's exact-destination rules: a change copies one shard, not the table.
const SHARDS: usize = 64;

/// The rules of one VNI, indexed by destination: those for one exact MAC, and the wildcards
/// (`any`, `not MAC`) that can match any destination. Each keeps its rules in the order they
/// were added, which is the configuration's order. A destination's rules are shared too
/// (`Arc<[RouteRule]>`), so that copying a shard copies no rule list (one allocation for
/// the shard's table, none per destination).
#[derive(Debug, Clone, Default)]
struct VniRules {
    exact: Vec<Arc<crate::FastMap<MacAddr, Arc<[RouteRule]>>>>,
    wild: Vec<RouteRule>,
    len: usize,
}

fn shard(mac: MacAddr) -> usize {
    let m = mac.0;
    (m[5] ^ m[4].rotate_left(3) ^ m[3].rotate_left(5)) as usize % SHARDS
}

impl VniRules {
    fn exact_rules(&self, dst: MacAddr) -> &[RouteRule] {
        self.exact
            .get(shard(dst))
            .and_then(|s| s.get(&dst))
            .map_or(&[], |rs| &rs[..])
    }
}

/// The rule table, per VNI and by destination, so that a frame's candidates are the rules
/// for its destination MAC and the wildcard rules, and a route change touches one entry. The
/// exact-destination rules are in shards shared between copies of the table (copy on write):
/// publishing a table after a change copies one shard. [`crate::RouteCache`] makes the common
/// lookup O(1).
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    by_vni: crate::FastMap<u32, VniRules>,
}

impl RouteTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule after the others of its destination.
    pub fn insert(&mut self, rule: RouteRule) {
        let v = self.by_vni.entry(rule.vni).or_default();
        v.len += 1;
        match rule.dst {
            MacMatch::Exact(d) => {
                if v.exact.is_empty() {
                    v.exact = (0..SHARDS).map(|_| Default::default()).collect();
                }
                let rs = Arc::make_mut(&mut v.exact[shard(d)]).entry(d).or_default();
                *rs = rs.iter().copied().chain([rule]).collect();
            }
            _ => v.wild.push(rule),
        }
    }

    /// Removes one rule equal to `rule` (the first); false when there is none.
    pub fn remove(&mut self, rule: &RouteRule) -> bool {
        let Some(v) = self.by_vni.get_mut(&rule.vni) else {
            return false;
        };
        let removed = match rule.dst {
            MacMatch::Exact(d) => {
                let i = shard(d);
                let present = v
                    .exact
                    .get(i)
                    .and_then(|s| s.get(&d))
                    .is_some_and(|rs| rs.contains(rule));
                if present {
                    let s = Arc::make_mut(&mut v.exact[i]);
                    if let Some(rs) = s.get_mut(&d) {
                        if let Some(p) = rs.iter().position(|r| r == rule) {
                            let mut left = rs.to_vec();
                            left.remove(p);
                            *rs = left.into();
                        }
                        if rs.is_empty() {
                            s.remove(&d);
                        }
                    }
                }
                present
            }
            _ => match v.wild.iter().position(|r| r == rule) {
                Some(p) => {
                    v.wild.remove(p);
                    true
                }
                None => false,
            },
        };
        if removed {
            v.len -= 1;
            if v.len == 0 {
                self.by_vni.remove(&rule.vni);
            }
        }
        removed
    }

    /// Removes every rule of `vni` whose destination port is `dest` (a port going); returns
    /// them. Scans the VNI's rules.
    pub fn remove_dest(&mut self, vni: u32, dest: PortId) -> Vec<RouteRule> {
        let gone: Vec<RouteRule> = match self.by_vni.get(&vni) {
            Some(v) => v
                .wild
                .iter()
                .chain(
                    v.exact
                        .iter()
                        .flat_map(|s| s.values().flat_map(|rs| rs.iter())),
                )
                .filter(|r| r.dest == dest)
                .copied()
                .collect(),
            None => return Vec::new(),
        };
        for r in &gone {
            self.remove(r);
        }
        gone
    }

    pub fn len(&self) -> usize {
        self.by_vni.values().map(|v| v.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rules of `vni` whose destination is exactly `dst`, in order.
    pub fn exact_rules(&self, vni: u32, dst: MacAddr) -> &[RouteRule] {
        self.by_vni.get(&vni).map_or(&[], |v| v.exact_rules(dst))
    }

    /// The rules of `vni` whose destination is `any` or `not MAC`, in order.
    pub fn wild_rules(&self, vni: u32) -> &[RouteRule] {
        self.by_vni.get(&vni).map_or(&[], |v| v.wild.as_slice())
    }

    /// The exact destinations of `vni` with their rules.
    pub fn exact_groups(&self, vni: u32) -> impl Iterator<Item = (MacAddr, &[RouteRule])> {
        self.by_vni
            .get(&vni)
            .into_iter()
            .flat_map(|v| v.exact.iter())
            .flat_map(|s| s.iter().map(|(d, rs)| (*d, &rs[..])))
    }

    /// Every rule, per VNI and destination (`None`: the wildcards), each group in order.
    pub fn groups(&self) -> std::collections::BTreeMap<(u32, Option<MacAddr>), Vec<RouteRule>> {
        let mut out = std::collections::BTreeMap::new();
        for (vni, v) in &self.by_vni {
            if !v.wild.is_empty() {
                out.insert((*vni, None), v.wild.clone());
            }
            for s in &v.exact {
                for (d, rs) in s.iter() {
                    out.insert((*vni, Some(*d)), rs.to_vec());
                }
            }
        }
        out
    }

    /// The destinations of the best-ranked rules matching (src, dst) in `vni`, in rule order,
    /// without duplicates. Empty when no rule matches. The exact-destination rules come
    /// first: any of them that matches outranks every wildcard, so the order among the best
    /// is the order of one group.
    pub fn lookup(&self, vni: u32, src: MacAddr, dst: MacAddr) -> Vec<PortId> {
        let Some(v) = self.by_vni.get(&vni) else {
            return Vec::new();
        };
        let mut best = (0u8, 0u8);
        let mut out: Vec<PortId> = Vec::new();
        for r in v.exact_rules(dst).iter().chain(v.wild.iter()) {
            if !(r.src.matches(src) && r.dst.matches(dst)) {
                continue;
            }
            let rank = r.rank();
            if rank > best {
                best = rank;
                out.clear();
            }
            if rank == best && !out.contains(&r.dest) {
                out.push(r.dest);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mac;

    fn rule(src: MacMatch, dst: MacMatch, dest: u32) -> RouteRule {
        RouteRule {
            vni: 1,
            src,
            dst,
            dest: PortId(dest),
        }
    }

    #[test]
    fn exact_destination_beats_any() {
        let mut t = RouteTable::new();
        t.insert(rule(MacMatch::Exact(mac(1)), MacMatch::Any, 1));
        t.insert(rule(MacMatch::Any, MacMatch::Exact(mac(2)), 2));
        assert_eq!(t.lookup(1, mac(1), mac(2)), vec![PortId(2)]);
        assert_eq!(t.lookup(1, mac(1), mac(3)), vec![PortId(1)]);
        assert!(t.lookup(1, mac(4), mac(3)).is_empty());
    }

    #[test]
    fn source_breaks_ties_and_not_ranks_between() {
        let mut t = RouteTable::new();
        t.insert(rule(MacMatch::Any, MacMatch::Exact(mac(2)), 1));
        t.insert(rule(MacMatch::Not(mac(9)), MacMatch::Exact(mac(2)), 2));
        t.insert(rule(MacMatch::Exact(mac(1)), MacMatch::Exact(mac(2)), 3));
        assert_eq!(t.lookup(1, mac(1), mac(2)), vec![PortId(3)]);
        assert_eq!(t.lookup(1, mac(5), mac(2)), vec![PortId(2)]);
        assert_eq!(t.lookup(1, mac(9), mac(2)), vec![PortId(1)]);
        // not-dst ranks above any-dst
        let mut t = RouteTable::new();
        t.insert(rule(MacMatch::Any, MacMatch::Any, 1));
        t.insert(rule(MacMatch::Any, MacMatch::Not(mac(7)), 2));
        assert_eq!(t.lookup(1, mac(1), mac(2)), vec![PortId(2)]);
        assert_eq!(t.lookup(1, mac(1), mac(7)), vec![PortId(1)]);
    }

    #[test]
    fn equal_rank_gives_every_destination_once() {
        let mut t = RouteTable::new();
        t.insert(rule(MacMatch::Any, MacMatch::Exact(MacAddr::BROADCAST), 1));
        t.insert(rule(MacMatch::Any, MacMatch::Exact(MacAddr::BROADCAST), 2));
        t.insert(rule(MacMatch::Any, MacMatch::Exact(MacAddr::BROADCAST), 1));
        assert_eq!(
            t.lookup(1, mac(1), MacAddr::BROADCAST),
            vec![PortId(1), PortId(2)]
        );
    }

    #[test]
    fn vnis_do_not_mix() {
        let mut t = RouteTable::new();
        t.insert(rule(MacMatch::Any, MacMatch::Any, 1));
        assert!(t.lookup(2, mac(1), mac(2)).is_empty());
    }

    #[test]
    fn display() {
        assert_eq!(MacMatch::Exact(MacAddr::BROADCAST).to_string(), "broadcast");
        assert_eq!(MacMatch::Not(mac(1)).to_string(), "not 52:54:00:00:00:01");
    }

    proptest::proptest! {
        /// Any sequence of insertions and removals leaves the table (its groups, in order, and
        /// every lookup) a table built from the final rules in order would be.
        #[test]
        fn insert_and_remove_equal_a_fresh_table(
            ops in proptest::collection::vec((proptest::bool::weighted(0.6), 0usize..20, 1u32..3, 0u8..5, 0u8..5, 0u8..3, 0u32..4), 0..60),
        ) {
            let m = |k: u8, n: u8| match n {
                0 => MacMatch::Any,
                1 => MacMatch::Not(mac(k)),
                _ => MacMatch::Exact(mac(k)),
            };
            let mut rules: Vec<RouteRule> = Vec::new();
            let mut t = RouteTable::new();
            for (add, pick, vni, s, d, kind, dest) in ops {
                if add || rules.is_empty() {
                    let r = RouteRule { vni, src: m(s, kind % 2 * 2), dst: m(d, kind), dest: PortId(dest) };
                    rules.push(r);
                    t.insert(r);
                } else {
                    // The first equal rule goes, as `remove` takes the first.
                    let r = rules[pick % rules.len()];
                    let first = rules.iter().position(|x| *x == r).unwrap_or(0);
                    rules.remove(first);
                    proptest::prop_assert!(t.remove(&r));
                }
                let mut fresh = RouteTable::new();
                for r in &rules {
                    fresh.insert(*r);
                }
                proptest::prop_assert_eq!(t.groups(), fresh.groups());
                proptest::prop_assert_eq!(t.len(), rules.len());
                for vni in 1..3 {
                    for s in 0..5 {
                        for d in 0..5 {
                            proptest::prop_assert_eq!(t.lookup(vni, mac(s), mac(d)), fresh.lookup(vni, mac(s), mac(d)));
                        }
                    }
                }
            }
        }
    }
}
