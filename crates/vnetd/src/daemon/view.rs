//! What readers see: the [`View`] the owner thread publishes after every change (an
//! immutable value behind an `ArcSwap`), and every `show` answer rendered from it.
//!
//! Why: a reader (`show`, `/metrics`, the live view, the etcd agent's look at the local
//! configuration) must never wait for a change in progress, which can take seconds (a device
//! made, the kernel's table written). The view costs the owner little per change: its parts
//! are shared between views and only the part a change touched is made anew (the ports and
//! settings part on a change of ports or settings; the routes are a persistent vector changed
//! at the changed slots, `view_routes.rs`; the derived record's indexes are persistent too). Live
//! counters are read through the engine's [`EngineStatus`] at read time. Rendering (rows,
//! text, a whole configuration for `show config`) is the reader's work, on the reader's
//! thread.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use vnet_control::status::{
    DaemonCounters, InterfaceStatus, InterfaceTable, LinkReach, LinkState, LinkStatus, LinkTable,
    ListenerTable, MatrixReport, RouteStatus, StateStatus, StatsReport,
};
use vnet_control::{Config, DestKind, Interface, Route};
use vnet_dataplane::EngineStatus;
use vnet_wire::MacAddr;

use super::view_routes::ViewRoutes;
use crate::derived::DerivedIndex;
use crate::pending::Pending;

/// `show links`' last text, for the readers (`View::links_text`); lock-free, like the view.
#[derive(Default)]
pub struct LinksTextCache(ArcSwapOption<LinksText>);

/// A rendering of `show links` and what it was rendered from: the ports part it holds (so
/// the pointer compared cannot be reused by another) and each link's state.
pub struct LinksText {
    ports: Arc<Config>,
    states: Vec<(LinkState, bool, Option<Arc<LinkReach>>)>,
    text: Arc<str>,
}

/// Everything a reader can ask for, as of the last change.
#[derive(Clone)]
pub struct View {
    /// The running configuration without its routes (interfaces, links and their rates,
    /// listeners, settings).
    pub ports: Arc<Config>,
    /// The running configuration's routes, in order.
    pub routes: ViewRoutes,
    /// Which links and routes are the etcd agent's.
    pub derived: DerivedIndex,
    /// Routes of the local configuration waiting for their link.
    pub pending: Arc<Pending>,
    pub engine: EngineStatus,
}

impl View {
    /// The local configuration (`show config`, what the etcd agent derives from): the running
    /// one without the agent's objects. Made here, on the reader's thread.
    pub fn local_config(&self) -> Config {
        let mut cfg = (*self.ports).clone();
        cfg.links.retain(|l| !self.derived.has_link(l));
        cfg.routes = self
            .routes
            .iter()
            .filter(|r| !self.derived.has_route(r))
            .map(|r| (**r).clone())
            .collect::<Vec<Route>>()
            .into();
        cfg
    }

    /// The running configuration, routes included.
    #[cfg(all(test, debug_assertions))]
    pub fn running_config(&self) -> Config {
        let mut cfg = (*self.ports).clone();
        cfg.routes = vnet_control::Routes::from(
            self.routes
                .iter()
                .map(|r| (**r).clone())
                .collect::<Vec<Route>>(),
        );
        cfg
    }

    /// `show config`: the local configuration's script, the waiting routes after it.
    pub fn config_text(&self) -> String {
        self.local_config().to_script() + &self.pending.shown()
    }

    pub fn interfaces(&self) -> Vec<Interface> {
        self.ports.interfaces.clone()
    }

    pub fn listeners(&self) -> ListenerTable {
        ListenerTable(self.ports.listeners.clone())
    }

    /// `show interfaces`: each interface's configuration and which data path serves it.
    pub fn interface_table(&self) -> InterfaceTable {
        InterfaceTable(
            self.ports
                .interfaces
                .iter()
                .map(|i| InterfaceStatus {
                    interface: i.clone(),
                    path: self
                        .engine
                        .port_status(DestKind::Interface, &i.name)
                        .map(|p| p.path),
                })
                .collect(),
        )
    }

    /// `show links` as text. What a link's row says comes from the configuration's ports
    /// part, except its state: so the text is kept with the ports part and the states it was
    /// rendered with, and while neither changed (a route storm changes neither) an answer is
    /// a copy of it: one look-up per link instead of a row built and formatted per link
    /// (2-3 ms at 1,000 links).
    pub fn links_text(&self, cache: &LinksTextCache) -> Arc<str> {
        let states: Vec<(LinkState, bool, Option<Arc<LinkReach>>)> = self
            .ports
            .links
            .iter()
            .map(|l| self.engine.link_state_encrypted(&l.name))
            .collect();
        if let Some(c) = cache.0.load().as_deref() {
            if Arc::ptr_eq(&c.ports, &self.ports) && c.states == states {
                return c.text.clone();
            }
        }
        let text: Arc<str> = LinkTable(self.links()).to_string().into();
        cache.0.store(Some(Arc::new(LinksText {
            ports: self.ports.clone(),
            states,
            text: text.clone(),
        })));
        text
    }

    /// `show links`.
    pub fn links(&self) -> Vec<LinkStatus> {
        self.ports
            .links
            .iter()
            .map(|l| {
                LinkStatus::new(
                    l,
                    self.engine.link_state(&l.name),
                    self.ports.link_rates.get(&l.name).copied(),
                    self.engine.link_crypto(&l.name),
                )
                .with_reach(self.engine.link_reach(&l.name))
            })
            .collect()
    }

    /// The VNI of each destination, looked up once per answer (`show routes` is what a
    /// poller asks every daemon for: scanning the ports for each route made it quadratic).
    fn vnis(&self) -> HashMap<(DestKind, &str), u32> {
        let c = &self.ports;
        c.interfaces
            .iter()
            .map(|i| ((DestKind::Interface, i.name.as_str()), i.vni))
            .chain(
                c.links
                    .iter()
                    .map(|l| ((DestKind::Link, l.name.as_str()), l.vni)),
            )
            .collect()
    }

    /// `show routes`, or with `to`, the rows whose destination matches that MAC.
    pub fn routes(&self, to: Option<MacAddr>) -> Vec<RouteStatus> {
        let vnis = self.vnis();
        self.routes
            .iter()
            .filter(|r| to.is_none_or(|mac| r.dst.matches(mac)))
            .map(|r| {
                let vni = vnis.get(&(r.to.kind, r.to.name.as_str())).copied();
                RouteStatus::at(r, vni.unwrap_or(0))
            })
            .collect()
    }

    /// `show cluster`'s list of what the agent applied: its links by name, then its routes in
    /// the running configuration's order.
    pub fn derived_lines(&self) -> Vec<String> {
        let links = self.derived.links().map(|l| {
            let spec = vnet_control::LinkSpec {
                name: l.name.clone(),
                kind: l.kind.clone(),
                vni: Some(l.vni),
                encrypt: l.encrypt,
                reach: l.reach,
                rate: None,
            };
            vnet_control::Command::LinkAdd(spec)
        });
        let routes = self
            .routes
            .iter()
            .filter(|r| self.derived.has_route(r))
            .map(|r| {
                vnet_control::Command::Route(vnet_control::RouteOp::Add, crate::pending::spec_of(r))
            });
        links
            .chain(routes)
            .filter_map(|c| vnet_cluster::render_command(&c))
            .collect()
    }

    pub fn matrix(&self) -> MatrixReport {
        let (pairs, overflow) = self.engine.matrix();
        MatrixReport { pairs, overflow }
    }

    /// `show stats` (the state directory's part and the control port's errors are the
    /// daemon's to fill in).
    pub fn stats(&self, control_errors: u64) -> StatsReport {
        let e = &self.engine;
        let mut ports = Vec::new();
        for i in &self.ports.interfaces {
            ports.extend(e.port_status(DestKind::Interface, &i.name));
        }
        for l in &self.ports.links {
            ports.extend(e.port_status(DestKind::Link, &l.name));
        }
        let daemon = e.daemon_counters();
        StatsReport {
            ports,
            daemon: DaemonCounters {
                rx_datagrams: daemon.rx_frames,
                rx_bytes: daemon.rx_bytes,
                drops: daemon.drops,
                control_errors,
            },
            state: StateStatus {
                pending_routes: self.pending.len() as u64,
                ..StateStatus::default()
            },
            dispatch: e.dispatch_status(),
            kernel: e.kernel_status(),
        }
    }
}
