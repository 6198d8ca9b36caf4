//! How the engine's changes reach the forwarding threads and the kernel: the forwarding table
//! is changed in a copy ([`Engine::table_mut`]) where a change bears (a route's destination, a
//! port), and [`Engine::publish`] swaps in a snapshot with it, numbered and saying what
//! changed, so each thread's route cache forgets only those decisions
//! (`vnet_core::RouteCache`) and the kernel recompiles and writes only those destinations.
//!
//! What bears on every decision says so: a port that comes or goes (floods change), learning
//! switched (every entry of the kernel's table is then slow, or compiled again), the kernel
//! path's mode. A policy (`link set X rate`) or a dispatcher setting changes no decision and
//! publishes nothing. [`Engine::rebuild`] makes the whole table anew from a configuration: the
//! way back after a script failed half-way, not the way of a change.

use std::mem::take;
use std::sync::Arc;

use vnet_control::{Config, RouteChange};
use vnet_core::{FastMap, FastSet, ForwardingTable, PortId, RouteRule, TableChange, Touched};

use super::Engine;
use crate::shared::{PortEntry, Snapshot};

impl Engine {
    /// A route's rule, when its destination port is up (a rule to a port that failed to
    /// come up is left out, as [`Engine::rebuild`] leaves it out).
    fn rule(&self, r: &vnet_control::Route) -> Option<RouteRule> {
        let rt = self.ports.get(&(r.to.kind, r.to.name.clone()))?;
        Some(RouteRule {
            vni: rt.entry.info.vni,
            src: r.src,
            dst: r.dst,
            dest: rt.id,
        })
    }

    /// The table the next publication swaps in (a copy of the published one, made at the
    /// first change after a publication; its maps are shared until changed).
    pub(super) fn table_mut(&mut self) -> &mut ForwardingTable {
        self.pending
            .get_or_insert_with(|| self.shared.snapshot.load().table.clone())
    }

    /// The next publication bears on every decision (and on the kernel's whole table, with
    /// `kernel`).
    pub(super) fn touch_all(&mut self, kernel: bool) {
        self.table_mut();
        self.table_all = true;
        self.kernel_full |= kernel;
    }

    /// Applies one route change to the table to publish: the rule goes from or to its
    /// destination's place, nothing else is looked at.
    pub(super) fn change_route(&mut self, rc: &RouteChange) {
        let (gone, new) = rc.parts();
        let rules = [
            gone.and_then(|r| self.rule(r)),
            new.and_then(|r| self.rule(r)),
        ];
        for (k, rule) in rules.iter().enumerate() {
            let Some(rule) = rule else { continue };
            let table = self.table_mut();
            let changed = if k == 0 {
                table.remove_route(rule)
            } else {
                table.insert_route(*rule)
            };
            if changed {
                self.touched.push(Touched::of(rule));
            }
        }
    }

    /// Publishes what changed since the last publication: a table that differs where the
    /// changes bore, for the forwarding threads (their route caches forget only that) and the
    /// kernel (which recompiles and writes only that). Nothing when nothing changed.
    pub fn publish(&mut self) {
        if self.pending.is_some() || self.kernel_full {
            self.store(|_| {});
        }
    }

    /// Swaps in a snapshot: the table with the changes since the last publication (numbered,
    /// saying what changed), the kernel's table brought along, and the port maps as `edit`
    /// changes them.
    pub(super) fn store(&mut self, edit: impl FnOnce(&mut Snapshot)) {
        let old = self.shared.snapshot.load_full();
        let table = match self.pending.take() {
            Some(mut t) => {
                let touched = take(&mut self.touched);
                self.generation += 1;
                let change = if take(&mut self.table_all) {
                    TableChange::All
                } else {
                    TableChange::Some(touched.clone().into())
                };
                t.publish(self.generation, change);
                self.kernel_follow(&t, &touched);
                t
            }
            None => {
                self.kernel_follow(&old.table, &[]);
                old.table.clone()
            }
        };
        let mut snap = old.with_table(table);
        edit(&mut snap);
        self.shared.snapshot.store(Arc::new(snap));
    }

    /// The kernel's table follows `table`: the `touched` destinations recompiled and written,
    /// or all of it when a change bore on all of it.
    fn kernel_follow(&mut self, table: &ForwardingTable, touched: &[Touched]) {
        let learning = self.shared.learning();
        let full = take(&mut self.kernel_full);
        let Some(k) = &mut self.kernel else {
            return;
        };
        if full {
            let ports: Vec<(PortId, u32)> = table.ports().map(|(id, p)| (id, p.vni)).collect();
            let rules: Vec<RouteRule> = table.routes().groups().into_values().flatten().collect();
            k.apply(&ports, &rules, learning);
        } else if !touched.is_empty() {
            k.apply_routes(table, touched, learning);
        }
    }

    /// Publishes a whole new forwarding table for `cfg` (ports that exist, and the routes to
    /// them; the kernel's table compiled whole), and starts reading ports the dispatchers do
    /// not read yet. The route caches forget everything.
    pub fn rebuild(&mut self, cfg: &Config) {
        self.pending = None;
        self.touched.clear();
        self.table_all = false;
        self.generation += 1;
        let mut ports: FastMap<PortId, PortEntry> = FastMap::default();
        let mut udp_peers: FastMap<(std::net::IpAddr, u32), PortId> = FastMap::default();
        let mut udp_ips: FastSet<std::net::IpAddr> = FastSet::default();
        let mut tcp_accept: FastMap<(std::net::IpAddr, u32), PortId> = FastMap::default();
        for rt in self.ports.values() {
            ports.insert(rt.id, rt.entry.clone());
            if let Some(ip) = rt.udp_peer {
                udp_peers.insert((ip, rt.entry.info.vni), rt.id);
                udp_ips.insert(ip);
            }
            if let Some(ip) = rt.tcp_accept_peer {
                tcp_accept.insert((ip, rt.entry.info.vni), rt.id);
            }
        }
        let rules: Vec<RouteRule> = cfg.routes.iter().filter_map(|r| self.rule(r)).collect();
        let table = ForwardingTable::new(
            self.generation,
            ports.iter().map(|(id, e)| (*id, e.info)),
            rules,
        );
        self.kernel_full = true;
        self.kernel_follow(&table, &[]);
        let mut snap = Snapshot {
            table,
            ports: Arc::new(ports),
            udp_peers: Arc::new(udp_peers),
            udp_ips: Arc::new(udp_ips),
            tcp_accept: Arc::new(tcp_accept),
            reach_endpoints: Default::default(),
            reach_tags: Default::default(),
            relays: Default::default(),
            udp: self.udp.clone(),
        };
        self.set_reach_maps(&mut snap);
        self.shared.snapshot.store(Arc::new(snap));
        for rt in self.ports.values() {
            for s in &rt.sources {
                if !self.dispatchers.contains(s) {
                    self.dispatchers.add(s.clone());
                }
            }
        }
        self.ports_changed();
    }

    /// The generation of the published forwarding table (one more per publication).
    pub fn snapshot_generation(&self) -> u64 {
        self.shared.snapshot.load().table.generation()
    }
}
