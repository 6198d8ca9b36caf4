//! The route list's tests: its counting tree and index, squeezing out empty slots, and a
//! property test that it behaves as a plain list under generated operations.

use super::*;
use crate::command::DestKind;
use proptest::prelude::*;
use vnet_wire::MacAddr;

fn mac(n: u8) -> MacMatch {
    MacMatch::Exact(MacAddr([2, 0, 0, 0, 0, n]))
}

fn route(src: u8, dst: u8, to: u8) -> Route {
    Route {
        src: if src == 0 { MacMatch::Any } else { mac(src) },
        dst: mac(dst),
        to: DestRef {
            kind: if to.is_multiple_of(2) {
                DestKind::Link
            } else {
                DestKind::Interface
            },
            name: format!("p{to}"),
        },
    }
}

#[test]
fn the_tree_counts_and_finds() {
    let mut f = Fenwick::default();
    let bits = [1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1];
    for b in bits {
        f.push(b);
    }
    assert_eq!(f.tree.len(), bits.len());
    for slot in 0..=bits.len() {
        assert_eq!(f.before(slot), bits[..slot].iter().sum::<u32>(), "{slot}");
    }
    let live: Vec<usize> = (0..bits.len()).filter(|&i| bits[i] == 1).collect();
    for (k, &s) in live.iter().enumerate() {
        assert_eq!(f.slot_of(k), s, "route {k}");
    }
    f.add(2, -1);
    assert_eq!(f.before(4), 2);
    assert_eq!(f.slot_of(1), 3);
    let g = Fenwick::full(13);
    assert_eq!((g.before(13), g.slot_of(12), g.slot_of(0)), (13, 12, 0));
}

#[test]
fn a_list_with_an_index() {
    let mut r = Routes::new();
    for (s, d, t) in [(0, 1, 2), (0, 2, 2), (3, 1, 4), (0, 1, 4)] {
        r.push(route(s, d, t));
    }
    assert_eq!(r.len(), 4);
    let k: Vec<usize> = r
        .with_key(MacMatch::Any, mac(1))
        .iter()
        .map(|x| x.0)
        .collect();
    assert_eq!(k, vec![0, 3]);
    assert_eq!(r.position(&route(0, 1, 4)), Some(3));
    assert!(!r.contains(&route(0, 1, 6)));
    assert_eq!(r.remove(1), route(0, 2, 2));
    assert_eq!(r.get(1), Some(&route(3, 1, 4)));
    let gone = r.remove_to(&route(0, 0, 4).to);
    assert_eq!(gone, vec![(1, route(3, 1, 4)), (1, route(0, 1, 4))]);
    assert_eq!(r.to_vec(), vec![route(0, 1, 2)]);
    r.insert(0, route(0, 9, 2));
    assert_eq!(r.to_vec(), vec![route(0, 9, 2), route(0, 1, 2)]);
    assert_eq!(format!("{r:?}"), format!("{:?}", r.to_vec()));
}

#[derive(Debug, Clone)]
enum Op {
    Push(u8, u8, u8),
    Remove(usize),
    Insert(usize, u8, u8, u8),
    RemoveTo(u8),
    Retain(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 1..6u8, 0..4u8).prop_map(|(s, d, t)| Op::Push(s, d, t)),
        4 => (0..64usize).prop_map(Op::Remove),
        2 => (0..64usize, 0..3u8, 1..6u8, 0..4u8).prop_map(|(p, s, d, t)| Op::Insert(p, s, d, t)),
        1 => (0..4u8).prop_map(Op::RemoveTo),
        1 => (0..4u8).prop_map(Op::Retain),
    ]
}

proptest! {
    /// Every operation does to `Routes` what it does to a `Vec` of the same routes, and every
    /// lookup through the indexes finds what a scan of the `Vec` finds; the empty slots that
    /// removals leave (and their squeezing) never show.
    #[test]
    fn routes_behave_as_a_list(ops in proptest::collection::vec(op(), 1..300)) {
        let mut r = Routes::new();
        let mut v: Vec<Route> = Vec::new();
        for o in ops {
            match o {
                Op::Push(s, d, t) => {
                    r.push(route(s, d, t));
                    v.push(route(s, d, t));
                }
                Op::Remove(p) if !v.is_empty() => {
                    let p = p % v.len();
                    prop_assert_eq!(r.remove(p), v.remove(p));
                }
                Op::Insert(p, s, d, t) => {
                    let p = p % (v.len() + 1);
                    r.insert(p, route(s, d, t));
                    v.insert(p, route(s, d, t));
                }
                Op::RemoveTo(t) => {
                    let to = route(0, 1, t).to;
                    let mut replay = v.clone();
                    for (at, x) in r.remove_to(&to) {
                        prop_assert_eq!(replay.remove(at), x);
                    }
                    v.retain(|x| x.to != to);
                    prop_assert_eq!(&replay, &v);
                }
                Op::Retain(t) => {
                    r.retain(|x| x.to.name != format!("p{t}"));
                    v.retain(|x| x.to.name != format!("p{t}"));
                }
                Op::Remove(_) => {}
            }
            prop_assert_eq!(r.len(), v.len());
            prop_assert_eq!(&r.to_vec(), &v);
            prop_assert!(r.iter().rev().eq(v.iter().rev()));
            for (i, x) in v.iter().enumerate() {
                prop_assert_eq!(r.get(i), Some(x));
                prop_assert_eq!(r.position(x), v.iter().position(|y| y == x));
                prop_assert_eq!(r.rposition(x), v.iter().rposition(|y| y == x));
                prop_assert!(r.contains(x));
                let want: Vec<(usize, &Route)> = v
                    .iter()
                    .enumerate()
                    .filter(|(_, y)| y.src == x.src && y.dst == x.dst)
                    .collect();
                prop_assert_eq!(r.with_key(x.src, x.dst), want);
            }
            prop_assert_eq!(r.get(v.len()), None);
            prop_assert_eq!(r.clone(), Routes::from(v.clone()));
        }
    }
}

/// Many removals squeeze the empty slots out; the list, its positions and its indexes are
/// as they were, and an undo of a removal from before the squeeze still puts the route back.
#[test]
fn empty_slots_are_squeezed_out() {
    let mut r = Routes::new();
    let all: Vec<Route> = (0..200u32)
        .map(|i| route((i % 3) as u8, (i % 50) as u8 + 1, (i % 7) as u8))
        .collect();
    for x in &all {
        r.push(x.clone());
    }
    let mut v = all.clone();
    let mut undo = Vec::new();
    for k in 0..150 {
        let p = (k * 7) % v.len();
        undo.push((p, v.remove(p)));
        r.remove(p);
    }
    assert!(r.slots.len() < 200, "squeezed: {} slots", r.slots.len());
    assert_eq!(r.to_vec(), v);
    for (p, x) in undo.into_iter().rev() {
        r.insert(p, x.clone());
        v.insert(p, x);
    }
    assert_eq!(v, all);
    assert_eq!(r, Routes::from(all));
}
