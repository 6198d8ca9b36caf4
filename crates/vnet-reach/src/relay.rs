//! A relay's admission and accounting: which endpoints belong to which members (bound by their
//! authenticated pings), and whether a relay datagram may go on. One datagram out per datagram
//! in, the same size, only between current members, within a token bucket per (source,
//! destination) pair: a relay cannot be used to amplify, nor to reach a host outside the
//! overlay, and one member can cost it only its pair's budget. The data path's VXLAN reader
//! calls [`RelayTable::forward`] per datagram; the reach thread binds and expires, and hands
//! the pairs admitted here to the kernel ([`RelayTable::kernel_pairs`]), which forwards their
//! datagrams from then on within a budget of its own and reports what it did
//! ([`RelayTable::kernel_counted`]).

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

/// A pair the kernel may forward: datagrams from `from` (member `src`'s binding) carrying
/// `dst`'s tag go to `to` (member `dst`'s binding) carrying `src`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelPair {
    pub from: SocketAddr,
    pub src: Tag,
    pub dst: Tag,
    pub to: SocketAddr,
}

#[derive(Debug)]
pub struct RelayTable {
    members: HashSet<Tag>,
    by_tag: HashMap<Tag, Binding>,
    by_endpoint: HashMap<SocketAddr, Tag>,
    pairs: HashMap<(Tag, Tag), (TokenBucket, u64)>,
    /// A pair was admitted for the first time since [`RelayTable::take_new_pairs`].
    new_pairs: bool,
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
            new_pairs: false,
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

    /// Each pair's budget: bits per second and burst bytes.
    pub fn budget(&self) -> (u64, u64) {
        (self.rate_bps, self.burst_bytes)
    }

    /// The pairs admitted here that the kernel may forward now: both members bound (where to
    /// as the bindings say now), their budget not forgotten (used within the last minute, here
    /// or in the kernel). A pair not listed is one the kernel must stop forwarding.
    pub fn kernel_pairs(&self) -> Vec<KernelPair> {
        let mut v: Vec<KernelPair> = self
            .pairs
            .keys()
            .filter_map(|&(src, dst)| {
                Some(KernelPair {
                    from: self.by_tag.get(&src)?.endpoint,
                    src,
                    dst,
                    to: self.by_tag.get(&dst)?.endpoint,
                })
            })
            .collect();
        v.sort();
        v
    }

    /// Whether a pair was admitted for the first time since the last call (the kernel should
    /// take it now: until then its datagrams cost vnetd a read and a send each).
    pub fn take_new_pairs(&mut self) -> bool {
        std::mem::take(&mut self.new_pairs)
    }

    /// The kernel forwarded `frames` datagrams (`bytes`) of pair (`src`, `dst`) and refused
    /// `rate_limited` over its budget since it last said: counted as if done here, and the
    /// pair is in use.
    pub fn kernel_counted(
        &mut self,
        src: Tag,
        dst: Tag,
        (frames, bytes, rate_limited): (u64, u64, u64),
        now_ms: u64,
    ) {
        let c = &mut self.counters;
        c.forwarded += frames;
        c.forwarded_bytes += bytes;
        c.rate_limited += rate_limited;
        if frames + rate_limited > 0 {
            if let Some((_, last)) = self.pairs.get_mut(&(src, dst)) {
                *last = now_ms;
            }
        }
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
        let new_pairs = &mut self.new_pairs;
        let (bucket, last) = self.pairs.entry((src, dst)).or_insert_with(|| {
            *new_pairs = true;
            (TokenBucket::new(rate, burst, now_ns), now_ms)
        });
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
    fn the_kernel_gets_admitted_pairs_of_bound_members_and_keeps_them_alive() {
        let mut t = table();
        assert!(t.kernel_pairs().is_empty(), "nothing admitted yet");
        assert!(!t.take_new_pairs());
        // Refused datagrams admit no pair the kernel could take.
        let _ = t.forward(ep("203.0.113.1:4790"), B, 100, 0);
        let _ = t.forward(ep("203.0.113.1:4789"), X, 100, 0);
        assert!(t.kernel_pairs().is_empty());
        assert!(t.forward(ep("203.0.113.1:4789"), B, 100, 0).is_ok());
        assert!(
            t.take_new_pairs(),
            "a new pair: the kernel should take it now"
        );
        assert!(t.forward(ep("203.0.113.1:4789"), B, 100, 0).is_ok());
        assert!(!t.take_new_pairs(), "said once");
        let ab = KernelPair {
            from: ep("203.0.113.1:4789"),
            src: A,
            dst: B,
            to: ep("198.51.100.2:50000"),
        };
        assert_eq!(t.kernel_pairs(), vec![ab]);
        // B's binding moves: the pair follows it.
        assert!(t.bind(B, ep("198.51.100.2:50001"), 1_000));
        assert_eq!(t.kernel_pairs()[0].to, ep("198.51.100.2:50001"));
        // What the kernel forwarded and refused is counted here and keeps the pair's budget
        // alive.
        t.kernel_counted(A, B, (10, 15_000, 2), 50_000);
        assert_eq!(t.counters.forwarded, 12, "2 here, 10 in the kernel");
        assert_eq!(t.counters.forwarded_bytes, 15_200);
        assert_eq!(t.counters.rate_limited, 2);
        t.bind(A, ep("203.0.113.1:4789"), 100_000);
        t.bind(B, ep("198.51.100.2:50001"), 100_000);
        t.expire(100_000);
        assert_eq!(t.kernel_pairs().len(), 1, "used 50 s ago: kept");
        t.bind(A, ep("203.0.113.1:4789"), 115_000);
        t.bind(B, ep("198.51.100.2:50001"), 115_000);
        t.expire(115_000);
        assert!(t.kernel_pairs().is_empty(), "idle a minute: forgotten");
        // A member whose binding lapses takes its pairs out of the kernel.
        assert!(t
            .forward(ep("203.0.113.1:4789"), B, 100, 120_000_000_000)
            .is_ok());
        assert_eq!(t.kernel_pairs().len(), 1);
        t.expire(115_000 + BINDING_TTL_MS + 1);
        assert!(t.kernel_pairs().is_empty());
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
