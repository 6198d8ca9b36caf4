//! Tests of `engine.rs`, in a file of their own so that the module reads as what it does.

//! The control side without root: links and routes need no devices.
use super::*;
use std::net::IpAddr;
use vnet_control::status::{LinkState, PortRole};
use vnet_control::{Command, Config};
use vnet_fastpath::FastPathConfig;

fn apply_script(e: &mut Engine, cfg: &mut Config, script: &str) {
    let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    for (_, cmd) in vnet_control::parse_script(script).expect("script") {
        for ch in cfg.apply(&cmd, &mut gen).expect("valid") {
            e.apply(&ch).expect("engine");
        }
    }
    e.publish();
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
    let status = e.status();
    assert_eq!(status.link_state("b"), LinkState::Up);
    assert_ne!(
        status.link_state("c"),
        LinkState::Up,
        "nobody listens on port 1"
    );
    assert_eq!(status.link_state("nope"), LinkState::Down);
    let st = status.port_status(DestKind::Link, "b").expect("status");
    assert_eq!((st.vni, st.kind), (7, PortRole::Link));
    assert!(status.link_crypto("b").is_none());
    assert!(!e.status().inject_from_interface("nope", &[]));
    let gen = snap.table.generation();
    // Removing a link takes it out of the snapshot at once, and its peer with it.
    let del = Command::LinkDel("b".into());
    let mut g = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    for ch in cfg.apply(&del, &mut g).expect("valid") {
        e.apply(&ch).expect("engine");
    }
    e.publish();
    let snap = e.shared.snapshot.load_full();
    assert_eq!(snap.ports.len(), 1);
    assert!(
        e.status().port_status(DestKind::Link, "b").is_none(),
        "readers see it gone"
    );
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
            e.publish();
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

/// Applies one command's changes and publishes (what vnetd's owner does per command).
fn apply_line(e: &mut Engine, cfg: &mut Config, line: &str) {
    let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
    let cmd = vnet_control::parse_line(line)
        .expect("parse")
        .expect("a command");
    for ch in cfg.apply(&cmd, &mut gen).expect("valid") {
        e.apply(&ch).expect("engine");
    }
    e.publish();
}

/// A policy, a dispatcher setting: no decision changes, so no table is published and no
/// route cache forgets anything; learning bears on every decision.
#[test]
fn only_what_bears_on_decisions_publishes_a_table() {
    let mut e = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    let mut cfg = Config::default();
    apply_script(
        &mut e,
        &mut cfg,
        "link add b udp 127.0.0.2:4799\nroute add any 52:54:00:00:00:09 link b\n",
    );
    let gen = e.snapshot_generation();
    let table = e.shared.snapshot.load_full();
    apply_line(&mut e, &mut cfg, "link set b rate 10");
    apply_line(&mut e, &mut cfg, "set adaptive-window-ms 7");
    assert_eq!(e.snapshot_generation(), gen);
    assert!(Arc::ptr_eq(&table, &e.shared.snapshot.load_full()));
    let rate = e
        .status()
        .port_status(DestKind::Link, "b")
        .expect("b")
        .policy
        .rate;
    assert!(rate.is_some(), "the guard has the rate");
    apply_line(&mut e, &mut cfg, "set learn on");
    let t = e.shared.snapshot.load_full();
    assert_eq!(t.table.generation(), gen + 1);
    assert!(
        matches!(
            t.table
                .changes_since(gen)
                .map(|c| c.cloned().collect::<Vec<_>>())
                .as_deref(),
            Some([vnet_core::TableChange::All])
        ),
        "learning bears on everything"
    );
    // A route change says where it bore.
    apply_line(&mut e, &mut cfg, "route add any 52:54:00:00:00:0a link b");
    let t = e.shared.snapshot.load_full();
    let changes: Vec<_> = t
        .table
        .changes_since(gen + 1)
        .expect("logged")
        .cloned()
        .collect();
    assert!(matches!(&changes[..], [vnet_core::TableChange::Some(p)]
        if p[..] == [vnet_core::Touched::Dst(1, vnet_wire::MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]))]));
    e.shutdown(Leave::Remove);
}

/// `link set X rate` on a host with 1,000 routes over the kernel fast path writes only that
/// link's entries to the kernel's maps (its bucket, value, cached next hop, receive key), not the
/// forwarding table (needs root and BPF; skipped otherwise).
#[test]
fn a_link_rate_writes_only_that_links_kernel_entries() {
    use crate::testing::{ip, private_netns};
    if !private_netns() {
        return;
    }
    ip("link set lo up");
    ip("link add u0 type veth peer name u1");
    ip("link set u0 up");
    ip("link set u1 up");
    ip("addr add 10.67.0.1/16 dev u0");
    let mut e = Engine::new("10.67.0.1:0".parse().unwrap()).expect("engine");
    if let Err(why) = e.enable_kernel_path(FastPathConfig::default()) {
        eprintln!("skipped: no kernel fast path here: {why}");
        return;
    }
    let mut cfg = Config::default();
    let mut script = String::new();
    for l in 0..100u32 {
        script.push_str(&format!("link add l{l} udp 10.67.1.{}\n", l + 1));
        for g in 0..10u32 {
            script.push_str(&format!(
                "route add any 52:54:00:00:{l:02x}:{g:02x} link l{l}\n"
            ));
        }
    }
    apply_script(&mut e, &mut cfg, &script);
    let k = e.kernel.as_ref().expect("kernel path");
    assert_eq!(k.table_len(), 1000, "the kernel holds every destination");
    let before = k.map_writes();
    apply_line(&mut e, &mut cfg, "link set l7 rate 10");
    let writes = e.kernel.as_ref().expect("kernel path").map_writes() - before;
    assert!(
        (1..=4).contains(&writes),
        "{writes} map writes for one link's rate (at most its bucket, value, cached next hop and receive key)"
    );
    // For the record: what a change cost when every change ended in a rebuild (the whole
    // table compiled and planned again), against the change alone; CPU of this thread.
    let (mut alone, mut rebuilt) = (Vec::new(), Vec::new());
    for i in 0..21u32 {
        let line = format!("link set l7 rate {}", 20 + i);
        let mut gen = || vnet_wire::MacAddr::local_from_random([1, 2, 3, 4, 5, 6]);
        let cmd = vnet_control::parse_line(&line)
            .expect("parse")
            .expect("a command");
        let changes = cfg.apply(&cmd, &mut gen).expect("valid");
        let (t0, w0) = (thread_cpu_ns(), e.kernel.as_ref().expect("k").map_writes());
        for ch in &changes {
            e.apply(ch).expect("engine");
        }
        e.publish();
        alone.push((
            thread_cpu_ns() - t0,
            e.kernel.as_ref().expect("k").map_writes() - w0,
        ));
        let (t0, w0) = (thread_cpu_ns(), e.kernel.as_ref().expect("k").map_writes());
        for ch in &changes {
            e.apply(ch).expect("engine");
        }
        e.rebuild(&cfg);
        rebuilt.push((
            thread_cpu_ns() - t0,
            e.kernel.as_ref().expect("k").map_writes() - w0,
        ));
    }
    alone.sort();
    rebuilt.sort();
    eprintln!(
        "link set rate, 1,000 routes: alone {} us CPU ({} map writes), with a rebuild {} us ({} map writes) (medians of 21; min {} / {} us, max {} / {} us)",
        alone[10].0 / 1000, alone[10].1, rebuilt[10].0 / 1000, rebuilt[10].1,
        alone[0].0 / 1000, rebuilt[0].0 / 1000, alone[20].0 / 1000, rebuilt[20].0 / 1000,
    );
    e.shutdown(Leave::Remove);
}

/// A daemon that stops and leaves its devices for the next one (`Leave::Keep`) leaves the
/// kernel's table as it is: the kernel forwards by it until the next vnetd takes it over, so
/// the ports' going must not take their routes from it (needs root and BPF; skipped
/// otherwise).
#[test]
fn a_stop_that_keeps_leaves_the_kernel_table_alone() {
    use crate::testing::{ip, private_netns};
    if !private_netns() {
        return;
    }
    ip("link set lo up");
    ip("link add u0 type veth peer name u1");
    ip("link set u0 up");
    ip("link set u1 up");
    ip("addr add 10.68.0.1/16 dev u0");
    let mut e = Engine::new("10.68.0.1:0".parse().unwrap()).expect("engine");
    if let Err(why) = e.enable_kernel_path(FastPathConfig::default()) {
        eprintln!("skipped: no kernel fast path here: {why}");
        return;
    }
    let mut cfg = Config::default();
    let mut script = String::new();
    for l in 0..4u32 {
        script.push_str(&format!("link add l{l} udp 10.68.1.{}\n", l + 1));
        for g in 0..5u32 {
            script.push_str(&format!(
                "route add any 52:54:00:01:{l:02x}:{g:02x} link l{l}\n"
            ));
        }
    }
    apply_script(&mut e, &mut cfg, &script);
    let k = e.kernel.as_ref().expect("kernel path");
    assert_eq!(k.table_len(), 20, "the kernel holds every destination");
    let before = k.map_writes();
    e.remove_all_ports(Leave::Keep);
    assert!(e.ports.is_empty());
    let k = e
        .kernel
        .as_ref()
        .expect("the kernel path stays until it is dropped");
    assert_eq!(
        k.map_writes() - before,
        0,
        "no map write for ports left to the next vnetd"
    );
    assert_eq!(k.table_len(), 20, "the kernel's table is as it was");
    e.shutdown(Leave::Remove);
}

/// This thread's CPU time in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
