//! What a host knows of how the underlay sees its VXLAN socket: its own addresses, the address
//! the operator advertised, and what observers (peers answering its pings, STUN servers) saw
//! its datagrams come from. From these: the candidates it publishes, and whether a NAT in front
//! of it maps by endpoint (a symmetric NAT: a different public port for each destination).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use crate::endpoint::{canonical, usable};
use crate::keys::Tag;

/// Candidates a host publishes, at most.
pub const MAX_CANDIDATES: usize = 8;
/// An observation older than this no longer counts (a NAT's mapping may have changed).
pub const OBSERVATION_TTL_MS: u64 = 120_000;
/// Observers remembered, at most (the oldest is forgotten).
pub const MAX_OBSERVERS: usize = 32;

/// Where a candidate comes from, in the order they are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CandidateKind {
    /// `--advertise-addr`: the operator's word.
    Advertised,
    /// How an observer saw this host.
    Reflexive,
    /// An address of this host.
    Local,
}

impl CandidateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CandidateKind::Advertised => "advertised",
            CandidateKind::Reflexive => "reflexive",
            CandidateKind::Local => "local",
        }
    }

    pub fn parse(s: &str) -> Option<CandidateKind> {
        match s {
            "advertised" => Some(CandidateKind::Advertised),
            "reflexive" => Some(CandidateKind::Reflexive),
            "local" => Some(CandidateKind::Local),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Candidate {
    pub endpoint: SocketAddr,
    pub kind: CandidateKind,
}

/// How a NAT in front of the host maps its socket, as far as observers tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatMapping {
    /// Fewer than two observers at different addresses have answered.
    Unknown,
    /// Observers saw one of the host's own addresses: no NAT.
    None,
    /// Every observer saw the same public endpoint (a cone NAT, or a 1:1 NAT).
    EndpointIndependent,
    /// Observers saw different public endpoints: a symmetric NAT.
    EndpointDependent,
}

impl NatMapping {
    pub fn as_str(self) -> &'static str {
        match self {
            NatMapping::Unknown => "unknown",
            NatMapping::None => "none",
            NatMapping::EndpointIndependent => "eim",
            NatMapping::EndpointDependent => "edm",
        }
    }

    pub fn parse(s: &str) -> NatMapping {
        match s {
            "none" => NatMapping::None,
            "eim" => NatMapping::EndpointIndependent,
            "edm" => NatMapping::EndpointDependent,
            _ => NatMapping::Unknown,
        }
    }
}

/// Who saw the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Observer {
    Peer(Tag),
    Stun(SocketAddr),
}

#[derive(Debug, Clone, Copy)]
struct Observation {
    seen: SocketAddr,
    observer_ip: IpAddr,
    /// When the observer first saw `seen` (the candidates' order: stable while nothing
    /// changes, so the published record does not either).
    first_ms: u64,
    at_ms: u64,
}

/// The host's view of itself.
#[derive(Debug, Clone)]
pub struct SelfView {
    port: u16,
    local: Vec<IpAddr>,
    advertised: Option<SocketAddr>,
    observed: BTreeMap<Observer, Observation>,
}

impl SelfView {
    /// A host whose VXLAN socket is on `port`, with these addresses of its own.
    pub fn new(port: u16, local: Vec<IpAddr>, advertised: Option<SocketAddr>) -> SelfView {
        let mut v = SelfView {
            port,
            local: Vec::new(),
            advertised: advertised.map(canonical),
            observed: BTreeMap::new(),
        };
        v.set_local(local);
        v
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host's addresses changed (an interface came or went).
    pub fn set_local(&mut self, local: Vec<IpAddr>) {
        let mut l: Vec<IpAddr> = local
            .into_iter()
            .map(|a| a.to_canonical())
            .filter(|a| usable(*a))
            .collect();
        l.sort();
        l.dedup();
        self.local = l;
    }

    fn is_local(&self, ep: SocketAddr) -> bool {
        ep.port() == self.port && self.local.contains(&ep.ip())
    }

    /// An observer at `observer_ip` saw this host's datagrams come from `seen`.
    pub fn observe(&mut self, by: Observer, observer_ip: IpAddr, seen: SocketAddr, now_ms: u64) {
        if !self.observed.contains_key(&by) && self.observed.len() >= MAX_OBSERVERS {
            if let Some(oldest) = self
                .observed
                .iter()
                .min_by_key(|(_, o)| o.at_ms)
                .map(|(k, _)| *k)
            {
                self.observed.remove(&oldest);
            }
        }
        let seen = canonical(seen);
        let first_ms = match self.observed.get(&by) {
            Some(o) if o.seen == seen => o.first_ms,
            _ => now_ms,
        };
        self.observed.insert(
            by,
            Observation {
                seen,
                observer_ip: observer_ip.to_canonical(),
                first_ms,
                at_ms: now_ms,
            },
        );
    }

    fn fresh(&self, now_ms: u64) -> impl Iterator<Item = &Observation> {
        self.observed
            .values()
            .filter(move |o| now_ms.saturating_sub(o.at_ms) <= OBSERVATION_TTL_MS)
    }

    /// What the observations say of a NAT in front of the host.
    pub fn nat(&self, now_ms: u64) -> NatMapping {
        let fresh: Vec<&Observation> = self.fresh(now_ms).collect();
        if fresh.iter().any(|o| self.is_local(o.seen)) {
            return NatMapping::None;
        }
        let mut by_ip: Vec<IpAddr> = fresh.iter().map(|o| o.observer_ip).collect();
        by_ip.sort();
        by_ip.dedup();
        let mut seen: Vec<SocketAddr> = fresh.iter().map(|o| o.seen).collect();
        seen.sort();
        seen.dedup();
        match (by_ip.len(), seen.len()) {
            (n, 1) if n >= 2 => NatMapping::EndpointIndependent,
            (n, s) if n >= 2 && s >= 2 => NatMapping::EndpointDependent,
            _ => NatMapping::Unknown,
        }
    }

    /// The candidates to publish: the advertised endpoint, then what observers saw (the longest
    /// seen first: the list changes only when what is seen does, never with each answer), then
    /// the host's own addresses; no endpoint twice, at most [`MAX_CANDIDATES`].
    pub fn candidates(&self, now_ms: u64) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = Vec::new();
        let mut push = |endpoint: SocketAddr, kind| {
            if out.len() < MAX_CANDIDATES && !out.iter().any(|c| c.endpoint == endpoint) {
                out.push(Candidate { endpoint, kind });
            }
        };
        if let Some(a) = self.advertised {
            push(a, CandidateKind::Advertised);
        }
        let mut fresh: Vec<&Observation> = self.fresh(now_ms).collect();
        fresh.sort_by_key(|o| (o.first_ms, o.seen));
        for o in fresh {
            if !self.is_local(o.seen) && usable(o.seen.ip()) {
                push(o.seen, CandidateKind::Reflexive);
            }
        }
        for ip in &self.local {
            push(SocketAddr::new(*ip, self.port), CandidateKind::Local);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_host_without_nat() {
        let mut v = SelfView::new(4789, vec![ip("10.0.0.1"), ip("127.0.0.1")], None);
        assert_eq!(v.nat(0), NatMapping::Unknown);
        v.observe(
            Observer::Peer(Tag([1; 8])),
            ip("10.0.0.2"),
            ep("10.0.0.1:4789"),
            0,
        );
        assert_eq!(v.nat(0), NatMapping::None);
        assert_eq!(
            v.candidates(0),
            vec![Candidate {
                endpoint: ep("10.0.0.1:4789"),
                kind: CandidateKind::Local
            }]
        );
    }

    #[test]
    fn a_cone_nat_and_a_symmetric_one() {
        let mut v = SelfView::new(4789, vec![ip("192.168.1.5")], None);
        v.observe(
            Observer::Peer(Tag([1; 8])),
            ip("198.51.100.1"),
            ep("203.0.113.5:4789"),
            0,
        );
        // One observer cannot tell.
        assert_eq!(v.nat(0), NatMapping::Unknown);
        // A second one at another address saw the same: endpoint-independent.
        v.observe(
            Observer::Stun(ep("198.51.100.2:3478")),
            ip("198.51.100.2"),
            ep("203.0.113.5:4789"),
            10,
        );
        assert_eq!(v.nat(10), NatMapping::EndpointIndependent);
        let c = v.candidates(10);
        assert_eq!(c[0].endpoint, ep("203.0.113.5:4789"));
        assert_eq!(c[0].kind, CandidateKind::Reflexive);
        assert_eq!(c[1].kind, CandidateKind::Local);
        assert_eq!(c.len(), 2);
        // A third saw another port: endpoint-dependent.
        v.observe(
            Observer::Peer(Tag([2; 8])),
            ip("198.51.100.3"),
            ep("203.0.113.5:61000"),
            20,
        );
        assert_eq!(v.nat(20), NatMapping::EndpointDependent);
        // Observations age out.
        assert_eq!(v.nat(20 + OBSERVATION_TTL_MS + 1), NatMapping::Unknown);
        assert_eq!(v.candidates(20 + OBSERVATION_TTL_MS + 1).len(), 1);
    }

    #[test]
    fn advertised_first_and_bounded() {
        let mut v = SelfView::new(4789, vec![ip("10.0.0.1")], Some(ep("198.51.100.9:4789")));
        for i in 0..40u8 {
            v.observe(
                Observer::Peer(Tag([i; 8])),
                IpAddr::from([198, 51, 100, i]),
                SocketAddr::new(ip("203.0.113.1"), 1000 + i as u16),
                i as u64,
            );
        }
        let c = v.candidates(100);
        assert_eq!(c.len(), MAX_CANDIDATES);
        assert_eq!(c[0].kind, CandidateKind::Advertised);
        // The longest-seen observation first among the reflexive ones (the oldest 8 observers
        // were forgotten for newer ones).
        assert_eq!(c[1].endpoint.port(), 1008);
        assert_eq!(v.observed.len(), MAX_OBSERVERS);
    }

    #[test]
    fn the_list_does_not_change_with_every_answer() {
        let mut v = SelfView::new(4789, vec![ip("192.168.1.5")], None);
        let a = Observer::Peer(Tag([1; 8]));
        let b = Observer::Peer(Tag([2; 8]));
        v.observe(a, ip("198.51.100.1"), ep("203.0.113.5:1000"), 0);
        v.observe(b, ip("198.51.100.2"), ep("203.0.113.5:2000"), 5);
        let first = v.candidates(10);
        // The answers go on, in any order: the list stays as it is.
        for t in 1..50 {
            let (o, p, port) = if t % 3 == 0 {
                (a, "198.51.100.1", 1000)
            } else {
                (b, "198.51.100.2", 2000)
            };
            v.observe(o, ip(p), SocketAddr::new(ip("203.0.113.5"), port), 10 + t);
            assert_eq!(v.candidates(10 + t), first);
        }
        // An observer seeing a new mapping moves it behind the others.
        v.observe(a, ip("198.51.100.1"), ep("203.0.113.5:1001"), 100);
        let c = v.candidates(100);
        assert_eq!(c[0].endpoint.port(), 2000);
        assert_eq!(c[1].endpoint.port(), 1001);
    }
}
