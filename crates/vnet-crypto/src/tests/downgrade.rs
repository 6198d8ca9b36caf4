//! The downgrade rule: once a link completed a v3 handshake it initiates only v3, so forged
//! v1/v2 messages (which can only spend the old versions' budgets) cannot slow a v3 pair;
//! and a peer really rolled back to an older vnetd still links: at once when it initiates
//! and nothing floods the old versions' budget, else within a rekey interval and 3.5 s (three
//! unanswered v3 initiations, then v2, v1 and v3 in turn).

use super::*;
use crate::peer::V3_ATTEMPTS_BEFORE_FALLBACK;
use crate::wire::{
    Version, INITIATION_LEN, INITIATION_V2_LEN, MSG_INITIATION, MSG_INITIATION_V2,
    MSG_INITIATION_V3,
};

fn forged(kind: u8, len: usize, n: u32) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 5];
    m.extend((0..len - 4).map(|i| (i as u32 * 17 + n * 3) as u8));
    m[8..12].copy_from_slice(&n.to_le_bytes());
    m
}

/// Two v3 hosts after a v3 handshake.
fn v3_pair() -> (Peer, Peer) {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    handshake(&mut a, &mut b, 0);
    assert!(a.peer_speaks_v3() && b.peer_speaks_v3());
    (a, b)
}

#[test]
fn a_v3_pair_sends_only_v3_and_shrugs_off_old_version_floods() {
    let (mut a, mut b) = v3_pair();
    // Both hosts flooded with forged v1 and v2 initiations for the whole rekey.
    let mut n = 0;
    let mut flood = |p: &mut Peer, ms: u64| {
        for _ in 0..10 {
            n += 1;
            let m = match n % 2 {
                0 => forged(MSG_INITIATION_V2, INITIATION_V2_LEN, n),
                _ => forged(MSG_INITIATION, INITIATION_LEN, n),
            };
            assert!(receive(p, m, ms).is_err());
        }
    };
    let mut kinds = vec![];
    for ms in 119_000..124_000u64 {
        flood(&mut a, ms);
        flood(&mut b, ms);
        if ms % 100 == 0 {
            // The rekey's first initiations are lost: still only v3 (three in 1.5 s).
            if let Some(m) = a.tick(at(ms)) {
                kinds.push(m[0]);
                if kinds.len() == V3_ATTEMPTS_BEFORE_FALLBACK as usize {
                    let Got::Reply(r) = receive(&mut b, m, ms).unwrap() else {
                        panic!()
                    };
                    let Got::Reply(k) = receive(&mut a, r, ms).unwrap() else {
                        panic!()
                    };
                    receive(&mut b, k, ms).unwrap();
                }
            }
        }
    }
    assert_eq!(kinds, [MSG_INITIATION_V3; 3]);
    assert_eq!(a.stats.rekeys, 1);
    assert_eq!(a.current().unwrap().version(), Version::V3);
    assert!(b.stats.initiations_throttled > 0);
}

#[test]
fn after_three_unanswered_v3_initiations_older_versions_are_tried() {
    let (mut a, _b) = v3_pair();
    let mut sent = vec![];
    for ms in (120_000..140_000).step_by(100) {
        if let Some(m) = a.tick(at(ms)) {
            sent.push((ms - 120_000, m[0]));
        }
    }
    assert_eq!(
        &sent[..6],
        [
            (0, MSG_INITIATION_V3),
            (500, MSG_INITIATION_V3),
            (1_500, MSG_INITIATION_V3),
            (3_500, MSG_INITIATION_V2),
            (7_500, MSG_INITIATION),
            (12_500, MSG_INITIATION_V3),
        ]
    );
}

#[test]
fn a_peer_rolled_back_to_v2_links_again() {
    let (ka, kb) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let t = Timers::default();
    let mut a = Peer::new(ka.clone(), kb.public(), 5, t, 1);
    let mut b = Peer::new(kb.clone(), ka.public(), 5, t, 2);
    handshake(&mut a, &mut b, 0);
    assert!(a.peer_speaks_v3());
    // b's host goes back to a vnetd before v3; it initiates at its start (v2 first), and a,
    // nothing flooding it, answers at once.
    let mut old = Peer::new(kb, ka.public(), 5, t, 4_000).up_to_version(Version::V2);
    let init = old.tick(at(30_000)).unwrap();
    assert_eq!(init[0], MSG_INITIATION_V2);
    let Got::Reply(r) = receive(&mut a, init, 30_000).unwrap() else {
        panic!()
    };
    let Got::Reply(k) = receive(&mut old, r, 30_000).unwrap() else {
        panic!()
    };
    assert_eq!(receive(&mut a, k, 30_000).unwrap(), Got::Plain(vec![]));
    assert_eq!(a.current().unwrap().version(), Version::V2);
    assert!(!a.peer_speaks_v3(), "a v2 handshake ends the v3 memory");
    assert_delivers(&a, &mut old, b"after the rollback", 30_001);
}

#[test]
fn a_rolled_back_peer_links_within_a_rekey_even_under_an_old_version_flood() {
    let (ka, kb) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let t = Timers::default();
    let mut a = Peer::new(ka.clone(), kb.public(), 5, t, 1);
    let mut b = Peer::new(kb.clone(), ka.public(), 5, t, 2);
    handshake(&mut a, &mut b, 0);
    let mut old = Peer::new(kb, ka.public(), 5, t, 4_000).up_to_version(Version::V2);
    // The old host initiates from 1 s on, and an attacker floods a with forged v1/v2
    // initiations all along: a refuses the old host's (its budget is spent) until its own
    // rekey at 120 s, where three v3 initiations go unanswered and the v2 one (3.5 s later) is
    // answered.
    let mut linked_at = None;
    let mut n = 0u32;
    for ms in 1_000..140_000u64 {
        for _ in 0..10 {
            n += 1;
            let _ = receive(&mut a, forged(MSG_INITIATION_V2, INITIATION_V2_LEN, n), ms);
        }
        if ms % 100 != 0 {
            continue;
        }
        if let Some(m) = old.tick(at(ms)) {
            if let Ok(Got::Reply(r)) = receive(&mut a, m, ms) {
                panic!("a read the old host's initiation under the flood: {r:?}");
            }
        }
        if let Some(m) = a.tick(at(ms)) {
            if let Ok(Got::Reply(r)) = receive(&mut old, m, ms) {
                let Got::Reply(k) = receive(&mut a, r, ms).unwrap() else {
                    panic!()
                };
                receive(&mut old, k, ms).unwrap();
                linked_at = Some(ms);
                break;
            }
        }
    }
    let linked_at = linked_at.expect("the rolled-back peer never linked");
    assert!(
        (120_000..120_000 + 4_000).contains(&linked_at),
        "linked at {linked_at} ms"
    );
    assert_eq!(a.current().unwrap().version(), Version::V2);
    assert_delivers(&old, &mut a, b"back", linked_at);
}
