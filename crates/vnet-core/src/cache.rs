//! The hash route cache over the rule table (VNET/P section 4.2), one per forwarding thread so
//! lookups take no lock.
//!
//! Why selective: a daemon on a large overlay publishes a new forwarding table for every
//! route event (a guest moving somewhere), and a cache that emptied itself at each one would
//! recompute every flow's decision many times a second. A published table says what it
//! changed ([`crate::ForwardingTable::changes_since`]: destinations of a VNI, a VNI's
//! wildcards, or everything), so the cache forgets only the decisions for those destinations.
//! It still empties itself when the learning table changed (a learned MAC bears on unknown
//! unicast and floods), when it falls too far behind the table's change log, and when it holds
//! `capacity` entries (a guest spraying random MACs cannot grow it).

use vnet_wire::MacAddr;

use crate::{Decision, FastMap, ForwardingTable, PortId, TableChange, Touched};

/// More changed places than this in one step: the cache is emptied rather than searched.
const MAX_SELECTIVE: usize = 64;

#[derive(Debug)]
pub struct RouteCache {
    /// The table's generation and the learning table's the entries were computed at.
    generation: (u64, u64),
    capacity: usize,
    map: FastMap<(PortId, MacAddr, MacAddr), Decision>,
    hits: u64,
    misses: u64,
    /// Entries forgotten one by one (selectively), and times the whole cache was emptied.
    forgotten: u64,
    emptied: u64,
}

impl RouteCache {
    pub fn new(capacity: usize) -> Self {
        RouteCache {
            generation: (u64::MAX, u64::MAX),
            capacity: capacity.max(1),
            map: FastMap::default(),
            hits: 0,
            misses: 0,
            forgotten: 0,
            emptied: 0,
        }
    }

    /// The cached decision for the key (ingress, src, dst) in `table`, computing and
    /// remembering it on a miss. `learn_generation` is the learning table's (0 without
    /// learning).
    pub fn lookup(
        &mut self,
        table: &ForwardingTable,
        learn_generation: u64,
        key: (PortId, MacAddr, MacAddr),
        compute: impl FnOnce() -> Decision,
    ) -> &Decision {
        let generation = (table.generation(), learn_generation);
        if generation != self.generation {
            self.follow(table, learn_generation);
        }
        if self.map.contains_key(&key) {
            self.hits += 1;
        } else {
            self.misses += 1;
            if self.map.len() >= self.capacity {
                self.clear();
            }
            self.map.insert(key, compute());
        }
        // The entry was just ensured above.
        &self.map[&key]
    }

    /// Brings the cache to `table`: forgets the decisions its changes since the cache's
    /// generation bear on, or everything when that is not known.
    fn follow(&mut self, table: &ForwardingTable, learn_generation: u64) {
        let (cached, cached_learn) = self.generation;
        self.generation = (table.generation(), learn_generation);
        if self.map.is_empty() {
            return;
        }
        if cached_learn != learn_generation {
            return self.clear();
        }
        let mut places: Vec<Touched> = Vec::new();
        let Some(changes) = table.changes_since(cached) else {
            return self.clear();
        };
        for c in changes {
            match c {
                TableChange::Some(t) if places.len() + t.len() <= MAX_SELECTIVE => {
                    places.extend(t.iter().copied());
                }
                _ => return self.clear(),
            }
        }
        let before = self.map.len();
        self.map
            .retain(|(ingress, _, dst), _| match table.port(*ingress) {
                Some(p) => !places.iter().any(|t| t.bears_on(p.vni, *dst)),
                None => false,
            });
        self.forgotten += (before - self.map.len()) as u64;
    }

    fn clear(&mut self) {
        if !self.map.is_empty() {
            self.map.clear();
            self.emptied += 1;
        }
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Times the whole cache was emptied (a change of everything, of learning, or full).
    pub fn emptied(&self) -> u64 {
        self.emptied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mac;
    use crate::{DropReason, MacMatch, PortInfo, PortKind, RouteRule};

    const IF_A: PortId = PortId(1);
    const IF_B: PortId = PortId(2);
    const LINK_X: PortId = PortId(3);
    const IF_V2: PortId = PortId(4);

    fn table() -> ForwardingTable {
        let p = |vni, kind| PortInfo { vni, kind };
        ForwardingTable::new(
            1,
            vec![
                (IF_A, p(1, PortKind::Interface)),
                (IF_B, p(1, PortKind::Interface)),
                (LINK_X, p(1, PortKind::OverlayLink)),
                (IF_V2, p(2, PortKind::Interface)),
            ],
            vec![],
        )
    }

    fn to(vni: u32, dst: MacAddr, dest: PortId) -> RouteRule {
        RouteRule {
            vni,
            src: MacMatch::Any,
            dst: MacMatch::Exact(dst),
            dest,
        }
    }

    /// Looks (ingress, src, dst) up, computing with the table; true when it was a hit.
    fn hit(c: &mut RouteCache, t: &ForwardingTable, key: (PortId, MacAddr, MacAddr)) -> bool {
        let misses = c.misses();
        c.lookup(t, 0, key, || t.decide(key.0, key.1, key.2, false, None));
        c.misses() == misses
    }

    #[test]
    fn a_route_change_forgets_only_its_destination() {
        let mut t = table();
        let mut c = RouteCache::new(64);
        let (to2, to3, v2) = (
            (IF_A, mac(1), mac(2)),
            (IF_A, mac(1), mac(3)),
            (IF_V2, mac(1), mac(2)),
        );
        for k in [to2, to3, v2] {
            assert!(!hit(&mut c, &t, k));
            assert!(hit(&mut c, &t, k));
        }
        // A route to mac(2) in VNI 1: decisions for mac(3) and for VNI 2 stay.
        t.insert_route(to(1, mac(2), LINK_X));
        t.publish(2, TableChange::Some(vec![Touched::Dst(1, mac(2))].into()));
        assert!(
            !hit(&mut c, &t, to2),
            "the changed destination is computed again"
        );
        assert_eq!(
            c.lookup(&t, 0, to2, || unreachable!()),
            &Decision::Forward(vec![LINK_X])
        );
        assert!(hit(&mut c, &t, to3));
        assert!(hit(&mut c, &t, v2));
        assert_eq!(c.emptied(), 0);
        // A wildcard change forgets the whole VNI, not the other.
        t.publish(3, TableChange::Some(vec![Touched::Wild(1)].into()));
        assert!(!hit(&mut c, &t, to3));
        assert!(hit(&mut c, &t, v2));
        // Everything (ports changed): all of it.
        t.publish(4, TableChange::All);
        assert!(!hit(&mut c, &t, v2));
        assert_eq!(c.emptied(), 1);
    }

    #[test]
    fn several_publications_at_once_and_a_log_too_short() {
        let mut t = table();
        let mut c = RouteCache::new(64);
        let (to2, to3) = ((IF_A, mac(1), mac(2)), (IF_A, mac(1), mac(3)));
        hit(&mut c, &t, to2);
        hit(&mut c, &t, to3);
        for g in 2..5 {
            t.publish(g, TableChange::Some(vec![Touched::Dst(1, mac(9))].into()));
        }
        t.publish(5, TableChange::Some(vec![Touched::Dst(1, mac(2))].into()));
        assert!(!hit(&mut c, &t, to2));
        assert!(hit(&mut c, &t, to3), "four publications followed at once");
        // A cache further behind than the log: emptied.
        for g in 6..(7 + crate::CHANGE_LOG_DEPTH as u64) {
            t.publish(g, TableChange::Some(vec![Touched::Dst(1, mac(9))].into()));
        }
        assert!(!hit(&mut c, &t, to3));
        assert_eq!(c.emptied(), 1);
        // A table built anew has no log: emptied too.
        let fresh = table();
        assert!(!hit(&mut c, &fresh, to3));
        assert_eq!(c.emptied(), 2);
    }

    #[test]
    fn a_learning_change_and_a_full_cache_empty_it() {
        let t = table();
        let mut c = RouteCache::new(2);
        let k = (IF_A, mac(1), mac(2));
        assert_eq!(
            c.lookup(&t, 0, k, || Decision::Forward(vec![IF_B])),
            &Decision::Forward(vec![IF_B])
        );
        assert_eq!(
            c.lookup(&t, 0, k, || unreachable!()),
            &Decision::Forward(vec![IF_B])
        );
        assert_eq!(
            c.lookup(&t, 1, k, || Decision::Drop(DropReason::NoRoute)),
            &Decision::Drop(DropReason::NoRoute)
        );
        assert_eq!((c.hits(), c.misses()), (1, 2));
        for i in 0..10 {
            c.lookup(&t, 1, (IF_A, mac(i), mac(2)), || {
                Decision::Drop(DropReason::NoRoute)
            });
        }
        assert!(c.len() <= 2);
    }

    #[test]
    fn a_port_that_went_takes_its_entries() {
        let mut t = table();
        let mut c = RouteCache::new(64);
        let from_b = (IF_B, mac(1), mac(2));
        hit(&mut c, &t, from_b);
        t.remove_port(IF_B);
        t.publish(2, TableChange::Some(Vec::new().into()));
        assert!(!hit(&mut c, &t, from_b));
    }
}
