//! `incremental`'s tests: the incremental derivation against the whole one, on generated
//! sequences of etcd events (the property that makes the incremental path safe to use).

use super::*;
use crate::schema::{ClusterEntry, InterfaceRecord, OperatorRoute, RouteRecord, SCHEMA_VERSION};
use proptest::prelude::*;
use vnet_control::parse_line;

const POOL: [&str; 5] = ["a", "b", "c", "d", "e"];

fn h(s: &str) -> HostId {
    s.parse().unwrap()
}

fn host(id: &str, addr: u8, caps: &[&str]) -> ClusterEntry {
    host_probing(id, addr, caps, false)
}

/// A host record, with a probe key (one per host id) when `probe`: its udp links then go by
/// key, so two hosts at one address both get theirs.
fn host_probing(id: &str, addr: u8, caps: &[&str], probe: bool) -> ClusterEntry {
    let probe_key = probe.then(|| {
        let b = id.as_bytes()[0];
        vnet_crypto::PublicKey([b; 32]).to_string()
    });
    ClusterEntry::Host(HostRecord {
        host_id: h(id),
        addr: format!("10.0.0.{addr}").parse().unwrap(),
        udp_port: 4789,
        tcp_port: caps.contains(&"tcp").then_some(7000),
        capabilities: caps.iter().map(|c| c.to_string()).collect(),
        public_key: None,
        version: SCHEMA_VERSION,
        reach: crate::schema::HostReach {
            probe_key,
            ..Default::default()
        },
    })
}

fn mac(m: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, m])
}

/// One change of the store, as a watch event brings it.
#[derive(Debug, Clone)]
enum Event {
    Put(ClusterEntry),
    Delete(ClusterKey),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0usize..5, 1u8..4, 0usize..3, any::<bool>()).prop_map(|(i, addr, caps, probe)| {
            let caps: &[&str] = [&["vxlan"][..], &["tcp"], &["vxlan", "tcp"]][caps];
            Event::Put(host_probing(POOL[i], addr, caps, probe))
        }),
        2 => (0usize..5).prop_map(|i| Event::Delete(ClusterKey::Host(h(POOL[i])))),
        8 => (0usize..5, 1u32..4, 1u8..7).prop_map(|(i, vni, m)| {
            Event::Put(ClusterEntry::Interface(InterfaceRecord {
                mac: mac(m),
                vni,
                host_id: h(POOL[i]),
                name: format!("vm{m}"),
                epoch: 0,
            }))
        }),
        3 => (1u32..4, 1u8..7).prop_map(|(vni, m)| Event::Delete(ClusterKey::Interface { vni, mac: mac(m) })),
        1 => (0usize..2).prop_map(|l| {
            let line = ["route add any 02:00:00:00:00:01 link c-b-v1", "route add any 02:00:00:00:00:04 interface vm2"][l];
            let rec = RouteRecord { line: line.into(), host_id: None };
            Event::Put(ClusterEntry::Route(OperatorRoute::from_record(format!("r{l}").parse().unwrap(), rec).unwrap()))
        }),
        1 => (0usize..2).prop_map(|l| Event::Delete(ClusterKey::Route(format!("r{l}").parse().unwrap()))),
        1 => prop_oneof![
            Just(Policy::Mesh),
            Just(Policy::Explicit),
            (0usize..3).prop_map(|i| Policy::Star { proxy: h(POOL[i]) }),
        ].prop_map(|p| Event::Put(ClusterEntry::Policy(p))),
        1 => Just(Event::Delete(ClusterKey::Policy)),
    ]
}

/// Host a's local configuration: interfaces (MACs from the placements' pool), sometimes a link
/// and a route that compete with derived ones.
fn arb_local() -> impl Strategy<Value = Config> {
    (
        proptest::collection::vec((1u32..4, 1u8..7), 1..5),
        any::<bool>(),
    )
        .prop_map(|(ifaces, extra)| {
            let mut c = Config::default();
            let mut script: Vec<String> = ifaces
                .iter()
                .enumerate()
                .map(|(n, (vni, m))| {
                    format!("interface add vm{n} tap mac 02:00:00:00:00:0{m} vni {vni}")
                })
                .collect();
            if extra {
                script.push("link add up udp 10.0.0.2".into());
                script.push("route add any 02:00:00:00:00:03 link up".into());
            }
            for line in script {
                if let Ok(Some(cmd)) = parse_line(&line) {
                    let _ = c.apply(&cmd, &mut || MacAddr([2, 0, 0, 0, 0, 0xee]));
                }
            }
            c
        })
}

fn apply_event(state: &mut ClusterState, e: &Event) -> Option<ClusterKey> {
    match e {
        Event::Put(entry) => state.insert(entry.clone()).then(|| entry.key()),
        Event::Delete(k) => state.remove(k).then(|| k.clone()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// After every batch of events (and local changes now and then), the incremental
    /// derivation equals a full one, and its commands turn the previous derived set into it.
    #[test]
    fn incremental_equals_full_derivation(
        start in proptest::collection::vec(arb_event(), 0..20),
        batches in proptest::collection::vec(
            (proptest::collection::vec(arb_event(), 1..6), proptest::option::weighted(0.1, arb_local())),
            1..25),
        local0 in arb_local(),
    ) {
        let me = h("a");
        let mut state = ClusterState::new("lab".parse().unwrap());
        for e in &start {
            apply_event(&mut state, e);
        }
        let mut local = local0;
        let mut d = Deriver::new(me.clone(), &state, &local);
        prop_assert_eq!(d.derivation(), &derive(&me, &state, &local));
        for (events, new_local) in batches {
            let keys: Vec<ClusterKey> = events.iter().filter_map(|e| apply_event(&mut state, e)).collect();
            if let Some(l) = new_local {
                local = l;
            }
            let before = d.derivation().config.clone();
            let cmds = d.update(&state, &keys, &local);
            let full = derive(&me, &state, &local);
            prop_assert_eq!(d.derivation(), &full);
            let mut applied = before;
            for c in &cmds {
                prop_assert!(applied.apply(c).is_ok(), "command {:?} not valid", c);
            }
            prop_assert_eq!(&applied, &full.config);
        }
    }
}

/// A mesh of interfaces only stays on the incremental path for other hosts' events.
#[test]
fn the_common_case_is_incremental() {
    let me = h("a");
    let mut state = ClusterState::new("lab".parse().unwrap());
    let mut local = Config::default();
    local
        .apply(
            &parse_line("interface add vm1 tap mac 02:00:00:00:00:01 vni 1")
                .unwrap()
                .unwrap(),
            &mut || MacAddr::ZERO,
        )
        .unwrap();
    for (i, id) in POOL.iter().enumerate() {
        state.insert(host(id, i as u8 + 1, &["vxlan"]));
    }
    let mut d = Deriver::new(me.clone(), &state, &local);
    let put = ClusterEntry::Interface(InterfaceRecord {
        mac: mac(9),
        vni: 1,
        host_id: h("c"),
        name: "x".into(),
        epoch: 0,
    });
    state.insert(put.clone());
    let cmds = d.update(&state, &[put.key()], &local);
    // c serves VNI 1 now: a link and the route over it.
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert_eq!((d.full, d.incremental), (1, 1));
    assert_eq!(d.derivation(), &derive(&me, &state, &local));
}
