//! Tests of `compile.rs`, in a file of their own so that the module reads as what it does.

use super::*;
use proptest::prelude::*;
use vnet_core::{Decision, ForwardingTable, PortInfo, PortKind};

fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, last])
}

fn port(id: u32, vni: u32, egress: Egress) -> CompilePort {
    CompilePort {
        id: PortId(id),
        vni,
        egress,
    }
}

fn rule(vni: u32, src: MacMatch, dst: MacMatch, dest: u32) -> RouteRule {
    RouteRule {
        vni,
        src,
        dst,
        dest: PortId(dest),
    }
}

fn ports() -> Vec<CompilePort> {
    vec![
        port(1, 1, Egress::FastPort),
        port(2, 1, Egress::FastPort),
        port(3, 1, Egress::UdpLink),
        port(4, 1, Egress::Other),
        port(5, 2, Egress::FastPort),
    ]
}

#[test]
fn destination_rules_are_one_entry_each() {
    let rules = [
        rule(1, MacMatch::Any, MacMatch::Exact(mac(2)), 2),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(3)), 3),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(4)), 4),
    ];
    let t = compile(&ports(), &rules, false);
    assert_eq!(t.len(), 3);
    assert_eq!(t.lookup(1, mac(1), mac(2)), Action::Port(PortId(2)));
    assert_eq!(t.lookup(1, mac(1), mac(3)), Action::Link(PortId(3)));
    assert_eq!(t.lookup(1, mac(1), mac(4)), Action::Slow);
    assert_eq!(t.lookup(1, mac(1), mac(9)), Action::None);
    assert_eq!(t.lookup(2, mac(1), mac(2)), Action::None);
}

#[test]
fn source_rules_are_checked_first_only_where_they_exist() {
    let rules = [
        rule(1, MacMatch::Any, MacMatch::Exact(mac(2)), 2),
        rule(1, MacMatch::Exact(mac(7)), MacMatch::Exact(mac(2)), 3),
        rule(1, MacMatch::Exact(mac(8)), MacMatch::Any, 1),
    ];
    let t = compile(&ports(), &rules, false);
    assert_eq!(t.lookup(1, mac(7), mac(2)), Action::Link(PortId(3)));
    assert_eq!(t.lookup(1, mac(6), mac(2)), Action::Port(PortId(2)));
    assert_eq!(t.lookup(1, mac(8), mac(9)), Action::Port(PortId(1)));
    assert_eq!(t.lookup(1, mac(6), mac(9)), Action::None);
}

#[test]
fn not_rules_and_multiple_targets_are_slow() {
    let rules = [
        rule(1, MacMatch::Not(mac(7)), MacMatch::Exact(mac(2)), 2),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(3)), 1),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(3)), 2),
        rule(1, MacMatch::Any, MacMatch::Not(mac(5)), 3),
    ];
    let t = compile(&ports(), &rules, false);
    assert_eq!(t.lookup(1, mac(1), mac(2)), Action::Slow);
    assert_eq!(t.lookup(1, mac(1), mac(3)), Action::Slow);
    assert_eq!(t.lookup(1, mac(1), mac(9)), Action::Slow);
    assert!(compile(&ports(), &rules, true).is_empty());
}

#[test]
fn plan_orders_writes_and_keeps_unchanged_entries() {
    let a = compile(
        &ports(),
        &[
            rule(1, MacMatch::Any, MacMatch::Exact(mac(2)), 2),
            rule(1, MacMatch::Any, MacMatch::Exact(mac(3)), 3),
        ],
        false,
    );
    let b = compile(
        &ports(),
        &[
            rule(1, MacMatch::Any, MacMatch::Exact(mac(2)), 2),
            rule(1, MacMatch::Any, MacMatch::Exact(mac(3)), 1),
            rule(1, MacMatch::Any, MacMatch::Exact(mac(9)), 3),
        ],
        false,
    );
    let p = plan_update(&a.entries, &b, 100);
    assert_eq!(p.upserts.len(), 2, "changed mac(3) and new mac(9) only");
    assert!(p.deletes.is_empty());
    assert_eq!(p.result, b.entries);
    let back = plan_update(&b.entries, &a, 100);
    assert_eq!(back.deletes.len(), 1);
}

#[test]
fn a_full_table_degrades_to_slow_never_elsewhere() {
    let rules = [
        rule(1, MacMatch::Any, MacMatch::Any, 3),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(2)), 2),
        rule(1, MacMatch::Any, MacMatch::Exact(mac(4)), 1),
    ];
    let t = compile(&ports(), &rules, false);
    assert_eq!(t.len(), 3);
    // room for the fallback and one destination only
    let p = plan_update(&BTreeMap::new(), &t, 2);
    assert_eq!(p.left_out, 1);
    let got = CompiledTable { entries: p.result };
    for d in [2, 4, 9] {
        let a = got.lookup(1, mac(1), mac(d));
        let want = t.lookup(1, mac(1), mac(d));
        assert!(a == want || a == Action::Slow, "{d}: {a:?} vs {want:?}");
    }
    assert_eq!(got.lookup(1, mac(1), mac(9)), Action::Slow);
}

// ---- the property: the kernel's decision is slow or decide()'s single target ----

fn arb_mac() -> impl Strategy<Value = MacAddr> {
    prop_oneof![
        8 => (1u8..7).prop_map(mac),
        1 => Just(MacAddr::BROADCAST),
        1 => Just(MacAddr([0x33, 0x33, 0, 0, 0, 1])),
    ]
}

fn arb_match() -> impl Strategy<Value = MacMatch> {
    prop_oneof![
        3 => Just(MacMatch::Any),
        5 => arb_mac().prop_map(MacMatch::Exact),
        1 => arb_mac().prop_map(MacMatch::Not),
    ]
}

fn arb_egress() -> impl Strategy<Value = (Egress, PortKind)> {
    prop_oneof![
        Just((Egress::FastPort, PortKind::Interface)),
        Just((Egress::UdpLink, PortKind::OverlayLink)),
        Just((Egress::Other, PortKind::Interface)),
        Just((Egress::Other, PortKind::OverlayLink)),
        Just((Egress::Other, PortKind::DirectLink)),
    ]
}

type Case = (
    Vec<(u32, Egress, PortKind)>,
    Vec<(u32, MacMatch, MacMatch, u32)>,
);

/// The ports of a case, numbered in order.
fn case_ports(pspecs: &[(u32, Egress, PortKind)]) -> Vec<CompilePort> {
    pspecs
        .iter()
        .enumerate()
        .map(|(i, (vni, e, _))| port(i as u32, *vni, *e))
        .collect()
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(
            (1u32..3, arb_egress()).prop_map(|(v, (e, k))| (v, e, k)),
            1..7,
        ),
        prop::collection::vec((1u32..3, arb_match(), arb_match(), 0u32..8), 0..14),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn kernel_decision_is_slow_or_exactly_decide(
        case in arb_case(),
        frames in prop::collection::vec((0usize..8, arb_mac(), arb_mac()), 1..24),
        learning in prop::bool::weighted(0.1),
        capacity in prop_oneof![Just(10_000usize), 0usize..6],
    ) {
        let (pspecs, rspecs) = case;
        let ports = case_ports(&pspecs);
        let rules: Vec<RouteRule> = rspecs
            .iter()
            .map(|(vni, s, d, dest)| rule(*vni, *s, *d, *dest))
            .collect();
        let table = ForwardingTable::new(
            1,
            pspecs.iter().enumerate().map(|(i, (vni, _, k))| {
                (PortId(i as u32), PortInfo { vni: *vni, kind: *k })
            }),
            rules.iter().copied(),
        );
        let full = compile(&ports, &rules, learning);
        // The table as the kernel holds it, also when the map was too small for it.
        let compiled = CompiledTable {
            entries: plan_update(&BTreeMap::new(), &full, capacity).result,
        };
        for (i, src, dst) in frames {
            let ingress = ports[i % ports.len()];
            if ingress.egress == Egress::Other {
                continue; // the programs only run on fast-path ports and udp links
            }
            let kd = kernel_decision(&compiled, ingress, src, dst);
            if let KernelDecision::Forward(p) = kd {
                let d = table.decide(ingress.id, src, dst, learning, None);
                prop_assert_eq!(
                    d,
                    Decision::Forward(vec![p]),
                    "ingress {:?} {} -> {}", ingress, src, dst
                );
            }
        }
    }
}

// ---- the property: incremental recompilation equals a full compile ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    /// Any sequence of rule insertions and removals, applied to a forwarding table and
    /// recompiled at the destinations each touches, gives the table a full compile of the
    /// final rules gives (the incremental path of `vnet-dataplane`'s engine).
    #[test]
    fn recompiling_touched_destinations_equals_a_full_compile(
        case in arb_case(),
        ops in prop::collection::vec((any::<bool>(), 0usize..14, (1u32..3, arb_match(), arb_match(), 0u32..8)), 0..30),
    ) {
        let (pspecs, rspecs) = case;
        let ports = case_ports(&pspecs);
        let infos = pspecs.iter().enumerate().map(|(i, (vni, _, k))| {
            (PortId(i as u32), PortInfo { vni: *vni, kind: *k })
        });
        let mut rules: Vec<RouteRule> = rspecs
            .iter()
            .map(|(vni, s, d, dest)| rule(*vni, *s, *d, *dest))
            .collect();
        let mut ft = ForwardingTable::new(1, infos, rules.iter().copied());
        let mut table = compile(&ports, &rules, false);
        let by_id: BTreeMap<PortId, CompilePort> = ports.iter().map(|p| (p.id, *p)).collect();
        for (add, pick, (vni, s, d, dest)) in ops {
            let r = if add || rules.is_empty() {
                rule(vni, s, d, dest)
            } else {
                rules[pick % rules.len()]
            };
            let changed = if add || rules.is_empty() {
                rules.push(r);
                ft.insert_route(r)
            } else {
                let p = rules.iter().position(|x| *x == r).unwrap();
                rules.remove(p);
                ft.remove_route(&r)
            };
            if changed {
                let t = match r.dst {
                    MacMatch::Exact(m) => Touched::Dst(r.vni, m),
                    _ => Touched::Wild(r.vni),
                };
                recompile(&mut table, ft.routes(), &[t], |id| by_id.get(&id).copied(), false);
            }
            prop_assert_eq!(&table, &compile(&ports, &rules, false));
        }
    }
}
