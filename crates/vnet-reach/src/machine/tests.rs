//! The machine in a simulated internet: hosts behind NATs of each kind (a model of Linux
//! conntrack's: endpoint-independent or -dependent mapping; full-cone or port-restricted
//! filtering), a relay on the public side, records exchanged as etcd would carry them. Which
//! pairs find a direct path, how fast, and that the others go through the relay.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::*;
use crate::candidates::CandidateKind;
use crate::CountingRandom;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NatKind {
    None,
    FullCone,
    PortRestricted,
    Symmetric,
    OneToOne,
}

struct Nat {
    kind: NatKind,
    public: Ipv4Addr,
    /// (private source, destination or None for endpoint-independent) -> public port.
    out: HashMap<(SocketAddr, Option<SocketAddr>), u16>,
    /// public port -> (private endpoint, destinations it sent to).
    inbound: HashMap<u16, (SocketAddr, Vec<SocketAddr>)>,
    next_port: u16,
}

impl Nat {
    fn new(kind: NatKind, public: Ipv4Addr) -> Nat {
        Nat {
            kind,
            public,
            out: HashMap::new(),
            inbound: HashMap::new(),
            next_port: 20_000,
        }
    }

    /// The public source of a datagram from `src` to `dst`.
    fn outbound(&mut self, src: SocketAddr, dst: SocketAddr) -> SocketAddr {
        let key = match self.kind {
            NatKind::Symmetric => (src, Some(dst)),
            _ => (src, None),
        };
        let port = match self.out.get(&key) {
            Some(p) => *p,
            None => {
                let p = match self.kind {
                    // Port-preserving when free, as Linux masquerade.
                    NatKind::FullCone | NatKind::PortRestricted | NatKind::OneToOne
                        if !self.inbound.contains_key(&src.port()) =>
                    {
                        src.port()
                    }
                    _ => {
                        self.next_port += 7;
                        self.next_port
                    }
                };
                self.out.insert(key, p);
                p
            }
        };
        let e = self.inbound.entry(port).or_insert((src, Vec::new()));
        if !e.1.contains(&dst) {
            e.1.push(dst);
        }
        SocketAddr::new(IpAddr::V4(self.public), port)
    }

    /// Where a datagram from `src` to public port `port` goes, if it is let in.
    fn inbound(&self, src: SocketAddr, port: u16) -> Option<SocketAddr> {
        let (private, sent_to) = self.inbound.get(&port)?;
        match self.kind {
            NatKind::FullCone | NatKind::OneToOne => Some(*private),
            _ => sent_to.contains(&src).then_some(*private),
        }
    }
}

struct Host {
    name: String,
    private: SocketAddr,
    nat: Option<Nat>,
    reach: Reach,
    record: Option<SelfRecord>,
    key: PublicKey,
    relay: bool,
    paths: BTreeMap<String, Path>,
    /// When each peer first had a direct path / any path (ms).
    first_direct: BTreeMap<String, u64>,
    first_any: BTreeMap<String, u64>,
    binds: Vec<(Tag, SocketAddr)>,
    /// A firewall in front of the host drops all UDP (TCP passes).
    udp_blocked: bool,
    /// What the host's uplink carries (IP packets, both ways); larger datagrams vanish without
    /// an ICMP (a black hole), so the kernel's figure is always the local 1500.
    mtu: usize,
    /// Each peer's link MTU as last said, and when.
    link_mtu: BTreeMap<String, (u64, Option<usize>)>,
    /// The host's etcd agent reads the overlay from this time on (a late first sync).
    sync_from_ms: u64,
    /// When the host's timer fires next (as vnetd's: set from `next_wake_ms` after each tick).
    wake_at_ms: u64,
}

/// A TCP tunnel of the simulation: a member's local end and the relay's, each a UDP endpoint
/// on its own host (as vnetd's tunnel sockets are).
struct SimTunnel {
    member: usize,
    relay: usize,
    member_end: SocketAddr,
    relay_end: SocketAddr,
}

struct Net {
    hosts: Vec<Host>,
    queue: VecDeque<(u64, SocketAddr, SocketAddr, Vec<u8>)>,
    now_ms: u64,
    rng: CountingRandom,
    tunnels: Vec<SimTunnel>,
    /// Tunnels the hosts asked for, in order (member, relay).
    tunnels_asked: Vec<(usize, usize)>,
}

const LATENCY_MS: u64 = 5;

fn now(ms: u64) -> Now {
    Now {
        mono_us: ms * 1000,
        wall_ms: 1_700_000_000_000 + ms,
    }
}

impl Net {
    fn new(kinds: &[(NatKind, bool)]) -> Net {
        let hosts = kinds
            .iter()
            .enumerate()
            .map(|(i, (kind, relay))| {
                let i = i as u8;
                let public = Ipv4Addr::new(198, 51, 100, 10 + i);
                let private = match kind {
                    NatKind::None => SocketAddr::new(IpAddr::V4(public), 4789),
                    // Every site uses the same private range, as real ones do.
                    _ => "192.168.1.2:4789".parse().unwrap(),
                };
                let key = PrivateKey([i + 1; 32]);
                let public_key = key.public();
                Host {
                    name: format!("h{i}"),
                    private,
                    nat: (*kind != NatKind::None).then(|| Nat::new(*kind, public)),
                    reach: Reach::new(ReachConfig {
                        key,
                        port: 4789,
                        local: vec![private.ip()],
                        advertised: None,
                        stun: vec![],
                        relay: *relay,
                    }),
                    record: None,
                    key: public_key,
                    relay: *relay,
                    paths: BTreeMap::new(),
                    first_direct: BTreeMap::new(),
                    first_any: BTreeMap::new(),
                    binds: Vec::new(),
                    udp_blocked: false,
                    mtu: 1500,
                    link_mtu: BTreeMap::new(),
                    sync_from_ms: 0,
                    wake_at_ms: 0,
                }
            })
            .collect();
        Net {
            hosts,
            queue: VecDeque::new(),
            now_ms: 0,
            rng: CountingRandom::default(),
            tunnels: Vec::new(),
            tunnels_asked: Vec::new(),
        }
    }

    /// Opens the tunnels the hosts want (to relays they can reach over TCP: every one here).
    fn open_tunnels(&mut self) {
        let t = now(self.now_ms);
        for i in 0..self.hosts.len() {
            for (tag, _) in self.hosts[i].reach.tunnels_wanted(t) {
                let Some(r) = self.hosts.iter().position(|h| h.reach.tag() == tag) else {
                    continue;
                };
                if self.tunnels.iter().any(|x| x.member == i && x.relay == r) {
                    continue;
                }
                let member_end =
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 77, i as u8, 1)), 40_000);
                let relay_end = SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(10, 88, r as u8, 1)),
                    40_000 + i as u16,
                );
                self.hosts[i].reach.tunnel_opened(member_end, Some(tag), t);
                self.hosts[r].reach.tunnel_opened(relay_end, None, t);
                self.tunnels.push(SimTunnel {
                    member: i,
                    relay: r,
                    member_end,
                    relay_end,
                });
                self.tunnels_asked.push((i, r));
            }
        }
    }

    /// The host a public destination reaches, and the private endpoint it arrives at.
    fn deliver_to(&self, src: SocketAddr, dst: SocketAddr) -> Option<(usize, SocketAddr)> {
        for x in &self.tunnels {
            if src == dst && dst == x.member_end {
                return Some((x.member, dst));
            }
            if src == dst && dst == x.relay_end {
                return Some((x.relay, dst));
            }
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if h.udp_blocked {
                continue;
            }
            match &h.nat {
                None if h.private == dst => return Some((i, dst)),
                Some(n) if IpAddr::V4(n.public) == dst.ip() => {
                    return n.inbound(src, dst.port()).map(|p| (i, p));
                }
                _ => {}
            }
        }
        None
    }

    fn act(&mut self, i: usize, actions: Vec<Action>) {
        let mut later = Vec::new();
        for a in actions {
            match a {
                Action::Send { to, bytes } => {
                    // Into a tunnel: out of its other end, into the other host's VXLAN
                    // socket (queued with the far end as both source and destination).
                    let far = self.tunnels.iter().find_map(|x| {
                        if x.member == i && to == x.member_end {
                            Some(x.relay_end)
                        } else if x.relay == i && to == x.relay_end {
                            Some(x.member_end)
                        } else {
                            None
                        }
                    });
                    if let Some(far) = far {
                        self.queue
                            .push_back((self.now_ms + LATENCY_MS, far, far, bytes));
                        continue;
                    }
                    if self.hosts[i].udp_blocked {
                        continue;
                    }
                    let h = &mut self.hosts[i];
                    if bytes.len() + 28 > h.mtu {
                        continue;
                    }
                    let src = match &mut h.nat {
                        None => h.private,
                        Some(n) => n.outbound(h.private, to),
                    };
                    self.queue
                        .push_back((self.now_ms + LATENCY_MS, src, to, bytes));
                }
                Action::Path(u) => {
                    let h = &mut self.hosts[i];
                    if matches!(u.path, Path::Direct { .. }) {
                        h.first_direct.entry(u.name.clone()).or_insert(self.now_ms);
                    }
                    if u.path != Path::Unknown {
                        h.first_any.entry(u.name.clone()).or_insert(self.now_ms);
                    }
                    // As vnetd does: the kernel's figure for a new direct path at once.
                    if let Path::Direct { endpoint, .. } = u.path {
                        let mut more = Vec::new();
                        h.reach
                            .set_kernel_mtu(u.peer, endpoint, Some(1500), &mut more);
                        later.extend(more);
                    }
                    h.paths.insert(u.name, u.path);
                }
                Action::Publish(r) => self.hosts[i].record = Some(r),
                Action::RelayBind { tag, endpoint } => self.hosts[i].binds.push((tag, endpoint)),
                Action::PathMtu { peer, mtu } => {
                    let h = &mut self.hosts[i];
                    let name = h
                        .reach
                        .status(now(self.now_ms))
                        .peers
                        .into_iter()
                        .find(|p| p.tag == peer)
                        .map(|p| p.name)
                        .unwrap_or_default();
                    h.link_mtu.insert(name, (self.now_ms, mtu));
                }
            }
        }
        if !later.is_empty() {
            self.act(i, later);
        }
    }

    /// What etcd holds: every host's record (none before its first publish, but its name and
    /// key, as a registration has them).
    fn peers_of(&self, i: usize) -> Vec<PeerInfo> {
        self.hosts
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, h)| PeerInfo {
                name: h.name.clone(),
                key: h.key,
                candidates: h
                    .record
                    .as_ref()
                    .map(|r| r.candidates.clone())
                    .unwrap_or_default(),
                relay: h.relay,
                bound_relays: h
                    .record
                    .as_ref()
                    .map(|r| r.bound_relays.clone())
                    .unwrap_or_default(),
                nat: h
                    .record
                    .as_ref()
                    .map(|r| r.nat)
                    .unwrap_or(NatMapping::Unknown),
            })
            .collect()
    }

    fn run(&mut self, until_ms: u64) {
        while self.now_ms < until_ms {
            self.now_ms += 5;
            let t = now(self.now_ms);
            if self.now_ms.is_multiple_of(100) {
                self.open_tunnels();
            }
            // etcd's watch: everyone sees the others' records every 100 ms.
            if self.now_ms.is_multiple_of(100) {
                for i in 0..self.hosts.len() {
                    if self.now_ms < self.hosts[i].sync_from_ms {
                        continue;
                    }
                    let peers = self.peers_of(i);
                    let mut out = Vec::new();
                    let mut rng = std::mem::take(&mut self.rng);
                    self.hosts[i].reach.set_peers(peers, t, &mut rng, &mut out);
                    self.rng = rng;
                    self.act(i, out);
                }
            }
            while self
                .queue
                .front()
                .is_some_and(|(at, ..)| *at <= self.now_ms)
            {
                let Some((_, src, dst, bytes)) = self.queue.pop_front() else {
                    break;
                };
                if let Some((i, _)) = self.deliver_to(src, dst) {
                    if bytes.len() + 28 > self.hosts[i].mtu {
                        continue;
                    }
                    let mut out = Vec::new();
                    let mut rng = std::mem::take(&mut self.rng);
                    self.hosts[i]
                        .reach
                        .on_datagram(src, &bytes, t, &mut rng, &mut out);
                    self.rng = rng;
                    self.act(i, out);
                }
            }
            for i in 0..self.hosts.len() {
                // A datagram or new peers may have brought the wake earlier.
                let h = &mut self.hosts[i];
                h.wake_at_ms = h.wake_at_ms.min(h.reach.next_wake_ms(t));
                if self.now_ms >= h.wake_at_ms {
                    let mut out = Vec::new();
                    let mut rng = std::mem::take(&mut self.rng);
                    self.hosts[i].reach.tick(t, &mut rng, &mut out);
                    self.rng = rng;
                    self.act(i, out);
                    let h = &mut self.hosts[i];
                    h.wake_at_ms = h.reach.next_wake_ms(t);
                }
            }
        }
    }

    fn path(&self, a: usize, b: usize) -> Path {
        self.hosts[a]
            .paths
            .get(&self.hosts[b].name)
            .cloned()
            .unwrap_or(Path::Unknown)
    }
}

fn punchable(a: NatKind, b: NatKind) -> bool {
    use NatKind::*;
    !matches!(
        (a, b),
        (Symmetric, Symmetric) | (Symmetric, PortRestricted) | (PortRestricted, Symmetric)
    )
}

#[test]
fn the_nat_matrix() {
    use NatKind::*;
    let kinds = [None, FullCone, PortRestricted, Symmetric, OneToOne];
    for (ai, a) in kinds.iter().enumerate() {
        for b in kinds.iter().skip(ai) {
            // Host 0 is the public relay; hosts 1 and 2 the pair.
            let mut net = Net::new(&[(None, true), (*a, false), (*b, false)]);
            net.run(12_000);
            for (x, y) in [(1, 2), (2, 1)] {
                let p = net.path(x, y);
                let name = &net.hosts[y].name;
                if punchable(*a, *b) {
                    assert!(
                        matches!(p, Path::Direct { .. }),
                        "{a:?}-{b:?}: {x}->{y} {p:?}"
                    );
                    let t = net.hosts[x].first_direct[name];
                    assert!(t <= 5_000, "{a:?}-{b:?}: direct after {t} ms");
                } else {
                    assert!(
                        matches!(&p, Path::Relayed { relay, .. } if relay == "h0"),
                        "{a:?}-{b:?}: {x}->{y} {p:?}"
                    );
                }
                let t = net.hosts[x].first_any[name];
                assert!(t <= 2_000, "{a:?}-{b:?}: first path after {t} ms");
                // Everyone reaches the public relay directly.
                assert!(matches!(net.path(x, 0), Path::Direct { .. }));
            }
            // The relay recorded both bindings.
            let tags: Vec<Tag> = net.hosts[0].binds.iter().map(|(t, _)| *t).collect();
            assert!(tags.contains(&net.hosts[1].reach.tag()), "{a:?}-{b:?}");
            assert!(tags.contains(&net.hosts[2].reach.tag()), "{a:?}-{b:?}");
        }
    }
}

#[test]
fn a_host_whose_udp_is_filtered_reaches_everyone_through_a_tunnel_to_the_relay() {
    use NatKind::*;
    // h0 the public relay, h1 behind a firewall that drops all UDP, h2 behind a NAT.
    let mut net = Net::new(&[(None, true), (None, false), (PortRestricted, false)]);
    net.hosts[1].udp_blocked = true;
    net.run(10_000);
    // Only h1 asked for a tunnel, to the relay, and not before UDP had its chance.
    assert_eq!(net.tunnels_asked, vec![(1, 0)]);
    // h1 reaches the relay over the tunnel and h2 through the relay over the tunnel; h2
    // reaches h1 through the relay over UDP (the relay's far end is the tunnel).
    assert!(
        matches!(net.path(1, 0), Path::Direct { tunnel: true, .. }),
        "{:?}",
        net.path(1, 0)
    );
    assert!(
        matches!(&net.path(1, 2), Path::Relayed { relay, tunnel: true, .. } if relay == "h0"),
        "{:?}",
        net.path(1, 2)
    );
    assert!(
        matches!(&net.path(2, 1), Path::Relayed { relay, tunnel: false, .. } if relay == "h0"),
        "{:?}",
        net.path(2, 1)
    );
    assert!(matches!(net.path(0, 1), Path::Direct { tunnel: true, .. }));
    assert_eq!(net.path(1, 0).word(), "tunneled");
    assert_eq!(net.path(1, 2).word(), "relayed-tcp");
    // The relay bound h1 at its tunnel end; nothing seen through the tunnel became a
    // candidate of either side.
    let relay_end = net.tunnels[0].relay_end;
    assert!(net.hosts[0]
        .binds
        .contains(&(net.hosts[1].reach.tag(), relay_end)));
    for i in [0, 1] {
        let rec = net.hosts[i].record.clone().unwrap();
        assert!(
            rec.candidates
                .iter()
                .all(|c| c.kind != CandidateKind::Reflexive),
            "h{i}: {:?}",
            rec.candidates
        );
    }
    // UDP passes again: h1 leaves the tunnel for UDP within a discovery round.
    net.hosts[1].udp_blocked = false;
    let before = net.now_ms;
    net.run(before + 12_000);
    assert!(
        matches!(net.path(1, 0), Path::Direct { tunnel: false, .. }),
        "{:?}",
        net.path(1, 0)
    );
    assert!(net.hosts[1]
        .reach
        .tunnels_wanted(now(net.now_ms))
        .is_empty());
}

#[test]
fn nat_kinds_are_recognised_and_published() {
    use NatKind::*;
    // Two public observers (the relay and another public host) see each NATed host.
    let mut net = Net::new(&[
        (None, true),
        (None, false),
        (Symmetric, false),
        (FullCone, false),
    ]);
    net.run(3_000);
    let rec = |i: usize| net.hosts[i].record.clone().unwrap();
    assert_eq!(rec(0).nat, NatMapping::None);
    assert_eq!(rec(2).nat, NatMapping::EndpointDependent);
    assert_eq!(rec(3).nat, NatMapping::EndpointIndependent);
    let c = &rec(3).candidates;
    assert_eq!(c[0].kind, CandidateKind::Reflexive);
    assert_eq!(c[0].endpoint, "198.51.100.13:4789".parse().unwrap());
    assert!(c.iter().any(|c| c.kind == CandidateKind::Local));
    assert_eq!(rec(3).bound_relays, vec!["h0".to_string()]);
}

#[test]
fn a_lost_mapping_falls_back_to_the_relay_and_recovers() {
    use NatKind::*;
    let mut net = Net::new(&[
        (None, true),
        (PortRestricted, false),
        (PortRestricted, false),
    ]);
    net.run(8_000);
    assert!(matches!(net.path(1, 2), Path::Direct { punched: true, .. }));
    // Host 2's NAT reboots: every mapping gone, new ones get other ports.
    if let Some(n) = net.hosts[2].nat.as_mut() {
        n.out.clear();
        n.inbound.clear();
        n.next_port = 30_000;
        n.kind = Symmetric; // and it came back as a symmetric one: no direct path now
    }
    let before = net.now_ms;
    net.run(before + 12_000);
    assert!(
        matches!(net.path(1, 2), Path::Relayed { .. }),
        "{:?}",
        net.path(1, 2)
    );
    // It comes back as port-restricted again: direct within the slow discovery round.
    if let Some(n) = net.hosts[2].nat.as_mut() {
        n.kind = PortRestricted;
        n.out.clear();
        n.inbound.clear();
    }
    let before = net.now_ms;
    net.run(before + 25_000);
    assert!(
        matches!(net.path(1, 2), Path::Direct { .. }),
        "{:?}",
        net.path(1, 2)
    );
}

#[test]
fn forged_and_foreign_probes_are_refused_and_counted() {
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    net.run(1_000);
    let a = &mut net.hosts[0];
    let t = now(1_000);
    let mut rng = CountingRandom(77);
    let mut out = Vec::new();
    let from: SocketAddr = "203.0.113.66:4789".parse().unwrap();
    // A stranger's key: unknown sender.
    let stranger = PrivateKey([99; 32]);
    let sp = stranger.public();
    let pair = PairKey::derive(&stranger, &sp, &a.key).unwrap();
    let ping = ProbeBody::Ping(Ping {
        txid: [1; 12],
        wall_ms: t.wall_ms,
    });
    let m = seal(&pair, Kind::Ping, 0, sp, &ping, 0, &mut rng);
    a.reach.on_datagram(from, &m, t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.unknown_sender, 1);
    // A member's key in the header but sealed with another key: bad auth.
    let peer_key = net.hosts[1].key;
    let a = &mut net.hosts[0];
    let m = seal(&pair, Kind::Ping, 0, peer_key, &ping, 0, &mut rng);
    a.reach.on_datagram(from, &m, t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.bad_auth, 1);
    // Garbage of our kinds.
    a.reach
        .on_datagram(from, &[0x20, 9, 9], t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.malformed, 1);
    assert!(
        out.iter().all(|x| !matches!(x, Action::Send { .. })),
        "nothing answered"
    );
}

#[test]
fn replayed_and_stale_pings_are_refused() {
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    net.run(1_000);
    let b_key = PrivateKey([2; 32]);
    let bp = b_key.public();
    let a_pub = net.hosts[0].key;
    let pair = PairKey::derive(&b_key, &bp, &a_pub).unwrap();
    let t = now(1_000);
    let mut rng = CountingRandom(1234);
    let from = net.hosts[1].private;
    let a = &mut net.hosts[0];
    let base = a.reach.counters.pongs_sent;
    let ping = |wall_ms: u64, txid: u8| {
        ProbeBody::Ping(Ping {
            txid: [txid; 12],
            wall_ms,
        })
    };
    let m = seal(&pair, Kind::Ping, 0, bp, &ping(t.wall_ms, 5), 0, &mut rng);
    let mut out = Vec::new();
    a.reach.on_datagram(from, &m, t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.pongs_sent, base + 1);
    a.reach.on_datagram(from, &m, t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.replay, 1);
    let old = seal(
        &pair,
        Kind::Ping,
        0,
        bp,
        &ping(t.wall_ms - FRESH_MS - 1, 6),
        0,
        &mut rng,
    );
    a.reach.on_datagram(from, &old, t, &mut rng, &mut out);
    assert_eq!(a.reach.counters.replay, 2);
    assert_eq!(a.reach.counters.pongs_sent, base + 1);
}

#[test]
fn a_pong_pads_to_a_probe_that_asks() {
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    net.run(1_000);
    let b_key = PrivateKey([2; 32]);
    let bp = b_key.public();
    let pair = PairKey::derive(&b_key, &bp, &net.hosts[0].key).unwrap();
    let t = now(1_000);
    let mut rng = CountingRandom(4321);
    let ping = ProbeBody::Ping(Ping {
        txid: [8; 12],
        wall_ms: t.wall_ms,
    });
    let m = seal(&pair, Kind::Ping, FLAG_PAD_REPLY, bp, &ping, 1400, &mut rng);
    let mut out = Vec::new();
    let from = net.hosts[1].private;
    net.hosts[0]
        .reach
        .on_datagram(from, &m, t, &mut rng, &mut out);
    let sent: Vec<usize> = out
        .iter()
        .filter_map(|a| match a {
            Action::Send { bytes, .. } => Some(bytes.len()),
            _ => None,
        })
        .collect();
    assert!(sent.contains(&1400), "{sent:?}");
}

#[test]
fn stun_answers_count_only_when_asked() {
    let server: SocketAddr = "198.51.100.200:3478".parse().unwrap();
    let mut r = Reach::new(ReachConfig {
        key: PrivateKey([5; 32]),
        port: 4789,
        local: vec!["192.168.1.2".parse().unwrap()],
        advertised: None,
        stun: vec![server],
        relay: false,
    });
    let mut rng = CountingRandom(1);
    let mut out = Vec::new();
    r.tick(now(0), &mut rng, &mut out);
    let req = out
        .iter()
        .find_map(|a| match a {
            Action::Send { to, bytes } if *to == server => Some(bytes.clone()),
            _ => None,
        })
        .unwrap();
    let mut txid = [0u8; 12];
    txid.copy_from_slice(&req[8..20]);
    let answer = |txid: [u8; 12]| {
        let mut m = vec![0x01, 0x01, 0, 12, 0x21, 0x12, 0xa4, 0x42];
        m.extend_from_slice(&txid);
        m.extend_from_slice(&[0, 0x20, 0, 8, 0, 1]);
        m.extend_from_slice(&(40000u16 ^ 0x2112).to_be_bytes());
        for (b, c) in [203u8, 0, 113, 9].iter().zip([0x21, 0x12, 0xa4, 0x42]) {
            m.push(b ^ c);
        }
        m
    };
    // From elsewhere, or another txid: refused.
    r.on_datagram(
        "198.51.100.201:3478".parse().unwrap(),
        &answer(txid),
        now(10),
        &mut rng,
        &mut out,
    );
    r.on_datagram(server, &answer([0; 12]), now(10), &mut rng, &mut out);
    assert_eq!(r.counters.unsolicited, 2);
    r.on_datagram(server, &answer(txid), now(10), &mut rng, &mut out);
    assert_eq!(r.counters.stun_received, 1);
    let st = r.status(now(10));
    assert_eq!(
        st.candidates[0].endpoint,
        "203.0.113.9:40000".parse().unwrap()
    );
}

#[test]
fn a_ping_before_its_senders_record_is_answered_when_the_record_comes() {
    // b pings a before a has b's record: refused for now, answered as soon as it arrives.
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    let b_key = PrivateKey([2; 32]);
    let bp = b_key.public();
    let pair = PairKey::derive(&b_key, &bp, &net.hosts[0].key).unwrap();
    let t = now(0);
    let mut rng = CountingRandom(99);
    let ping = ProbeBody::Ping(Ping {
        txid: [3; 12],
        wall_ms: t.wall_ms,
    });
    let m = seal(&pair, Kind::Ping, 0, bp, &ping, 0, &mut rng);
    let from = net.hosts[1].private;
    let mut out = Vec::new();
    net.hosts[0]
        .reach
        .on_datagram(from, &m, t, &mut rng, &mut out);
    assert_eq!(net.hosts[0].reach.counters.unknown_sender, 1);
    assert!(out.is_empty());
    let peers = net.peers_of(0);
    net.hosts[0]
        .reach
        .set_peers(peers.clone(), now(100), &mut rng, &mut out);
    let pongs = out
        .iter()
        .filter(|a| matches!(a, Action::Send { to, bytes } if *to == from && bytes[0] == wire::MSG_PONG))
        .count();
    assert_eq!(pongs, 1, "{out:?}");
    // Once: the same datagram again is a replay, and later records read nothing more.
    out.clear();
    net.hosts[0]
        .reach
        .on_datagram(from, &m, now(200), &mut rng, &mut out);
    assert_eq!(net.hosts[0].reach.counters.replay, 1);
    // A stranger's ping older than the TTL is not read when the key arrives.
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    let mut out = Vec::new();
    net.hosts[0]
        .reach
        .on_datagram(from, &m, t, &mut rng, &mut out);
    let peers = net.peers_of(0);
    net.hosts[0]
        .reach
        .set_peers(peers, now(STRANGER_TTL_MS + 1), &mut rng, &mut out);
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::Send { bytes, .. } if bytes[0] == wire::MSG_PONG)));
}

/// Host 1's uplink carries 1280 bytes and drops larger datagrams without a word (ICMP
/// filtered): probing finds 1280 for both ends of the direct path within a second of it, and
/// 1280 for host 1's path to the relay; host 2's path to the relay stays 1500.
#[test]
fn probing_finds_a_black_holed_path_mtu_within_a_second() {
    use NatKind::*;
    let mut net = Net::new(&[(None, true), (PortRestricted, false), (FullCone, false)]);
    net.hosts[1].mtu = 1280;
    net.run(6_000);
    assert!(
        matches!(net.path(1, 2), Path::Direct { .. }),
        "{:?}",
        net.path(1, 2)
    );
    for (a, b) in [(1, 2), (2, 1)] {
        let name = net.hosts[b].name.clone();
        let h = &net.hosts[a];
        let (at, mtu) = h.link_mtu[&name];
        assert_eq!(mtu, Some(1280), "{a}->{b}");
        assert_eq!(h.reach.link_mtu(Tag::of(&net.hosts[b].key)), Some(1280));
        let direct = h.first_direct[&name];
        assert!(
            at >= direct && at - direct <= 1_000,
            "{a}->{b}: direct at {direct} ms, 1280 at {at} ms"
        );
        let st = h.reach.status(now(net.now_ms));
        let p = st.peers.iter().find(|p| p.name == name).unwrap();
        let pm = p.pmtu.as_ref().unwrap();
        assert_eq!(
            (pm.state, pm.probed, pm.kernel),
            ("done", Some(1280), Some(1500))
        );
        assert!(pm.search_ms.unwrap() <= 1_000, "{pm:?}");
        assert!(st.counters.pmtu_probes_answered > 0 && st.counters.pmtu_probes_lost >= 3);
        assert_eq!(st.counters.pmtu_black_holes, 0);
    }
    assert_eq!(net.hosts[1].link_mtu["h0"].1, Some(1280));
    assert_eq!(net.hosts[2].link_mtu["h0"].1, Some(1500));
    // The path shrinks further (a route change, still no ICMP): noticed at the next
    // confirmation (within CONFIRM_MS) once MAX_PROBES of them are lost, and found again.
    net.hosts[1].mtu = 1200;
    let t0 = net.now_ms;
    net.run(t0 + crate::pmtu::CONFIRM_MS + 2_000);
    let (at, mtu) = net.hosts[2].link_mtu["h1"];
    assert_eq!(mtu, Some(1200));
    assert!(at - t0 <= crate::pmtu::CONFIRM_MS + 1_000, "{} ms", at - t0);
    assert!(net.hosts[2].reach.counters.pmtu_black_holes >= 1);
}

/// A relayed path takes the MTU of this host's own path to the relay.
#[test]
fn a_relayed_path_takes_the_relays_mtu() {
    use NatKind::*;
    let mut net = Net::new(&[(None, true), (Symmetric, false), (Symmetric, false)]);
    net.hosts[1].mtu = 1400;
    net.run(6_000);
    assert!(matches!(net.path(1, 2), Path::Relayed { .. }));
    assert_eq!(net.hosts[1].link_mtu["h2"].1, Some(1400));
    assert_eq!(net.hosts[1].link_mtu["h0"].1, Some(1400));
    // Host 2's leg to the relay carries 1500; the relay's leg to host 1 is host 1's to probe.
    assert_eq!(net.hosts[2].link_mtu["h1"].1, Some(1500));
}

/// A forged pong cannot confirm a probe size: it fails authentication before any txid is
/// looked at, and a replayed probe pong answers nothing any more.
#[test]
fn probe_answers_are_authenticated_and_used_once() {
    let mut net = Net::new(&[(NatKind::None, false), (NatKind::None, false)]);
    // Capture host 1's probe pongs to host 0 and replay them.
    net.run(3_000);
    let before = net.hosts[0].reach.counters.clone();
    assert!(before.pmtu_probes_answered > 0);
    let b_key = PrivateKey([2; 32]);
    let bp = b_key.public();
    let pair = PairKey::derive(&b_key, &bp, &net.hosts[0].key).unwrap();
    let t = now(net.now_ms);
    let mut rng = CountingRandom(999);
    let from = net.hosts[1].private;
    // A pong of any txid sealed with the right key is unsolicited; with another key, bad auth.
    let pong = ProbeBody::Pong(Pong {
        txid: [3; 12],
        wall_ms: t.wall_ms,
        observed: from,
    });
    let m = seal(&pair, Kind::Pong, 0, bp, &pong, 1472, &mut rng);
    let mut out = Vec::new();
    net.hosts[0]
        .reach
        .on_datagram(from, &m, t, &mut rng, &mut out);
    let stranger = PrivateKey([77; 32]);
    let other = PairKey::derive(&stranger, &stranger.public(), &net.hosts[0].key).unwrap();
    let m = seal(&other, Kind::Pong, 0, bp, &pong, 1472, &mut rng);
    net.hosts[0]
        .reach
        .on_datagram(from, &m, t, &mut rng, &mut out);
    let after = &net.hosts[0].reach.counters;
    assert_eq!(after.unsolicited, before.unsolicited + 1);
    assert_eq!(after.bad_auth, before.bad_auth + 1);
    assert_eq!(after.pmtu_probes_answered, before.pmtu_probes_answered);
}

#[test]
fn a_relay_that_reads_the_overlay_late_binds_members_where_their_links_go() {
    use NatKind::*;
    // The relay's agent reads the overlay 3 s late (a loaded machine, a burst of hosts):
    // until then it answers no member, so each opens a TCP tunnel to it (after 2 s). Then the
    // members reach it over UDP as well, their links go over UDP, and the relay must forward
    // their frames there too, not into the tunnels the discovery rounds still ping (each
    // member's links accept relayed frames only from the relay's endpoint they chose).
    let mut net = Net::new(&[
        (None, true),
        (PortRestricted, false),
        (Symmetric, false),
        (Symmetric, false),
    ]);
    net.hosts[0].sync_from_ms = 3_000;
    net.run(3_000);
    assert_eq!(net.tunnels_asked, vec![(1, 0), (2, 0), (3, 0)]);
    let tunnel_ends: Vec<SocketAddr> = net.tunnels.iter().map(|x| x.relay_end).collect();
    let mut t = 3_300;
    while t <= 15_000 {
        net.run(t);
        let mut bound: BTreeMap<Tag, SocketAddr> = BTreeMap::new();
        for (tag, ep) in &net.hosts[0].binds {
            bound.insert(*tag, *ep);
        }
        for i in 1..4 {
            assert!(
                matches!(net.path(i, 0), Path::Direct { tunnel: false, .. }),
                "t={t} h{i}: {:?}",
                net.path(i, 0)
            );
            let b = bound.get(&net.hosts[i].reach.tag());
            assert!(
                b.is_some_and(|b| !tunnel_ends.contains(b)),
                "t={t}: the relay forwards h{i}'s frames into its tunnel ({b:?})"
            );
        }
        assert!(matches!(
            net.path(2, 3),
            Path::Relayed { tunnel: false, .. }
        ));
        t += 100;
    }
}
