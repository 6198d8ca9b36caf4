//! The engine's handle on the kernel fast path (crate `vnet-fastpath`): which ports and links
//! the kernel serves, the underlay devices their datagrams cross, and the forwarding table
//! compiled from the same rules as the user-space one. vnetd stays the control plane and the
//! slow path: whatever the kernel does not decide reaches vnetd's ordinary ports (a fast-path
//! port's punt TAP, the VXLAN socket), so the kernel can only ever make a frame faster.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tracing::{info, warn};
use vnet_control::{FastPathMode, PortPolicy};
use vnet_core::{FastMap, ForwardingTable, MatrixEntry, PortId, RouteRule};
use vnet_fastpath::{
    compile, recompile, CompilePort, CompiledTable, Counters, Delivery, Egress, FastPath,
    FastPathConfig, LinkSpec, PortSpec, Rate, RelayCounts, RelayPair, Touched, Unavailable,
};
use vnet_reach::{KernelPair, Tag};
use vnet_wire::MacAddr;

use crate::netlink::Rtnl;
use crate::underlay_watch::UnderlayWatch;

/// What a port kind asks of the kernel when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelAttach {
    /// A fast-path port: the guest's frames arrive on `ifindex`; what the kernel does not
    /// forward goes to vnetd's punt TAP `punt_ifindex`.
    Port {
        ifindex: u32,
        punt_ifindex: u32,
        mac: MacAddr,
        mtu: u32,
        delivery: Delivery,
    },
    /// A plain udp link to `remote`; `src_port` for a reach link (every datagram from the
    /// VXLAN socket's port, the peer's found by its port too).
    Link {
        remote: SocketAddr,
        src_port: Option<u16>,
    },
}

/// A relay's pair in the kernel: its entry, the counts last read of it, and the device its
/// datagrams arrive by.
#[derive(Debug, Clone, Copy)]
struct RelayEntry {
    pair: RelayPair,
    last: RelayCounts,
    ingress: Option<u32>,
}

/// The kernel fast path of one engine.
pub struct KernelPath {
    fp: FastPath,
    mode: FastPathMode,
    ports: FastMap<PortId, u32>,
    links: FastMap<PortId, LinkSpec>,
    /// Underlay devices with the decapsulation program, and how many links use each.
    underlays: BTreeMap<u32, usize>,
    link_underlay: FastMap<PortId, u32>,
    /// Table entries left out because the map was full, at the last apply.
    pub left_out: usize,
    /// The address vnetd's VXLAN socket is bound to, when it is one (then it is every link's
    /// outer source: peers filter on it).
    bound: Option<Ipv4Addr>,
    /// A relay's pairs the kernel forwards.
    relay_pairs: BTreeMap<KernelPair, RelayEntry>,
    /// Underlay devices the decapsulation program is on for the relay's pairs.
    relay_devices: BTreeSet<u32>,
    /// The relay's map was full at the last sync (said once, not at every sync).
    relay_full: bool,
    /// Forgets the programs' cached outer next hops when the underlay changes.
    _underlay_watch: Option<UnderlayWatch>,
}

fn rate(p: &PortPolicy) -> Option<Rate> {
    p.rate.map(|r| Rate {
        bits_per_sec: r.rate_bps(),
        burst_bytes: r.burst_bytes(),
    })
}

fn fp_policy(p: &PortPolicy) -> vnet_fastpath::PortPolicy {
    vnet_fastpath::PortPolicy {
        any_source: p.any_source,
        rate: rate(p),
    }
}

impl KernelPath {
    /// Loads and verifies the programs; the error says in words why the kernel path is not
    /// available (vnetd then runs everything in user space).
    pub fn open(cfg: &FastPathConfig, bound: IpAddr) -> Result<KernelPath, Unavailable> {
        let mut fp = FastPath::open(cfg)?;
        // A relay's pairs an earlier vnetd left in pinned maps go: this one admits its own
        // (a host that no longer relays must not go on relaying).
        fp.retain_relay_pairs(|_| false);
        let bound = match bound.to_canonical() {
            IpAddr::V4(a) if !a.is_unspecified() => Some(a),
            _ => None,
        };
        let watch = match cfg.outer_cache {
            Some(_) => {
                let inv = fp.outer_cache_invalidator();
                let warned = AtomicBool::new(false);
                UnderlayWatch::start(move || {
                    if let Err(e) = inv.invalidate() {
                        if !warned.swap(true, Relaxed) {
                            warn!("kernel fast path: cannot forget cached next hops: {e}");
                        }
                    }
                })
                .map_err(|e| {
                    warn!("kernel fast path: not watching the underlay ({e}): a changed next hop is used after up to {:?}", cfg.outer_cache);
                })
                .ok()
            }
            None => None,
        };
        Ok(KernelPath {
            fp,
            mode: FastPathMode::Kernel,
            ports: FastMap::default(),
            links: FastMap::default(),
            underlays: BTreeMap::new(),
            link_underlay: FastMap::default(),
            left_out: 0,
            bound,
            relay_pairs: BTreeMap::new(),
            relay_devices: BTreeSet::new(),
            relay_full: false,
            _underlay_watch: watch,
        })
    }

    pub fn set_mode(&mut self, mode: FastPathMode) {
        self.mode = mode;
    }

    pub fn mode(&self) -> FastPathMode {
        self.mode
    }

    /// Whether the kernel serves this port or link.
    pub fn serves(&self, id: PortId) -> bool {
        self.ports.contains_key(&id) || self.links.contains_key(&id)
    }

    /// Hands a port or link to the kernel. A link the kernel cannot take (not IPv4, no
    /// underlay device for its local address) stays with vnetd alone: `Ok(false)`.
    pub fn attach(
        &mut self,
        id: PortId,
        vni: u32,
        what: &KernelAttach,
        policy: &PortPolicy,
    ) -> Result<bool, String> {
        match *what {
            KernelAttach::Port {
                ifindex,
                punt_ifindex,
                mac,
                mtu,
                delivery,
            } => {
                self.fp
                    .attach_port(&PortSpec {
                        id,
                        ifindex,
                        punt_ifindex,
                        mac,
                        vni,
                        mtu,
                        delivery,
                        policy: fp_policy(policy),
                    })
                    .map_err(|e| e.to_string())?;
                self.ports.insert(id, ifindex);
                Ok(true)
            }
            KernelAttach::Link { remote, src_port } => {
                let IpAddr::V4(r) = remote.ip().to_canonical() else {
                    return Ok(false);
                };
                let under = underlay_for(r, self.bound);
                if under.is_none() && src_port.is_none() {
                    warn!(%remote, "no underlay device that this link's datagrams cross (or a link to this host itself): its frames go through vnetd");
                    return Ok(false);
                }
                // A reach link whose first address leads nowhere waits in vnetd's hands (punt)
                // until reach finds its path (`set_link_path`).
                let spec = LinkSpec {
                    id,
                    vni,
                    remote: r,
                    local: under.map_or(Ipv4Addr::UNSPECIFIED, |(l, _)| l),
                    udp_port: remote.port(),
                    rate: rate(policy),
                    via_device: None,
                    src_port,
                    punt: under.is_none(),
                    path_mtu: None,
                    relay_tag: None,
                };
                if let Some((_, dev)) = under {
                    self.use_underlay(id, dev)?;
                }
                self.fp.set_link(&spec).map_err(|e| e.to_string())?;
                self.links.insert(id, spec);
                Ok(true)
            }
        }
    }

    /// Link `id` decapsulates on underlay device `dev` (the program attached there first).
    fn use_underlay(&mut self, id: PortId, dev: u32) -> Result<(), String> {
        if self.link_underlay.get(&id) == Some(&dev) {
            return Ok(());
        }
        if !self.underlays.contains_key(&dev) {
            self.fp.attach_underlay(dev).map_err(|e| e.to_string())?;
            info!(
                ifindex = dev,
                "kernel fast path: decapsulating on the underlay device"
            );
        }
        *self.underlays.entry(dev).or_default() += 1;
        if let Some(old) = self.link_underlay.insert(id, dev) {
            self.release_underlay(old);
        }
        Ok(())
    }

    fn release_underlay(&mut self, dev: u32) {
        let n = self.underlays.entry(dev).or_default();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.underlays.remove(&dev);
            if !self.relay_devices.contains(&dev) {
                let _ = self.fp.detach_underlay(dev);
            }
        }
    }

    /// Reach moved link `id`: straight to `to`, through the relay at `to` (`relay_tag`: the
    /// peer's tag, which the relay header carries), or (None) through vnetd (a TCP tunnel, or
    /// no path). A link the kernel does not serve is left alone.
    pub fn set_link_path(
        &mut self,
        id: PortId,
        to: Option<SocketAddr>,
        relay_tag: Option<Tag>,
        mtu: Option<usize>,
    ) {
        let Some(mut spec) = self.links.get(&id).copied() else {
            return;
        };
        spec.path_mtu = mtu.map(|m| m.min(u32::MAX as usize) as u32);
        let dest = to.and_then(|ep| match ep.ip().to_canonical() {
            IpAddr::V4(r) => underlay_for(r, self.bound).map(|u| (r, ep.port(), u)),
            IpAddr::V6(_) => None,
        });
        match dest {
            Some((r, port, (local, dev))) => {
                if let Err(e) = self.use_underlay(id, dev) {
                    warn!(
                        port = id.0,
                        "kernel fast path: underlay for a new path: {e}"
                    );
                    spec.punt = true;
                } else {
                    spec.remote = r;
                    spec.udp_port = port;
                    spec.local = local;
                    spec.punt = false;
                    spec.relay_tag = relay_tag.map(|t| t.0);
                }
            }
            None => spec.punt = true,
        }
        if spec.punt {
            // vnetd sends and takes the link's datagrams, relayed or not.
            spec.relay_tag = None;
        }
        match self.fp.set_link(&spec) {
            Ok(()) => {
                self.links.insert(id, spec);
            }
            Err(e) => warn!(port = id.0, "kernel fast path: link path: {e}"),
        }
    }

    /// A relay's pairs the kernel forwards from now on are `wanted` (each pair's budget
    /// `rate_bps`, bursts of `burst_bytes`); the others go back to vnetd. Returns what the
    /// kernel forwarded and refused over the budget of each pair since the last call (the
    /// counts of a pair removed now included). A pair the kernel cannot take (an endpoint that is
    /// not IPv4, a tunnel's loopback end, no underlay device) stays with vnetd.
    pub fn sync_relay_pairs(
        &mut self,
        wanted: &[KernelPair],
        (rate_bps, burst_bytes): (u64, u64),
    ) -> Vec<(Tag, Tag, RelayCounts)> {
        let mut counted = Vec::new();
        let wanted_set: BTreeSet<&KernelPair> = wanted.iter().collect();
        let current: Vec<KernelPair> = self.relay_pairs.keys().copied().collect();
        for kp in current {
            let Some(e) = self.relay_pairs.get(&kp).copied() else {
                continue;
            };
            let now = self.fp.relay_pair_counts(&e.pair).ok().flatten();
            if let Some(now) = now {
                let last = e.last;
                let d = RelayCounts {
                    frames: now.frames.saturating_sub(last.frames),
                    bytes: now.bytes.saturating_sub(last.bytes),
                    rate_limited: now.rate_limited.saturating_sub(last.rate_limited),
                };
                if d != RelayCounts::default() {
                    counted.push((kp.src, kp.dst, d));
                }
                if let Some(e) = self.relay_pairs.get_mut(&kp) {
                    e.last = now;
                }
            }
            if !wanted_set.contains(&kp) {
                let _ = self.fp.del_relay_pair(&e.pair);
                self.relay_pairs.remove(&kp);
            }
        }
        let mut full = false;
        for kp in wanted {
            if self.relay_pairs.contains_key(kp) {
                continue;
            }
            let Some(pair) = self.relay_pair(kp, rate_bps, burst_bytes) else {
                continue;
            };
            let ingress = underlay_for(*pair.from.ip(), self.bound).map(|(_, dev)| dev);
            match self.fp.set_relay_pair(&pair) {
                Ok(()) => {
                    self.relay_pairs.insert(
                        *kp,
                        RelayEntry {
                            pair,
                            last: RelayCounts::default(),
                            ingress,
                        },
                    );
                }
                Err(e) => {
                    // The map is full (or the kernel refused): the rest stay with vnetd until
                    // a pair leaves; no more tries in this sync.
                    if !self.relay_full {
                        warn!(
                            pairs = self.relay_pairs.len(),
                            "kernel fast path: a relay's further pairs stay in user space: {e}"
                        );
                    }
                    full = true;
                    break;
                }
            }
        }
        self.relay_full = full;
        self.relay_underlays();
        counted
    }

    /// The kernel's entry for pair `kp`, when the kernel can forward it.
    fn relay_pair(&self, kp: &KernelPair, rate_bps: u64, burst_bytes: u64) -> Option<RelayPair> {
        let v4 = |a: SocketAddr| match a.ip().to_canonical() {
            IpAddr::V4(ip) if !ip.is_loopback() => Some(SocketAddrV4::new(ip, a.port())),
            _ => None,
        };
        let (from, to) = (v4(kp.from)?, v4(kp.to)?);
        let (local, ifindex) = underlay_for(*to.ip(), self.bound)?;
        Some(RelayPair {
            from,
            dst_tag: kp.dst.0,
            to,
            src_tag: kp.src.0,
            local,
            ifindex,
            rate_bps,
            burst_bytes,
        })
    }

    /// The decapsulation program, which also relays, on each device the relay's pairs' datagrams
    /// arrive by (their route out: the device their sources are reached by), and off the
    /// devices no pair and no link needs any more.
    fn relay_underlays(&mut self) {
        let needed: BTreeSet<u32> = self
            .relay_pairs
            .values()
            .filter_map(|e| e.ingress)
            .collect();
        for dev in needed.difference(&self.relay_devices.clone()) {
            if self.underlays.contains_key(dev) {
                self.relay_devices.insert(*dev);
                continue;
            }
            match self.fp.attach_underlay(*dev) {
                Ok(()) => {
                    info!(
                        ifindex = dev,
                        "kernel fast path: relaying on the underlay device"
                    );
                    self.relay_devices.insert(*dev);
                }
                Err(e) => warn!(ifindex = dev, "kernel fast path: relay: {e}"),
            }
        }
        for dev in self.relay_devices.clone().difference(&needed) {
            self.relay_devices.remove(dev);
            if !self.underlays.contains_key(dev) {
                let _ = self.fp.detach_underlay(*dev);
            }
        }
    }

    /// Takes a port or link back from the kernel (before the port itself goes).
    pub fn detach(&mut self, id: PortId) {
        if self.ports.remove(&id).is_some() {
            if let Err(e) = self.fp.detach_port(id) {
                warn!(port = id.0, "kernel fast path: detach: {e}");
            }
        }
        if self.links.remove(&id).is_some() {
            if let Err(e) = self.fp.del_link(id) {
                warn!(port = id.0, "kernel fast path: link removal: {e}");
            }
            if let Some(dev) = self.link_underlay.remove(&id) {
                self.release_underlay(dev);
            }
        }
    }

    /// A port's or link's policy changed at run time.
    pub fn set_policy(&mut self, id: PortId, policy: &PortPolicy) {
        if self.ports.contains_key(&id) {
            if let Err(e) = self.fp.update_port(id, &fp_policy(policy)) {
                warn!(port = id.0, "kernel fast path: policy: {e}");
            }
        } else if let Some(spec) = self.links.get_mut(&id) {
            spec.rate = rate(policy);
            let s = *spec;
            if let Err(e) = self.fp.set_link(&s) {
                warn!(port = id.0, "kernel fast path: link rate: {e}");
            }
        }
    }

    /// Compiles the rules into the kernel's table (empty, all to vnetd, when the fast path is
    /// off) and writes the difference.
    pub fn apply(&mut self, ports: &[(PortId, u32)], rules: &[RouteRule], learning: bool) {
        let table = if self.mode == FastPathMode::Off {
            CompiledTable::default()
        } else {
            let cp: Vec<CompilePort> = ports
                .iter()
                .map(|&(id, vni)| CompilePort {
                    id,
                    vni,
                    egress: if self.ports.contains_key(&id) {
                        Egress::FastPort
                    } else if self.links.contains_key(&id) {
                        Egress::UdpLink
                    } else {
                        Egress::Other
                    },
                })
                .collect();
            compile(&cp, rules, learning)
        };
        match self.fp.apply_table(&table) {
            Ok(r) => {
                if r.left_out > 0 && r.left_out != self.left_out {
                    warn!(
                        left_out = r.left_out,
                        "kernel fast path: the forwarding map is full; those destinations go through vnetd (vnetd --fastpath-table-size)"
                    );
                }
                self.left_out = r.left_out;
            }
            Err(e) => warn!("kernel fast path: table: {e}"),
        }
    }

    /// Follows a change of the rules at the `touched` destinations only (the table was
    /// applied in full before, by [`KernelPath::apply`], with the same ports and learning):
    /// only their entries are recompiled and written.
    pub fn apply_routes(&mut self, table: &ForwardingTable, touched: &[Touched], learning: bool) {
        if self.mode == FastPathMode::Off || learning {
            return; // the table is empty, and stays so
        }
        let (ports, links) = (&self.ports, &self.links);
        let port = |id: PortId| {
            table.port(id).map(|info| CompilePort {
                id,
                vni: info.vni,
                egress: if ports.contains_key(&id) {
                    Egress::FastPort
                } else if links.contains_key(&id) {
                    Egress::UdpLink
                } else {
                    Egress::Other
                },
            })
        };
        let r = self
            .fp
            .update_table(|t| recompile(t, table.routes(), touched, port, learning));
        match r {
            Ok(r) => self.left_out = r.left_out,
            Err(e) => warn!("kernel fast path: table: {e}"),
        }
    }

    /// The kernel's counters of a port or link it serves.
    pub fn counters(&self, id: PortId) -> Option<Counters> {
        if self.ports.contains_key(&id) {
            self.fp.port_counters(id).ok()
        } else if self.links.contains_key(&id) {
            self.fp.link_counters(id).ok()
        } else {
            None
        }
    }

    /// A port's or link's kernel token bucket fill, when it has a rate.
    pub fn rate_available(&self, id: PortId) -> Option<i64> {
        self.fp.rate_available(id).ok().flatten()
    }

    /// The kernel's share of the traffic matrix.
    pub fn matrix(&self) -> Vec<MatrixEntry> {
        self.fp.matrix().unwrap_or_default()
    }

    /// Table entries and global counters, for `show stats`.
    pub fn table_len(&self) -> usize {
        self.fp.table_len()
    }

    pub fn global(&self) -> Option<vnet_fastpath::GlobalCounters> {
        self.fp.global_counters().ok()
    }

    /// The counting maps for readers on other threads, and where a port is counted there.
    pub fn readout(&self) -> Option<vnet_fastpath::Readout> {
        self.fp.readout().ok()
    }

    pub fn counter_slot(&self, id: PortId) -> Option<vnet_fastpath::CounterSlot> {
        self.fp.counter_slot(id)
    }

    /// Entries left out of the forwarding map so far, and the map writes made so far.
    pub fn table_full(&self) -> u64 {
        self.fp.table_full()
    }

    pub fn map_writes(&self) -> u64 {
        self.fp.map_writes()
    }

    /// Ends a takeover from an earlier vnetd's pinned fast path (the restored configuration
    /// is attached and applied): see [`vnet_fastpath::FastPath::commit`].
    pub fn commit(&mut self) {
        if let Err(e) = self.fp.commit() {
            warn!("kernel fast path: takeover: {e}");
        }
    }

    /// Whether the fast path is pinned (forwarding outlives vnetd).
    pub fn pinned(&self) -> bool {
        self.fp.pinned()
    }

    /// Removes every program, attachment and pin (a teardown).
    pub fn teardown(self) {
        self.fp.teardown();
    }

    /// The devices' `forwarding` values from before the fast path turned it on.
    pub fn forwarding_originals(&self) -> Vec<vnet_fastpath::ForwardingOriginal> {
        self.fp.forwarding_originals()
    }

    /// Values an earlier vnetd recorded (the devices still forward for its pinned programs).
    pub fn set_forwarding_originals(&mut self, o: Vec<vnet_fastpath::ForwardingOriginal>) {
        for x in o {
            self.fp.set_forwarding_original(x);
        }
    }

    pub fn config(&self) -> &FastPathConfig {
        self.fp.config()
    }
}

/// Our underlay address towards `remote` (vnetd's bound address, or else the source the
/// kernel's routing picks) and the device that holds it, when the route to `remote` leaves by
/// that device too. The program there charges the link's rate for vnetd (which then does not)
/// and decapsulates, so every datagram of the link must cross it: a link to this host itself
/// (its datagrams come over lo), or one routed out of another device, stays with vnetd.
/// (Datagrams that come back by another device than the route out, asymmetric routing, would
/// escape the rate; `rp_filter` refuses them when strict.)
fn underlay_for(remote: Ipv4Addr, bound: Option<Ipv4Addr>) -> Option<(Ipv4Addr, u32)> {
    let probe = UdpSocket::bind((bound.unwrap_or(Ipv4Addr::UNSPECIFIED), 0)).ok()?;
    probe.connect((remote, 9)).ok()?;
    let IpAddr::V4(local) = probe.local_addr().ok()?.ip() else {
        return None;
    };
    let mut nl = Rtnl::open().ok()?;
    let dev = nl
        .addresses()
        .ok()?
        .into_iter()
        .find(|(_, a)| *a == IpAddr::V4(local))
        .map(|(i, _)| i)?;
    let out = nl.route_oif(remote).ok()??;
    (dev != 1 && out == dev).then_some((local, dev))
}

/// Removes the kernel objects a vnetd pinned under `dir` (a teardown): its programs stop
/// forwarding and its maps are freed once nothing else holds them.
pub fn remove_pinned(dir: &std::path::Path) {
    match vnet_fastpath::pin::remove_dir(dir) {
        Ok(()) => info!(dir = %dir.display(), "no pinned kernel objects left"),
        Err(e) => warn!(dir = %dir.display(), "could not remove the pinned kernel objects: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ip, private_netns};

    #[test]
    fn the_kernel_takes_a_link_only_where_its_datagrams_cross_the_program() {
        if !private_netns() {
            return;
        }
        ip("link set lo up");
        ip("link add u0 type veth peer name u1");
        ip("link set u0 up");
        ip("link set u1 up");
        ip("addr add 10.66.0.1/24 dev u0");
        ip("addr add 10.66.1.1/32 dev lo");
        let u0 = Rtnl::open().unwrap().link("u0").unwrap().unwrap().index;
        let (local, remote) = (Ipv4Addr::new(10, 66, 0, 1), Ipv4Addr::new(10, 66, 0, 2));
        // A peer on the underlay: its datagrams arrive on u0, where the program is.
        assert_eq!(underlay_for(remote, None), Some((local, u0)));
        // This host's own address (another vnetd here): its datagrams come over lo.
        assert_eq!(underlay_for(local, None), None);
        // Our address on lo, the peer behind u0: the program would sit on lo, the datagrams
        // arrive on u0.
        assert_eq!(
            underlay_for(remote, Some(Ipv4Addr::new(10, 66, 1, 1))),
            None
        );
        assert_eq!(underlay_for(Ipv4Addr::LOCALHOST, None), None);
    }
}
