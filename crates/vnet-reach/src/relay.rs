//! A relay's admission and accounting: which endpoints belong to which members (bound by their
//! authenticated pings), and whether a relay datagram may go on. One datagram out per datagram
//! in, the same size, only between current members, within a token bucket per (source,
//! destination) pair: a relay cannot be used to amplify, nor to reach a host outside the
//! overlay, and one member can cost it only its pair's budget. The data path's VXLAN reader
//! calls [`RelayTable::forward`] per datagram; the reach thread binds and expires.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use vnet_core::TokenBucket;

use crate::endpoint::canonical;
use crate::keys::Tag;

/// A binding lapses this long after its member's last ping.
pub const BINDING_TTL_MS: u64 = 15_000;
/// A pair's bucket idle this long is forgotten.
const PAIR_IDLE_MS: u64 = 60_000;

/// Why a relay datagram was not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayRefusal {
    /// It came from an endpoint no member bound.
    UnboundSource,
    /// Its destination is not a member bound to this relay.
    UnknownDestination,
    /// The pair's budget is spent.
    RateLimited,
    /// Source and destination are the same member.
    ToSelf,
}

impl RelayRefusal {
    pub fn as_str(self) -> &'static str {
        match self {
            RelayRefusal::UnboundSource => "unbound_source",
            RelayRefusal::UnknownDestination => "unknown_destination",
            RelayRefusal::RateLimited => "rate_limited",
            RelayRefusal::ToSelf => "to_self",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Binding {
    endpoint: SocketAddr,
    last_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayCounters {
    pub forwarded: u64,
    pub forwarded_bytes: u64,
    pub unbound_source: u64,
    pub unknown_destination: u64,
    pub rate_limited: u64,
    pub to_self: u64,
    /// Binding pings from keys that are not members (never bound).
    pub refused_bindings: u64,
}

#[derive(Debug)]
pub struct RelayTable {
    members: HashSet<Tag>,
    by_tag: HashMap<Tag, Binding>,
    by_endpoint: HashMap<SocketAddr, Tag>,
    pairs: HashMap<(Tag, Tag), (TokenBucket, u64)>,
    rate_bps: u64,
    burst_bytes: u64,
    max_bindings: usize,
    pub counters: RelayCounters,
}

impl RelayTable {
    /// A relay that lets each pair of members send `rate_bps` (bursts of `burst_bytes`) and
    /// holds at most `max_bindings` members' bindings.
    pub fn new(rate_bps: u64, burst_bytes: u64, max_bindings: usize) -> RelayTable {
        RelayTable {
            members: HashSet::new(),
            by_tag: HashMap::new(),
            by_endpoint: HashMap::new(),
            pairs: HashMap::new(),
            rate_bps,
            burst_bytes,
            max_bindings,
            counters: RelayCounters::default(),
        }
    }

    /// The overlay's members now: bindings of hosts that left go at once.
    pub fn set_members(&mut self, members: impl IntoIterator<Item = Tag>) {
        self.members = members.into_iter().collect();
        let gone: Vec<Tag> = self
            .by_tag
            .keys()
            .filter(|t| !self.members.contains(t))
            .copied()
            .collect();
        for t in gone {
            self.unbind(t);
        }
        self.pairs
            .retain(|(a, b), _| self.members.contains(a) && self.members.contains(b));
    }

    fn unbind(&mut self, tag: Tag) {
        if let Some(b) = self.by_tag.remove(&tag) {
            if self.by_endpoint.get(&b.endpoint) == Some(&tag) {
                self.by_endpoint.remove(&b.endpoint);
            }
        }
    }

    /// Member `tag`'s authenticated binding ping came from `endpoint`. Refused (false) for a
    /// non-member, or when the table is full of other members' live bindings.
    pub fn bind(&mut self, tag: Tag, endpoint: SocketAddr, now_ms: u64) -> bool {
        if !self.members.contains(&tag) {
            self.counters.refused_bindings += 1;
            return false;
        }
        let endpoint = canonical(endpoint);
        if !self.by_tag.contains_key(&tag) && self.by_tag.len() >= self.max_bindings {
            self.expire(now_ms);
            if self.by_tag.len() >= self.max_bindings {
                self.counters.refused_bindings += 1;
                return false;
            }
        }
        self.unbind(tag);
        // An endpoint belongs to one member: the latest binding wins (a NAT reused a port).
        if let Some(old) = self.by_endpoint.get(&endpoint).copied() {
            self.by_tag.remove(&old);
        }
        self.by_tag.insert(
            tag,
            Binding {
                endpoint,
                last_ms: now_ms,
            },
        );
        self.by_endpoint.insert(endpoint, tag);
        true
    }

    /// Drops bindings and pair budgets that lapsed.
    pub fn expire(&mut self, now_ms: u64) {
        let lapsed: Vec<Tag> = self
            .by_tag
            .iter()
            .filter(|(_, b)| now_ms.saturating_sub(b.last_ms) > BINDING_TTL_MS)
            .map(|(t, _)| *t)
            .collect();
        for t in lapsed {
            self.unbind(t);
        }
        self.pairs
            .retain(|_, (_, last)| now_ms.saturating_sub(*last) <= PAIR_IDLE_MS);
    }

    pub fn bindings(&self) -> usize {
        self.by_tag.len()
    }

    /// Whether `tag` is bound here now.
    pub fn is_bound(&self, tag: Tag) -> bool {
        self.by_tag.contains_key(&tag)
    }

    /// A relay datagram of `len` bytes from `from` for member `dst`: the source's tag (to write
    /// into the header) and where to send it, or why not. Every outcome is counted.
    pub fn forward(
        &mut self,
        from: SocketAddr,
        dst: Tag,
        len: usize,
        now_ns: u64,
    ) -> Result<(Tag, SocketAddr), RelayRefusal> {
        let r = self.admit(canonical(from), dst, len, now_ns);
        let c = &mut self.counters;
        match r {
            Ok(_) => {
                c.forwarded += 1;
                c.forwarded_bytes += len as u64;
            }
            Err(RelayRefusal::UnboundSource) => c.unbound_source += 1,
            Err(RelayRefusal::UnknownDestination) => c.unknown_destination += 1,
            Err(RelayRefusal::RateLimited) => c.rate_limited += 1,
            Err(RelayRefusal::ToSelf) => c.to_self += 1,
        }
        r
    }

    fn admit(
        &mut self,
        from: SocketAddr,
        dst: Tag,
        len: usize,
        now_ns: u64,
    ) -> Result<(Tag, SocketAddr), RelayRefusal> {
        let src = *self
            .by_endpoint
            .get(&from)
            .ok_or(RelayRefusal::UnboundSource)?;
        if src == dst {
            return Err(RelayRefusal::ToSelf);
        }
        let to = self
            .by_tag
            .get(&dst)
            .ok_or(RelayRefusal::UnknownDestination)?
            .endpoint;
        let now_ms = now_ns / 1_000_000;
        let (rate, burst) = (self.rate_bps, self.burst_bytes);
        let (bucket, last) = self
            .pairs
            .entry((src, dst))
            .or_insert_with(|| (TokenBucket::new(rate, burst, now_ns), now_ms));
        *last = now_ms;
        if !bucket.admit(now_ns, len) {
            return Err(RelayRefusal::RateLimited);
        }
        Ok((src, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }
    const A: Tag = Tag([1; 8]);
    const B: Tag = Tag([2; 8]);
    const X: Tag = Tag([9; 8]);

    fn table() -> RelayTable {
        let mut t = RelayTable::new(8_000_000, 10_000, 16);
        t.set_members([A, B]);
        assert!(t.bind(A, ep("203.0.113.1:4789"), 0));
        assert!(t.bind(B, ep("198.51.100.2:50000"), 0));
        t
    }

    #[test]
    fn forwards_between_bound_members_only() {
        let mut t = table();
        assert_eq!(
            t.forward(ep("203.0.113.1:4789"), B, 100, 0),
            Ok((A, ep("198.51.100.2:50000")))
        );
        assert_eq!(
            t.forward(ep("[::ffff:198.51.100.2]:50000"), A, 100, 0),
            Ok((B, ep("203.0.113.1:4789")))
        );
        // From an endpoint nobody bound, to a non-member, to itself.
        assert_eq!(
            t.forward(ep("203.0.113.1:4790"), B, 100, 0),
            Err(RelayRefusal::UnboundSource)
        );
        assert_eq!(
            t.forward(ep("203.0.113.1:4789"), X, 100, 0),
            Err(RelayRefusal::UnknownDestination)
        );
        assert_eq!(
            t.forward(ep("203.0.113.1:4789"), A, 100, 0),
            Err(RelayRefusal::ToSelf)
        );
        assert_eq!(t.counters.forwarded, 2);
        assert_eq!(t.counters.unbound_source, 1);
        assert_eq!(t.counters.unknown_destination, 1);
        // A non-member cannot bind.
        assert!(!t.bind(X, ep("192.0.2.1:1"), 0));
        assert_eq!(t.counters.refused_bindings, 1);
    }

    #[test]
    fn each_pair_has_its_budget() {
        let mut t = table();
        // 8 Mbit/s = 1 MB/s, 10 KB burst: 1 s of 1,000-byte datagrams every 100 us is 10 MB.
        let mut passed = 0u64;
        for i in 0..10_000u64 {
            if t.forward(ep("203.0.113.1:4789"), B, 1000, i * 100_000)
                .is_ok()
            {
                passed += 1000;
            }
        }
        assert!(
            (1_000_000..=1_012_000).contains(&passed),
            "{passed} bytes in a second"
        );
        assert!(t.counters.rate_limited > 8_000);
        // The other direction is another pair, untouched.
        assert!(t
            .forward(ep("198.51.100.2:50000"), A, 1000, 999_000_000)
            .is_ok());
    }

    #[test]
    fn bindings_lapse_move_and_leave_with_membership() {
        let mut t = table();
        t.expire(BINDING_TTL_MS);
        assert_eq!(t.bindings(), 2);
        // B's NAT gave it another port: the new binding replaces the old.
        assert!(t.bind(B, ep("198.51.100.2:50001"), 1_000));
        assert_eq!(
            t.forward(ep("198.51.100.2:50000"), A, 10, 0),
            Err(RelayRefusal::UnboundSource)
        );
        assert!(t.forward(ep("198.51.100.2:50001"), A, 10, 0).is_ok());
        // A stops pinging: gone after the TTL.
        t.expire(BINDING_TTL_MS + 1);
        assert!(!t.is_bound(A));
        assert!(t.is_bound(B));
        // B leaves the overlay: unbound at once.
        t.set_members([A]);
        assert_eq!(t.bindings(), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = RelayTable::new(1_000_000, 1000, 3);
        let tags: Vec<Tag> = (0..5u8).map(|i| Tag([i; 8])).collect();
        t.set_members(tags.clone());
        for (i, tag) in tags.iter().enumerate() {
            let ok = t.bind(
                *tag,
                SocketAddr::new("192.0.2.1".parse().unwrap(), 1000 + i as u16),
                0,
            );
            assert_eq!(ok, i < 3);
        }
        // Once the old ones lapse there is room again.
        assert!(t.bind(tags[4], ep("192.0.2.9:1"), BINDING_TTL_MS + 1));
    }
}
