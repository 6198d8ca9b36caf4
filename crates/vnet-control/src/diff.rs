//! The script that takes one configuration to another (`Config::diff_script`): what vnetd
//! applies at start when the config file changed since it was last applied, on top of the
//! restored state (so runtime changes such as a CNI container's interface survive an edit of
//! the file). Removals come first (routes, then the ports they point to), then additions
//! (ports, then routes), so every line is valid where it stands. An interface or link whose
//! definition changed is removed and added again; a change of policy alone is an
//! `interface set` / `link set`, which keeps the device.

use std::collections::HashSet;
use std::fmt::Write as _;

use crate::model::{Config, Interface};
use crate::render_config::{interface_line, link_line, route_line, settings_lines};

/// An interface's definition apart from its policy (which `interface set` changes in place).
fn same_device(a: &Interface, b: &Interface) -> bool {
    Interface {
        any_source: b.any_source,
        rate: b.rate,
        ..a.clone()
    } == *b
}

impl Config {
    /// A script that, applied to `self`, gives a configuration equal to `new` (up to the
    /// order of its lists).
    pub fn diff_script(&self, new: &Config) -> String {
        let mut s = String::new();
        let old = self;
        // Interfaces and links that go, or come back changed.
        let gone_ifaces: Vec<&Interface> = old
            .interfaces
            .iter()
            .filter(|o| !new.interface(&o.name).is_some_and(|n| same_device(o, n)))
            .collect();
        let gone_links: Vec<&crate::Link> = old
            .links
            .iter()
            .filter(|o| new.link(&o.name) != Some(*o))
            .collect();
        let gone: HashSet<(crate::DestKind, &str)> = gone_ifaces
            .iter()
            .map(|i| (crate::DestKind::Interface, i.name.as_str()))
            .chain(
                gone_links
                    .iter()
                    .map(|l| (crate::DestKind::Link, l.name.as_str())),
            )
            .collect();
        // Routes that go: deleting a port drops its routes with it, so only the others.
        for r in &old.routes {
            if !new.routes.contains(r) && !gone.contains(&(r.to.kind, r.to.name.as_str())) {
                s.push_str(&route_line("del", r));
            }
        }
        for i in &gone_ifaces {
            let _ = writeln!(s, "interface del {}", i.name);
        }
        for l in &gone_links {
            let _ = writeln!(s, "link del {}", l.name);
        }
        for a in &old.listeners {
            if !new.listeners.contains(a) {
                let _ = writeln!(s, "listen del tcp {a}");
            }
        }
        if old.learn != new.learn {
            let _ = writeln!(s, "set learn {}", if new.learn { "on" } else { "off" });
        }
        s.push_str(&settings_lines(&old.settings, &new.settings));
        for a in &new.listeners {
            if !old.listeners.contains(a) {
                let _ = writeln!(s, "listen tcp {a}");
            }
        }
        for n in &new.interfaces {
            match old.interface(&n.name) {
                Some(o) if same_device(o, n) => {
                    if o.policy() != n.policy() {
                        s.push_str(&policy_line("interface", &n.name, n.any_source, n.rate));
                    }
                }
                _ => s.push_str(&interface_line(n)),
            }
        }
        for n in &new.links {
            let rate = new.link_rates.get(&n.name);
            match old.link(&n.name) {
                Some(o) if o == n => {
                    if old.link_rates.get(&n.name) != rate {
                        s.push_str(&policy_line("link", &n.name, false, rate.copied()));
                    }
                }
                _ => s.push_str(&link_line(n, rate)),
            }
        }
        for r in &new.routes {
            let kept = old.routes.contains(r) && !gone.contains(&(r.to.kind, r.to.name.as_str()));
            if !kept {
                s.push_str(&route_line("add", r));
            }
        }
        s
    }
}

/// `interface set NAME any-source on|off rate ...|rate off` (or `link set NAME rate ...`).
fn policy_line(what: &str, name: &str, any_source: bool, rate: Option<crate::RateLimit>) -> String {
    let mut s = format!("{what} set {name}");
    if what == "interface" {
        s.push_str(if any_source {
            " any-source on"
        } else {
            " any-source off"
        });
    }
    match rate {
        Some(r) => {
            let _ = write!(s, " {r}");
        }
        None => s.push_str(" rate off"),
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_script;
    use proptest::prelude::*;
    use vnet_wire::MacAddr;

    fn mac_gen() -> impl FnMut() -> MacAddr {
        let mut n = 0u8;
        move || {
            n = n.wrapping_add(1);
            MacAddr([2, 0, 0, 0, 0xee, n])
        }
    }

    /// Applies `script` to `cfg`, line by line, panicking on a refused line.
    fn apply(cfg: &mut Config, script: &str) {
        for (line, cmd) in parse_script(script).unwrap_or_else(|e| panic!("{e}\n{script}")) {
            if let Err(e) = cfg.apply(&cmd, &mut mac_gen()) {
                panic!("line {line}: {e}\n{script}");
            }
        }
    }

    /// A configuration compared as sets (the diff may reorder its lists).
    fn canonical(c: &Config) -> Vec<String> {
        let mut v: Vec<String> = c.to_script().lines().map(String::from).collect();
        v.sort();
        v
    }

    #[test]
    fn the_diff_of_equal_configurations_is_empty() {
        let mut c = Config::default();
        apply(
            &mut c,
            "set mode polling\ninterface add a tap mac 02:00:00:00:00:01 netns g rate 10\n\
             link add b udp 10.0.0.2 vni 1 rate 20\nroute add any 02:00:00:00:00:09 link b\n",
        );
        assert_eq!(c.diff_script(&c.clone()), "");
    }

    #[test]
    fn a_policy_change_keeps_the_device_and_a_definition_change_replaces_it() {
        let mut old = Config::default();
        apply(
            &mut old,
            "interface add a tap mac 02:00:00:00:00:01\ninterface add b tap mac 02:00:00:00:00:02\n\
             route add any 02:00:00:00:00:01 interface a\nroute add any 02:00:00:00:00:02 interface b\n",
        );
        let mut new = old.clone();
        apply(
            &mut new,
            "interface set a any-source on rate 5\ninterface del b\n\
             interface add b tap mac 02:00:00:00:00:02 mtu 9000\n\
             route add any 02:00:00:00:00:02 interface b\n",
        );
        let d = old.diff_script(&new);
        assert!(d.contains("interface set a any-source on rate 5"), "{d}");
        assert!(!d.contains("interface del a"), "{d}");
        assert!(
            d.contains("interface del b") && d.contains("mtu 9000"),
            "{d}"
        );
        let mut got = old.clone();
        apply(&mut got, &d);
        assert_eq!(canonical(&got), canonical(&new));
    }

    /// Lines from which random configurations are built: a small vocabulary, so that two
    /// random configurations share objects, differ in some and conflict in others.
    fn line() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec!["a", "b", "c"]);
        let mac = (1u8..5).prop_map(|n| format!("02:00:00:00:00:0{n}"));
        let vni = 1u32..3;
        prop_oneof![
            (
                name.clone(),
                mac.clone(),
                vni.clone(),
                prop::bool::ANY,
                0u32..3
            )
                .prop_map(|(n, m, v, any, r)| {
                    let mut s = format!("interface add {n} tap mac {m} vni {v}");
                    if any {
                        s.push_str(" any-source");
                    }
                    if r > 0 {
                        s.push_str(&format!(" rate {r}"));
                    }
                    s
                }),
            (name.clone(), 2u8..4, vni.clone(), 0u32..3).prop_map(|(n, ip, v, r)| {
                let mut s = format!("link add l{n} udp 10.0.0.{ip} vni {v}");
                if r > 0 {
                    s.push_str(&format!(" rate {r}"));
                }
                s
            }),
            (mac.clone(), name.clone(), prop::bool::ANY).prop_map(|(m, n, link)| {
                if link {
                    format!("route add any {m} link l{n}")
                } else {
                    format!("route add any {m} interface {n}")
                }
            }),
            name.clone()
                .prop_map(|n| format!("interface set {n} rate off")),
            prop::sample::select(vec![
                "set learn on",
                "set mode polling",
                "set dispatchers 2",
                "set adaptive-low 20000",
                "set adaptive-high 50000",
                "set notify-alpha-mbps 20000",
                "set notify-beta-mbps 30000",
                "set cpus 0,1",
                "set cut-through off",
                "set fastpath off",
                "listen tcp 127.0.0.1:7000",
                "listen tcp 127.0.0.1:7001",
            ])
            .prop_map(String::from),
        ]
    }

    /// A configuration from the lines that are valid in order (the others are skipped).
    fn config_from(lines: &[String]) -> Config {
        let mut c = Config::default();
        let mut gen = mac_gen();
        for l in lines {
            if let Ok(Some(cmd)) = crate::parse_line(l) {
                let _ = c.apply(&cmd, &mut gen);
            }
        }
        c
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The diff applies cleanly to the old configuration and gives the new one.
        #[test]
        fn the_diff_takes_old_to_new(
            a in prop::collection::vec(line(), 0..14),
            b in prop::collection::vec(line(), 0..14),
        ) {
            let (old, new) = (config_from(&a), config_from(&b));
            let script = old.diff_script(&new);
            let mut got = old.clone();
            for (line, cmd) in parse_script(&script).map_err(|e| TestCaseError::fail(format!("{e}\n{script}")))? {
                if let Err(e) = got.apply(&cmd, &mut mac_gen()) {
                    return Err(TestCaseError::fail(format!("line {line}: {e}\n{script}")));
                }
            }
            prop_assert_eq!(canonical(&got), canonical(&new), "{}", script);
            // And back again.
            let back = new.diff_script(&old);
            let mut got = new.clone();
            for (_, cmd) in parse_script(&back).map_err(|e| TestCaseError::fail(e.to_string()))? {
                got.apply(&cmd, &mut mac_gen()).map_err(|e| TestCaseError::fail(format!("{e}\n{back}")))?;
            }
            prop_assert_eq!(canonical(&got), canonical(&old));
        }
    }
}
