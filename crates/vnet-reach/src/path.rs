//! The path to one peer host (shared by all the links to it, whatever their VNIs): which of its
//! endpoints to ping and when, which answered, and which one its links use.
//!
//! An endpoint carries data only after this host's own ping to it was answered (return
//! routability: a forged or replayed message can make this host ping an address, never send
//! data there). Discovery pings every endpoint at once, then on a schedule that starts fast
//! (both hosts punch at the same moment only if they retry often while the other starts) and
//! slows down; the chosen endpoint is then kept alive by a heartbeat well inside NATs' UDP
//! timeouts, and given up when it stops answering.

use std::net::SocketAddr;

use crate::candidates::{Candidate, CandidateKind};
use crate::endpoint::canonical;
use crate::wire::TXID_LEN;
use crate::{Random, ReachError};

/// When discovery pings every endpoint, from its start.
pub const DISCOVERY_STEPS_MS: [u64; 6] = [0, 250, 500, 1_000, 2_000, 4_000];
/// After the fast steps (and, with a path, for the endpoints not chosen): every 10 s.
pub const DISCOVERY_SLOW_MS: u64 = 10_000;
/// The chosen endpoint's heartbeat: well inside Linux conntrack's 30 s for an unreplied UDP
/// mapping (and common home NATs').
pub const HEARTBEAT_MS: u64 = 2_500;
/// An endpoint is trusted this long after its last answer.
pub const TRUST_MS: u64 = 6_500;
/// A ping unanswered this long is forgotten.
pub const PING_TIMEOUT_MS: u64 = 5_000;
/// Endpoints learned from the peer's pings (its NAT's mappings), at most.
pub const MAX_PEER_REFLEXIVE: usize = 8;
/// Published endpoints taken from the peer's record, at most.
pub const MAX_PUBLISHED: usize = 8;
/// Unanswered pings remembered per endpoint.
const MAX_OUTSTANDING: usize = 8;
/// Another endpoint replaces the chosen one only if its round trip is this much better (%).
const SWITCH_BETTER_PERCENT: u64 = 20;

/// How the host knows of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// From the peer's record.
    Published(CandidateKind),
    /// A ping from the peer came from it.
    PeerReflexive,
    /// A TCP tunnel's local end (a UDP socket of this host's vnetd that carries datagrams over
    /// a TCP connection to or from a relay): the last resort where UDP does not pass, used only
    /// while no endpoint over UDP answers.
    Tunnel,
}

impl Origin {
    /// Whether using this endpoint means a NAT was punched (not one of the peer's own or
    /// advertised addresses).
    pub fn punched(self) -> bool {
        matches!(
            self,
            Origin::PeerReflexive | Origin::Published(CandidateKind::Reflexive)
        )
    }

    fn rank(self) -> u8 {
        match self {
            Origin::Published(CandidateKind::Local) => 0,
            Origin::Published(CandidateKind::Advertised) => 1,
            Origin::Published(CandidateKind::Reflexive) => 2,
            Origin::PeerReflexive => 3,
            Origin::Tunnel => 4,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Published(k) => k.as_str(),
            Origin::PeerReflexive => "peer-reflexive",
            Origin::Tunnel => "tcp-tunnel",
        }
    }
}

#[derive(Debug, Clone)]
pub struct EndpointState {
    pub endpoint: SocketAddr,
    pub origin: Origin,
    added_ms: u64,
    last_ping_ms: Option<u64>,
    outstanding: Vec<([u8; TXID_LEN], u64)>,
    pub last_pong_ms: Option<u64>,
    /// Smoothed round trip (1/8 of each new sample), microseconds.
    pub rtt_us: Option<u64>,
}

impl EndpointState {
    fn new(endpoint: SocketAddr, origin: Origin, now_ms: u64) -> EndpointState {
        EndpointState {
            endpoint,
            origin,
            added_ms: now_ms,
            last_ping_ms: None,
            outstanding: Vec::new(),
            last_pong_ms: None,
            rtt_us: None,
        }
    }

    pub fn trusted(&self, now_ms: u64) -> bool {
        self.last_pong_ms
            .is_some_and(|t| now_ms.saturating_sub(t) <= TRUST_MS)
    }
}

/// A ping to send: where, and its transaction id (already recorded as outstanding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingOrder {
    pub to: SocketAddr,
    pub txid: [u8; TXID_LEN],
}

#[derive(Debug, Clone, Default)]
pub struct PeerPath {
    endpoints: Vec<EndpointState>,
    chosen: Option<SocketAddr>,
    /// When the running discovery started (None: a path is trusted, only slow pings).
    discovery_start_ms: Option<u64>,
    /// The next discovery round (all endpoints), in ms.
    next_round_ms: u64,
    step: usize,
    /// Since when no endpoint over UDP has been trusted (None: one is).
    udp_down_since_ms: Option<u64>,
    /// The choice changed: the new endpoint is pinged at once, not at its next heartbeat (to a
    /// relay, that ping moves the relay's binding there; see `Reach::tick`).
    announce: bool,
}

impl PeerPath {
    pub fn new(now_ms: u64) -> PeerPath {
        PeerPath {
            discovery_start_ms: Some(now_ms),
            next_round_ms: now_ms,
            udp_down_since_ms: Some(now_ms),
            ..PeerPath::default()
        }
    }

    /// How long (ms) the peer has had no trusted endpoint over UDP as of the last
    /// [`PeerPath::choose`]; 0 while it has one.
    pub fn udp_down_for_ms(&self, now_ms: u64) -> u64 {
        self.udp_down_since_ms
            .map_or(0, |t| now_ms.saturating_sub(t))
    }

    /// The local end of a TCP tunnel to the peer (a relay) opened (`Some`) or closed (`None`).
    /// The tunnel is an endpoint like the others (pinged, trusted only once it answers), ranked
    /// below every endpoint over UDP.
    pub fn set_tunnel(&mut self, tunnel: Option<SocketAddr>, now_ms: u64) {
        self.endpoints
            .retain(|e| e.origin != Origin::Tunnel || Some(e.endpoint) == tunnel);
        if let Some(t) = tunnel {
            let t = canonical(t);
            match self.endpoints.iter_mut().find(|e| e.endpoint == t) {
                Some(e) => e.origin = Origin::Tunnel,
                None => self
                    .endpoints
                    .push(EndpointState::new(t, Origin::Tunnel, now_ms)),
            }
        }
        if self
            .chosen
            .is_some_and(|c| !self.endpoints.iter().any(|e| e.endpoint == c))
        {
            self.chosen = None;
        }
    }

    pub fn endpoints(&self) -> &[EndpointState] {
        &self.endpoints
    }

    pub fn chosen(&self) -> Option<&EndpointState> {
        let c = self.chosen?;
        self.endpoints.iter().find(|e| e.endpoint == c)
    }

    fn restart_discovery(&mut self, now_ms: u64) {
        self.discovery_start_ms = Some(now_ms);
        self.next_round_ms = now_ms;
        self.step = 0;
    }

    /// The peer's published candidates: endpoints that stay keep what is known of them; if the
    /// set changed, discovery starts again.
    pub fn set_published(&mut self, cands: &[Candidate], now_ms: u64) {
        let mut wanted: Vec<(SocketAddr, CandidateKind)> = Vec::new();
        for c in cands.iter().take(MAX_PUBLISHED) {
            let ep = canonical(c.endpoint);
            if !wanted.iter().any(|(e, _)| *e == ep) {
                wanted.push((ep, c.kind));
            }
        }
        let before: Vec<SocketAddr> = self.published().collect();
        self.endpoints.retain(|e| {
            matches!(e.origin, Origin::PeerReflexive | Origin::Tunnel)
                || wanted.iter().any(|(w, _)| *w == e.endpoint)
        });
        for (ep, kind) in wanted {
            match self.endpoints.iter_mut().find(|e| e.endpoint == ep) {
                Some(e) if e.origin == Origin::Tunnel => {}
                Some(e) => e.origin = Origin::Published(kind),
                None => {
                    self.endpoints
                        .push(EndpointState::new(ep, Origin::Published(kind), now_ms))
                }
            }
        }
        let after: Vec<SocketAddr> = self.published().collect();
        if before != after {
            self.restart_discovery(now_ms);
        }
        if self
            .chosen
            .is_some_and(|c| !self.endpoints.iter().any(|e| e.endpoint == c))
        {
            self.chosen = None;
        }
    }

    fn published(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.endpoints
            .iter()
            .filter(|e| matches!(e.origin, Origin::Published(_)))
            .map(|e| e.endpoint)
    }

    /// The endpoint `at` is gone (a tunnel's local end, closed).
    pub fn forget(&mut self, at: SocketAddr) {
        let at = canonical(at);
        self.endpoints.retain(|e| e.endpoint != at);
        if self.chosen == Some(at) {
            self.chosen = None;
        }
    }

    /// An authenticated, fresh ping from the peer came from `from`: a new endpoint is learned
    /// (the peer's NAT's mapping towards this host) and pinged at the next [`PeerPath::due`].
    /// `tunnel`: `from` is the local end of a TCP tunnel (the peer came in over TCP).
    pub fn on_ping(&mut self, from: SocketAddr, now_ms: u64, tunnel: bool) {
        let from = canonical(from);
        if self.endpoints.iter().any(|e| e.endpoint == from) {
            return;
        }
        if tunnel {
            self.endpoints
                .push(EndpointState::new(from, Origin::Tunnel, now_ms));
            return;
        }
        let reflexive = self
            .endpoints
            .iter()
            .filter(|e| e.origin == Origin::PeerReflexive)
            .count();
        if reflexive >= MAX_PEER_REFLEXIVE {
            let chosen = self.chosen;
            if let Some(i) = self
                .endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| e.origin == Origin::PeerReflexive && Some(e.endpoint) != chosen)
                .min_by_key(|(_, e)| e.last_pong_ms.unwrap_or(e.added_ms))
                .map(|(i, _)| i)
            {
                self.endpoints.remove(i);
            } else {
                return;
            }
        }
        self.endpoints
            .push(EndpointState::new(from, Origin::PeerReflexive, now_ms));
    }

    /// A pong from `from` answering `txid`: its round trip in microseconds, or `Unsolicited`
    /// if this host sent no such ping there (a replay, or a forgery that passed the AEAD).
    pub fn on_pong(
        &mut self,
        from: SocketAddr,
        txid: [u8; TXID_LEN],
        now_us: u64,
    ) -> Result<u64, ReachError> {
        let from = canonical(from);
        let now_ms = now_us / 1000;
        let e = self
            .endpoints
            .iter_mut()
            .find(|e| e.endpoint == from)
            .ok_or(ReachError::Unsolicited)?;
        let i = e
            .outstanding
            .iter()
            .position(|(t, _)| *t == txid)
            .ok_or(ReachError::Unsolicited)?;
        let (_, sent_us) = e.outstanding.swap_remove(i);
        let sample = now_us.saturating_sub(sent_us).max(1);
        e.rtt_us = Some(match e.rtt_us {
            None => sample,
            Some(r) => (r * 7 + sample) / 8,
        });
        e.last_pong_ms = Some(now_ms);
        Ok(sample)
    }

    /// The pings to send now (recorded as outstanding, sent at `now_us`).
    pub fn due(&mut self, now_us: u64, rng: &mut dyn Random) -> Vec<PingOrder> {
        let now_ms = now_us / 1000;
        let mut to: Vec<usize> = Vec::new();
        for (i, e) in self.endpoints.iter_mut().enumerate() {
            e.outstanding
                .retain(|(_, sent)| now_us.saturating_sub(*sent) / 1000 < PING_TIMEOUT_MS);
            if e.last_ping_ms.is_none() {
                to.push(i); // new: at once
            }
        }
        let chosen_trusted = self.chosen().is_some_and(|c| c.trusted(now_ms));
        if chosen_trusted {
            self.discovery_start_ms = None;
        } else if self.discovery_start_ms.is_none() {
            self.restart_discovery(now_ms);
        }
        if now_ms >= self.next_round_ms {
            to.extend(0..self.endpoints.len());
            self.next_round_ms = match self.discovery_start_ms {
                Some(start) => {
                    self.step += 1;
                    match DISCOVERY_STEPS_MS.get(self.step) {
                        // Never in the past (a caller that slept): the next step from now.
                        Some(at) => (start + at).max(now_ms + 1),
                        None => now_ms + DISCOVERY_SLOW_MS,
                    }
                }
                None => now_ms + DISCOVERY_SLOW_MS,
            };
        }
        if let Some(c) = self.chosen {
            if let Some(i) = self.endpoints.iter().position(|e| e.endpoint == c) {
                let last = self.endpoints[i].last_ping_ms.unwrap_or(0);
                if self.announce || now_ms.saturating_sub(last) >= HEARTBEAT_MS {
                    to.push(i);
                }
            }
        }
        self.announce = false;
        to.sort_unstable();
        to.dedup();
        let mut out = Vec::with_capacity(to.len());
        for i in to {
            let e = &mut self.endpoints[i];
            let mut txid = [0u8; TXID_LEN];
            rng.fill(&mut txid);
            if e.outstanding.len() >= MAX_OUTSTANDING {
                e.outstanding.remove(0);
            }
            e.outstanding.push((txid, now_us));
            e.last_ping_ms = Some(now_ms);
            out.push(PingOrder {
                to: e.endpoint,
                txid,
            });
        }
        out
    }

    /// Chooses the endpoint the links use now: the chosen one while it is trusted and no other
    /// is clearly faster, else the best trusted one (lowest round trip, the peer's own address
    /// first at equal cost), else none (discovery starts again). Returns the choice.
    pub fn choose(&mut self, now_ms: u64) -> Option<SocketAddr> {
        // A tunnel only when nothing over UDP answers: any UDP endpoint beats it.
        let key = |e: &EndpointState| {
            (
                e.origin == Origin::Tunnel,
                e.rtt_us.unwrap_or(u64::MAX),
                e.origin.rank(),
            )
        };
        let best = self
            .endpoints
            .iter()
            .filter(|e| e.trusted(now_ms))
            .min_by_key(|e| key(e))
            .map(|e| (e.endpoint, e.rtt_us.unwrap_or(u64::MAX)));
        let udp_up = self
            .endpoints
            .iter()
            .any(|e| e.origin != Origin::Tunnel && e.trusted(now_ms));
        self.udp_down_since_ms = match (udp_up, self.udp_down_since_ms) {
            (true, _) => None,
            (false, Some(t)) => Some(t),
            (false, None) => Some(now_ms),
        };
        let current_tunnel = self.chosen().is_some_and(|c| c.origin == Origin::Tunnel);
        let current = self
            .chosen()
            .filter(|c| c.trusted(now_ms))
            .filter(|_| !(current_tunnel && udp_up))
            .map(|c| (c.endpoint, c.rtt_us.unwrap_or(u64::MAX)));
        let before = self.chosen;
        self.chosen = match (current, best) {
            (Some((c, crtt)), Some((b, brtt))) if b != c => {
                // Switch only for a clearly better round trip: no flapping between equals.
                if brtt.saturating_mul(100) < crtt.saturating_mul(100 - SWITCH_BETTER_PERCENT) {
                    Some(b)
                } else {
                    Some(c)
                }
            }
            (Some((c, _)), _) => Some(c),
            (None, b) => b.map(|(b, _)| b),
        };
        if self.chosen.is_some() && self.chosen != before {
            self.announce = true;
        }
        match self.chosen {
            None if self.discovery_start_ms.is_none() => self.restart_discovery(now_ms),
            Some(_) => self.discovery_start_ms = None,
            None => {}
        }
        self.chosen
    }

    /// The endpoints whose datagrams are the peer's: every trusted one.
    pub fn accepted(&self, now_ms: u64) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self
            .endpoints
            .iter()
            .filter(|e| e.trusted(now_ms))
            .map(|e| e.endpoint)
            .collect();
        v.sort();
        v
    }

    /// When [`PeerPath::due`] or [`PeerPath::choose`] may next have something to do, in ms.
    pub fn next_wake_ms(&self, now_ms: u64) -> u64 {
        let mut t = self.next_round_ms;
        let mut at = |x: u64| {
            if x > now_ms {
                t = t.min(x);
            }
        };
        if let Some(c) = self.chosen() {
            if self.announce {
                return now_ms;
            }
            at(c.last_ping_ms.unwrap_or(now_ms) + HEARTBEAT_MS);
        }
        for e in &self.endpoints {
            if e.last_ping_ms.is_none() {
                return now_ms;
            }
            // The moment an endpoint stops being trusted may change the choice.
            if let Some(p) = e.last_pong_ms {
                at(p + TRUST_MS + 1);
            }
        }
        t.max(now_ms)
    }
}

#[cfg(test)]
mod tests;
