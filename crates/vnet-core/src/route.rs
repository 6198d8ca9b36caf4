use std::fmt;

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

/// The rule table: a linear list per VNI, as in VNET/P; [`crate::RouteCache`] makes the common
/// lookup O(1).
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    by_vni: crate::FastMap<u32, Vec<RouteRule>>,
}

impl RouteTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, rule: RouteRule) {
        self.by_vni.entry(rule.vni).or_default().push(rule);
    }

    pub fn len(&self) -> usize {
        self.by_vni.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The destinations of the best-ranked rules matching (src, dst) in `vni`, in rule order,
    /// without duplicates. Empty when no rule matches.
    pub fn lookup(&self, vni: u32, src: MacAddr, dst: MacAddr) -> Vec<PortId> {
        let Some(rules) = self.by_vni.get(&vni) else {
            return Vec::new();
        };
        let mut best = (0u8, 0u8);
        let mut out: Vec<PortId> = Vec::new();
        for r in rules {
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
}
