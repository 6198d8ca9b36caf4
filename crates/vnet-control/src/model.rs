//! The configuration model: [`Config`] validates a command against the running configuration
//! and applies it, and says what the data path must do as typed [`Change`]s (a route change
//! names the route, so the data path touches its destination only); every change has an
//! inverse, so a script refused half-way is undone.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use vnet_wire::MacAddr;

use crate::command::{
    Command, DestKind, DestRef, DispatchMode, FastPathMode, InterfaceKind, InterfaceSpec, LinkKind,
    LinkSpec, NotifyMode, PolicyUpdate, RateLimit, RouteOp, RouteSpec, Setting, YieldStrategy,
};
use crate::names::NameHints;
use crate::routes::{Route, Routes};

const DEFAULT_VNI: u32 = 1;
const DEFAULT_MTU: u32 = 1500;
/// Most interfaces and links, together.
pub const MAX_PORTS: usize = 4096;
/// Most routes.
pub const MAX_ROUTES: usize = 100_000;
/// Most TCP listeners.
pub const MAX_LISTENERS: usize = 64;
/// Most lines [`Config::to_script`] renders: one for each port, route and listener, and at
/// most one for `set learn` and for each data path setting (`render_config.rs`; 32 is far
/// above them, tested). A saved configuration is read back within this bound
/// ([`crate::parse_config`]), not a script's: what the control port accepted, in as many
/// batches as it took, always reads back.
pub const MAX_CONFIG_LINES: usize = MAX_PORTS + MAX_ROUTES + MAX_LISTENERS + 32;

/// A configured interface, with every default filled in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Interface {
    pub name: String,
    pub kind: InterfaceKind,
    pub ifname: String,
    #[serde(serialize_with = "ser_display")]
    pub mac: MacAddr,
    pub mtu: u32,
    pub netns: Option<String>,
    pub vni: u32,
    /// TAP queues (`IFF_MULTI_QUEUE`), one descriptor each.
    pub queues: u32,
    /// Virtio-net header offloads (TSO, checksum) on the TAP.
    pub offload: bool,
    /// vhost-user: the socket, and whether vnet connects to the VMM (`client`).
    pub socket: Option<String>,
    pub client: bool,
    /// The guest may send with source MACs other than `mac` (a bridge or router inside it).
    pub any_source: bool,
    /// A token bucket on what the guest sends.
    pub rate: Option<RateLimit>,
}

impl Interface {
    pub fn policy(&self) -> PortPolicy {
        PortPolicy {
            any_source: self.any_source,
            rate: self.rate,
        }
    }
}

/// What a port lets in: for an interface, whether its guest may send with any source MAC; for
/// both interfaces and links, an optional rate limit on what the port receives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PortPolicy {
    pub any_source: bool,
    pub rate: Option<RateLimit>,
}

/// The data path's tuning knobs (VNET/P sections 4.5-4.6), with the paper's published defaults.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DataPathSettings {
    pub mode: DispatchMode,
    pub dispatchers: u32,
    #[serde(rename = "yield")]
    pub yield_strategy: YieldStrategy,
    pub yield_sleep_us: u32,
    pub yield_nowork_us: u32,
    /// alpha_l, packets per second.
    pub adaptive_low: u32,
    /// alpha_u, packets per second.
    pub adaptive_high: u32,
    /// omega.
    pub adaptive_window_ms: u32,
    /// Pin dispatcher i to `cpus[i % len]`; empty: no pinning.
    pub cpus: Vec<u32>,
    /// vhost-user: move frames between guest buffers and sockets without an extra copy.
    pub cut_through: bool,
    /// vhost-user: receive notification policy.
    pub notify: NotifyMode,
    /// Optimistic notification thresholds α and β on receive density, Mbit/s.
    pub notify_alpha_mbps: u32,
    pub notify_beta_mbps: u32,
    /// Whether the kernel forwards veth and netdev interfaces' frames where it can.
    pub fastpath: FastPathMode,
}

impl Default for DataPathSettings {
    fn default() -> Self {
        DataPathSettings {
            mode: DispatchMode::Adaptive,
            dispatchers: 1,
            yield_strategy: YieldStrategy::Immediate,
            yield_sleep_us: 50,
            yield_nowork_us: 1000,
            adaptive_low: 1_000,
            adaptive_high: 10_000,
            adaptive_window_ms: 5,
            cpus: Vec::new(),
            cut_through: true,
            notify: NotifyMode::Optimistic,
            notify_alpha_mbps: 100,
            notify_beta_mbps: 10_000,
            fastpath: FastPathMode::Kernel,
        }
    }
}

/// A configured link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub kind: LinkKind,
    pub vni: u32,
    /// The peer's static public key when the link is encrypted (udp links only).
    pub encrypt: Option<vnet_wire::PublicKey>,
    /// The peer's probe key when vnetd finds the link's path itself (udp links only).
    pub reach: Option<vnet_wire::PublicKey>,
}

fn ser_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// What the data path must do to follow a configuration change. Every change has an inverse,
/// so a script that fails half-way in the OS can be undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    AddInterface(Interface),
    DelInterface(Interface),
    AddLink(Link),
    DelLink(Link),
    AddListener(SocketAddr),
    DelListener(SocketAddr),
    /// One route came or went: the forwarding tables change at its destination only.
    Route(RouteChange),
    /// A port's policy changed (`interface set`, `link set`, or a link added with a rate).
    Policy {
        kind: DestKind,
        name: String,
        old: PortPolicy,
        new: PortPolicy,
    },
    Learn(bool),
    Settings {
        old: DataPathSettings,
        new: DataPathSettings,
    },
}

impl Change {
    pub fn inverse(&self) -> Change {
        match self {
            Change::AddInterface(i) => Change::DelInterface(i.clone()),
            Change::DelInterface(i) => Change::AddInterface(i.clone()),
            Change::AddLink(l) => Change::DelLink(l.clone()),
            Change::DelLink(l) => Change::AddLink(l.clone()),
            Change::AddListener(a) => Change::DelListener(*a),
            Change::DelListener(a) => Change::AddListener(*a),
            Change::Route(r) => Change::Route(r.inverse()),
            Change::Policy {
                kind,
                name,
                old,
                new,
            } => Change::Policy {
                kind: *kind,
                name: name.clone(),
                old: *new,
                new: *old,
            },
            Change::Learn(b) => Change::Learn(!b),
            Change::Settings { old, new } => Change::Settings {
                old: new.clone(),
                new: old.clone(),
            },
        }
    }
}

/// A typed change of the route set. `at` is the route's index in [`Config::routes`] when it
/// was taken out, so that undoing a change puts it back where it was (the order of the routes
/// is the order of a multi-destination route's targets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteChange {
    /// Added after the other routes.
    Added(Route),
    Removed {
        route: Route,
        at: usize,
    },
    /// `route replace` took `old` out and added `new` after the other routes.
    Replaced {
        old: Route,
        at: usize,
        new: Route,
    },
}

impl RouteChange {
    pub fn inverse(&self) -> RouteChange {
        match self {
            // Only ever undone newest first, so an added route is the last one.
            RouteChange::Added(r) => RouteChange::Removed {
                route: r.clone(),
                at: usize::MAX,
            },
            RouteChange::Removed { route, .. } => RouteChange::Added(route.clone()),
            RouteChange::Replaced { old, new, .. } => RouteChange::Replaced {
                old: new.clone(),
                at: usize::MAX,
                new: old.clone(),
            },
        }
    }

    /// The routes taken out (first) and put in (second).
    pub fn parts(&self) -> (Option<&Route>, Option<&Route>) {
        match self {
            RouteChange::Added(r) => (None, Some(r)),
            RouteChange::Removed { route, .. } => (Some(route), None),
            RouteChange::Replaced { old, new, .. } => (Some(old), Some(new)),
        }
    }
}

/// A command refused by validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn refuse<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// The whole desired configuration of one daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub interfaces: Vec<Interface>,
    pub links: Vec<Link>,
    pub listeners: Vec<SocketAddr>,
    /// In order, indexed by (source, destination) and by destination (see [`Routes`]).
    pub routes: Routes,
    pub learn: bool,
    pub settings: DataPathSettings,
    /// Rate limits of links, by link name (kept beside [`Link`] so a link's identity, which
    /// the cluster layer compares, does not include it).
    pub link_rates: BTreeMap<String, RateLimit>,
    /// Where each interface and each link sits in its list (checked hints, see
    /// [`NameHints`]), so that a lookup by name does not scan the list.
    interface_hints: NameHints,
    link_hints: NameHints,
}

impl Config {
    pub fn interface(&self, name: &str) -> Option<&Interface> {
        self.interface_hints
            .find(&self.interfaces, name, |i| &i.name)
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.link_hints.find(&self.links, name, |l| &l.name)
    }

    /// The policy of a link (only its rate applies).
    pub fn link_policy(&self, name: &str) -> PortPolicy {
        PortPolicy {
            any_source: false,
            rate: self.link_rates.get(name).copied(),
        }
    }

    /// The VNI of a destination, if it exists.
    pub fn dest_vni(&self, d: &DestRef) -> Option<u32> {
        match d.kind {
            DestKind::Interface => self.interface(&d.name).map(|i| i.vni),
            DestKind::Link => self.link(&d.name).map(|l| l.vni),
        }
    }

    /// Validates `cmd` against the current state and applies it; on error nothing changed.
    /// `random_mac` supplies a MAC for interfaces given none.
    pub fn apply(
        &mut self,
        cmd: &Command,
        random_mac: &mut dyn FnMut() -> MacAddr,
    ) -> Result<Vec<Change>, ConfigError> {
        match cmd {
            Command::InterfaceAdd(spec) => self.add_interface(spec, random_mac),
            Command::InterfaceDel(name) => {
                let Some(pos) = self.interfaces.iter().position(|i| &i.name == name) else {
                    return refuse(format!("no interface {name}"));
                };
                let iface = self.interfaces.remove(pos);
                let mut ch = self.drop_routes_to(DestKind::Interface, name);
                ch.push(Change::DelInterface(iface));
                Ok(ch)
            }
            Command::LinkAdd(spec) => self.add_link(spec),
            Command::LinkDel(name) => {
                let Some(pos) = self.links.iter().position(|l| &l.name == name) else {
                    return refuse(format!("no link {name}"));
                };
                let link = self.links.remove(pos);
                let mut ch = self.drop_routes_to(DestKind::Link, name);
                // Clear the rate first, so the inverse (an undo) restores it after re-adding.
                if let Some(rate) = self.link_rates.remove(name) {
                    ch.push(Change::Policy {
                        kind: DestKind::Link,
                        name: name.clone(),
                        old: PortPolicy {
                            any_source: false,
                            rate: Some(rate),
                        },
                        new: PortPolicy::default(),
                    });
                }
                ch.push(Change::DelLink(link));
                Ok(ch)
            }
            Command::InterfaceSet(name, u) => {
                let Some(iface) = self.interfaces.iter_mut().find(|i| &i.name == name) else {
                    return refuse(format!("no interface {name}"));
                };
                let old = iface.policy();
                let new = updated(old, u);
                if new == old {
                    return Ok(vec![]);
                }
                iface.any_source = new.any_source;
                iface.rate = new.rate;
                Ok(vec![Change::Policy {
                    kind: DestKind::Interface,
                    name: name.clone(),
                    old,
                    new,
                }])
            }
            Command::LinkSet(name, u) => {
                if self.link(name).is_none() {
                    return refuse(format!("no link {name}"));
                }
                if u.any_source.is_some() {
                    return refuse("any-source is a setting of interfaces");
                }
                let old = self.link_policy(name);
                let new = updated(old, u);
                if new == old {
                    return Ok(vec![]);
                }
                match new.rate {
                    Some(r) => self.link_rates.insert(name.clone(), r),
                    None => self.link_rates.remove(name),
                };
                Ok(vec![Change::Policy {
                    kind: DestKind::Link,
                    name: name.clone(),
                    old,
                    new,
                }])
            }
            Command::ListenAdd(a) => {
                if self.listeners.contains(a) {
                    return refuse(format!("already listening on {a}"));
                }
                if self.listeners.len() >= MAX_LISTENERS {
                    return refuse(format!("at most {MAX_LISTENERS} listeners"));
                }
                self.listeners.push(*a);
                Ok(vec![Change::AddListener(*a)])
            }
            Command::ListenDel(a) => {
                let Some(pos) = self.listeners.iter().position(|l| l == a) else {
                    return refuse(format!("not listening on {a}"));
                };
                self.listeners.remove(pos);
                Ok(vec![Change::DelListener(*a)])
            }
            Command::Route(op, spec) => self.route(*op, spec),
            Command::Set(Setting::Learn(on)) => {
                if self.learn == *on {
                    return Ok(vec![]);
                }
                self.learn = *on;
                Ok(vec![Change::Learn(*on)])
            }
            Command::Set(s) => self.set(s),
            Command::Show(..) => refuse("show changes nothing"),
        }
    }

    fn set(&mut self, s: &Setting) -> Result<Vec<Change>, ConfigError> {
        let old = self.settings.clone();
        let mut new = old.clone();
        match s {
            Setting::Learn(_) => {}
            Setting::Mode(m) => new.mode = *m,
            Setting::Dispatchers(n) => new.dispatchers = *n,
            Setting::Yield(y) => new.yield_strategy = *y,
            Setting::YieldSleepUs(n) => new.yield_sleep_us = *n,
            Setting::YieldNoworkUs(n) => new.yield_nowork_us = *n,
            Setting::AdaptiveLow(n) => new.adaptive_low = *n,
            Setting::AdaptiveHigh(n) => new.adaptive_high = *n,
            Setting::AdaptiveWindowMs(n) => new.adaptive_window_ms = *n,
            Setting::Cpus(c) => new.cpus = c.clone(),
            Setting::CutThrough(on) => new.cut_through = *on,
            Setting::Notify(m) => new.notify = *m,
            Setting::NotifyAlphaMbps(n) => new.notify_alpha_mbps = *n,
            Setting::NotifyBetaMbps(n) => new.notify_beta_mbps = *n,
            Setting::FastPath(m) => new.fastpath = *m,
        }
        if new.adaptive_low > new.adaptive_high {
            return refuse(format!(
                "adaptive-low ({}) must not exceed adaptive-high ({})",
                new.adaptive_low, new.adaptive_high
            ));
        }
        if new.notify_alpha_mbps > new.notify_beta_mbps {
            return refuse(format!(
                "notify-alpha-mbps ({}) must not exceed notify-beta-mbps ({})",
                new.notify_alpha_mbps, new.notify_beta_mbps
            ));
        }
        if new == old {
            return Ok(vec![]);
        }
        self.settings = new.clone();
        Ok(vec![Change::Settings { old, new }])
    }

    fn add_interface(
        &mut self,
        spec: &InterfaceSpec,
        random_mac: &mut dyn FnMut() -> MacAddr,
    ) -> Result<Vec<Change>, ConfigError> {
        if self.interface(&spec.name).is_some() {
            return refuse(format!("interface {} exists", spec.name));
        }
        if self.interfaces.len() + self.links.len() >= MAX_PORTS {
            return refuse(format!("at most {MAX_PORTS} interfaces and links"));
        }
        let ifname = match (&spec.vhost_socket, &spec.ifname) {
            (Some(_), _) => String::new(),
            (None, Some(n)) => n.clone(),
            (None, None) => {
                let mut n = format!("vn-{}", spec.name);
                n.truncate(15);
                n
            }
        };
        if let Some(sock) = &spec.vhost_socket {
            if let Some(o) = self
                .interfaces
                .iter()
                .find(|i| i.socket.as_ref() == Some(sock))
            {
                return refuse(format!(
                    "socket {sock} is already used by interface {}",
                    o.name
                ));
            }
        }
        if let Some(o) = self
            .interfaces
            .iter()
            .find(|i| !ifname.is_empty() && i.ifname == ifname)
        {
            return refuse(format!(
                "device {ifname} is already used by interface {}",
                o.name
            ));
        }
        if let Some(l) = self
            .links
            .iter()
            .find(|l| matches!(&l.kind, LinkKind::Direct(d) if *d == ifname))
        {
            return refuse(format!(
                "device {ifname} is already used by link {}",
                l.name
            ));
        }
        let vni = spec.vni.unwrap_or(DEFAULT_VNI);
        let mac = match spec.mac {
            Some(m) => m,
            None => random_mac(),
        };
        if !mac.is_unicast() || mac == MacAddr::ZERO {
            return refuse(format!(
                "interface MAC {mac} must be a non-zero unicast address"
            ));
        }
        if let Some(o) = self
            .interfaces
            .iter()
            .find(|i| i.mac == mac && i.vni == vni)
        {
            return refuse(format!(
                "MAC {mac} is already used by interface {} in VNI {vni}",
                o.name
            ));
        }
        let iface = Interface {
            name: spec.name.clone(),
            kind: spec.kind,
            ifname,
            mac,
            // A netdev's MTU is its owner's (0: read from the device).
            mtu: if spec.kind == InterfaceKind::Netdev {
                0
            } else {
                spec.mtu.unwrap_or(DEFAULT_MTU)
            },
            netns: spec.netns.clone(),
            vni,
            queues: spec.queues.unwrap_or(1),
            offload: spec.offload.unwrap_or(true),
            socket: spec.vhost_socket.clone(),
            client: spec.client,
            any_source: spec.any_source,
            rate: spec.rate,
        };
        self.interfaces.push(iface.clone());
        Ok(vec![Change::AddInterface(iface)])
    }

    fn add_link(&mut self, spec: &LinkSpec) -> Result<Vec<Change>, ConfigError> {
        if self.link(&spec.name).is_some() {
            return refuse(format!("link {} exists", spec.name));
        }
        if self.interfaces.len() + self.links.len() >= MAX_PORTS {
            return refuse(format!("at most {MAX_PORTS} interfaces and links"));
        }
        let vni = spec.vni.unwrap_or(DEFAULT_VNI);
        for l in &self.links {
            let clash = match (&l.kind, &spec.kind) {
                // UDP datagrams are assigned to links by (source IP, VNI), a reach link's by
                // the peer's endpoints that answered its probes: one per (peer key, VNI).
                (LinkKind::Udp(a), LinkKind::Udp(b)) => {
                    l.vni == vni
                        && match (l.reach, spec.reach) {
                            (None, None) => a.ip() == b.ip(),
                            (Some(x), Some(y)) => x == y,
                            _ => false,
                        }
                }
                (LinkKind::TcpDial(a), LinkKind::TcpDial(b)) => a == b && l.vni == vni,
                (LinkKind::TcpAccept(a), LinkKind::TcpAccept(b)) => a == b && l.vni == vni,
                // One direct link per device: two would each take every LAN frame.
                (LinkKind::Direct(a), LinkKind::Direct(b)) => a == b,
                _ => false,
            };
            if clash {
                return refuse(format!(
                    "link {} already covers {} in VNI {}",
                    l.name, l.kind, l.vni
                ));
            }
        }
        if let LinkKind::Direct(dev) = &spec.kind {
            if let Some(i) = self.interfaces.iter().find(|i| &i.ifname == dev) {
                return refuse(format!("device {dev} is interface {}'s TAP", i.name));
            }
        }
        let link = Link {
            name: spec.name.clone(),
            kind: spec.kind.clone(),
            vni,
            encrypt: spec.encrypt,
            reach: spec.reach,
        };
        self.links.push(link.clone());
        let mut ch = vec![Change::AddLink(link)];
        if let Some(rate) = spec.rate {
            self.link_rates.insert(spec.name.clone(), rate);
            ch.push(Change::Policy {
                kind: DestKind::Link,
                name: spec.name.clone(),
                old: PortPolicy::default(),
                new: PortPolicy {
                    any_source: false,
                    rate: Some(rate),
                },
            });
        }
        Ok(ch)
    }

    fn drop_routes_to(&mut self, kind: DestKind, name: &str) -> Vec<Change> {
        let to = DestRef {
            kind,
            name: name.to_string(),
        };
        self.routes
            .remove_to(&to)
            .into_iter()
            .map(|(at, route)| Change::Route(RouteChange::Removed { route, at }))
            .collect()
    }

    /// Undoes route changes this configuration made, newest first (a script refused half-way
    /// is taken back without a copy of the whole configuration).
    pub fn undo_routes(&mut self, changes: &[RouteChange]) {
        for c in changes.iter().rev() {
            match c {
                RouteChange::Added(r) => {
                    if let Some(p) = self.routes.rposition(r) {
                        self.routes.remove(p);
                    }
                }
                RouteChange::Removed { route, at } => {
                    let at = (*at).min(self.routes.len());
                    self.routes.insert(at, route.clone());
                }
                RouteChange::Replaced { old, at, new } => {
                    if let Some(p) = self.routes.rposition(new) {
                        self.routes.remove(p);
                    }
                    let at = (*at).min(self.routes.len());
                    self.routes.insert(at, old.clone());
                }
            }
        }
    }

    fn route(&mut self, op: RouteOp, spec: &RouteSpec) -> Result<Vec<Change>, ConfigError> {
        let route = Route {
            src: spec.src,
            dst: spec.dst,
            to: spec.to.clone(),
        };
        let Some(vni) = self.dest_vni(&spec.to) else {
            return refuse(format!("no {} {}", spec.to.kind, spec.to.name));
        };
        match op {
            RouteOp::Add => {
                if self.routes.contains(&route) {
                    return refuse(format!("route {spec} exists"));
                }
                if self.routes.len() >= MAX_ROUTES {
                    return refuse(format!("at most {MAX_ROUTES} routes"));
                }
                self.routes.push(route.clone());
                Ok(vec![Change::Route(RouteChange::Added(route))])
            }
            RouteOp::Replace => {
                // The routes with the same key (source, destination, VNI), in order.
                let olds: Vec<usize> = self
                    .routes
                    .with_key(route.src, route.dst)
                    .into_iter()
                    .filter(|(_, r)| self.dest_vni(&r.to) == Some(vni))
                    .map(|(at, _)| at)
                    .collect();
                if self.routes.len() - olds.len() >= MAX_ROUTES {
                    return refuse(format!("at most {MAX_ROUTES} routes"));
                }
                if let [at] = olds[..] {
                    let old = self.routes.remove(at);
                    self.routes.push(route.clone());
                    return Ok(vec![Change::Route(RouteChange::Replaced {
                        old,
                        at,
                        new: route,
                    })]);
                }
                let mut ch = Vec::new();
                for (k, at) in olds.into_iter().enumerate() {
                    // Indices shift down by one per route already taken out.
                    let at = at - k;
                    let old = self.routes.remove(at);
                    ch.push(Change::Route(RouteChange::Removed { route: old, at }));
                }
                self.routes.push(route.clone());
                ch.push(Change::Route(RouteChange::Added(route)));
                Ok(ch)
            }
            RouteOp::Del => {
                let Some(at) = self.routes.position(&route) else {
                    return refuse(format!("no route {spec}"));
                };
                let route = self.routes.remove(at);
                Ok(vec![Change::Route(RouteChange::Removed { route, at })])
            }
        }
    }
}

/// `old` with what `u` sets.
fn updated(old: PortPolicy, u: &PolicyUpdate) -> PortPolicy {
    PortPolicy {
        any_source: u.any_source.unwrap_or(old.any_source),
        rate: u.rate.unwrap_or(old.rate),
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
