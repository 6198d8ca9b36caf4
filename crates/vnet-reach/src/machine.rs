//! One host's reach machine: the peers from etcd and the datagrams of reach's kinds in, with
//! the time; out come the datagrams to send, each peer's path (and which of its endpoints'
//! datagrams are its own), each path's MTU as probing finds it (`pmtu`), the relay bindings to
//! record and the record to publish. vnetd's `reach` thread owns it and does the I/O;
//! everything here is decided without any.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};

use vnet_crypto::{PrivateKey, PublicKey};

use crate::candidates::{Candidate, NatMapping, Observer, SelfView};
use crate::endpoint::canonical;
use crate::keys::{PairKey, Tag, NONCE_LEN};
use crate::path::{Origin, PeerPath};
use crate::pmtu::{Answer, Pmtu};
use crate::stun;
use crate::wire::{
    self, Kind, Ping, Pong, ProbeBody, ProbeHeader, FLAG_BIND, FLAG_PAD_REPLY, TXID_LEN,
};
use crate::{Now, Random, ReachError};

/// A ping's wall clock may differ from this host's by this much (hosts' clocks are NTP's).
pub const FRESH_MS: u64 = 120_000;
/// Pings remembered against replay, at most.
const REPLAY_CACHE: usize = 4096;
/// How often each STUN server is asked again (it also keeps the mapping alive).
pub const STUN_INTERVAL_MS: u64 = 20_000;
const STUN_TIMEOUT_MS: u64 = 5_000;
/// The published record changes at most this often (etcd writes; in a steady state it does
/// not change at all).
pub const PUBLISH_MIN_MS: u64 = 200;
/// Pings from keys not (yet) known, kept this long to be read once their sender's record
/// arrives: two hosts starting together each learn of the other at a different moment, and
/// the first pings would otherwise wait for the next discovery round.
pub const STRANGER_TTL_MS: u64 = 5_000;
/// Such pings kept, at most (the oldest go first), and the largest one kept.
const MAX_STRANGERS: usize = 64;
const MAX_STRANGER_LEN: usize = 256;
/// Relays a host binds to, at most (the fastest).
pub const MAX_BOUND_RELAYS: usize = 3;
/// A relay that has not answered over UDP for this long is asked for a TCP tunnel (UDP is
/// filtered on the way: the last fallback). Discovery's first rounds (0-1 s) come before.
pub const TUNNEL_AFTER_MS: u64 = 2_000;

/// What the machine was started with.
#[derive(Debug, Clone)]
pub struct ReachConfig {
    pub key: PrivateKey,
    /// The VXLAN socket's port.
    pub port: u16,
    /// This host's addresses.
    pub local: Vec<IpAddr>,
    /// `--advertise-addr`, at the VXLAN port.
    pub advertised: Option<SocketAddr>,
    /// `--stun` servers.
    pub stun: Vec<SocketAddr>,
    /// This host relays for others (`--relay`).
    pub relay: bool,
}

/// A peer host, as its record in etcd says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub name: String,
    pub key: PublicKey,
    pub candidates: Vec<Candidate>,
    /// The peer relays for others.
    pub relay: bool,
    /// The relays (by name) the peer is bound to.
    pub bound_relays: Vec<String>,
    pub nat: NatMapping,
}

/// How a peer's links send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Path {
    /// No way known yet: the links send to their configured address, as without reach.
    Unknown,
    /// Straight to one of the peer's endpoints; `punched` when it is not one of the peer's own
    /// or advertised addresses; `tunnel` when the endpoint is a TCP tunnel's local end (the
    /// peer is a relay, or a member that came in over TCP).
    Direct {
        endpoint: SocketAddr,
        punched: bool,
        tunnel: bool,
    },
    /// Through a relay (by name) at its endpoint, with the relay header naming the peer;
    /// `tunnel` when that endpoint is a TCP tunnel's local end.
    Relayed {
        relay: String,
        endpoint: SocketAddr,
        tunnel: bool,
    },
}

impl Path {
    pub fn word(&self) -> &'static str {
        match self {
            Path::Unknown => "unknown",
            Path::Direct { tunnel: true, .. } => "tunneled",
            Path::Direct { punched: false, .. } => "direct",
            Path::Direct { punched: true, .. } => "punched",
            Path::Relayed { tunnel: false, .. } => "relayed",
            Path::Relayed { tunnel: true, .. } => "relayed-tcp",
        }
    }
}

/// A peer's path changed, or the endpoints its datagrams may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathUpdate {
    pub peer: Tag,
    pub name: String,
    pub path: Path,
    /// Datagrams from these endpoints are the peer's (the trusted ones).
    pub accept: Vec<SocketAddr>,
}

/// What this host publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfRecord {
    pub candidates: Vec<Candidate>,
    pub nat: NatMapping,
    pub bound_relays: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Send {
        to: SocketAddr,
        bytes: Vec<u8>,
    },
    Path(PathUpdate),
    Publish(SelfRecord),
    /// (This host is a relay.) Member `tag`'s binding ping came from `endpoint`.
    RelayBind {
        tag: Tag,
        endpoint: SocketAddr,
    },
    /// The MTU of the path peer `peer`'s links take changed ([`Reach::link_mtu`]): probing
    /// found a size, or the kernel's figure changed it.
    PathMtu {
        peer: Tag,
        mtu: Option<usize>,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReachCounters {
    pub pings_sent: u64,
    pub pongs_sent: u64,
    pub pings_received: u64,
    pub pongs_received: u64,
    pub stun_sent: u64,
    pub stun_received: u64,
    /// Probes from a key that is not a member's.
    pub unknown_sender: u64,
    /// Probes that failed authentication.
    pub bad_auth: u64,
    /// Pings outside the clock window or seen before.
    pub replay: u64,
    /// Pongs (and STUN answers) to nothing this host asked.
    pub unsolicited: u64,
    /// Malformed or unknown-version messages of reach's kinds.
    pub malformed: u64,
    /// Peers whose key gives no pair key (a small-order point).
    pub bad_key: u64,
    /// Path-MTU probes (`pmtu`): sent, answered (padded pongs of the same size), lost
    /// (unanswered in time, or answered short), and found sizes that stopped passing.
    pub pmtu_probes_sent: u64,
    pub pmtu_probes_answered: u64,
    pub pmtu_probes_lost: u64,
    pub pmtu_black_holes: u64,
}

impl ReachCounters {
    fn refuse(&mut self, e: ReachError) {
        match e {
            ReachError::UnknownSender => self.unknown_sender += 1,
            ReachError::BadAuth => self.bad_auth += 1,
            ReachError::Replay => self.replay += 1,
            ReachError::Unsolicited => self.unsolicited += 1,
            _ => self.malformed += 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointStatus {
    pub endpoint: SocketAddr,
    pub origin: &'static str,
    pub trusted: bool,
    pub rtt_us: Option<u64>,
}

/// What probing knows of a peer's direct path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmtuStatus {
    pub endpoint: SocketAddr,
    /// `searching`, `done`, `black-hole` or `error` (`pmtu::Pmtu::state_word`).
    pub state: &'static str,
    /// The size probing found (or confirmed so far).
    pub probed: Option<usize>,
    /// The kernel's figure, as last given.
    pub kernel: Option<usize>,
    /// How long the last search that found a size took.
    pub search_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub name: String,
    pub tag: Tag,
    pub path: Path,
    pub rtt_us: Option<u64>,
    pub nat: NatMapping,
    pub endpoints: Vec<EndpointStatus>,
    /// Probing of the direct path (none without one).
    pub pmtu: Option<PmtuStatus>,
    /// The MTU the peer's links use ([`Reach::link_mtu`]).
    pub link_mtu: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReachStatus {
    pub tag: Tag,
    pub relay: bool,
    pub nat: NatMapping,
    pub candidates: Vec<Candidate>,
    pub bound_relays: Vec<String>,
    pub peers: Vec<PeerStatus>,
    pub counters: ReachCounters,
}

struct PeerState {
    info: PeerInfo,
    pair: PairKey,
    path: PeerPath,
    emitted: Option<(Path, Vec<SocketAddr>)>,
    /// Probing of the chosen direct endpoint's MTU (a new one for each endpoint chosen).
    pmtu: Option<Pmtu>,
    /// The link MTU last said ([`Action::PathMtu`]).
    emitted_mtu: Option<Option<usize>>,
}

struct StunServer {
    server: SocketAddr,
    next_ms: u64,
    outstanding: Option<([u8; TXID_LEN], u64)>,
}

/// Pings seen, against replays: (sender, txid) in arrival order.
#[derive(Default)]
struct ReplayCache {
    order: VecDeque<((Tag, [u8; TXID_LEN]), u64)>,
    set: HashSet<(Tag, [u8; TXID_LEN])>,
}

impl ReplayCache {
    /// Records a ping; false if it was seen before.
    fn insert(&mut self, key: (Tag, [u8; TXID_LEN]), now_ms: u64) -> bool {
        while let Some((k, at)) = self.order.front() {
            if now_ms.saturating_sub(*at) > 2 * FRESH_MS || self.order.len() >= REPLAY_CACHE {
                self.set.remove(k);
                self.order.pop_front();
            } else {
                break;
            }
        }
        if !self.set.insert(key) {
            return false;
        }
        self.order.push_back((key, now_ms));
        true
    }
}

pub struct Reach {
    key: PrivateKey,
    public: PublicKey,
    tag: Tag,
    relay: bool,
    view: SelfView,
    peers: BTreeMap<Tag, PeerState>,
    seen: ReplayCache,
    stun: Vec<StunServer>,
    published: Option<SelfRecord>,
    last_publish_ms: Option<u64>,
    /// Pings from unknown keys: (key, from, datagram, when), read again when the key appears.
    strangers: VecDeque<(PublicKey, SocketAddr, Vec<u8>, u64)>,
    /// The local ends of this host's TCP tunnels (to relays, or from members when this host
    /// relays): what comes from them came over TCP, and says nothing of how the underlay
    /// sees this host.
    tunnels: HashSet<SocketAddr>,
    pub counters: ReachCounters,
}

impl Reach {
    pub fn new(cfg: ReachConfig) -> Reach {
        let public = cfg.key.public();
        Reach {
            tag: Tag::of(&public),
            public,
            key: cfg.key,
            relay: cfg.relay,
            view: SelfView::new(cfg.port, cfg.local, cfg.advertised),
            peers: BTreeMap::new(),
            seen: ReplayCache::default(),
            stun: cfg
                .stun
                .into_iter()
                .map(|server| StunServer {
                    server: canonical(server),
                    next_ms: 0,
                    outstanding: None,
                })
                .collect(),
            published: None,
            last_publish_ms: None,
            strangers: VecDeque::new(),
            tunnels: HashSet::new(),
            counters: ReachCounters::default(),
        }
    }

    /// The relays to reach over a TCP tunnel now, each with the endpoints to connect to (its
    /// published candidates; a relay listens for tunnels on TCP at its VXLAN port): relay
    /// peers that have not answered over UDP for [`TUNNEL_AFTER_MS`].
    pub fn tunnels_wanted(&self, now: Now) -> Vec<(Tag, Vec<SocketAddr>)> {
        let now_ms = now.mono_ms();
        self.peers
            .iter()
            .filter(|(_, p)| p.info.relay)
            .filter(|(_, p)| p.path.udp_down_for_ms(now_ms) >= TUNNEL_AFTER_MS)
            .map(|(tag, p)| {
                let eps = p.info.candidates.iter().map(|c| c.endpoint).collect();
                (*tag, eps)
            })
            .collect()
    }

    /// A TCP tunnel opened; `local` is the local end its datagrams come from and go to.
    /// `toward`: the relay this host opened it to (None: a member's, to this relay).
    pub fn tunnel_opened(&mut self, local: SocketAddr, toward: Option<Tag>, now: Now) {
        let local = canonical(local);
        self.tunnels.insert(local);
        if let Some(p) = toward.and_then(|t| self.peers.get_mut(&t)) {
            p.path.set_tunnel(Some(local), now.mono_ms());
        }
    }

    /// A TCP tunnel closed: its local end is no peer's endpoint any more.
    pub fn tunnel_closed(&mut self, local: SocketAddr, now: Now, out: &mut Vec<Action>) {
        let local = canonical(local);
        self.tunnels.remove(&local);
        for p in self.peers.values_mut() {
            p.path.forget(local);
        }
        self.refresh(now, out);
    }

    pub fn tag(&self) -> Tag {
        self.tag
    }

    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    /// This host's addresses changed.
    pub fn set_local(&mut self, local: Vec<IpAddr>) {
        self.view.set_local(local);
    }

    /// The overlay's other hosts now (this host's own record is left out by the caller or
    /// here). Paths of peers that left are withdrawn (as `Path::Unknown` with no endpoints).
    pub fn set_peers(
        &mut self,
        peers: Vec<PeerInfo>,
        now: Now,
        rng: &mut dyn Random,
        out: &mut Vec<Action>,
    ) {
        let now_ms = now.mono_ms();
        let mut keep: HashSet<Tag> = HashSet::new();
        for info in peers {
            if info.key == self.public {
                continue;
            }
            let tag = Tag::of(&info.key);
            keep.insert(tag);
            match self.peers.get_mut(&tag) {
                Some(p) => {
                    p.path.set_published(&info.candidates, now_ms);
                    p.info = info;
                }
                None => {
                    let Some(pair) = PairKey::derive(&self.key, &self.public, &info.key) else {
                        self.counters.bad_key += 1;
                        continue;
                    };
                    let mut path = PeerPath::new(now_ms);
                    path.set_published(&info.candidates, now_ms);
                    self.peers.insert(
                        tag,
                        PeerState {
                            info,
                            pair,
                            path,
                            emitted: None,
                            pmtu: None,
                            emitted_mtu: None,
                        },
                    );
                }
            }
        }
        let gone: Vec<Tag> = self
            .peers
            .keys()
            .filter(|t| !keep.contains(t))
            .copied()
            .collect();
        // Pings that came before their sender's record: read now (still fresh, still once).
        self.strangers
            .retain(|(_, _, _, at)| now_ms.saturating_sub(*at) <= STRANGER_TTL_MS);
        let known: Vec<(SocketAddr, Vec<u8>)> = self
            .strangers
            .iter()
            .filter(|(k, ..)| keep.contains(&Tag::of(k)))
            .map(|(_, from, bytes, _)| (*from, bytes.clone()))
            .collect();
        self.strangers.retain(|(k, ..)| !keep.contains(&Tag::of(k)));
        for (from, bytes) in known {
            if let Err(e) = self.on_probe(from, &bytes, now, rng, out) {
                self.counters.refuse(e);
            }
        }
        for tag in gone {
            if let Some(p) = self.peers.remove(&tag) {
                if p.emitted.is_some() {
                    out.push(Action::Path(PathUpdate {
                        peer: tag,
                        name: p.info.name,
                        path: Path::Unknown,
                        accept: Vec::new(),
                    }));
                }
            }
        }
        self.refresh(now, out);
    }

    /// A datagram of reach's kinds (ping, pong) or a STUN answer arrived from `from`. Relay
    /// datagrams are the data path's, not this machine's.
    pub fn on_datagram(
        &mut self,
        from: SocketAddr,
        buf: &[u8],
        now: Now,
        rng: &mut dyn Random,
        out: &mut Vec<Action>,
    ) {
        let from = canonical(from);
        if stun::is_stun(buf) {
            if let Err(e) = self.on_stun(from, buf, now) {
                self.counters.refuse(e);
            }
            return;
        }
        match self.on_probe(from, buf, now, rng, out) {
            Ok(()) => self.refresh(now, out),
            Err(e) => self.counters.refuse(e),
        }
    }

    fn on_stun(&mut self, from: SocketAddr, buf: &[u8], now: Now) -> Result<(), ReachError> {
        let (txid, mapped) = stun::parse_binding_success(buf)?;
        let s = self
            .stun
            .iter_mut()
            .find(|s| s.server == from && s.outstanding.is_some_and(|(t, _)| t == txid))
            .ok_or(ReachError::Unsolicited)?;
        s.outstanding = None;
        self.counters.stun_received += 1;
        self.view
            .observe(Observer::Stun(from), from.ip(), mapped, now.mono_ms());
        Ok(())
    }

    fn on_probe(
        &mut self,
        from: SocketAddr,
        buf: &[u8],
        now: Now,
        rng: &mut dyn Random,
        out: &mut Vec<Action>,
    ) -> Result<(), ReachError> {
        let hdr = wire::peek_probe(buf)?;
        let tag = Tag::of(&hdr.sender);
        let Some(peer) = self
            .peers
            .get_mut(&tag)
            .filter(|p| p.info.key == hdr.sender)
        else {
            if hdr.kind == Kind::Ping && buf.len() <= MAX_STRANGER_LEN {
                if self.strangers.len() >= MAX_STRANGERS {
                    self.strangers.pop_front();
                }
                self.strangers
                    .push_back((hdr.sender, from, buf.to_vec(), now.mono_ms()));
            }
            return Err(ReachError::UnknownSender);
        };
        let (hdr, body) = wire::open_probe(&peer.pair, buf)?;
        let now_ms = now.mono_ms();
        match body {
            ProbeBody::Ping(ping) => {
                if hdr.kind != Kind::Ping || now.wall_ms.abs_diff(ping.wall_ms) > FRESH_MS {
                    return Err(ReachError::Replay);
                }
                if !self.seen.insert((tag, ping.txid), now_ms) {
                    return Err(ReachError::Replay);
                }
                self.counters.pings_received += 1;
                let len = if hdr.flags & FLAG_PAD_REPLY != 0 {
                    buf.len()
                } else {
                    0
                };
                let pong = ProbeBody::Pong(Pong {
                    txid: ping.txid,
                    wall_ms: now.wall_ms,
                    observed: from,
                });
                let bytes = seal(&peer.pair, Kind::Pong, 0, self.public, &pong, len, rng);
                out.push(Action::Send { to: from, bytes });
                self.counters.pongs_sent += 1;
                peer.path
                    .on_ping(from, now_ms, self.tunnels.contains(&from));
                if hdr.flags & FLAG_BIND != 0 && self.relay {
                    out.push(Action::RelayBind {
                        tag,
                        endpoint: from,
                    });
                }
                Ok(())
            }
            ProbeBody::Pong(pong) => {
                // A path-MTU probe's answer (to the endpoint probed), else a plain ping's.
                let probe = peer
                    .pmtu
                    .as_mut()
                    .filter(|m| m.endpoint() == from)
                    .and_then(|m| m.on_pong(pong.txid, buf.len(), now_ms));
                match probe {
                    Some(Answer::Confirmed(_)) => self.counters.pmtu_probes_answered += 1,
                    Some(Answer::Short(_)) => self.counters.pmtu_probes_lost += 1,
                    None => {
                        peer.path.on_pong(from, pong.txid, now.mono_us)?;
                    }
                }
                self.counters.pongs_received += 1;
                // Through a tunnel the peer saw the tunnel's far end, not this host.
                if !self.tunnels.contains(&from) {
                    self.view
                        .observe(Observer::Peer(tag), from.ip(), pong.observed, now_ms);
                }
                Ok(())
            }
        }
    }

    /// Sends what is due, chooses paths and says what changed.
    pub fn tick(&mut self, now: Now, rng: &mut dyn Random, out: &mut Vec<Action>) {
        let now_ms = now.mono_ms();
        for s in &mut self.stun {
            if s.outstanding
                .is_some_and(|(_, at)| now_ms.saturating_sub(at) > STUN_TIMEOUT_MS)
            {
                s.outstanding = None;
            }
            if now_ms >= s.next_ms {
                let mut txid = [0u8; TXID_LEN];
                rng.fill(&mut txid);
                s.outstanding = Some((txid, now_ms));
                s.next_ms = now_ms + STUN_INTERVAL_MS;
                out.push(Action::Send {
                    to: s.server,
                    bytes: stun::binding_request(txid).to_vec(),
                });
                self.counters.stun_sent += 1;
            }
        }
        self.refresh(now, out);
        // Pings after the choice: a lost path restarts discovery at once.
        let me = self.public;
        for p in self.peers.values_mut() {
            let orders = p.path.due(now.mono_us, rng);
            // To a relay, the ping that binds says where to forward this host's frames: the
            // endpoint its links chose, else (while none is) every one (the first to answer
            // is chosen and then binds alone, announced at once: PeerPath::choose). A ping
            // over another endpoint (a discovery round over UDP while on a tunnel, or the
            // tunnel's while on UDP) must not move the binding away from where the links'
            // frames are accepted.
            let chosen = p.path.chosen().map(|c| c.endpoint);
            for o in orders {
                let binds = p.info.relay && chosen.is_none_or(|c| c == o.to);
                let flags = if binds { FLAG_BIND } else { 0 };
                let ping = ProbeBody::Ping(Ping {
                    txid: o.txid,
                    wall_ms: now.wall_ms,
                });
                let bytes = seal(&p.pair, Kind::Ping, flags, me, &ping, 0, rng);
                out.push(Action::Send { to: o.to, bytes });
                self.counters.pings_sent += 1;
            }
            // Path-MTU probes: pings padded to the size probed, their pongs padded alike.
            let rtt = p.path.chosen().and_then(|c| c.rtt_us);
            let Some(m) = p.pmtu.as_mut() else { continue };
            let due = m.due(now.mono_us, rtt, rng);
            self.counters.pmtu_probes_lost += due.lost;
            self.counters.pmtu_black_holes += u64::from(due.black_hole);
            for o in due.probes {
                let ping = ProbeBody::Ping(Ping {
                    txid: o.txid,
                    wall_ms: now.wall_ms,
                });
                let bytes = seal(
                    &p.pair,
                    Kind::Ping,
                    FLAG_PAD_REPLY,
                    me,
                    &ping,
                    o.payload,
                    rng,
                );
                out.push(Action::Send {
                    to: m.endpoint(),
                    bytes,
                });
                self.counters.pmtu_probes_sent += 1;
            }
        }
        self.emit_mtus(out);
    }

    /// The kernel's figure for the path to peer `peer` at `endpoint` (asked of a socket
    /// connected there): the ceiling of its probing, if that is the endpoint probed.
    pub fn set_kernel_mtu(
        &mut self,
        peer: Tag,
        endpoint: SocketAddr,
        mtu: Option<usize>,
        out: &mut Vec<Action>,
    ) {
        let endpoint = canonical(endpoint);
        if let Some(m) = self
            .peers
            .get_mut(&peer)
            .and_then(|p| p.pmtu.as_mut())
            .filter(|m| m.endpoint() == endpoint)
        {
            m.set_ceiling(mtu);
            self.emit_mtus(out);
        }
    }

    /// The MTU of the path peer `peer`'s links take: the probed one and the kernel's, the
    /// smaller (`pmtu::Pmtu::mtu`) for a direct path; the relay's direct path's for a relayed
    /// one (the relay's leg to the peer is the peer's own to probe). `None`: not known here
    /// (the caller keeps the kernel's figure).
    pub fn link_mtu(&self, peer: Tag) -> Option<usize> {
        let p = self.peers.get(&peer)?;
        match &p.emitted.as_ref()?.0 {
            Path::Direct { .. } => p.pmtu.as_ref()?.mtu(),
            Path::Relayed { relay, .. } => self
                .peers
                .values()
                .find(|r| r.info.relay && r.info.name == *relay)?
                .pmtu
                .as_ref()?
                .mtu(),
            Path::Unknown => None,
        }
    }

    /// Says the link MTUs that changed since last said (one pass: a relayed path's is its
    /// relay's, looked up by name among the relays).
    fn emit_mtus(&mut self, out: &mut Vec<Action>) {
        let relays: BTreeMap<String, Option<usize>> = self
            .peers
            .values()
            .filter(|p| p.info.relay)
            .map(|p| (p.info.name.clone(), p.pmtu.as_ref().and_then(Pmtu::mtu)))
            .collect();
        for (tag, p) in self.peers.iter_mut() {
            let Some((path, _)) = &p.emitted else {
                continue;
            };
            let mtu = match path {
                Path::Direct { .. } => p.pmtu.as_ref().and_then(Pmtu::mtu),
                Path::Relayed { relay, .. } => relays.get(relay).copied().flatten(),
                Path::Unknown => None,
            };
            if p.emitted_mtu != Some(mtu) {
                p.emitted_mtu = Some(mtu);
                out.push(Action::PathMtu { peer: *tag, mtu });
            }
        }
    }

    /// Chooses every peer's path again, emits those that changed, and the record if it did.
    fn refresh(&mut self, now: Now, out: &mut Vec<Action>) {
        let now_ms = now.mono_ms();
        for p in self.peers.values_mut() {
            // A TCP tunnel carries any size: nothing to probe there.
            let chosen = p
                .path
                .choose(now_ms)
                .filter(|_| p.path.chosen().is_some_and(|c| c.origin != Origin::Tunnel));
            // A new endpoint is a new path: its MTU is searched afresh.
            if p.pmtu.as_ref().map(Pmtu::endpoint) != chosen {
                p.pmtu = chosen.map(|ep| Pmtu::new(ep, now_ms));
            }
        }
        // Relays this host can use: relay peers with a trusted path, over UDP before over a
        // tunnel, fastest first.
        let mut relays: Vec<(bool, u64, String, SocketAddr)> = self
            .peers
            .values()
            .filter(|p| p.info.relay)
            .filter_map(|p| {
                let c = p.path.chosen()?;
                Some((
                    c.origin == Origin::Tunnel,
                    c.rtt_us.unwrap_or(u64::MAX),
                    p.info.name.clone(),
                    c.endpoint,
                ))
            })
            .collect();
        relays.sort();
        relays.truncate(MAX_BOUND_RELAYS);
        for (tag, p) in self.peers.iter_mut() {
            let path = match p.path.chosen() {
                Some(c) => Path::Direct {
                    endpoint: c.endpoint,
                    punched: c.origin.punched(),
                    tunnel: c.origin == Origin::Tunnel,
                },
                None => relays
                    .iter()
                    .find(|(_, _, name, _)| {
                        *name != p.info.name && p.info.bound_relays.contains(name)
                    })
                    .map(|(tunnel, _, name, ep)| Path::Relayed {
                        relay: name.clone(),
                        endpoint: *ep,
                        tunnel: *tunnel,
                    })
                    .unwrap_or(Path::Unknown),
            };
            let accept = p.path.accepted(now_ms);
            let now_state = (path, accept);
            if p.emitted.as_ref() != Some(&now_state) {
                out.push(Action::Path(PathUpdate {
                    peer: *tag,
                    name: p.info.name.clone(),
                    path: now_state.0.clone(),
                    accept: now_state.1.clone(),
                }));
                p.emitted = Some(now_state);
            }
        }
        let record = SelfRecord {
            candidates: self.view.candidates(now_ms),
            nat: self.view.nat(now_ms),
            bound_relays: relays.into_iter().map(|(_, _, n, _)| n).collect(),
        };
        let due = self
            .last_publish_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= PUBLISH_MIN_MS);
        if self.published.as_ref() != Some(&record) && due {
            self.last_publish_ms = Some(now_ms);
            self.published = Some(record.clone());
            out.push(Action::Publish(record));
        }
        self.emit_mtus(out);
    }

    /// When [`Reach::tick`] next has something to do (ms, monotonic).
    pub fn next_wake_ms(&self, now: Now) -> u64 {
        let now_ms = now.mono_ms();
        let mut t = now_ms + 1_000;
        for p in self.peers.values() {
            t = t.min(p.path.next_wake_ms(now_ms));
            if let Some(m) = &p.pmtu {
                t = t.min(m.next_wake_ms(now_ms, p.path.chosen().and_then(|c| c.rtt_us)));
            }
        }
        for s in &self.stun {
            t = t.min(s.next_ms.max(now_ms));
        }
        if let Some(last) = self.last_publish_ms {
            // A record held back by PUBLISH_MIN_MS, or a candidate aging out.
            t = t.min((last + PUBLISH_MIN_MS).max(now_ms));
        }
        t
    }

    pub fn status(&self, now: Now) -> ReachStatus {
        let now_ms = now.mono_ms();
        ReachStatus {
            tag: self.tag,
            relay: self.relay,
            nat: self.view.nat(now_ms),
            candidates: self.view.candidates(now_ms),
            bound_relays: self
                .published
                .as_ref()
                .map(|r| r.bound_relays.clone())
                .unwrap_or_default(),
            peers: self
                .peers
                .iter()
                .map(|(tag, p)| PeerStatus {
                    name: p.info.name.clone(),
                    tag: *tag,
                    path: p
                        .emitted
                        .as_ref()
                        .map(|(path, _)| path.clone())
                        .unwrap_or(Path::Unknown),
                    rtt_us: p.path.chosen().and_then(|c| c.rtt_us),
                    nat: p.info.nat,
                    endpoints: p
                        .path
                        .endpoints()
                        .iter()
                        .map(|e| EndpointStatus {
                            endpoint: e.endpoint,
                            origin: e.origin.as_str(),
                            trusted: e.trusted(now_ms),
                            rtt_us: e.rtt_us,
                        })
                        .collect(),
                    pmtu: p.pmtu.as_ref().map(|m| PmtuStatus {
                        endpoint: m.endpoint(),
                        state: m.state_word(),
                        probed: m.probed(),
                        kernel: m.ceiling(),
                        search_ms: m.search_ms(),
                    }),
                    link_mtu: self.link_mtu(*tag),
                })
                .collect(),
            counters: self.counters.clone(),
        }
    }
}

fn seal(
    pair: &PairKey,
    kind: Kind,
    flags: u8,
    sender: PublicKey,
    body: &ProbeBody,
    len: usize,
    rng: &mut dyn Random,
) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill(&mut nonce);
    let hdr = ProbeHeader {
        kind,
        flags,
        sender,
        nonce,
    };
    wire::seal_probe(pair, &hdr, body, len)
}

#[cfg(test)]
mod tests;
