use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use vnet_core::MacMatch;
use vnet_wire::MacAddr;

use crate::command::{
    Command, DestKind, DestRef, DispatchMode, FastPathMode, InterfaceKind, InterfaceSpec, LinkKind,
    LinkSpec, NotifyMode, PolicyUpdate, RateLimit, RouteOp, RouteSpec, Setting, YieldStrategy,
};

const DEFAULT_VNI: u32 = 1;
const DEFAULT_MTU: u32 = 1500;
const MAX_PORTS: usize = 4096;
const MAX_ROUTES: usize = 100_000;
const MAX_LISTENERS: usize = 64;

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
    pub encrypt: Option<vnet_crypto::PublicKey>,
}

/// A configured route; its VNI is its destination's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub src: MacMatch,
    pub dst: MacMatch,
    pub to: DestRef,
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
    /// The route set changed: rebuild the forwarding table.
    Routes,
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
            Change::Routes => Change::Routes,
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
    pub routes: Vec<Route>,
    pub learn: bool,
    pub settings: DataPathSettings,
    /// Rate limits of links, by link name (kept beside [`Link`] so a link's identity, which
    /// the cluster layer compares, does not include it).
    pub link_rates: BTreeMap<String, RateLimit>,
}

impl Config {
    pub fn interface(&self, name: &str) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.name == name)
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
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
                // UDP datagrams are assigned to links by (source IP, VNI).
                (LinkKind::Udp(a), LinkKind::Udp(b)) => a.ip() == b.ip() && l.vni == vni,
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
        let before = self.routes.len();
        self.routes
            .retain(|r| !(r.to.kind == kind && r.to.name == name));
        if self.routes.len() != before {
            vec![Change::Routes]
        } else {
            vec![]
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
                self.routes.push(route);
            }
            RouteOp::Replace => {
                let same_key = |r: &Route, cfg: &Config| {
                    r.src == route.src && r.dst == route.dst && cfg.dest_vni(&r.to) == Some(vni)
                };
                let keep: Vec<Route> = self
                    .routes
                    .iter()
                    .filter(|r| !same_key(r, self))
                    .cloned()
                    .collect();
                if keep.len() >= MAX_ROUTES {
                    return refuse(format!("at most {MAX_ROUTES} routes"));
                }
                self.routes = keep;
                self.routes.push(route);
            }
            RouteOp::Del => {
                let Some(pos) = self.routes.iter().position(|r| *r == route) else {
                    return refuse(format!("no route {spec}"));
                };
                self.routes.remove(pos);
            }
        }
        Ok(vec![Change::Routes])
    }

    /// The configuration as a script of the control language, which `apply` accepts back.
    pub fn to_script(&self) -> String {
        let mut s = String::new();
        if self.learn {
            s.push_str("set learn on\n");
        }
        s.push_str(&settings_lines(
            &DataPathSettings::default(),
            &self.settings,
        ));
        for a in &self.listeners {
            let _ = writeln!(s, "listen tcp {a}");
        }
        for i in &self.interfaces {
            s.push_str(&interface_line(i));
        }
        for l in &self.links {
            s.push_str(&link_line(l, self.link_rates.get(&l.name)));
        }
        for r in &self.routes {
            s.push_str(&route_line("add", r));
        }
        s
    }
}

/// The `set` lines that take settings `base` to `c` (nothing where they agree).
pub(crate) fn settings_lines(base: &DataPathSettings, c: &DataPathSettings) -> String {
    let mut s = String::new();
    let d = base;
    if c.mode != d.mode {
        let _ = writeln!(s, "set mode {}", c.mode);
    }
    if c.dispatchers != d.dispatchers {
        let _ = writeln!(s, "set dispatchers {}", c.dispatchers);
    }
    if c.yield_strategy != d.yield_strategy {
        let _ = writeln!(s, "set yield {}", c.yield_strategy);
    }
    if c.yield_sleep_us != d.yield_sleep_us {
        let _ = writeln!(s, "set yield-sleep-us {}", c.yield_sleep_us);
    }
    if c.yield_nowork_us != d.yield_nowork_us {
        let _ = writeln!(s, "set yield-nowork-us {}", c.yield_nowork_us);
    }
    // Order the pair so every line keeps adaptive-low <= adaptive-high: lowering alpha_l
    // first always works unless the new alpha_l exceeds the old alpha_u.
    let low = (c.adaptive_low != d.adaptive_low)
        .then(|| format!("set adaptive-low {}\n", c.adaptive_low));
    let high = (c.adaptive_high != d.adaptive_high)
        .then(|| format!("set adaptive-high {}\n", c.adaptive_high));
    let pair = if c.adaptive_low <= d.adaptive_high {
        [low, high]
    } else {
        [high, low]
    };
    for line in pair.into_iter().flatten() {
        s.push_str(&line);
    }
    if c.adaptive_window_ms != d.adaptive_window_ms {
        let _ = writeln!(s, "set adaptive-window-ms {}", c.adaptive_window_ms);
    }
    if c.cut_through != d.cut_through {
        let _ = writeln!(
            s,
            "set cut-through {}",
            if c.cut_through { "on" } else { "off" }
        );
    }
    // The same ordering for the notification thresholds (alpha <= beta on every line).
    let alpha = (c.notify_alpha_mbps != d.notify_alpha_mbps)
        .then(|| format!("set notify-alpha-mbps {}\n", c.notify_alpha_mbps));
    let beta = (c.notify_beta_mbps != d.notify_beta_mbps)
        .then(|| format!("set notify-beta-mbps {}\n", c.notify_beta_mbps));
    if c.notify != d.notify {
        let _ = writeln!(s, "set notify {}", c.notify);
    }
    let pair = if c.notify_alpha_mbps <= d.notify_beta_mbps {
        [alpha, beta]
    } else {
        [beta, alpha]
    };
    for line in pair.into_iter().flatten() {
        s.push_str(&line);
    }
    if c.cpus != d.cpus {
        if c.cpus.is_empty() {
            s.push_str("set cpus none\n");
        } else {
            let list: Vec<String> = c.cpus.iter().map(|c| c.to_string()).collect();
            let _ = writeln!(s, "set cpus {}", list.join(","));
        }
    }
    if c.fastpath != d.fastpath {
        let _ = writeln!(s, "set fastpath {}", c.fastpath);
    }
    s
}

/// The `interface add` line of `i`, newline included.
pub(crate) fn interface_line(i: &Interface) -> String {
    let mut s = String::new();
    match (&i.socket, i.kind) {
        (_, InterfaceKind::Netdev) => {
            let _ = write!(
                s,
                "interface add {} netdev {} mac {}",
                i.name, i.ifname, i.mac
            );
        }
        (_, InterfaceKind::Veth) => {
            let _ = write!(
                s,
                "interface add {} veth ifname {} mac {} mtu {}",
                i.name, i.ifname, i.mac, i.mtu
            );
            if let Some(ns) = &i.netns {
                let _ = write!(s, " netns {ns}");
            }
        }
        (Some(sock), _) => {
            let _ = write!(
                s,
                "interface add {} vhost-user {sock} mac {} mtu {}",
                i.name, i.mac, i.mtu
            );
            if i.client {
                s.push_str(" client");
            }
        }
        (None, _) => {
            let _ = write!(
                s,
                "interface add {} tap ifname {} mac {} mtu {}",
                i.name, i.ifname, i.mac, i.mtu
            );
            if let Some(ns) = &i.netns {
                let _ = write!(s, " netns {ns}");
            }
            if !i.offload {
                s.push_str(" offload off");
            }
        }
    }
    if i.queues != 1 {
        let _ = write!(s, " queues {}", i.queues);
    }
    if i.any_source {
        s.push_str(" any-source");
    }
    if let Some(r) = &i.rate {
        let _ = write!(s, " {r}");
    }
    let _ = writeln!(s, " vni {}", i.vni);
    s
}

/// The `link add` line of `l` with its rate, newline included.
pub(crate) fn link_line(l: &Link, rate: Option<&RateLimit>) -> String {
    let mut s = format!("link add {} {} vni {}", l.name, l.kind, l.vni);
    if let Some(k) = &l.encrypt {
        let _ = write!(s, " encrypt {k}");
    }
    if let Some(r) = rate {
        let _ = write!(s, " {r}");
    }
    s.push('\n');
    s
}

/// `route OP SRC DST KIND NAME`, newline included.
pub(crate) fn route_line(op: &str, r: &Route) -> String {
    format!(
        "route {op} {} {} {} {}\n",
        r.src, r.dst, r.to.kind, r.to.name
    )
}

/// `old` with what `u` sets.
fn updated(old: PortPolicy, u: &PolicyUpdate) -> PortPolicy {
    PortPolicy {
        any_source: u.any_source.unwrap_or(old.any_source),
        rate: u.rate.unwrap_or(old.rate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_line, parse_script};

    fn mac_gen() -> impl FnMut() -> MacAddr {
        let mut n = 0u8;
        move || {
            n += 1;
            MacAddr([2, 0, 0, 0, 0, n])
        }
    }

    fn run(cfg: &mut Config, line: &str) -> Result<Vec<Change>, ConfigError> {
        let cmd = parse_line(line).unwrap().unwrap();
        cfg.apply(&cmd, &mut mac_gen())
    }

    /// Asserts that `line` parses but the configuration refuses it, saying `why`.
    #[track_caller]
    fn refused(cfg: &mut Config, line: &str, why: &str) {
        let e = run(cfg, line).unwrap_err().0;
        assert!(e.contains(why), "{line}: {e}");
    }

    #[test]
    fn veth_and_netdev_interfaces() {
        let mut c = Config::default();
        let ch = run(
            &mut c,
            "interface add c1 veth netns ns1 mac 02:00:00:00:01:01 mtu 1450",
        )
        .unwrap();
        match &ch[..] {
            [Change::AddInterface(i)] => {
                assert_eq!(i.kind, InterfaceKind::Veth);
                assert_eq!(i.ifname, "vn-c1");
                assert_eq!((i.mtu, i.netns.as_deref()), (1450, Some("ns1")));
            }
            o => panic!("{o:?}"),
        }
        let ch = run(
            &mut c,
            "interface add vm netdev tap-vm mac 02:00:00:00:01:02 vni 3",
        )
        .unwrap();
        match &ch[..] {
            [Change::AddInterface(i)] => {
                assert_eq!(
                    (i.kind, i.ifname.as_str(), i.vni),
                    (InterfaceKind::Netdev, "tap-vm", 3)
                );
                assert_eq!(i.mtu, 0, "a netdev's MTU is its owner's");
            }
            o => panic!("{o:?}"),
        }
        // The same device twice is refused; so are options that belong to its owner.
        assert!(run(&mut c, "interface add vm2 netdev tap-vm").is_err());
        assert!(parse_line("interface add x netdev d mtu 9000").is_err());
        assert!(parse_line("interface add x netdev d netns n").is_err());
        assert!(parse_line("interface add x netdev").is_err());
        assert!(parse_line("interface add x veth queues 2").is_err());
        // Round trip through the script.
        run(&mut c, "set fastpath off").unwrap();
        let script = c.to_script();
        assert!(script.contains("set fastpath off"), "{script}");
        let mut d = Config::default();
        for (_, cmd) in parse_script(&script).unwrap() {
            d.apply(&cmd, &mut mac_gen()).unwrap();
        }
        assert_eq!(d.to_script(), script);
        assert_eq!(d.settings.fastpath, FastPathMode::Off);
    }

    #[test]
    fn defaults_and_duplicates() {
        let mut c = Config::default();
        let ch = run(&mut c, "interface add vm1 tap").unwrap();
        let Change::AddInterface(i) = &ch[0] else {
            panic!()
        };
        assert_eq!((i.ifname.as_str(), i.mtu, i.vni), ("vn-vm1", 1500, 1));
        assert!(i.mac.is_unicast());
        refused(&mut c, "interface add vm1 tap", "exists");
        refused(
            &mut c,
            "interface add vm2 tap ifname vn-vm1",
            "already used",
        );
        refused(&mut c, "interface add vm2 tap mac 02:00:00:00:00:01", "MAC");
        // same MAC in another VNI is fine
        run(&mut c, "interface add vm2 tap mac 02:00:00:00:00:01 vni 2").unwrap();
        refused(
            &mut c,
            "interface add vm3 tap mac 01:00:5e:00:00:01",
            "unicast",
        );
        let long = run(
            &mut c,
            "interface add averyveryverylongname tap mac 02:00:00:00:00:0f",
        )
        .unwrap();
        let Change::AddInterface(i) = &long[0] else {
            panic!()
        };
        assert_eq!(i.ifname.len(), 15);
    }

    #[test]
    fn link_clashes() {
        let mut c = Config::default();
        run(&mut c, "link add b udp 10.0.0.2").unwrap();
        refused(&mut c, "link add b2 udp 10.0.0.2:5000", "already covers");
        run(&mut c, "link add b2 udp 10.0.0.2 vni 2").unwrap();
        run(&mut c, "link add l direct eth0").unwrap();
        assert!(run(&mut c, "link add l2 direct eth0 vni 2").is_err());
        assert!(run(&mut c, "interface add x tap ifname eth0").is_err());
    }

    #[test]
    fn routes_follow_their_destinations() {
        let mut c = Config::default();
        run(&mut c, "interface add vm1 tap mac 02:00:00:00:00:01").unwrap();
        run(&mut c, "link add b udp 10.0.0.2").unwrap();
        refused(&mut c, "route add any any link nope", "no link");
        run(&mut c, "route add any 02:00:00:00:00:01 interface vm1").unwrap();
        refused(
            &mut c,
            "route add any 02:00:00:00:00:01 interface vm1",
            "exists",
        );
        run(&mut c, "route add any 02:00:00:00:00:09 link b").unwrap();
        // replace moves the MAC to the link in one step
        run(&mut c, "route replace any 02:00:00:00:00:01 link b").unwrap();
        assert_eq!(c.routes.len(), 2);
        assert!(c.routes.iter().all(|r| r.to.kind == DestKind::Link));
        assert!(run(&mut c, "route del any 02:00:00:00:00:01 interface vm1").is_err());
        // deleting a link takes its routes with it
        let ch = run(&mut c, "link del b").unwrap();
        assert_eq!(ch[0], Change::Routes);
        assert!(c.routes.is_empty());
        assert!(run(&mut c, "link del b").is_err());
    }

    fn policy_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let rate = prop_oneof![
            Just("rate off".to_string()),
            (1u32..2000).prop_map(|m| format!("rate {m}")),
            (1u32..2000, 1u32..5000).prop_map(|(m, b)| format!("rate {m} burst {b}")),
        ];
        prop_oneof![
            rate.clone().prop_map(|r| format!("interface set vm1 {r}")),
            any::<bool>().prop_map(|b| format!(
                "interface set vm1 any-source {}",
                if b { "on" } else { "off" }
            )),
            rate.prop_map(|r| format!("link set b {r}")),
        ]
    }

    proptest::proptest! {
        /// Any sequence of policy changes renders into a script that rebuilds the same
        /// configuration, and undoing the changes in reverse order restores the start.
        #[test]
        fn policy_changes_render_and_undo(lines in proptest::collection::vec(policy_line(), 0..12)) {
            let mut c = Config::default();
            run(&mut c, "interface add vm1 tap mac 02:00:00:00:00:01").unwrap();
            run(&mut c, "link add b udp 10.0.0.2").unwrap();
            let start = c.clone();
            let mut changes = Vec::new();
            for l in &lines {
                changes.extend(run(&mut c, l).unwrap());
            }
            let mut c2 = Config::default();
            for (_, cmd) in parse_script(&c.to_script()).unwrap() {
                c2.apply(&cmd, &mut mac_gen()).unwrap();
            }
            proptest::prop_assert_eq!(&c, &c2);
            // Replaying the inverses on the policies gives back the starting ones.
            let (mut ipol, mut lpol) = (c.interfaces[0].policy(), c.link_policy("b"));
            for ch in changes.iter().rev() {
                if let Change::Policy { kind, new, .. } = ch.inverse() {
                    match kind {
                        DestKind::Interface => ipol = new,
                        DestKind::Link => lpol = new,
                    }
                }
            }
            proptest::prop_assert_eq!(ipol, start.interfaces[0].policy());
            proptest::prop_assert_eq!(lpol, start.link_policy("b"));
        }
    }

    #[test]
    fn policies() {
        let mut c = Config::default();
        run(&mut c, "interface add vm1 tap mac 02:00:00:00:00:01").unwrap();
        assert_eq!(c.interfaces[0].policy(), PortPolicy::default());
        let ch = run(&mut c, "interface set vm1 any-source on rate 10 burst 100").unwrap();
        let want = PortPolicy {
            any_source: true,
            rate: Some(RateLimit {
                mbit: 10,
                burst_kb: 100,
            }),
        };
        assert_eq!(
            ch,
            vec![Change::Policy {
                kind: DestKind::Interface,
                name: "vm1".into(),
                old: PortPolicy::default(),
                new: want
            }]
        );
        assert_eq!(c.interfaces[0].policy(), want);
        // setting what is already set changes nothing
        assert!(run(&mut c, "interface set vm1 any-source on")
            .unwrap()
            .is_empty());
        // only the named setting changes
        run(&mut c, "interface set vm1 rate off").unwrap();
        assert_eq!(
            c.interfaces[0].policy(),
            PortPolicy {
                any_source: true,
                rate: None
            }
        );
        refused(&mut c, "interface set nope any-source on", "no interface");
        // links: added with a rate, changed, deleted with the rate cleared first
        let ch = run(&mut c, "link add b udp 10.0.0.2 rate 100").unwrap();
        assert_eq!(ch.len(), 2);
        assert!(
            matches!(&ch[1], Change::Policy { kind: DestKind::Link, new, .. } if new.rate.is_some())
        );
        refused(&mut c, "link set nope rate 5", "no link");
        run(&mut c, "link set b rate 5 burst 64").unwrap();
        assert_eq!(c.link_policy("b").rate.map(|r| r.mbit), Some(5));
        let ch = run(&mut c, "link del b").unwrap();
        assert!(matches!(&ch[0], Change::Policy { new, .. } if *new == PortPolicy::default()));
        assert!(matches!(&ch[1], Change::DelLink(_)));
        assert!(c.link_rates.is_empty());
        // the undo of a deletion re-adds, then restores the rate
        let undo: Vec<Change> = ch.iter().rev().map(|c| c.inverse()).collect();
        assert!(matches!(&undo[0], Change::AddLink(_)));
        assert!(
            matches!(&undo[1], Change::Policy { new, .. } if new.rate.map(|r| r.mbit) == Some(5))
        );
    }

    #[test]
    fn script_roundtrip_and_inverse() {
        let script = "set learn on\nset mode polling\nset adaptive-low 20\nset adaptive-high 50\nset cpus 1\nlisten tcp 10.0.0.1:7000\ninterface add vm1 tap mac 02:00:00:00:00:01 netns g1 mtu 9000 queues 2 offload off\ninterface add vm2 vhost-user /run/vm2.sock mac 02:00:00:00:00:02 queues 2 client any-source rate 50\ninterface add vm3 tap mac 02:00:00:00:00:03 rate 10 burst 70\nlink add b udp 10.0.0.2 vni 1 rate 300 burst 1000\nlink add e udp 10.0.0.9 vni 1 encrypt q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80= rate 20 burst 200\nlink add t tcp accept 10.0.0.3\nlink add l direct eth1\nroute add not 02:00:00:00:00:05 broadcast link b\nroute add any 02:00:00:00:00:01 interface vm1\n";
        let mut c = Config::default();
        for (_, cmd) in parse_script(script).unwrap() {
            c.apply(&cmd, &mut mac_gen()).unwrap();
        }
        let mut c2 = Config::default();
        for (_, cmd) in parse_script(&c.to_script()).unwrap() {
            c2.apply(&cmd, &mut mac_gen()).unwrap();
        }
        assert_eq!(c, c2);
        // raising both thresholds renders in an order that applies line by line
        let mut c3 = Config::default();
        run(&mut c3, "set adaptive-high 90000").unwrap();
        run(&mut c3, "set adaptive-low 50000").unwrap();
        let mut c4 = Config::default();
        for (_, cmd) in parse_script(&c3.to_script()).unwrap() {
            c4.apply(&cmd, &mut mac_gen()).unwrap();
        }
        assert_eq!(c3, c4);
        refused(&mut c4, "set adaptive-high 10", "must not exceed");
        let ch = Change::AddListener("10.0.0.1:1".parse().unwrap());
        assert_eq!(ch.inverse().inverse(), ch);
    }
}
