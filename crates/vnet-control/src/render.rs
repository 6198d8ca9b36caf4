//! Rendering the configuration back into the control language: the script `show config`
//! prints and the state directory keeps, and the single lines `diff` builds its scripts of.

use std::fmt::Write as _;

use crate::command::{InterfaceKind, RateLimit};
use crate::model::{Config, DataPathSettings, Interface, Link, Route};

impl Config {
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
