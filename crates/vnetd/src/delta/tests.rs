//! Tests of `delta.rs`: the journal replayed equals the whole file, for any sequence of local
//! changes and agent changes (the property the journal rests on), and what a change says.

use proptest::prelude::*;
use vnet_control::{parse_line, Command, Config, RouteOp};
use vnet_wire::MacAddr;

use super::*;
use crate::derived::DerivedRecord;
use crate::journal::{Kind, Record};
use crate::pending::Pending;
use crate::restore::{bring_back, saved_config, Saved};

/// The running configuration, the agent's record and the routes waiting for their link, as
/// the daemon keeps them, with a MAC generator that never repeats.
struct Model {
    cfg: Config,
    derived: DerivedRecord,
    pending: Pending,
    macs: u32,
}

fn nth_mac(n: u32) -> MacAddr {
    let b = n.to_be_bytes();
    MacAddr([2, 0x55, b[0], b[1], b[2], b[3]])
}

/// One of `words`, by `k`.
fn pick<'a>(k: u8, words: &[&'a str]) -> &'a str {
    words[k as usize % words.len()]
}

impl Model {
    /// A local change: the commands all or none (as `Daemon::apply_commands`: deletes of
    /// waiting routes aside, the rest as `apply_in`); its journal record.
    fn local(&mut self, lines: &[String]) -> Option<Option<String>> {
        let mut cmds = Vec::new();
        for l in lines {
            cmds.push((0, parse_line(l).ok()??));
        }
        let (cmds, unwaited) = self.pending.deletes(cmds, &self.cfg);
        let mut cfg = self.cfg.clone();
        let mut changes = Vec::new();
        for (_, cmd) in cmds {
            let mut n = self.macs;
            let r = cfg.apply(&cmd, &mut || {
                n += 1;
                nth_mac(n)
            });
            self.macs = n;
            changes.extend(r.ok()?);
        }
        self.cfg = cfg;
        let mut extra = String::new();
        for r in &unwaited {
            self.pending.forget(r);
            extra.push_str(&format!("route del {}\n", crate::pending::spec_of(r)));
        }
        let d = &self.derived;
        let delta = local_delta(&changes, &|r| d.has_route(r), &|l| d.has_link(l)).map(|mut t| {
            t.push_str(&extra);
            t
        });
        if changes.iter().any(|c| matches!(c, Change::AddLink(_))) {
            bring_back(
                &mut self.cfg,
                &mut self.pending,
                &mut nth_mac_from(&mut self.macs),
            );
        }
        Some(delta)
    }

    /// What a start would read back from the file written whole now.
    fn whole_script(&self) -> String {
        self.derived.local_script(&self.cfg) + &self.pending.script()
    }

    /// An agent's change: to the running configuration and, when it applied, to the record.
    /// The agent takes back only what it applied (its commands are a diff of its record).
    fn agent(&mut self, line: &str) {
        let Ok(Some(cmd)) = parse_line(line) else {
            return;
        };
        let owned = match &cmd {
            Command::Route(RouteOp::Del, s) => self.derived.has_route(&Route {
                src: s.src,
                dst: s.dst,
                to: s.to.clone(),
            }),
            Command::LinkDel(name) => self.derived.config().links.iter().any(|l| &l.name == name),
            _ => true,
        };
        if !owned {
            return;
        }
        let Ok(changes) = self.cfg.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 1])) else {
            return;
        };
        // A derived link that goes takes local routes along: they wait for it.
        for c in &changes {
            if let Change::Route(vnet_control::RouteChange::Removed { route, .. }) = c {
                if !self.derived.has_route(route) {
                    self.pending.push(route.clone());
                }
            }
        }
        let _ = self.derived.apply(&cmd);
        if changes.iter().any(|c| matches!(c, Change::AddLink(_))) {
            bring_back(
                &mut self.cfg,
                &mut self.pending,
                &mut nth_mac_from(&mut self.macs),
            );
        }
    }
}

/// MACs that never repeat (a route brought back draws none, but the signature takes one).
fn nth_mac_from(n: &mut u32) -> impl FnMut() -> MacAddr + '_ {
    move || {
        *n += 1;
        nth_mac(*n)
    }
}

/// A configuration read back as a start reads it: the configuration, and the waiting routes'
/// lines in order (their order is not what a start keeps: where a route waits comes from when
/// its link went, at run time, and from where its line is, read back).
fn lenient(text: &str) -> (Config, Vec<String>) {
    let mut notes = Vec::new();
    read_back(saved_config(
        &Saved::whole(text),
        &mut || MacAddr([2, 9, 9, 9, 9, 9]),
        &mut notes,
    ))
}

fn read_back((cfg, pending): (Config, Pending)) -> (Config, Vec<String>) {
    let mut lines: Vec<String> = pending.script().lines().map(str::to_string).collect();
    lines.sort();
    (cfg, lines)
}

fn mac_word(k: u8) -> &'static str {
    ["02:00:00:00:00:01", "02:00:00:00:00:02"][k as usize % 2]
}

/// Mostly `any` as the agent's routes have it, so that local routes meet the agent's.
fn matcher(k: u8, m: u8) -> String {
    match k % 4 {
        0 | 1 => "any".into(),
        2 => mac_word(m).into(),
        _ => format!("not {}", mac_word(m)),
    }
}

fn dest(k: u8) -> String {
    match k % 5 {
        0 => "interface i0".into(),
        1 => "link l0".into(),
        2 => "link l1".into(),
        _ => format!("link d{}", k % 2), // the agent's links
    }
}

/// A local command from a few numbers: every kind the control port takes, over a small
/// universe of names so that they collide with each other and with the agent's objects.
fn local_line(op: u8, a: u8, b: u8, c: u8) -> String {
    match op % 16 {
        0 => format!("interface add i{} tap vni {}", a % 3, 1 + b % 2),
        1 => format!("interface add i{} tap mac {} vni 1", a % 3, mac_word(b)),
        2 => format!("interface del i{}", a % 3),
        3 => format!(
            "link add l{} udp 10.0.0.{} vni {}",
            a % 3,
            1 + b % 3,
            1 + c % 2
        ),
        4 => format!("link add l{} udp 10.0.1.{} vni 1 rate 10", a % 3, 1 + b % 3),
        5 => format!("link del {}", ["l0", "l1", "d0"][a as usize % 3]),
        6 | 7 => format!("route add {} {} {}", matcher(a, b), mac_word(c), dest(b)),
        8 | 9 => format!(
            "route replace {} {} {}",
            matcher(a, b),
            mac_word(c),
            dest(b)
        ),
        10 => format!("route del {} {} {}", matcher(a, c), matcher(b, c), dest(b)),
        11 => format!(
            "interface set i{} any-source {} rate {}",
            a % 3,
            pick(b, &["on", "off"]),
            pick(c, &["20", "off"])
        ),
        12 => format!("link set l{} rate {}", a % 2, pick(b, &["30", "off"])),
        13 => format!("set learn {}", pick(a, &["on", "off"])),
        14 => format!(
            "set mode {}",
            ["polling", "guest-driven", "adaptive"][a as usize % 3]
        ),
        _ => format!("listen {}tcp 127.0.0.1:77{}", pick(a, &["", "del "]), b % 2),
    }
}

/// What the agent does: links d0, d1 and routes over them (or over a local link, as when a
/// local link covers the derived one), and taking them back.
fn agent_line(op: u8, a: u8, b: u8) -> String {
    match op % 4 {
        0 => format!("link add d{} udp 10.1.0.{} vni 1", a % 2, 1 + a % 2),
        1 => format!("link del d{}", a % 2),
        2 => format!("route add any {} {}", mac_word(b), dest(a)),
        _ => format!("route del any {} {}", mac_word(b), dest(a)),
    }
}

proptest! {
    /// After every change, the file written whole (the local script, read back as a start
    /// reads it) equals the file as it was at the start with every journal record since
    /// replayed on it; whatever the agent did in between.
    #[test]
    fn the_journal_replayed_is_the_whole_file(
        steps in proptest::collection::vec(
            (0u8..4, proptest::collection::vec((0u8..16, 0u8..6, 0u8..6, 0u8..6), 1..4)),
            1..40,
        ),
        start in 0usize..3,
    ) {
        let mut m = Model {
            cfg: Config::default(),
            derived: DerivedRecord::default(),
            pending: Pending::default(),
            macs: 0,
        };
        // Some state before the file was last written whole.
        for l in ["interface add i0 tap vni 1", "link add l0 udp 10.0.0.9 vni 1",
                  "route add any 02:00:00:00:00:01 interface i0"].iter().take(start) {
            m.local(&[l.to_string()]);
        }
        m.agent("link add d0 udp 10.1.0.1 vni 1");
        m.agent("route add any 02:00:00:00:00:02 link d0");
        let file = m.whole_script();
        let mut records: Vec<Record> = Vec::new();
        for (who, cmds) in steps {
            if who == 0 {
                let (op, a, b) = (cmds[0].0, cmds[0].1, cmds[0].2);
                m.agent(&agent_line(op, a, b));
            } else {
                let lines: Vec<String> =
                    cmds.iter().map(|&(op, a, b, c)| local_line(op, a, b, c)).collect();
                let Some(delta) = m.local(&lines) else { continue };
                let seq = records.len() as u64 + 1;
                records.push(match delta {
                    Some(text) => Record { seq, kind: Kind::Delta, text },
                    None => Record {
                        seq,
                        kind: Kind::Snapshot,
                        text: m.whole_script(),
                    },
                });
            }
            let whole = lenient(&m.whole_script());
            let mut notes = Vec::new();
            let replayed = read_back(saved_config(
                &Saved { text: &file, journal: &records },
                &mut || MacAddr([2, 9, 9, 9, 9, 9]),
                &mut notes,
            ));
            prop_assert_eq!(&replayed, &whole, "records {:?}", records);
        }
    }
}

impl Model {
    /// The record of one local command that the model accepts.
    fn said(&mut self, line: &str) -> Option<String> {
        self.local(&[line.to_string()]).expect("accepted")
    }
}

#[test]
fn a_change_says_what_it_did() {
    let mut m = Model {
        cfg: Config::default(),
        derived: DerivedRecord::default(),
        pending: Pending::default(),
        macs: 0,
    };
    // An interface given a random MAC: the record has the MAC it got.
    let d = m.said("interface add a tap").unwrap();
    let mac = m.cfg.interface("a").unwrap().mac;
    assert!(
        d.starts_with("interface add a tap") && d.contains(&mac.to_string()),
        "{d}"
    );
    // A route replace: the old route out, the new one in.
    m.said("link add l udp 10.0.0.2 vni 1");
    m.said("route add any 02:00:00:00:00:07 interface a");
    assert_eq!(
        m.said("route replace any 02:00:00:00:00:07 link l")
            .unwrap(),
        "route del any 02:00:00:00:00:07 interface a\nroute add any 02:00:00:00:00:07 link l\n"
    );
    // An agent's route taken out by a local command: nothing for the local configuration.
    m.agent("link add d udp 10.1.0.1 vni 1");
    m.agent("route add any 02:00:00:00:00:08 link d");
    assert_eq!(
        m.said("route del any 02:00:00:00:00:08 link d").unwrap(),
        ""
    );
    // An agent's route over a local link (a local link covers the derived one), replaced by
    // the same route locally: still the agent's, so not in the local configuration.
    m.agent("route add any 02:00:00:00:00:0a link l");
    assert_eq!(
        m.said("route replace any 02:00:00:00:00:0a link l")
            .unwrap(),
        ""
    );
    // A setting: a snapshot.
    assert_eq!(m.said("set mode polling"), None);
    // `interface del` takes its routes along, each said.
    m.said("route add any 02:00:00:00:00:09 interface a");
    assert_eq!(
        m.said("interface del a").unwrap(),
        "route del any 02:00:00:00:00:09 interface a\ninterface del a\n"
    );
}
