//! Tests of `engine.rs`, in a file of their own so that the module reads as what it does.

//! The control side without root: links and routes need no devices.
use super::*;
use vnet_control::status::LinkState;
use vnet_control::Command;

fn apply_script(e: &mut Engine, cfg: &mut Config, script: &str) {
    let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    for (_, cmd) in vnet_control::parse_script(script).expect("script") {
        for ch in cfg.apply(&cmd, &mut gen).expect("valid") {
            e.apply(&ch).expect("engine");
        }
    }
    e.rebuild(cfg);
}

#[test]
fn links_and_routes_reach_the_snapshot_and_go_again() {
    let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    let mut cfg = Config::default();
    apply_script(
        &mut e,
        &mut cfg,
        "link add b udp 127.0.0.1:4799 vni 7\nlink add c tcp 127.0.0.1:1 vni 7\n\
         route add any 52:54:00:00:00:09 link b\n",
    );
    let snap = e.shared.snapshot.load_full();
    assert_eq!(snap.ports.len(), 2);
    assert_eq!(snap.udp_peers.len(), 1);
    assert!(snap
        .udp_ips
        .contains(&"127.0.0.1".parse::<IpAddr>().unwrap()));
    assert_eq!(e.link_state("b"), LinkState::Up);
    assert_ne!(e.link_state("c"), LinkState::Up, "nobody listens on port 1");
    assert_eq!(e.link_state("nope"), LinkState::Down);
    let st = e.port_status(DestKind::Link, "b").expect("status");
    assert_eq!((st.vni, st.kind), (7, PortRole::Link));
    assert!(e.link_crypto("b").is_none());
    assert!(!e.inject_from_interface("nope", &[]));
    let gen = snap.table.generation();
    // Removing a link takes it out of the snapshot at once, and its peer with it.
    let del = Command::LinkDel("b".into());
    let mut g = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    for ch in cfg.apply(&del, &mut g).expect("valid") {
        e.apply(&ch).expect("engine");
    }
    e.rebuild(&cfg);
    let snap = e.shared.snapshot.load_full();
    assert_eq!(snap.ports.len(), 1);
    assert!(snap.udp_peers.is_empty());
    assert!(snap.table.generation() > gen);
    e.shutdown(Leave::Remove);
    assert!(e.shared.snapshot.load().ports.is_empty());
}

/// A route command on links a (VNI 1), b (VNI 1) and c (VNI 2), over a few MACs.
fn route_line() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let mac = prop_oneof![
        4 => (1u8..5).prop_map(|m| format!("52:54:00:00:00:0{m}")),
        1 => Just("ff:ff:ff:ff:ff:ff".to_string()),
    ];
    let side = prop_oneof![
        2 => Just("any".to_string()),
        4 => mac.clone(),
        1 => mac.prop_map(|m| format!("not {m}")),
    ];
    // A broadcast source renders as `broadcast`, which only a destination may be.
    let src = side
        .clone()
        .prop_filter("unicast source", |s| !s.contains("ff:ff"));
    (0..3usize, src, side, 0..3usize).prop_map(|(op, s, d, to)| {
        format!(
            "route {} {s} {d} link {}",
            ["add", "del", "replace"][op],
            ["a", "b", "c"][to]
        )
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Any sequence of route commands, applied as typed changes and published without a
    /// rebuild, leaves the forwarding table a rebuild from the final configuration makes.
    #[test]
    fn typed_route_changes_equal_a_rebuild(lines in proptest::collection::vec(route_line(), 1..40)) {
        let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
        let mut cfg = Config::default();
        apply_script(
            &mut e,
            &mut cfg,
            "link add a udp 127.0.0.2:4799\nlink add b udp 127.0.0.3:4799\nlink add c udp 127.0.0.4:4799 vni 2\n",
        );
        let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
        for line in &lines {
            let cmd = vnet_control::parse_line(line).expect("parse").expect("a command");
            let Ok(changes) = cfg.apply(&cmd, &mut gen) else { continue };
            for ch in &changes {
                proptest::prop_assert!(matches!(ch, Change::Route(_)), "{ch:?}");
                e.apply(ch).expect("engine");
            }
            e.publish_routes();
            let got = e.shared.snapshot.load_full().table.routes().groups();
            let mut full = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
            apply_script(&mut full, &mut Config::default(), &cfg.to_script());
            let want = full.shared.snapshot.load_full().table.routes().groups();
            // Port ids are the same: both engines added a, b, c in that order.
            proptest::prop_assert_eq!(got, want, "after {}", line);
            full.shutdown(Leave::Remove);
        }
        e.shutdown(Leave::Remove);
    }
}

#[test]
fn an_encrypted_link_needs_a_key() {
    let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    let mut cfg = Config::default();
    let key = vnet_crypto::PrivateKey::generate().expect("key").public();
    let cmd = vnet_control::parse_line(&format!("link add s udp 127.0.0.1 encrypt {key}"))
        .expect("parse")
        .expect("a command");
    let mut g = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    let ch = cfg.apply(&cmd, &mut g).expect("valid");
    assert!(matches!(
        e.apply(&ch[0]),
        Err(EngineError::Unsupported { .. })
    ));
}
