//! The overlay as a picture's data (pure): hosts, the links between them, guests per host,
//! and the traffic between guests and between hosts, from the agent's view of the store and
//! the traffic matrices the hosts publish (`/vnet/O/matrix/<host>`).
//!
//! Published matrices hold cumulative counters and are put every few seconds (only when they
//! changed), so a rate is the difference between the last two *different* matrices of a host
//! over the time between them ([`MatrixTracker`]), and falls to zero when a host's matrix has
//! not changed for two of its intervals. A frame between hosts is in the matrices of both (each
//! records what enters it), so a pair's rate is taken from the matrix of the source guest's
//! host only.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use serde::Serialize;
use vnet_cluster::{derive, ClusterState, HostId, MatrixRecord, Policy, CAP_NOISE};
use vnet_control::{parse_line, Config, LinkKind};
use vnet_wire::MacAddr;

/// The most hosts whose links are derived for the picture (each is a derivation).
pub const MAX_VIEW_HOSTS: usize = 64;
/// The most guests in the heat map (the busiest).
pub const MAX_VIEW_GUESTS: usize = 48;

type PairKey = (u32, MacAddr, MacAddr);

#[derive(Debug, Clone)]
struct Seen {
    at_ms: u64,
    bytes: BTreeMap<PairKey, u64>,
}

/// The distinct matrices of one host seen within [`RATE_WINDOW_MS`], oldest first (at
/// least the newest two).
#[derive(Debug, Clone)]
struct Track {
    seen: VecDeque<Seen>,
}

/// Rates are averaged over the matrices seen in this window: a host's publications come late
/// when its machine is busy, and one late put would otherwise halve one rate and double the
/// next.
pub const RATE_WINDOW_MS: u64 = 6000;

/// Rates of the published matrices, from the matrices seen at successive reads.
#[derive(Debug, Default)]
pub struct MatrixTracker {
    hosts: BTreeMap<String, Track>,
}

/// A (VNI, source, destination) pair's rate as one host's matrix shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairRate {
    pub vni: u32,
    pub src: MacAddr,
    pub dst: MacAddr,
    pub bytes_per_s: f64,
}

impl MatrixTracker {
    /// Records the matrices read at `now_ms` (a monotonic clock); hosts absent are forgotten.
    pub fn observe(&mut self, now_ms: u64, matrices: &[MatrixRecord]) {
        let present: BTreeSet<&str> = matrices.iter().map(|m| m.host_id.as_str()).collect();
        self.hosts.retain(|h, _| present.contains(h.as_str()));
        for m in matrices {
            let bytes: BTreeMap<PairKey, u64> = m
                .pairs
                .iter()
                .map(|p| ((p.vni, p.src, p.dst), p.bytes))
                .collect();
            let seen = Seen {
                at_ms: now_ms,
                bytes,
            };
            match self.hosts.get_mut(m.host_id.as_str()) {
                Some(t) if t.seen.back().map(|b| &b.bytes) == Some(&seen.bytes) => {}
                Some(t) => {
                    t.seen.push_back(seen);
                    while t.seen.len() > 2 && t.seen[1].at_ms + RATE_WINDOW_MS <= now_ms {
                        t.seen.pop_front();
                    }
                }
                None => {
                    self.hosts.insert(
                        m.host_id.to_string(),
                        Track {
                            seen: VecDeque::from([seen]),
                        },
                    );
                }
            }
        }
    }

    /// The rates per host at `now_ms`, over the window: nothing for a host seen once, zero
    /// for one whose matrix stood still for more than twice its last interval (plus a second).
    pub fn rates(&self, now_ms: u64) -> BTreeMap<String, Vec<PairRate>> {
        let mut out = BTreeMap::new();
        for (host, t) in &self.hosts {
            let n = t.seen.len();
            if n < 2 {
                continue;
            }
            let (cur, last_prev, first) = (&t.seen[n - 1], &t.seen[n - 2], &t.seen[0]);
            let last_interval = cur.at_ms.saturating_sub(last_prev.at_ms).max(1);
            let stale = now_ms.saturating_sub(cur.at_ms) > 2 * last_interval + 1000;
            let (prev, interval) = (first, cur.at_ms.saturating_sub(first.at_ms).max(1));
            let rates = cur
                .bytes
                .iter()
                .map(|(&(vni, src, dst), &now)| {
                    let before = prev.bytes.get(&(vni, src, dst)).copied().unwrap_or(0);
                    // A restarted daemon counts from zero again: no rate from that.
                    let delta = now.saturating_sub(before);
                    let bytes_per_s = if stale {
                        0.0
                    } else {
                        delta as f64 * 1000.0 / interval as f64
                    };
                    PairRate {
                        vni,
                        src,
                        dst,
                        bytes_per_s,
                    }
                })
                .collect();
            out.insert(host.clone(), rates);
        }
        out
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HostView {
    pub id: String,
    pub addr: String,
    pub encrypted: bool,
    pub local: bool,
    /// Bytes per second its guests send to guests on other hosts, and receive from them.
    pub out_bytes_per_s: f64,
    pub in_bytes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EdgeView {
    /// The pair of hosts, `a` < `b`.
    pub a: String,
    pub b: String,
    /// A derived link joins them (false: only traffic, relayed by another host).
    pub linked: bool,
    pub vnis: Vec<u32>,
    pub a_to_b_bytes_per_s: f64,
    pub b_to_a_bytes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GuestView {
    pub mac: String,
    pub vni: u32,
    pub host: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CellView {
    /// Indexes into `guests`.
    pub src: usize,
    pub dst: usize,
    pub bytes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OverlayView {
    pub enabled: bool,
    pub overlay: String,
    pub local_host: String,
    pub policy: String,
    pub hosts: Vec<HostView>,
    pub edges: Vec<EdgeView>,
    /// Guests in the heat map (the busiest, at most [`MAX_VIEW_GUESTS`]), ordered by host.
    pub guests: Vec<GuestView>,
    /// Guests left out of the heat map.
    pub guests_not_shown: usize,
    /// Every guest per host id.
    pub guests_per_host: BTreeMap<String, Vec<GuestView>>,
    /// The heat map's cells with traffic (source row, destination column).
    pub matrix: Vec<CellView>,
    /// Set when the published matrices could not be read.
    pub matrices_error: Option<String>,
}

fn policy_text(p: &Policy) -> String {
    match p {
        Policy::Mesh => "mesh".into(),
        Policy::Star { proxy } => format!("star via {proxy}"),
        Policy::Explicit => "explicit".into(),
    }
}

/// The picture's data from the agent's state and the matrices' rates.
pub fn overlay_view(
    local: &HostId,
    state: &ClusterState,
    rates: &BTreeMap<String, Vec<PairRate>>,
    matrices_error: Option<String>,
) -> OverlayView {
    let hosts = state.hosts();
    let by_addr: BTreeMap<IpAddr, &HostId> = hosts.iter().map(|(id, r)| (r.addr, id)).collect();

    // Links: each host's derivation (without local overrides, which only that host knows).
    let mut linked: BTreeMap<(String, String), BTreeSet<u32>> = BTreeMap::new();
    if hosts.len() <= MAX_VIEW_HOSTS {
        for id in hosts.keys() {
            for l in derive(id, state, &placed_config(state, id)).config.links {
                let ip = match l.kind {
                    LinkKind::Udp(a) | LinkKind::TcpDial(a) => a.ip(),
                    LinkKind::TcpAccept(ip) => ip,
                    LinkKind::Direct(_) => continue,
                };
                let Some(peer) = by_addr.get(&ip) else {
                    continue;
                };
                let (a, b) = ordered(id.as_str(), peer.as_str());
                linked.entry((a, b)).or_default().insert(l.vni);
            }
        }
    }

    // Traffic between guests: from the matrix of the source guest's host.
    let placed = |vni: u32, mac: MacAddr| state.placement(vni, mac).map(|p| p.host_id.as_str());
    let mut pair_rate: BTreeMap<PairKey, f64> = BTreeMap::new();
    for (host, list) in rates {
        for r in list {
            if placed(r.vni, r.src) == Some(host.as_str()) {
                *pair_rate.entry((r.vni, r.src, r.dst)).or_default() += r.bytes_per_s;
            }
        }
    }
    let mut edge_rate: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    let mut host_out: BTreeMap<&str, f64> = BTreeMap::new();
    let mut host_in: BTreeMap<&str, f64> = BTreeMap::new();
    for (&(vni, src, dst), &r) in &pair_rate {
        let (Some(hs), Some(hd)) = (placed(vni, src), placed(vni, dst)) else {
            continue;
        };
        if hs == hd {
            continue;
        }
        *host_out.entry(hs).or_default() += r;
        *host_in.entry(hd).or_default() += r;
        let (a, b) = ordered(hs, hd);
        let e = edge_rate.entry((a.clone(), b)).or_default();
        if a == hs {
            e.0 += r;
        } else {
            e.1 += r;
        }
    }
    let mut edges = Vec::new();
    let keys: BTreeSet<(String, String)> = linked.keys().chain(edge_rate.keys()).cloned().collect();
    for k in keys {
        let (ab, ba) = edge_rate.get(&k).copied().unwrap_or((0.0, 0.0));
        edges.push(EdgeView {
            linked: linked.contains_key(&k),
            vnis: linked
                .get(&k)
                .map(|v| v.iter().copied().collect())
                .unwrap_or_default(),
            a: k.0,
            b: k.1,
            a_to_b_bytes_per_s: ab,
            b_to_a_bytes_per_s: ba,
        });
    }

    let host_views = hosts
        .iter()
        .map(|(id, r)| HostView {
            id: id.to_string(),
            addr: r.addr.to_string(),
            encrypted: r.has_capability(CAP_NOISE),
            local: id == local,
            out_bytes_per_s: host_out.get(id.as_str()).copied().unwrap_or(0.0),
            in_bytes_per_s: host_in.get(id.as_str()).copied().unwrap_or(0.0),
        })
        .collect();

    // Guests: all per host; the heat map takes the busiest.
    let all: Vec<GuestView> = state
        .interfaces()
        .values()
        .map(|i| GuestView {
            mac: i.mac.to_string(),
            vni: i.vni,
            host: i.host_id.to_string(),
            name: i.name.clone(),
        })
        .collect();
    let mut guests_per_host: BTreeMap<String, Vec<GuestView>> = BTreeMap::new();
    for g in &all {
        guests_per_host
            .entry(g.host.clone())
            .or_default()
            .push(g.clone());
    }
    let mut traffic: BTreeMap<(u32, String), f64> = BTreeMap::new();
    for (&(vni, src, dst), &r) in &pair_rate {
        *traffic.entry((vni, src.to_string())).or_default() += r;
        *traffic.entry((vni, dst.to_string())).or_default() += r;
    }
    let mut shown = all.clone();
    if shown.len() > MAX_VIEW_GUESTS {
        shown.sort_by(|x, y| {
            let tx = traffic.get(&(x.vni, x.mac.clone())).copied().unwrap_or(0.0);
            let ty = traffic.get(&(y.vni, y.mac.clone())).copied().unwrap_or(0.0);
            ty.total_cmp(&tx)
        });
        shown.truncate(MAX_VIEW_GUESTS);
    }
    shown.sort_by(|x, y| (&x.host, x.vni, &x.mac).cmp(&(&y.host, y.vni, &y.mac)));
    let index: BTreeMap<(u32, &str), usize> = shown
        .iter()
        .enumerate()
        .map(|(i, g)| ((g.vni, g.mac.as_str()), i))
        .collect();
    let mut matrix = Vec::new();
    for (&(vni, src, dst), &r) in &pair_rate {
        let (s, d) = (src.to_string(), dst.to_string());
        if let (Some(&si), Some(&di)) =
            (index.get(&(vni, s.as_str())), index.get(&(vni, d.as_str())))
        {
            matrix.push(CellView {
                src: si,
                dst: di,
                bytes_per_s: r,
            });
        }
    }

    OverlayView {
        enabled: true,
        overlay: state.overlay().to_string(),
        local_host: local.to_string(),
        policy: policy_text(&state.policy()),
        hosts: host_views,
        edges,
        guests_not_shown: all.len() - shown.len(),
        guests: shown,
        guests_per_host,
        matrix,
        matrices_error,
    }
}

/// A stand-in for a host's local configuration: its placed interfaces (the derivation links
/// a host in the VNIs it serves). Its real local links and routes are known to it alone.
fn placed_config(state: &ClusterState, host: &HostId) -> Config {
    let mut cfg = Config::default();
    let mut gen = || MacAddr([2, 0, 0, 0, 0, 1]);
    for (n, i) in state
        .interfaces()
        .values()
        .filter(|i| &i.host_id == host)
        .enumerate()
    {
        let line = format!("interface add g{n} tap mac {} vni {}", i.mac, i.vni);
        if let Ok(Some(cmd)) = parse_line(&line) {
            let _ = cfg.apply(&cmd, &mut gen);
        }
    }
    cfg
}

fn ordered(x: &str, y: &str) -> (String, String) {
    if x <= y {
        (x.to_string(), y.to_string())
    } else {
        (y.to_string(), x.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_cluster::{encode, key_for_host, key_for_interface, HostRecord, InterfaceRecord};
    use vnet_core::MatrixEntry;

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    fn entry(src: u8, dst: u8, bytes: u64) -> MatrixEntry {
        MatrixEntry {
            vni: 1,
            src: mac(src),
            dst: mac(dst),
            frames: bytes / 100,
            bytes,
        }
    }

    fn pm(host: &str, pairs: Vec<MatrixEntry>) -> MatrixRecord {
        MatrixRecord {
            host_id: host.parse().expect("host id"),
            pairs,
        }
    }

    #[test]
    fn rates_from_successive_matrices() {
        let mut t = MatrixTracker::default();
        t.observe(0, &[pm("a", vec![entry(1, 2, 1000)])]);
        assert!(t.rates(0).is_empty(), "one matrix gives no rate");
        // Unchanged at the next read: no new sample.
        t.observe(1000, &[pm("a", vec![entry(1, 2, 1000)])]);
        assert!(t.rates(1000).is_empty());
        t.observe(2000, &[pm("a", vec![entry(1, 2, 5000), entry(2, 1, 200)])]);
        let r = &t.rates(2000)["a"];
        // 4000 bytes over the 2 s since the previous different matrix; a new pair counts all.
        assert_eq!(r[0].bytes_per_s, 2000.0);
        assert_eq!(r[1].bytes_per_s, 100.0);
        // Still within two intervals: the rate holds; past them, it is zero.
        assert_eq!(t.rates(6000)["a"][0].bytes_per_s, 2000.0);
        assert_eq!(t.rates(7001)["a"][0].bytes_per_s, 0.0);
        // Averaged over the window: 2000 more bytes 1 s later, then 8000 more 1 s after that:
        // 10000 bytes over the 2 s since the oldest matrix in the window.
        t.observe(7100, &[pm("a", vec![entry(1, 2, 7000)])]);
        t.observe(8100, &[pm("a", vec![entry(1, 2, 15000)])]);
        assert_eq!(t.rates(8100)["a"][0].bytes_per_s, 10000.0 / 6.1);
        // A restarted host counts from zero: no negative rate.
        t.observe(15000, &[pm("a", vec![entry(1, 2, 10)])]);
        assert_eq!(t.rates(15000)["a"][0].bytes_per_s, 0.0);
        // A host that no longer publishes is forgotten.
        t.observe(9000, &[]);
        assert!(t.rates(9000).is_empty());
    }

    fn state() -> ClusterState {
        let overlay: vnet_cluster::OverlayName = "lab".parse().unwrap();
        let mut s = ClusterState::new(overlay.clone());
        for (i, h) in ["a", "b", "c"].iter().enumerate() {
            let id: HostId = h.parse().unwrap();
            let rec = HostRecord {
                host_id: id.clone(),
                addr: format!("10.0.0.{}", i + 1).parse().unwrap(),
                udp_port: 4789,
                tcp_port: None,
                capabilities: vec!["vxlan".into()],
                public_key: None,
                version: vnet_cluster::SCHEMA_VERSION,
                reach: Default::default(),
            };
            s.apply_put(&key_for_host(&overlay, &id), &encode(&rec))
                .unwrap();
            let ir = InterfaceRecord {
                mac: mac(i as u8 + 1),
                vni: 1,
                host_id: id,
                name: format!("vm{}", i + 1),
                epoch: 0,
            };
            s.apply_put(&key_for_interface(&overlay, 1, ir.mac), &encode(&ir))
                .unwrap();
        }
        s
    }

    #[test]
    fn the_picture_of_a_mesh() {
        let s = state();
        let a: HostId = "a".parse().unwrap();
        let mut rates = BTreeMap::new();
        // a's guest sends to b's at 1000 B/s; b's matrix also has it (as it entered b): the
        // pair is counted once, from a's matrix.
        rates.insert(
            "a".to_string(),
            vec![PairRate {
                vni: 1,
                src: mac(1),
                dst: mac(2),
                bytes_per_s: 1000.0,
            }],
        );
        rates.insert(
            "b".to_string(),
            vec![PairRate {
                vni: 1,
                src: mac(1),
                dst: mac(2),
                bytes_per_s: 1000.0,
            }],
        );
        let v = overlay_view(&a, &s, &rates, None);
        assert_eq!(v.hosts.len(), 3);
        assert!(v.hosts[0].local && !v.hosts[1].local);
        assert_eq!(v.hosts[0].out_bytes_per_s, 1000.0);
        assert_eq!(v.hosts[1].in_bytes_per_s, 1000.0);
        // The mesh: three links, one with traffic.
        assert_eq!(v.edges.len(), 3);
        assert!(v.edges.iter().all(|e| e.linked && e.vnis == [1]));
        let ab = v.edges.iter().find(|e| e.a == "a" && e.b == "b").unwrap();
        assert_eq!(
            (ab.a_to_b_bytes_per_s, ab.b_to_a_bytes_per_s),
            (1000.0, 0.0)
        );
        assert_eq!(v.guests.len(), 3);
        assert_eq!(v.matrix.len(), 1);
        assert_eq!((v.matrix[0].src, v.matrix[0].dst), (0, 1));
        assert_eq!(v.guests_per_host["c"][0].name, "vm3");
        assert_eq!(v.policy, "mesh");
    }
}
