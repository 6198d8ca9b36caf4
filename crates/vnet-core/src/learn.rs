//! MAC learning (`set learn on`): which port a (VNI, MAC) was last seen on, bounded in size
//! and aged out, so a guest spraying source MACs cannot grow memory. Pure: the caller passes
//! the time; the forwarding decision reads it after the route table.

use vnet_wire::MacAddr;

use crate::{FastMap, PortId};

/// How long a learned MAC stays without being seen again.
pub const LEARN_AGE_MS: u64 = 300_000;
/// At most this many learned MACs; beyond, new MACs are not learned until old ones expire.
pub const LEARN_CAPACITY: usize = 65536;

/// The MAC learning table of `set learn on`: (VNI, MAC) → the port it was last seen on.
/// Time comes in as milliseconds from the caller, so this stays pure and testable.
#[derive(Debug)]
pub struct LearnTable {
    map: FastMap<(u32, MacAddr), (PortId, u64)>,
    capacity: usize,
    generation: u64,
    refused: u64,
}

impl Default for LearnTable {
    fn default() -> Self {
        Self::new(LEARN_CAPACITY)
    }
}

impl LearnTable {
    pub fn new(capacity: usize) -> Self {
        LearnTable {
            map: FastMap::default(),
            capacity,
            generation: 0,
            refused: 0,
        }
    }

    /// Bumped whenever a MAC appears or moves, so route caches drop stale decisions.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// MACs that could not be learned because the table was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `observe` would change anything (a cheap read-only check for the hot path).
    pub fn is_current(&self, vni: u32, mac: MacAddr, port: PortId, now_ms: u64) -> bool {
        matches!(self.map.get(&(vni, mac)), Some((p, seen)) if *p == port && now_ms.saturating_sub(*seen) < LEARN_AGE_MS / 2)
    }

    /// Records that `mac` was seen on `port`. Group addresses are never learned.
    pub fn observe(&mut self, vni: u32, mac: MacAddr, port: PortId, now_ms: u64) {
        if mac.is_multicast() {
            return;
        }
        if let Some(e) = self.map.get_mut(&(vni, mac)) {
            if e.0 != port {
                self.generation += 1;
            }
            *e = (port, now_ms);
            return;
        }
        if self.map.len() >= self.capacity {
            self.expire(now_ms);
            if self.map.len() >= self.capacity {
                self.refused += 1;
                return;
            }
        }
        self.map.insert((vni, mac), (port, now_ms));
        self.generation += 1;
    }

    pub fn lookup(&self, vni: u32, mac: MacAddr, now_ms: u64) -> Option<PortId> {
        self.map
            .get(&(vni, mac))
            .filter(|(_, seen)| now_ms.saturating_sub(*seen) < LEARN_AGE_MS)
            .map(|(p, _)| *p)
    }

    pub fn expire(&mut self, now_ms: u64) {
        let before = self.map.len();
        self.map
            .retain(|_, (_, seen)| now_ms.saturating_sub(*seen) < LEARN_AGE_MS);
        if self.map.len() != before {
            self.generation += 1;
        }
    }

    /// Forgets everything learned on a port that went away.
    pub fn remove_port(&mut self, port: PortId) {
        let before = self.map.len();
        self.map.retain(|_, (p, _)| *p != port);
        if self.map.len() != before {
            self.generation += 1;
        }
    }

    pub fn clear(&mut self) {
        if !self.map.is_empty() {
            self.map.clear();
            self.generation += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mac;

    #[test]
    fn learns_moves_and_ages() {
        let mut t = LearnTable::new(4);
        t.observe(1, mac(1), PortId(1), 0);
        assert_eq!(t.lookup(1, mac(1), 10), Some(PortId(1)));
        assert_eq!(t.lookup(2, mac(1), 10), None);
        let g = t.generation();
        t.observe(1, mac(1), PortId(2), 20);
        assert!(t.generation() > g);
        assert_eq!(t.lookup(1, mac(1), 30), Some(PortId(2)));
        assert_eq!(t.lookup(1, mac(1), 20 + LEARN_AGE_MS), None);
        t.observe(1, MacAddr::BROADCAST, PortId(1), 0);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn bounded() {
        let mut t = LearnTable::new(2);
        for i in 0..5 {
            t.observe(1, mac(i), PortId(1), 0);
        }
        assert_eq!(t.len(), 2);
        assert_eq!(t.refused(), 3);
        // after expiry there is room again
        t.observe(1, mac(9), PortId(1), LEARN_AGE_MS + 1);
        assert_eq!(t.lookup(1, mac(9), LEARN_AGE_MS + 2), Some(PortId(1)));
    }

    #[test]
    fn remove_port() {
        let mut t = LearnTable::new(8);
        t.observe(1, mac(1), PortId(1), 0);
        t.observe(1, mac(2), PortId(2), 0);
        t.remove_port(PortId(1));
        assert_eq!(t.lookup(1, mac(1), 0), None);
        assert_eq!(t.lookup(1, mac(2), 0), Some(PortId(2)));
    }
}
