//! Rendering the configuration back into the control language: the script `show config`
//! prints and the state directory keeps, and the single lines `diff` builds its scripts of.

use std::fmt::{Display, Write as _};

use vnet_core::MacMatch;
use vnet_wire::MacAddr;

use crate::command::{DestKind, InterfaceKind, RateLimit};
use crate::model::{Config, DataPathSettings, Interface, Link};
use crate::routes::Route;

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
    let mut w = SetLines {
        s: String::new(),
        before: base,
        after: c,
    };
    w.line("mode", |x| x.mode);
    w.line("dispatchers", |x| x.dispatchers);
    w.line("yield", |x| x.yield_strategy);
    w.line("yield-sleep-us", |x| x.yield_sleep_us);
    w.line("yield-nowork-us", |x| x.yield_nowork_us);
    w.ordered_pair(
        ("adaptive-low", |x| x.adaptive_low),
        ("adaptive-high", |x| x.adaptive_high),
    );
    w.line("adaptive-window-ms", |x| x.adaptive_window_ms);
    w.line("cut-through", |x| if x.cut_through { "on" } else { "off" });
    w.line("notify", |x| x.notify);
    w.ordered_pair(
        ("notify-alpha-mbps", |x| x.notify_alpha_mbps),
        ("notify-beta-mbps", |x| x.notify_beta_mbps),
    );
    w.line("cpus", |x| cpu_list(&x.cpus));
    w.line("fastpath", |x| x.fastpath);
    w.s
}

/// The `set` lines from settings `before` to `after`: a line for each setting that differs.
struct SetLines<'a> {
    s: String,
    before: &'a DataPathSettings,
    after: &'a DataPathSettings,
}

/// A setting of a pair that must keep `low <= high`: its keyword and its field.
type Bound = (&'static str, fn(&DataPathSettings) -> u32);

impl SetLines<'_> {
    /// `set KEYWORD VALUE` when the setting `field` reads has a new value.
    fn line<T: PartialEq + Display>(
        &mut self,
        keyword: &str,
        field: impl Fn(&DataPathSettings) -> T,
    ) {
        let new = field(self.after);
        if new != field(self.before) {
            let _ = writeln!(self.s, "set {keyword} {new}");
        }
    }

    /// The lines of two settings that must keep `low <= high` after every line
    /// (adaptive-low/-high, notify-alpha/-beta-mbps), ordered so the pair stays valid in
    /// between: `low` first always works unless the new `low` is above the old `high`; then
    /// `high` goes first.
    fn ordered_pair(&mut self, low: Bound, high: Bound) {
        let pair = if low.1(self.after) <= high.1(self.before) {
            [low, high]
        } else {
            [high, low]
        };
        for (keyword, field) in pair {
            self.line(keyword, field);
        }
    }
}

/// `set cpus`'s value: the CPUs, comma-separated, or `none`.
fn cpu_list(cpus: &[u32]) -> String {
    if cpus.is_empty() {
        "none".to_string()
    } else {
        let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
        list.join(",")
    }
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
    if let Some(k) = &l.reach {
        let _ = write!(s, " reach {k}");
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
