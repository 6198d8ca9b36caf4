//! Reach's side of the engine: where vnetd's reach thread says a peer's links go now
//! ([`ReachPath`]): the links' sending side is pointed there, the kernel's link moved, and
//! the snapshot's maps that find a reach link's datagrams (by endpoint, by the peer's tag,
//! the relays in use) are made anew.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tracing::info;
use vnet_core::{FastMap, FastSet, LockRecover, PortId};

use super::{Engine, PortRuntime, ReachPath};
use crate::reach::LinkPath;
use crate::shared::Snapshot;

impl Engine {
    /// Reach chose a path for the links to the peer with probe key `peer`: their datagrams
    /// go there from the next batch on, and datagrams from `accept` are theirs.
    pub fn set_reach_path(&mut self, peer: vnet_crypto::PublicKey, path: ReachPath) {
        if self.reach_paths.get(&peer) == Some(&path) {
            return;
        }
        let mut in_kernel = Vec::new();
        for rt in self.ports.values() {
            if rt.reach.map(|(k, _)| k) == Some(peer) {
                self.realize_reach_path(rt, &path);
                if rt.kernel {
                    in_kernel.push((rt.id, rt.reach.map(|(_, c)| c)));
                }
            }
        }
        if let Some(k) = &mut self.kernel {
            for (id, configured) in in_kernel {
                // No path known yet: the configured address. A TCP tunnel's local end
                // (loopback), direct or to a relay, goes through vnetd.
                let (to, tag) = match (path.direct, path.relay) {
                    (Some(ep), _) if !ep.ip().is_loopback() => (Some(ep), None),
                    (None, Some(r)) if !r.ip().is_loopback() => {
                        (Some(r), Some(vnet_reach::Tag::of(&peer)))
                    }
                    (Some(_), _) | (None, Some(_)) => (None, None),
                    (None, None) => (configured, None),
                };
                k.set_link_path(id, to, tag, path.mtu);
            }
        }
        info!(peer = %vnet_reach::Tag::of(&peer), direct = ?path.direct, relay = ?path.relay,
              accept = ?path.accept, "reach path");
        self.reach_paths.insert(peer, path);
        // `show links` says each reach link's path.
        self.ports_changed();
        self.refresh_reach_maps();
    }

    /// A relay hands the pairs its table admitted to the kernel, which forwards their
    /// datagrams from then on, and counts in the table what the kernel forwarded and refused
    /// since the last call. Nothing without the kernel fast path, or on a host that does not
    /// relay.
    pub fn sync_relay_pairs(&mut self, now_ms: u64) {
        let (Some(k), Some(table)) = (&mut self.kernel, self.shared.reach.relay()) else {
            return;
        };
        let (wanted, budget) = {
            let t = table.lock_or_recover();
            (t.kernel_pairs(), t.budget())
        };
        let counted = k.sync_relay_pairs(&wanted, budget);
        if !counted.is_empty() {
            let mut t = table.lock_or_recover();
            for (src, dst, c) in counted {
                t.kernel_counted(src, dst, (c.frames, c.bytes, c.rate_limited), now_ms);
            }
        }
    }

    /// Publishes the snapshot with its reach maps made from the reach links and paths now.
    pub(super) fn refresh_reach_maps(&mut self) {
        let old = self.shared.snapshot.load_full();
        let mut snap = old.with_table(old.table.clone());
        self.set_reach_maps(&mut snap);
        self.shared.snapshot.store(Arc::new(snap));
    }

    /// Points a reach link's sending side at `path`.
    fn realize_reach_path(&self, rt: &PortRuntime, path: &ReachPath) {
        let (Some((key, configured)), Some(tx)) = (rt.reach, rt.entry.port.as_udp()) else {
            return;
        };
        let v6 = self.udp.local_addr().is_ipv6();
        let (to, outer_v6) = match (path.direct, path.relay) {
            (Some(ep), _) => (
                LinkPath::direct(crate::reach::for_socket(ep, v6)),
                ep.is_ipv6(),
            ),
            (None, Some(relay)) => (
                LinkPath::relayed(
                    crate::reach::for_socket(relay, v6),
                    vnet_reach::Tag::of(&key),
                ),
                relay.is_ipv6(),
            ),
            (None, None) => (LinkPath::direct(configured), false),
        };
        let extra = if tx.crypto.is_some() {
            vnet_crypto::DATA_OVERHEAD
        } else {
            0
        };
        tx.path
            .store(Arc::new(to.with_mtu(path.mtu, outer_v6, extra)));
        // What the last path refused to segment says nothing about this one.
        tx.gso_refused.store(usize::MAX, Relaxed);
    }

    /// The reach maps of a snapshot from the reach links and their peers' paths.
    pub(super) fn set_reach_maps(&self, snap: &mut Snapshot) {
        let mut endpoints: FastMap<(SocketAddr, u32), PortId> = FastMap::default();
        let mut tags: FastMap<(vnet_reach::Tag, u32), PortId> = FastMap::default();
        let mut relays: FastSet<SocketAddr> = FastSet::default();
        for rt in self.ports.values() {
            let Some((key, _)) = rt.reach else { continue };
            let vni = rt.entry.info.vni;
            tags.insert((vnet_reach::Tag::of(&key), vni), rt.id);
            if let Some(p) = self.reach_paths.get(&key) {
                for ep in &p.accept {
                    endpoints.insert((vnet_reach::canonical(*ep), vni), rt.id);
                }
                if let Some(r) = p.relay {
                    relays.insert(vnet_reach::canonical(r));
                }
            }
        }
        snap.reach_endpoints = Arc::new(endpoints);
        snap.reach_tags = Arc::new(tags);
        snap.relays = Arc::new(relays);
    }
}
