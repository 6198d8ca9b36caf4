//! The model's tests: validation, typed changes and their undo, the round trip through a script.

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
    // Reach links are one per (peer key, VNI), whatever their addresses (two sites may use
    // the same private range), and never clash with a plain link's address.
    let k1 = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=";
    let k2 = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
    run(&mut c, &format!("link add r1 udp 10.0.0.2 reach {k1}")).unwrap();
    run(&mut c, &format!("link add r2 udp 10.0.0.2 reach {k2}")).unwrap();
    refused(
        &mut c,
        &format!("link add r3 udp 10.0.0.7 reach {k1}"),
        "already covers",
    );
    run(
        &mut c,
        &format!("link add r3 udp 10.0.0.7 vni 2 reach {k1}"),
    )
    .unwrap();
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
    assert!(matches!(
        &ch[0],
        Change::Route(RouteChange::Removed { at: 0, .. })
    ));
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
    assert!(matches!(&undo[1], Change::Policy { new, .. } if new.rate.map(|r| r.mbit) == Some(5)));
}

#[test]
fn script_roundtrip_and_inverse() {
    let script = "set learn on\nset mode polling\nset adaptive-low 20\nset adaptive-high 50\nset cpus 1\nlisten tcp 10.0.0.1:7000\ninterface add vm1 tap mac 02:00:00:00:00:01 netns g1 mtu 9000 queues 2 offload off\ninterface add vm2 vhost-user /run/vm2.sock mac 02:00:00:00:00:02 queues 2 client any-source rate 50\ninterface add vm3 tap mac 02:00:00:00:00:03 rate 10 burst 70\nlink add b udp 10.0.0.2 vni 1 rate 300 burst 1000\nlink add e udp 10.0.0.9 vni 1 encrypt q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80= reach AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA= rate 20 burst 200\nlink add t tcp accept 10.0.0.3\nlink add l direct eth1\nroute add not 02:00:00:00:00:05 broadcast link b\nroute add any 02:00:00:00:00:01 interface vm1\n";
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

fn route_cmd() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let side = prop_oneof![
        Just("any".to_string()),
        (1u8..4).prop_map(|m| format!("02:00:00:00:00:0{m}")),
        (1u8..4).prop_map(|m| format!("not 02:00:00:00:00:0{m}")),
    ];
    (0..3usize, side.clone(), side, 0..3usize).prop_map(|(op, s, d, to)| {
        format!(
            "route {} {s} {d} {}",
            ["add", "del", "replace"][op],
            ["link a", "link b", "interface vm1"][to]
        )
    })
}

proptest::proptest! {
    /// Route commands give typed changes that say exactly how the route list changed: replayed
    /// on a copy of the rules (removed at `at`, added at the end) they give the new list, and
    /// `undo_routes` takes the list back to where it started.
    #[test]
    fn route_changes_replay_and_undo(lines in proptest::collection::vec(route_cmd(), 1..30)) {
        let mut c = Config::default();
        run(&mut c, "interface add vm1 tap mac 02:00:00:00:00:09").unwrap();
        run(&mut c, "link add a udp 10.0.0.2").unwrap();
        run(&mut c, "link add b udp 10.0.0.3").unwrap();
        // Routes from before, so that undoing a removal has something to put back.
        run(&mut c, "route add any 02:00:00:00:00:01 link a").unwrap();
        run(&mut c, "route add any any link b").unwrap();
        run(&mut c, "route add 02:00:00:00:00:02 02:00:00:00:00:03 interface vm1").unwrap();
        let start = c.clone();
        let mut all = Vec::new();
        for l in &lines {
            let before = c.routes.clone();
            let Ok(ch) = run(&mut c, l) else {
                proptest::prop_assert_eq!(&before, &c.routes, "a refusal changes nothing");
                continue;
            };
            let mut replay = before;
            for x in &ch {
                let Change::Route(rc) = x else { panic!("{x:?}") };
                match rc {
                    RouteChange::Added(r) => replay.push(r.clone()),
                    RouteChange::Removed { route, at } => {
                        proptest::prop_assert_eq!(&replay.remove(*at), route);
                    }
                    RouteChange::Replaced { old, at, new } => {
                        proptest::prop_assert_eq!(&replay.remove(*at), old);
                        replay.push(new.clone());
                    }
                }
                all.push(rc.clone());
            }
            proptest::prop_assert_eq!(&replay, &c.routes, "{}", l);
        }
        c.undo_routes(&all);
        proptest::prop_assert_eq!(c, start);
    }
}

/// The largest configuration the model accepts (every port, route and listener it allows,
/// every setting changed) renders within `MAX_CONFIG_LINES`, each line within `MAX_LINE_LEN`,
/// and reads back whole with `parse_config`; `parse_script` refuses it for its length. So a
/// configuration built over the control port in many batches is always restorable (issue 32:
/// a saved configuration over 100,000 lines stopped vnetd's start for good).
#[test]
fn the_largest_configuration_reads_back() {
    let mut cfg = Config::default();
    let mut gen = mac_gen();
    let mut apply = |cfg: &mut Config, line: &str| {
        let cmd = parse_line(line).unwrap().unwrap();
        cfg.apply(&cmd, &mut gen)
            .unwrap_or_else(|e| panic!("{line}: {e}"));
    };
    let cpus: Vec<String> = (960..1024).map(|c| c.to_string()).collect();
    for s in [
        "set learn on".to_string(),
        "set mode polling".into(),
        "set dispatchers 64".into(),
        "set yield timed".into(),
        "set yield-sleep-us 1000000".into(),
        "set yield-nowork-us 10000000".into(),
        "set adaptive-high 100000000".into(),
        "set adaptive-low 99999999".into(),
        "set adaptive-window-ms 10000".into(),
        format!("set cpus {}", cpus.join(",")),
        "set cut-through off".into(),
        "set notify batch".into(),
        "set notify-beta-mbps 1000000".into(),
        "set notify-alpha-mbps 999999".into(),
        "set fastpath off".into(),
    ] {
        apply(&mut cfg, &s);
    }
    for l in 0..MAX_LISTENERS {
        apply(&mut cfg, &format!("listen tcp 10.0.0.1:{}", 1000 + l));
    }
    let long = |k: usize| format!("{k:0>32}");
    // Socket paths of the most bytes allowed (107).
    let sock = |k: usize| format!("/{}{k:04}", "s".repeat(102));
    for k in 0..MAX_PORTS {
        let line = if k % 2 == 0 {
            format!(
                "interface add {} vhost-user {} mac 02:10:00:00:{:02x}:{:02x} mtu 65535 vni 16777215 queues 16 client any-source rate 1000000 burst 1048576",
                long(k), sock(k), k / 256, k % 256
            )
        } else {
            format!(
                "link add {} udp [fd00::{k:x}]:65535 vni 16777215 rate 1000000 burst 1048576",
                long(k)
            )
        };
        apply(&mut cfg, &line);
    }
    for r in 0..MAX_ROUTES {
        let to = long(1 + 2 * (r % (MAX_PORTS / 2)));
        apply(
            &mut cfg,
            &format!(
                "route add not 02:20:00:{:02x}:{:02x}:{:02x} not 02:30:00:{:02x}:{:02x}:{:02x} link {to}",
                r >> 16, (r >> 8) & 255, r & 255, r >> 16, (r >> 8) & 255, r & 255
            ),
        );
    }
    let script = cfg.to_script();
    let lines = script.lines().count();
    assert!(lines > crate::MAX_SCRIPT_LINES, "{lines}");
    assert!(lines <= MAX_CONFIG_LINES, "{lines} > {MAX_CONFIG_LINES}");
    let longest = script.lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= crate::MAX_LINE_LEN, "{longest}");
    assert!(parse_script(&script).is_err());
    let mut back = Config::default();
    for (_, cmd) in crate::parse_config(&script).expect("parse_config") {
        back.apply(&cmd, &mut mac_gen()).expect("apply");
    }
    assert_eq!(back, cfg);
}
