//! `derive`'s tests: the links and routes each topology and placement gives a host (mesh,
//! star, explicit, encrypted, reach), the local configuration's precedence, and properties over
//! generated overlays (the event order does not matter; applying the diff reaches the target).

use super::*;
use crate::schema::{
    ClusterEntry, InterfaceRecord, OperatorRoute, RouteRecord, CAP_NOISE, SCHEMA_VERSION,
};
use proptest::prelude::*;
use vnet_control::{parse_line, parse_script};

fn h(s: &str) -> HostId {
    s.parse().unwrap()
}

fn mac(s: &str) -> MacAddr {
    s.parse().unwrap()
}

fn host(id: &str, addr: &str, caps: &[&str]) -> ClusterEntry {
    ClusterEntry::Host(HostRecord {
        host_id: h(id),
        addr: addr.parse().unwrap(),
        udp_port: 4789,
        tcp_port: caps.contains(&"tcp").then_some(7000),
        capabilities: caps.iter().map(|c| c.to_string()).collect(),
        public_key: None,
        version: SCHEMA_VERSION,
        reach: Default::default(),
    })
}

fn placed(host: &str, vni: u32, m: &str, name: &str) -> ClusterEntry {
    ClusterEntry::Interface(InterfaceRecord {
        mac: mac(m),
        vni,
        host_id: h(host),
        name: name.into(),
        epoch: 0,
    })
}

fn op_route(id: &str, line: &str, host: Option<&str>) -> ClusterEntry {
    let rec = RouteRecord {
        line: line.into(),
        host_id: host.map(h),
    };
    ClusterEntry::Route(OperatorRoute::from_record(id.parse().unwrap(), rec).unwrap())
}

fn state(entries: Vec<ClusterEntry>) -> ClusterState {
    let mut s = ClusterState::new("lab".parse().unwrap());
    for e in entries {
        s.insert(e);
    }
    s
}

fn config(script: &str) -> Config {
    let mut c = Config::default();
    for (_, cmd) in parse_script(script).unwrap() {
        c.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 0xee]))
            .unwrap();
    }
    c
}

fn lines(d: &DerivedConfig) -> Vec<String> {
    d.commands()
        .iter()
        .map(|c| render_command(c).unwrap())
        .collect()
}

/// Applies commands to a configuration the way the daemon will; every one must be valid.
fn run(c: &mut Config, cmds: &[Command]) {
    for cmd in cmds {
        if let Err(e) = c.apply(cmd, &mut || MacAddr([2, 0, 0, 0, 0, 0xee])) {
            panic!("{}: {e}", render_command(cmd).unwrap());
        }
    }
}

/// Three hosts; a serves VNIs 1 and 2, b VNI 1, c VNIs 2 and 3.
fn three_hosts() -> Vec<ClusterEntry> {
    vec![
        host("a", "10.0.0.1", &["vxlan"]),
        host("b", "10.0.0.2", &["vxlan"]),
        host("c", "fd00::3", &["vxlan"]),
        placed("a", 1, "52:54:00:00:0a:01", "vm-a1"),
        placed("a", 2, "52:54:00:00:0a:02", "vm-a2"),
        placed("b", 1, "52:54:00:00:0b:01", "vm-b1"),
        placed("b", 1, "52:54:00:00:0b:02", "vm-b2"),
        placed("c", 2, "52:54:00:00:0c:01", "vm-c1"),
        placed("c", 3, "52:54:00:00:0c:02", "vm-c2"),
    ]
}

const LOCAL_A: &str = "interface add vm-a1 tap mac 52:54:00:00:0a:01\n\
                       interface add vm-a2 tap mac 52:54:00:00:0a:02 vni 2\n";

#[test]
fn mesh() {
    let s = state(three_hosts());
    let local = config(LOCAL_A);
    let d = derive(&h("a"), &s, &local);
    assert_eq!(d.conflicts, vec![]);
    assert_eq!(
        lines(&d.config),
        [
            "link add c-b-v1 udp 10.0.0.2:4789 vni 1",
            "link add c-c-v2 udp [fd00::3]:4789 vni 2",
            "route add any 52:54:00:00:0a:01 interface vm-a1",
            "route add any 52:54:00:00:0a:02 interface vm-a2",
            "route add any 52:54:00:00:0b:01 link c-b-v1",
            "route add any 52:54:00:00:0b:02 link c-b-v1",
            "route add any 52:54:00:00:0c:01 link c-c-v2",
        ]
    );
    // every line is the control language, and the commands apply to the local configuration
    for l in lines(&d.config) {
        assert!(parse_line(&l).unwrap().is_some(), "{l}");
    }
    let mut running = local.clone();
    run(&mut running, &d.config.commands());
    // host c sees a in VNI 2 only; b (VNI 1 only) is none of its business
    let dc = derive(&h("c"), &s, &config("interface add x tap mac 52:54:00:00:0c:01 vni 2\ninterface add y tap mac 52:54:00:00:0c:02 vni 3"));
    assert_eq!(
        dc.config
            .links
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>(),
        ["c-a-v2"]
    );
    // a host whose record is gone (lease expired) is not linked, its MACs not routed
    let mut s2 = s.clone();
    s2.remove(&crate::ClusterKey::Host(h("b")));
    let d2 = derive(&h("a"), &s2, &local);
    assert!(d2.config.links.iter().all(|l| l.name != "c-b-v1"));
    assert_eq!(d2.config.routes.len(), 3);
}

#[test]
fn star() {
    let mut e = three_hosts();
    e.push(host("hub", "10.0.0.9", &["vxlan"]));
    e.push(placed("hub", 1, "52:54:00:00:99:01", "vm-h1"));
    e.push(placed("b", 2, "52:54:00:00:0b:03", "vm-b3"));
    e.push(ClusterEntry::Policy(Policy::Star { proxy: h("hub") }));
    let s = state(e);
    // a leaf links only to the proxy, and reaches everyone through it
    let d = derive(&h("a"), &s, &config(LOCAL_A));
    assert_eq!(d.conflicts, vec![]);
    assert_eq!(
        lines(&d.config),
        [
            "link add c-hub-v1 udp 10.0.0.9:4789 vni 1",
            "link add c-hub-v2 udp 10.0.0.9:4789 vni 2",
            "route add any 52:54:00:00:0a:01 interface vm-a1",
            "route add any 52:54:00:00:0a:02 interface vm-a2",
            "route add any 52:54:00:00:0b:01 link c-hub-v1",
            "route add any 52:54:00:00:0b:02 link c-hub-v1",
            "route add any 52:54:00:00:0b:03 link c-hub-v2",
            "route add any 52:54:00:00:0c:01 link c-hub-v2",
            "route add any 52:54:00:00:99:01 link c-hub-v1",
        ]
    );
    // the proxy links to all, routes each MAC to its host and relays broadcasts; VNI 3 has
    // one user only
    let hub_local = config("interface add vm-h1 tap mac 52:54:00:00:99:01\n");
    let dh = derive(&h("hub"), &s, &hub_local);
    assert_eq!(dh.conflicts, vec![]);
    assert_eq!(
        lines(&dh.config),
        [
            "link add c-a-v1 udp 10.0.0.1:4789 vni 1",
            "link add c-a-v2 udp 10.0.0.1:4789 vni 2",
            "link add c-b-v1 udp 10.0.0.2:4789 vni 1",
            "link add c-b-v2 udp 10.0.0.2:4789 vni 2",
            "link add c-c-v2 udp [fd00::3]:4789 vni 2",
            "route add any 52:54:00:00:0a:01 link c-a-v1",
            "route add any 52:54:00:00:0a:02 link c-a-v2",
            "route add any 52:54:00:00:0b:01 link c-b-v1",
            "route add any 52:54:00:00:0b:02 link c-b-v1",
            "route add any 52:54:00:00:0b:03 link c-b-v2",
            "route add any 52:54:00:00:0c:01 link c-c-v2",
            "route add any 52:54:00:00:99:01 interface vm-h1",
            "route add any broadcast interface vm-h1",
            "route add any broadcast link c-a-v1",
            "route add any broadcast link c-a-v2",
            "route add any broadcast link c-b-v1",
            "route add any broadcast link c-b-v2",
            "route add any broadcast link c-c-v2",
        ]
    );
    let mut running = hub_local.clone();
    run(&mut running, &dh.config.commands());
    // without the proxy's record a leaf has nothing to link to
    let mut s2 = s.clone();
    s2.remove(&crate::ClusterKey::Host(h("hub")));
    let d2 = derive(&h("a"), &s2, &config(LOCAL_A));
    assert!(d2.config.links.is_empty());
    assert_eq!(
        d2.conflicts,
        vec![Conflict::ProxyMissing { proxy: h("hub") }]
    );
}

#[test]
fn explicit_derives_only_operator_routes() {
    let mut e = three_hosts();
    e.push(ClusterEntry::Policy(Policy::Explicit));
    e.push(op_route(
        "r1",
        "route add any 52:54:00:00:0b:01 link up",
        None,
    ));
    e.push(op_route(
        "r2",
        "route add any 52:54:00:00:0b:02 link up",
        Some("b"),
    ));
    e.push(op_route(
        "r3",
        "route add any 52:54:00:00:0b:02 link nowhere",
        None,
    ));
    let s = state(e);
    let local = config(&format!("{LOCAL_A}link add up udp 10.0.0.2\n"));
    let d = derive(&h("a"), &s, &local);
    assert_eq!(
        lines(&d.config),
        ["route add any 52:54:00:00:0b:01 link up"]
    );
    assert_eq!(
        d.conflicts,
        vec![Conflict::UnresolvedRoute {
            id: "r3".parse().unwrap(),
            to: DestRef {
                kind: DestKind::Link,
                name: "nowhere".into()
            }
        }]
    );
}

#[test]
fn local_configuration_wins() {
    let mut e = three_hosts();
    // operator routes: over a local link, to a local interface (winning over the derived
    // route for that MAC), and over a derived link this host does not get
    e.push(op_route(
        "r1",
        "route add any 52:54:00:00:0c:01 link c-c-v2",
        None,
    ));
    e.push(op_route(
        "r2",
        "route add any 52:54:00:00:0b:01 interface vm-a1",
        None,
    ));
    e.push(op_route(
        "r3",
        "route add any 52:54:00:00:0b:02 link c-b-v1",
        None,
    ));
    let s = state(e);
    let local = config(&format!(
        "{LOCAL_A}\
         link add to-b udp 10.0.0.2\n\
         link add c-c-v2 udp 10.0.0.33 vni 2\n\
         route add any 52:54:00:00:0a:01 interface vm-a1\n\
         route add any 52:54:00:00:0b:02 interface vm-a1\n"
    ));
    let d = derive(&h("a"), &s, &local);
    assert_eq!(
        lines(&d.config),
        [
            "route add any 52:54:00:00:0a:02 interface vm-a2",
            "route add any 52:54:00:00:0b:01 interface vm-a1",
            "route add any 52:54:00:00:0c:01 link c-c-v2",
        ]
    );
    let over = |dst: &str, to: &str, by: Overrider| Conflict::RouteOverridden {
        route: Route {
            src: MacMatch::Any,
            dst: MacMatch::Exact(mac(dst)),
            to: DestRef {
                kind: DestKind::Link,
                name: to.into(),
            },
        },
        vni: 1,
        by,
    };
    assert_eq!(
        d.conflicts,
        vec![
            Conflict::LinkCovered {
                derived: "c-b-v1".into(),
                local: "to-b".into()
            },
            Conflict::LinkName {
                name: "c-c-v2".into()
            },
            Conflict::UnresolvedRoute {
                id: "r3".parse().unwrap(),
                to: DestRef {
                    kind: DestKind::Link,
                    name: "c-b-v1".into()
                }
            },
            over(
                "52:54:00:00:0b:01",
                "to-b",
                Overrider::Operator("r2".parse().unwrap())
            ),
            over("52:54:00:00:0b:02", "to-b", Overrider::Local),
        ]
    );
    for c in &d.conflicts {
        assert!(!c.to_string().is_empty());
    }
    let mut running = local.clone();
    run(&mut running, &d.config.commands());
}

#[test]
fn placement_decides_where_a_mac_lives() {
    let mut e = three_hosts();
    // vm-a1 has moved to b; a also holds a placement with no interface behind it
    e.push(placed("b", 1, "52:54:00:00:0a:01", "vm-a1"));
    e.push(placed("a", 1, "52:54:00:00:0a:09", "gone"));
    let s = state(e);
    let d = derive(&h("a"), &s, &config(LOCAL_A));
    assert!(lines(&d.config).contains(&"route add any 52:54:00:00:0a:01 link c-b-v1".to_string()));
    assert!(
        !lines(&d.config).contains(&"route add any 52:54:00:00:0a:01 interface vm-a1".to_string())
    );
    assert_eq!(
        d.conflicts,
        vec![
            Conflict::StalePlacement {
                vni: 1,
                mac: mac("52:54:00:00:0a:09")
            },
            Conflict::PlacedElsewhere {
                interface: "vm-a1".into(),
                vni: 1,
                mac: mac("52:54:00:00:0a:01"),
                host: h("b")
            },
        ]
    );
}

#[test]
fn transports_and_shared_addresses() {
    let s = state(vec![
        host("a", "10.0.0.1", &["tcp"]),
        host("b", "10.0.0.2", &["tcp", "vxlan"]),
        host("c", "10.0.0.3", &["vxlan"]),
        host("d", "10.0.0.2", &["tcp"]),
        placed("a", 1, "52:54:00:00:0a:01", "x"),
        placed("b", 1, "52:54:00:00:0b:01", "x"),
        placed("c", 1, "52:54:00:00:0c:01", "x"),
        placed("d", 1, "52:54:00:00:0d:01", "x"),
    ]);
    let da = derive(
        &h("a"),
        &s,
        &config("interface add x tap mac 52:54:00:00:0a:01"),
    );
    let links: Vec<String> = da
        .config
        .commands()
        .iter()
        .take(2)
        .map(|c| render_command(c).unwrap())
        .collect();
    // a dials the larger ids; the second host at 10.0.0.2 gets no link of its own
    assert_eq!(
        links,
        [
            "link add c-b-v1 tcp 10.0.0.2:7000 vni 1",
            "route add any 52:54:00:00:0a:01 interface x"
        ]
    );
    assert_eq!(
        da.conflicts,
        vec![
            Conflict::NoTransport { host: h("c") },
            Conflict::SharedPeer {
                derived: "c-d-v1".into(),
                other: "c-b-v1".into()
            }
        ]
    );
    let db = derive(
        &h("b"),
        &s,
        &config("interface add x tap mac 52:54:00:00:0b:01"),
    );
    assert_eq!(
        lines(&db.config)[..2],
        [
            "link add c-a-v1 tcp accept 10.0.0.1 vni 1",
            "link add c-c-v1 udp 10.0.0.3:4789 vni 1"
        ]
    );
    // with no record of its own a host speaks VXLAN only
    let dx = derive(
        &h("x"),
        &s,
        &config("interface add x tap mac 52:54:00:00:0e:01"),
    );
    assert_eq!(dx.config.links.len(), 2);
}

#[test]
fn diff_orders_and_relinks() {
    let s1 = state(three_hosts());
    let mut e2 = three_hosts();
    e2[1] = host("b", "10.0.0.22", &["vxlan"]);
    e2.push(placed("c", 2, "52:54:00:00:0c:03", "vm-c3"));
    e2.retain(|e| !matches!(e, ClusterEntry::Interface(i) if i.mac == mac("52:54:00:00:0b:02")));
    let s2 = state(e2);
    let local = config(LOCAL_A);
    let d1 = derive(&h("a"), &s1, &local).config;
    let d2 = derive(&h("a"), &s2, &local).config;
    let cmds = diff(&d1, &d2);
    let text: Vec<String> = cmds.iter().map(|c| render_command(c).unwrap()).collect();
    assert_eq!(
        text,
        [
            "route del any 52:54:00:00:0b:01 link c-b-v1",
            "route del any 52:54:00:00:0b:02 link c-b-v1",
            "link del c-b-v1",
            "link add c-b-v1 udp 10.0.0.22:4789 vni 1",
            "route add any 52:54:00:00:0b:01 link c-b-v1",
            "route add any 52:54:00:00:0c:03 link c-c-v2",
        ]
    );
    assert!(diff(&d2, &d2).is_empty());
    let mut applied = d1.clone();
    for c in &cmds {
        applied.apply(c).unwrap();
    }
    assert_eq!(applied, d2);
    let mut running = local.clone();
    run(&mut running, &d1.commands());
    run(&mut running, &cmds);
}

#[test]
fn applied_record_follows_the_running_configuration() {
    let s = state(three_hosts());
    let local = config(LOCAL_A);
    let d = derive(&h("a"), &s, &local).config;
    let mut applied = d.clone();
    let link = d.commands()[0].clone();
    assert!(matches!(
        applied.apply(&link),
        Err(DerivedApplyError::LinkExists(_))
    ));
    assert!(matches!(
        applied.apply(&Command::LinkDel("nope".into())),
        Err(DerivedApplyError::NoLink(_))
    ));
    let route = d.commands().last().unwrap().clone();
    assert!(matches!(
        applied.apply(&route),
        Err(DerivedApplyError::RouteExists(_))
    ));
    assert!(matches!(
        applied.apply(
            &parse_line("route replace any any link c-b-v1")
                .unwrap()
                .unwrap()
        ),
        Err(DerivedApplyError::Unsupported)
    ));
    assert!(matches!(
        applied.apply(&parse_line("set learn on").unwrap().unwrap()),
        Err(DerivedApplyError::Unsupported)
    ));
    // deleting a link takes its routes, as in Config
    applied.apply(&Command::LinkDel("c-b-v1".into())).unwrap();
    assert!(applied.routes.iter().all(|r| r.to.name != "c-b-v1"));
    // an interface deleted locally took its derived route along: the record forgets it too
    let mut running = local.clone();
    run(&mut running, &d.commands());
    run(
        &mut running,
        &[parse_line("interface del vm-a2").unwrap().unwrap()],
    );
    let mut applied = d.clone();
    applied.retain_present(&running);
    assert_eq!(applied.routes.len(), d.routes.len() - 1);
    assert_eq!(applied.links, d.links);
    assert!(render_command(&parse_line("show stats").unwrap().unwrap()).is_none());
    assert_eq!(
        render_command(&Command::LinkAdd(LinkSpec {
            name: "x".into(),
            kind: LinkKind::Direct("eth0".into()),
            vni: None,
            encrypt: None,
            reach: None,
            rate: None,
        })),
        Some("link add x direct eth0".into())
    );
    assert!(DerivedConfig::default().is_empty() && !d.is_empty());
}

#[test]
fn derived_names_fit_the_language() {
    let longest = h(&"h".repeat(crate::schema::MAX_HOST_ID_LEN));
    let name = derived_link_name(&longest, vnet_wire::VNI_MAX);
    assert_eq!(name.len(), 32);
    assert!(parse_line(&format!("link del {name}")).is_ok());
}

// ---- properties ----

const POOL: [&str; 5] = ["a", "b", "c", "d", "e"];

fn arb_entry() -> impl Strategy<Value = ClusterEntry> {
    prop_oneof![
        4 => (0usize..4, 1u8..5, 0usize..3).prop_map(|(i, addr, caps)| {
            let caps: &[&str] = [&["vxlan"][..], &["tcp"], &["vxlan", "tcp"]][caps];
            host(POOL[i], &format!("10.0.0.{addr}"), caps)
        }),
        6 => (0usize..5, 1u32..4, 1u8..7).prop_map(|(i, vni, m)| {
            placed(POOL[i], vni, &format!("02:00:00:00:00:0{m}"), &format!("vm{m}"))
        }),
        1 => (0usize..5, proptest::option::of(0usize..3)).prop_map(|(l, host)| {
            let line = [
                "route add any 02:00:00:00:00:01 link c-b-v1",
                "route add any broadcast interface vm1",
                "route add 02:00:00:00:00:02 any link up",
                "route add any 02:00:00:00:00:03 link up",
                "route add any 02:00:00:00:00:04 interface vm2",
            ][l];
            op_route(&format!("r{l}"), line, host.map(|i| POOL[i]))
        }),
        1 => prop_oneof![
            Just(Policy::Mesh),
            Just(Policy::Explicit),
            (0usize..3).prop_map(|i| Policy::Star { proxy: h(POOL[i]) }),
        ].prop_map(ClusterEntry::Policy),
    ]
}

/// Host a's local configuration: interfaces from the same MAC pool as the placements, and
/// sometimes local links and routes that compete with derived ones.
fn arb_local() -> impl Strategy<Value = Config> {
    (
        proptest::collection::vec((1u32..4, 1u8..7), 1..5),
        any::<[bool; 3]>(),
    )
        .prop_map(|(ifaces, extra)| {
            let mut c = Config::default();
            let mut script = String::new();
            for (n, (vni, m)) in ifaces.iter().enumerate() {
                script += &format!("interface add vm{n} tap mac 02:00:00:00:00:0{m} vni {vni}\n");
            }
            if extra[0] {
                script += "link add up udp 10.0.0.2\nroute add any 02:00:00:00:00:03 link up\n";
            }
            if extra[1] {
                script += "link add c-b-v1 udp 10.0.0.77\n";
            }
            if extra[2] {
                script += "route add any 02:00:00:00:00:01 interface vm0\n";
            }
            for line in script.lines() {
                // lines that clash (a MAC twice in a VNI) are refused, as they would be
                if let Ok(Some(cmd)) = parse_line(line) {
                    let _ = c.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 0xee]));
                }
            }
            c
        })
}

fn route_set<'a>(routes: impl IntoIterator<Item = &'a Route>) -> Vec<String> {
    let mut v: Vec<String> = routes
        .into_iter()
        .map(|r| format!("{} {} {} {}", r.src, r.dst, r.to.kind, r.to.name))
        .collect();
    v.sort();
    v
}

fn link_set(links: &[Link]) -> Vec<String> {
    let mut v: Vec<String> = links
        .iter()
        .map(|l| format!("{} {} {}", l.name, l.kind, l.vni))
        .collect();
    v.sort();
    v
}

proptest! {
    #[test]
    fn derive_ignores_event_order(
        entries in proptest::collection::vec(arb_entry(), 0..24),
        local in arb_local(),
        seed in any::<u64>(),
    ) {
        // the same final state reached through events in another order (later puts to the
        // same key win in both, so shuffle only entries with distinct keys)
        let mut distinct: Vec<ClusterEntry> = Vec::new();
        for e in entries {
            distinct.retain(|d| d.key() != e.key());
            distinct.push(e);
        }
        let mut other = distinct.clone();
        let n = other.len();
        if n > 1 {
            let mut x = seed;
            for i in (1..n).rev() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                other.swap(i, (x >> 33) as usize % (i + 1));
            }
        }
        let s1 = state(distinct);
        let s2 = state(other);
        prop_assert_eq!(&s1, &s2);
        for me in ["a", "b"] {
            let d1 = derive(&h(me), &s1, &local);
            let d2 = derive(&h(me), &s2, &local);
            prop_assert_eq!(&d1, &d2);
            // and twice the same
            prop_assert_eq!(&d1, &derive(&h(me), &s1, &local));
        }
    }

    #[test]
    fn derived_set_applies_and_diff_reaches_the_target(
        e1 in proptest::collection::vec(arb_entry(), 0..30),
        e2 in proptest::collection::vec(arb_entry(), 0..30),
        local in arb_local(),
        me in prop_oneof![Just("a"), Just("b")],
    ) {
        let me = h(me);
        let d1 = derive(&me, &state(e1), &local).config;
        let d2 = derive(&me, &state(e2), &local).config;
        // diff applied to the derived record gives the target
        let cmds = diff(&d1, &d2);
        let mut applied = d1.clone();
        for c in &cmds {
            applied.apply(c).unwrap();
        }
        prop_assert_eq!(&applied, &d2);
        // and every command is valid on the running configuration, which ends as local + d2
        let mut running = local.clone();
        run(&mut running, &d1.commands());
        run(&mut running, &cmds);
        let mut want_links = local.links.clone();
        want_links.extend(d2.links.iter().cloned());
        let mut want_routes = local.routes.to_vec();
        want_routes.extend(d2.routes.iter().cloned());
        prop_assert_eq!(link_set(&running.links), link_set(&want_links));
        prop_assert_eq!(route_set(&running.routes), route_set(&want_routes));
        // resyncing against the running configuration changes nothing more
        let mut record = d2.clone();
        record.retain_present(&running);
        prop_assert!(diff(&record, &d2).is_empty());
    }
}

fn keyed_host(id: &str, addr: &str, key_byte: Option<u8>) -> ClusterEntry {
    let mut caps = vec!["vxlan".to_string()];
    let public_key = key_byte.map(|b| {
        caps.push(CAP_NOISE.to_string());
        vnet_crypto::PublicKey([b; 32]).to_string()
    });
    ClusterEntry::Host(HostRecord {
        host_id: h(id),
        addr: addr.parse().unwrap(),
        udp_port: 4789,
        tcp_port: None,
        capabilities: caps,
        public_key,
        version: SCHEMA_VERSION,
        reach: Default::default(),
    })
}

#[test]
fn hosts_with_keys_link_encrypted_and_never_in_plaintext() {
    let local = config("interface add vm tap mac 52:54:00:00:0a:01 vni 1\n");
    let placements = [
        placed("a", 1, "52:54:00:00:0a:01", "vm"),
        placed("b", 1, "52:54:00:00:0b:01", "vm"),
        placed("c", 1, "52:54:00:00:0c:01", "vm"),
    ];
    // a and b have keys, c has none.
    let mut entries = vec![
        keyed_host("a", "10.0.0.1", Some(1)),
        keyed_host("b", "10.0.0.2", Some(2)),
        keyed_host("c", "10.0.0.3", None),
    ];
    entries.extend(placements.iter().cloned());
    let d = derive(&h("a"), &state(entries), &local);
    let b_key = vnet_crypto::PublicKey([2; 32]);
    assert_eq!(
        d.config.links,
        vec![Link {
            name: "c-b-v1".into(),
            kind: LinkKind::Udp("10.0.0.2:4789".parse().unwrap()),
            vni: 1,
            encrypt: Some(b_key),
            reach: None,
        }]
    );
    assert!(lines(&d.config).contains(&format!(
        "link add c-b-v1 udp 10.0.0.2:4789 vni 1 encrypt {b_key}"
    )));
    assert!(d
        .conflicts
        .contains(&Conflict::EncryptionMismatch { host: h("c") }));
    // c's guest is not routed anywhere from a (no link reaches c).
    assert!(!lines(&d.config)
        .iter()
        .any(|l| l.contains("52:54:00:00:0c:01")));

    // From c (no key): no link to a or b, a plaintext one to another keyless host.
    let mut entries = vec![
        keyed_host("a", "10.0.0.1", Some(1)),
        keyed_host("c", "10.0.0.3", None),
        keyed_host("d", "10.0.0.4", None),
        placed("d", 1, "52:54:00:00:0d:01", "vm"),
    ];
    entries.extend(placements.iter().cloned());
    let local_c = config("interface add vm tap mac 52:54:00:00:0c:01 vni 1\n");
    let d = derive(&h("c"), &state(entries), &local_c);
    let names: Vec<_> = d
        .config
        .links
        .iter()
        .map(|l| (l.name.as_str(), l.encrypt))
        .collect();
    assert_eq!(names, vec![("c-d-v1", None)]);
    assert!(d
        .conflicts
        .contains(&Conflict::EncryptionMismatch { host: h("a") }));
}

#[test]
fn capability_noise_needs_a_valid_key() {
    let ClusterEntry::Host(mut r) = keyed_host("a", "10.0.0.1", Some(7)) else {
        unreachable!()
    };
    assert!(r.validate().is_ok());
    assert_eq!(r.noise_key(), Some(vnet_crypto::PublicKey([7; 32])));
    r.public_key = None;
    assert!(r.validate().is_err());
    r.public_key = Some("AAAA".into()); // base64, but not 32 bytes
    assert!(r.validate().is_err());
    r.capabilities.retain(|c| c != CAP_NOISE);
    assert!(r.validate().is_ok());
    assert_eq!(r.noise_key(), None);
}

#[test]
fn reach_links_go_by_probe_key() {
    // Two sites with the same private range: b and c both publish 192.168.1.2. With probe keys
    // on every host each gets its own reach link; d, without one, is linked to by address.
    let with_key = |e: ClusterEntry, k: u8| match e {
        ClusterEntry::Host(mut r) => {
            r.reach.probe_key = Some(vnet_crypto::PublicKey([k; 32]).to_string());
            ClusterEntry::Host(r)
        }
        e => e,
    };
    let s = state(vec![
        with_key(host("a", "10.0.0.1", &["vxlan"]), 1),
        with_key(host("b", "192.168.1.2", &["vxlan"]), 2),
        with_key(host("c", "192.168.1.2", &["vxlan"]), 3),
        host("d", "10.0.0.4", &["vxlan"]),
        placed("b", 1, "52:54:00:00:0b:01", "x"),
        placed("c", 1, "52:54:00:00:0c:01", "x"),
        placed("d", 1, "52:54:00:00:0d:01", "x"),
    ]);
    let d = derive(
        &h("a"),
        &s,
        &config("interface add x tap mac 52:54:00:00:0a:01"),
    );
    assert_eq!(d.conflicts, vec![]);
    let k = |b: u8| vnet_crypto::PublicKey([b; 32]).to_string();
    let links: Vec<String> = lines(&d.config)
        .into_iter()
        .filter(|l| l.starts_with("link"))
        .collect();
    assert_eq!(
        links,
        [
            format!("link add c-b-v1 udp 192.168.1.2:4789 vni 1 reach {}", k(2)),
            format!("link add c-c-v1 udp 192.168.1.2:4789 vni 1 reach {}", k(3)),
            "link add c-d-v1 udp 10.0.0.4:4789 vni 1".to_string(),
        ]
    );
    // A host without a probe key of its own links to nobody by key.
    let dd = derive(
        &h("d"),
        &s,
        &config("interface add x tap mac 52:54:00:00:0d:02"),
    );
    assert!(lines(&dd.config).iter().all(|l| !l.contains("reach")));
    assert!(dd
        .conflicts
        .iter()
        .any(|c| matches!(c, Conflict::SharedPeer { .. })));
}
