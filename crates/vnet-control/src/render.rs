//! Rendering the configuration back into the control language: the script `show config`
//! prints and the state directory keeps, and the single lines `diff` builds its scripts of.

use std::fmt::Write as _;

use vnet_core::MacMatch;
use vnet_wire::MacAddr;

use crate::command::{DestKind, InterfaceKind, RateLimit};
use crate::model::{Config, DataPathSettings, Interface, Link, Route};

impl Config {
    /// The configuration as a script of the control language, which `apply` accepts back.
    pub fn to_script(&self) -> String {
        self.script_where(|_| true, |_| true)
    }

    /// [`Config::to_script`] of the links and routes `link` and `route` keep (the local part
    /// of a running configuration, without copying it).
    pub fn script_where(
        &self,
        link: impl Fn(&Link) -> bool,
        route: impl Fn(&Route) -> bool,
    ) -> String {
        let mut s = String::with_capacity(64 * (self.links.len() + self.routes.len()) + 256);
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
        for l in self.links.iter().filter(|l| link(l)) {
            s.push_str(&link_line(l, self.link_rates.get(&l.name)));
        }
        for r in self.routes.iter().filter(|r| route(r)) {
            push_route_line(&mut s, "add", r);
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
    let mut s = String::with_capacity(64);
    push_route_line(&mut s, op, r);
    s
}

/// [`route_line`] appended to `s`, without the formatting machinery: the state directory
/// gets the whole configuration after every local change, thousands of these lines.
fn push_route_line(s: &mut String, op: &str, r: &Route) {
    s.push_str("route ");
    s.push_str(op);
    s.push(' ');
    push_match(s, &r.src);
    s.push(' ');
    push_match(s, &r.dst);
    s.push_str(match r.to.kind {
        DestKind::Interface => " interface ",
        DestKind::Link => " link ",
    });
    s.push_str(&r.to.name);
    s.push('\n');
}

/// As `MacMatch`'s `Display`.
fn push_match(s: &mut String, m: &MacMatch) {
    match m {
        MacMatch::Any => s.push_str("any"),
        MacMatch::Exact(a) if a.is_broadcast() => s.push_str("broadcast"),
        MacMatch::Exact(a) => push_mac(s, a),
        MacMatch::Not(a) if a.is_broadcast() => s.push_str("not broadcast"),
        MacMatch::Not(a) => {
            s.push_str("not ");
            push_mac(s, a);
        }
    }
}

/// As `MacAddr`'s `Display` (lower-case hex, colons).
fn push_mac(s: &mut String, a: &MacAddr) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in a.0.iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::DestRef;

    proptest::proptest! {
        /// The hand-written route line is the `Display` one.
        #[test]
        fn route_lines_are_the_display_ones(
            a in proptest::array::uniform6(proptest::prelude::any::<u8>()),
            b in proptest::array::uniform6(proptest::prelude::any::<u8>()),
            kinds in (0u8..3, 0u8..3, proptest::prelude::any::<bool>()),
        ) {
            let m = |k: u8, x: [u8; 6]| match k {
                0 => MacMatch::Any,
                1 => MacMatch::Exact(MacAddr(x)),
                _ => MacMatch::Not(MacAddr(x)),
            };
            for (x, y) in [(a, b), ([0xff; 6], [0xff; 6])] {
                let r = Route {
                    src: m(kinds.0, x),
                    dst: m(kinds.1, y),
                    to: DestRef {
                        kind: if kinds.2 { DestKind::Link } else { DestKind::Interface },
                        name: "n1".into(),
                    },
                };
                let want = format!("route add {} {} {} {}\n", r.src, r.dst, r.to.kind, r.to.name);
                proptest::prop_assert_eq!(route_line("add", &r), want);
            }
        }
    }
}
