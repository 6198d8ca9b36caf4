//! vnetd's reach thread (issue #31, `docs/design/reach.md`): runs `vnet-reach`'s machine for
//! this host. In: the host records the etcd agent hands over (every peer's probe key,
//! candidates and relay role), reach's datagrams from the data path's inbox, the clock. Out:
//! pings, pongs and STUN requests on the VXLAN socket (so a NAT's mapping is the one the data
//! uses), each peer's path into the engine, the reach part of this host's record for the agent
//! to publish, and a relay's bindings; the TCP tunnels to relays where UDP does not pass
//! (`reach_tunnel`), and on a relay the listener for them; each path's MTU: the kernel's figure
//! (asked every `MTU_EVERY_MS`) given to the machine as the ceiling of its probing (padded
//! pings, RFC 8899), and the machine's answer given to the engine. Also where the probe key
//! comes from: `--key-file`'s key, else `reach.key` in the state directory, made at the first
//! start.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use socket2::SockAddr;
use tracing::{debug, info, warn};
use vnet_cluster::{CandidateRecord, HostId, HostReach, HostRecord, CAP_RELAY};
use vnet_control::status::{ReachPeer, ReachReport};
use vnet_core::LockRecover;
use vnet_crypto::{PrivateKey, PublicKey};
use vnet_dataplane::reach::for_socket;
use vnet_dataplane::shared::Shared;
use vnet_dataplane::sys::IoPart;
use vnet_dataplane::vxlan_socket::VxlanSocket;
use vnet_dataplane::ReachPath;
use vnet_reach::{
    Action, Candidate, CandidateKind, NatMapping, Now, OsRandom, Path as ReachRoute, PeerInfo,
    ReachConfig, RelayTable, Tag,
};

use crate::daemon::Daemon;
pub use crate::reach_handle::Handle;
use crate::reach_tunnel::{TunnelEvent, Tunnels};

/// The probe key's file in the state directory (when there is no `--key-file`).
pub const KEY_FILE: &str = "reach.key";
/// How long the thread waits at most between two looks at its inputs.
const MAX_WAIT: Duration = Duration::from_millis(50);
/// This host's addresses are read again this often.
const ADDRESSES_EVERY_MS: u64 = 30_000;
/// `show reach` is refreshed this often.
const REPORT_EVERY_MS: u64 = 250;
/// Each path's MTU is asked of the kernel again this often: a smaller one learned from ICMP
/// reaches the data path within this (probing's answers reach it at once).
const MTU_EVERY_MS: u64 = 500;
/// A pair's burst through a relay: what its budget carries in 100 ms, and at least a few TSO
/// frames' segments in one go (256 KB). The kernel forwards a pair's datagrams as fast as they
/// come, so a pair's TCP meets the budget as a policer: with 25 ms of burst TCP through a 1
/// Gbit/s budget fell to a quarter of it, with 100 ms it gets about two thirds
/// (`docs/results/2026-11-29-stop40-relay`).
fn relay_burst_bytes(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 10).max(256 * 1024)
}

/// A relay's bindings, at most.
const MAX_RELAY_BINDINGS: usize = 4096;

/// The key reach authenticates this host with: the host key when there is one, else the
/// state directory's own (made now if it is not there yet).
pub fn probe_key(state_dir: &Path, host_key: Option<&PrivateKey>) -> Result<PrivateKey> {
    if let Some(k) = host_key {
        return Ok(k.clone());
    }
    let path = state_dir.join(KEY_FILE);
    let read = |p: &PathBuf| {
        vnet_crypto::keys::file::read(p).with_context(|| format!("probe key {}", p.display()))
    };
    if !path.exists() {
        let public = vnet_crypto::keys::file::generate(&path)
            .with_context(|| format!("probe key {}", path.display()))?;
        info!(key = %public, file = %path.display(), "reach: probe key made");
    }
    read(&path)
}

/// Removes the state directory's probe key (a teardown).
pub fn remove_key(state_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(state_dir.join(KEY_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// What reach starts with (from the command line).
#[derive(Debug, Clone)]
pub struct Settings {
    pub host: HostId,
    /// The VXLAN socket's port.
    pub port: u16,
    /// `--advertise-addr`, when given.
    pub advertised: Option<IpAddr>,
    /// `--stun` servers.
    pub stun: Vec<SocketAddr>,
    /// `--relay`, and the budget of each pair it relays between (`--relay-rate`, Mbit/s).
    pub relay: bool,
    pub relay_rate_mbit: u64,
}

/// Starts the reach thread for `daemon`'s data path.
pub fn start(
    daemon: Arc<Daemon>,
    key: PrivateKey,
    s: Settings,
) -> Result<(Arc<Handle>, std::thread::JoinHandle<()>)> {
    let (shared, sock) = daemon
        .reach_edge()
        .context("reach: the daemon's owner thread is gone")?;
    let inbox = shared
        .reach
        .open_inbox()
        .context("reach: the data path's inbox is taken")?;
    let relay = s.relay.then(|| {
        let rate_bps = s.relay_rate_mbit.saturating_mul(1_000_000);
        let t = Arc::new(Mutex::new(RelayTable::new(
            rate_bps,
            relay_burst_bytes(rate_bps),
            MAX_RELAY_BINDINGS,
        )));
        shared.reach.set_relay(t.clone());
        t
    });
    let handle = Arc::new(Handle::new(s.relay, key.public()));
    let machine = vnet_reach::Reach::new(ReachConfig {
        key,
        port: s.port,
        local: local_addresses(&daemon),
        advertised: s.advertised.map(|a| SocketAddr::new(a, s.port)),
        stun: s.stun.clone(),
        relay: s.relay,
    });
    info!(tag = %machine.tag(), relay = s.relay, stun = ?s.stun, "reach starting");
    let vxlan = sock.local_addr();
    let mut tunnels = Tunnels::new(vxlan);
    if s.relay {
        // Members whose UDP does not pass reach the relay over TCP at its VXLAN port.
        if let Err(e) = tunnels.listen(vxlan) {
            warn!(%vxlan, "reach: no TCP tunnels to this relay: {e}");
        }
    }
    let mut t = Thread {
        daemon,
        handle: handle.clone(),
        inbox,
        machine,
        shared,
        sock,
        relay,
        settings: s,
        keys: HashMap::new(),
        paths: HashMap::new(),
        mtus_changed: false,
        rng: OsRandom::new(),
        tunnels,
    };
    let join = std::thread::Builder::new()
        .name("reach".into())
        .spawn(move || t.run())
        .context("reach thread")?;
    Ok((handle, join))
}

struct Thread {
    daemon: Arc<Daemon>,
    handle: Arc<Handle>,
    inbox: Receiver<(SocketAddr, Vec<u8>)>,
    machine: vnet_reach::Reach,
    shared: Arc<Shared>,
    sock: Arc<VxlanSocket>,
    relay: Option<Arc<Mutex<RelayTable>>>,
    settings: Settings,
    /// Each peer's probe key by its tag (paths come out by tag, the engine takes keys).
    keys: HashMap<Tag, (PublicKey, String)>,
    /// The path each peer's links take now, as given to the engine (its MTU kept current).
    paths: HashMap<Tag, PeerPath>,
    /// The machine said a link MTU changed: the engine's are brought up to date.
    mtus_changed: bool,
    rng: OsRandom,
    tunnels: Tunnels,
}

/// A peer's path as given to the engine, and the kernel's MTU for its endpoint (the peer's,
/// or its relay's).
struct PeerPath {
    key: PublicKey,
    path: ReachPath,
    kernel_mtu: Option<usize>,
}

impl Thread {
    fn now(&self) -> Now {
        Now {
            mono_us: self.shared.now_ns() / 1000,
            wall_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }

    fn run(&mut self) {
        let mut out = Vec::new();
        let mut next_addresses = 0;
        let mut next_report = 0;
        let mut next_mtu = 0;
        loop {
            if self.handle.stop.load(Relaxed) {
                return;
            }
            let now = self.now();
            let now_ms = now.mono_ms();
            let hosts = self.handle.hosts.lock_or_recover().take();
            if let Some(hosts) = hosts {
                self.set_hosts(&hosts, now, &mut out);
            }
            if now_ms >= next_addresses {
                self.machine.set_local(local_addresses(&self.daemon));
                next_addresses = now_ms + ADDRESSES_EVERY_MS;
            }
            self.tunnels_step(now, &mut out);
            if now_ms >= self.machine.next_wake_ms(now) {
                self.machine.tick(now, &mut self.rng, &mut out);
            }
            self.act(&mut out, now_ms);
            if let Some(t) = &self.relay {
                // A pair admitted for the first time goes to the kernel at once (within this
                // loop's 50 ms), the rest at each report: budgets and counts brought together.
                let new = t.lock_or_recover().take_new_pairs();
                if new && now_ms < next_report {
                    self.daemon.sync_relay_pairs(now_ms);
                }
            }
            if now_ms >= next_report {
                if let Some(t) = &self.relay {
                    t.lock_or_recover().expire(now_ms);
                    // The pairs admitted so far forwarded in the kernel from now on.
                    self.daemon.sync_relay_pairs(now_ms);
                }
                self.report(now);
                next_report = now_ms + REPORT_EVERY_MS;
            }
            if now_ms >= next_mtu {
                self.refresh_mtus(now_ms);
                next_mtu = now_ms + MTU_EVERY_MS;
            }
            let wait = Duration::from_millis(self.machine.next_wake_ms(now).saturating_sub(now_ms))
                .clamp(Duration::from_millis(1), MAX_WAIT);
            match self.inbox.recv_timeout(wait) {
                Ok((from, bytes)) => {
                    let now = self.now();
                    self.machine
                        .on_datagram(from, &bytes, now, &mut self.rng, &mut out);
                    // Whatever else is queued, in one go.
                    for (from, bytes) in self.inbox.try_iter().take(256) {
                        self.machine
                            .on_datagram(from, &bytes, now, &mut self.rng, &mut out);
                    }
                    self.act(&mut out, now.mono_ms());
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// The tunnels' news into the machine, and the tunnels the machine wants opened.
    fn tunnels_step(&mut self, now: Now, out: &mut Vec<Action>) {
        for e in self.tunnels.events(now.mono_ms()) {
            match e {
                TunnelEvent::Opened { local, toward, .. } => {
                    self.machine.tunnel_opened(local, toward, now)
                }
                TunnelEvent::Closed {
                    local: Some(local), ..
                } => self.machine.tunnel_closed(local, now, out),
                TunnelEvent::Closed { local: None, .. } => {}
            }
        }
        let wanted = self.machine.tunnels_wanted(now);
        self.tunnels.reconcile(&wanted, now.mono_ms());
    }

    /// Asks the kernel each path's MTU again (it learns a smaller one from an ICMP
    /// "fragmentation needed" a router sent back for a DF datagram) and gives it to the
    /// machine as the ceiling of its probing; then [`Thread::apply_mtus`].
    fn refresh_mtus(&mut self, now_ms: u64) {
        let mut out = Vec::new();
        for (tag, p) in self.paths.iter_mut() {
            p.kernel_mtu = p
                .path
                .direct
                .or(p.path.relay)
                .and_then(|e| mtu_towards(&self.tunnels, e));
            if let Some(ep) = p.path.direct {
                self.machine
                    .set_kernel_mtu(*tag, ep, p.kernel_mtu, &mut out);
            }
        }
        self.act(&mut out, now_ms);
        self.apply_mtus();
    }

    /// Each path's MTU as the machine says it (probed, under the kernel's), else the kernel's:
    /// a change goes to the engine, which then tells guests whose frames no longer fit.
    fn apply_mtus(&mut self) {
        self.mtus_changed = false;
        let mut changed = Vec::new();
        for (tag, p) in self.paths.iter_mut() {
            let mtu = self.machine.link_mtu(*tag).or(p.kernel_mtu);
            if mtu != p.path.mtu {
                info!(peer = %tag, from = ?p.path.mtu, to = ?mtu, kernel = ?p.kernel_mtu, "reach: path MTU");
                p.path.mtu = mtu;
                changed.push((p.key, p.path.clone()));
            }
        }
        for (key, path) in changed {
            self.daemon.set_reach_path(key, path);
        }
    }

    /// The overlay's hosts now: every other host with a probe key is a peer.
    fn set_hosts(&mut self, hosts: &BTreeMap<HostId, HostRecord>, now: Now, out: &mut Vec<Action>) {
        let mut peers = Vec::new();
        self.keys.clear();
        for (id, rec) in hosts {
            let Some(key) = rec.probe_key() else { continue };
            if *id == self.settings.host {
                continue;
            }
            self.keys.insert(Tag::of(&key), (key, id.to_string()));
            peers.push(peer_info(id, rec, key));
        }
        if let Some(t) = &self.relay {
            let members: Vec<Tag> = hosts
                .values()
                .filter_map(HostRecord::probe_key)
                .map(|k| Tag::of(&k))
                .collect();
            t.lock_or_recover().set_members(members);
        }
        debug!(peers = peers.len(), "reach: hosts changed");
        self.machine.set_peers(peers, now, &mut self.rng, out);
    }

    fn act(&mut self, out: &mut Vec<Action>, now_ms: u64) {
        let v6 = self.sock.local_addr().is_ipv6();
        // What handling an action makes the machine say (a new path's MTU), after these.
        let mut more = Vec::new();
        for a in out.drain(..) {
            match a {
                Action::Send { to, bytes } => {
                    let to = SockAddr::from(for_socket(to, v6));
                    if let Err(r) = self.sock.send_parts(&to, &[IoPart::from(&bytes[..])], None) {
                        debug!(?r, "reach: datagram not sent");
                    }
                }
                Action::Path(u) => {
                    let Some((key, name)) = self.keys.get(&u.peer).cloned() else {
                        continue;
                    };
                    let (direct, relay) = match &u.path {
                        ReachRoute::Direct { endpoint, .. } => (Some(*endpoint), None),
                        ReachRoute::Relayed { endpoint, .. } => (None, Some(*endpoint)),
                        ReachRoute::Unknown => (None, None),
                    };
                    // The kernel's figure now (the ceiling of the new path's probing), and the
                    // machine's answer under it (the kernel's until probing knows better).
                    let kernel_mtu = direct.or(relay).and_then(|e| mtu_towards(&self.tunnels, e));
                    if let Some(ep) = direct {
                        self.machine
                            .set_kernel_mtu(u.peer, ep, kernel_mtu, &mut more);
                    }
                    let path = ReachPath {
                        direct,
                        relay,
                        accept: u.accept.clone(),
                        mtu: self.machine.link_mtu(u.peer).or(kernel_mtu),
                        kind: u.path.word(),
                    };
                    info!(peer = %name, path = u.path.word(), to = ?path.direct.or(path.relay), mtu = ?path.mtu, "reach: path");
                    if u.path == ReachRoute::Unknown && u.accept.is_empty() {
                        self.paths.remove(&u.peer);
                    } else {
                        self.paths.insert(
                            u.peer,
                            PeerPath {
                                key,
                                path: path.clone(),
                                kernel_mtu,
                            },
                        );
                    }
                    self.daemon.set_reach_path(key, path);
                }
                Action::PathMtu { .. } => self.mtus_changed = true,
                Action::Publish(r) => {
                    let relays = r
                        .bound_relays
                        .iter()
                        .filter_map(|n| n.parse::<HostId>().ok())
                        .collect();
                    let rec = HostReach {
                        probe_key: Some(self.handle.probe_key.to_string()),
                        candidates: r
                            .candidates
                            .iter()
                            .map(|c| CandidateRecord {
                                addr: c.endpoint.ip(),
                                port: c.endpoint.port(),
                                kind: c.kind.as_str().to_string(),
                            })
                            .collect(),
                        nat: (r.nat != NatMapping::Unknown).then(|| r.nat.as_str().to_string()),
                        relays,
                    };
                    info!(candidates = rec.candidates.len(), nat = ?rec.nat, relays = ?rec.relays, "reach: publishing");
                    *self.handle.publish.lock_or_recover() = Some(rec);
                }
                Action::RelayBind { tag, endpoint } => {
                    if let Some(t) = &self.relay {
                        if !t.lock_or_recover().bind(tag, endpoint, now_ms) {
                            warn!(%tag, %endpoint, "reach: relay binding refused");
                        }
                    }
                }
            }
        }
        if !more.is_empty() {
            self.act(&mut more, now_ms);
        }
        if self.mtus_changed {
            self.apply_mtus();
        }
    }

    fn report(&self, now: Now) {
        let st = self.machine.status(now);
        let c = &st.counters;
        let tc = &self.tunnels.counters;
        let mut counters: Vec<(String, u64)> = [
            ("pings_sent", c.pings_sent),
            ("pongs_sent", c.pongs_sent),
            ("pings_received", c.pings_received),
            ("pongs_received", c.pongs_received),
            ("stun_sent", c.stun_sent),
            ("stun_received", c.stun_received),
            ("unknown_sender", c.unknown_sender),
            ("bad_auth", c.bad_auth),
            ("replay", c.replay),
            ("unsolicited", c.unsolicited),
            ("malformed", c.malformed),
            ("bad_key", c.bad_key),
            ("pmtu_probes_sent", c.pmtu_probes_sent),
            ("pmtu_probes_answered", c.pmtu_probes_answered),
            ("pmtu_probes_lost", c.pmtu_probes_lost),
            ("pmtu_black_holes", c.pmtu_black_holes),
            ("inbox_full", self.shared.reach.inbox_full.load(Relaxed)),
            ("relayed_in", self.shared.reach.relayed_in.load(Relaxed)),
            (
                "relayed_unknown",
                self.shared.reach.relayed_unknown.load(Relaxed),
            ),
            (
                "too_big_answered",
                self.shared.reach.too_big_answered.load(Relaxed),
            ),
            ("fragmented", self.shared.reach.fragmented.load(Relaxed)),
            ("tunnels_open", tc.open.load(Relaxed) as u64),
            ("tunnels_opened", tc.opened.load(Relaxed)),
            ("tunnels_refused", tc.refused.load(Relaxed)),
            ("tunnel_malformed", tc.malformed.load(Relaxed)),
            ("tunnel_datagrams_out", tc.datagrams_out.load(Relaxed)),
            ("tunnel_datagrams_in", tc.datagrams_in.load(Relaxed)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(t) = &self.relay {
            let t = t.lock_or_recover();
            let r = &t.counters;
            counters.extend(
                [
                    ("relay_bindings", t.bindings() as u64),
                    ("relay_forwarded", r.forwarded),
                    ("relay_forwarded_bytes", r.forwarded_bytes),
                    ("relay_unbound_source", r.unbound_source),
                    ("relay_unknown_destination", r.unknown_destination),
                    ("relay_rate_limited", r.rate_limited),
                    ("relay_to_self", r.to_self),
                    ("relay_refused_bindings", r.refused_bindings),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
            );
        }
        let report = ReachReport {
            enabled: true,
            relay: st.relay,
            nat: st.nat.as_str().to_string(),
            candidates: st
                .candidates
                .iter()
                .map(|c| format!("{} {}", c.endpoint, c.kind.as_str()))
                .collect(),
            bound_relays: st.bound_relays,
            peers: st
                .peers
                .iter()
                .map(|p| ReachPeer {
                    host: p.name.clone(),
                    path: p.path.word().to_string(),
                    endpoint: match &p.path {
                        ReachRoute::Direct { endpoint, .. }
                        | ReachRoute::Relayed { endpoint, .. } => Some(endpoint.to_string()),
                        ReachRoute::Unknown => None,
                    },
                    rtt_us: p.rtt_us,
                    mtu: self.paths.get(&p.tag).and_then(|e| e.path.mtu),
                    kernel_mtu: self.paths.get(&p.tag).and_then(|e| e.kernel_mtu),
                    probed_mtu: p.pmtu.as_ref().and_then(|m| m.probed),
                    pmtu: p.pmtu.as_ref().map(|m| m.state.to_string()),
                    pmtu_search_ms: p.pmtu.as_ref().and_then(|m| m.search_ms),
                    nat: p.nat.as_str().to_string(),
                    endpoints: p
                        .endpoints
                        .iter()
                        .map(|e| {
                            format!(
                                "{} {} {}",
                                e.endpoint,
                                e.origin,
                                if e.trusted { "trusted" } else { "-" }
                            )
                        })
                        .collect(),
                })
                .collect(),
            counters,
        };
        *self.handle.report.lock_or_recover() = report;
    }
}

/// A peer as reach sees it from its record: its published candidates, and its record's address
/// (the one it advertised or routes from) when it published none yet.
fn peer_info(id: &HostId, rec: &HostRecord, key: PublicKey) -> PeerInfo {
    let mut candidates: Vec<Candidate> = rec
        .reach
        .candidates
        .iter()
        .map(|c| Candidate {
            endpoint: SocketAddr::new(c.addr, c.port),
            kind: CandidateKind::parse(&c.kind).unwrap_or(CandidateKind::Reflexive),
        })
        .collect();
    let own = SocketAddr::new(rec.addr, rec.udp_port);
    if !candidates.iter().any(|c| c.endpoint == own) {
        candidates.push(Candidate {
            endpoint: own,
            kind: CandidateKind::Local,
        });
    }
    PeerInfo {
        name: id.to_string(),
        key,
        candidates,
        relay: rec.has_capability(CAP_RELAY),
        bound_relays: rec.reach.relays.iter().map(|r| r.to_string()).collect(),
        nat: rec
            .reach
            .nat
            .as_deref()
            .map_or(NatMapping::Unknown, NatMapping::parse),
    }
}

/// The kernel's path MTU towards `endpoint`: through a tunnel, the path to the tunnel's TCP
/// peer (TCP carries any datagram; the relay sends it on over UDP).
fn mtu_towards(tunnels: &Tunnels, endpoint: SocketAddr) -> Option<usize> {
    path_mtu(tunnels.remote_of(endpoint).unwrap_or(endpoint))
}

/// The MTU the kernel knows for the path to `to`, when it knows one.
fn path_mtu(to: SocketAddr) -> Option<usize> {
    vnet_dataplane::vxlan_socket::path_mtu(to)
        .ok()
        .filter(|m| *m >= 576)
}

/// This host's addresses (of its network namespace), for its local candidates: never one on a
/// device of the overlay itself (a vnet interface's host-side device, such as the gateway a
/// CNI host reaches its pods through, or a device vnet made): a path to such an address runs
/// through the overlay, so the link would carry itself.
fn local_addresses(daemon: &Daemon) -> Vec<IpAddr> {
    let ours: Vec<String> = daemon
        .interfaces()
        .iter()
        .map(|i| i.ifname.clone())
        .collect();
    let read = |r: &mut vnet_netlink::Rtnl| -> std::io::Result<Vec<IpAddr>> {
        let overlay: Vec<u32> = r
            .links()?
            .into_iter()
            .filter(|l| on_overlay(&l.name, l.alias.as_deref(), &ours))
            .map(|l| l.index)
            .collect();
        Ok(r.addresses()?
            .into_iter()
            .filter(|(index, _)| !overlay.contains(index))
            .map(|(_, ip)| ip)
            .collect())
    };
    match vnet_netlink::Rtnl::open().and_then(|mut r| read(&mut r)) {
        Ok(a) => a,
        Err(e) => {
            warn!("reach: cannot list this host's addresses: {e}");
            Vec::new()
        }
    }
}

/// Whether a device is part of the overlay: one of vnet's interfaces, or made by vnet (its
/// alias says so).
fn on_overlay(name: &str, alias: Option<&str>, interfaces: &[String]) -> bool {
    interfaces.iter().any(|i| i == name) || alias.is_some_and(|a| a.starts_with("vnet:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relays_burst_is_a_tenth_of_a_second_of_its_budget_and_never_tiny() {
        assert_eq!(relay_burst_bytes(1_000_000_000), 12_500_000);
        assert_eq!(relay_burst_bytes(20_000_000), 256 * 1024);
        assert_eq!(relay_burst_bytes(100_000_000_000), 1_250_000_000);
    }

    #[test]
    fn overlay_devices_give_no_candidates() {
        let ifs = vec!["vnet-gw".to_string(), "tap-vm1".to_string()];
        assert!(on_overlay("vnet-gw", None, &ifs));
        assert!(on_overlay("vnp-c1", Some("vnet:c1"), &ifs));
        assert!(!on_overlay("eth0", None, &ifs));
        assert!(!on_overlay("eth1", Some("uplink"), &ifs));
    }

    #[test]
    fn a_peer_without_candidates_is_tried_at_its_address() {
        let rec = HostRecord {
            host_id: "b".parse().unwrap(),
            addr: "10.0.0.2".parse().unwrap(),
            udp_port: 4789,
            tcp_port: None,
            capabilities: vec!["vxlan".into(), "relay".into()],
            public_key: None,
            version: vnet_cluster::SCHEMA_VERSION,
            reach: HostReach {
                probe_key: None,
                candidates: vec![CandidateRecord {
                    addr: "198.51.100.2".parse().unwrap(),
                    port: 40000,
                    kind: "something-new".into(),
                }],
                nat: Some("edm".into()),
                relays: vec!["r".parse().unwrap()],
            },
        };
        let p = peer_info(&rec.host_id, &rec, PublicKey([1; 32]));
        assert_eq!(p.candidates.len(), 2);
        assert_eq!(p.candidates[0].kind, CandidateKind::Reflexive);
        assert_eq!(p.candidates[1].endpoint, "10.0.0.2:4789".parse().unwrap());
        assert!(p.relay);
        assert_eq!(p.nat, NatMapping::EndpointDependent);
        assert_eq!(p.bound_relays, vec!["r".to_string()]);
    }
}
