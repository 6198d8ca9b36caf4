//! The v3 checks one at a time, on a peer fed by hand: what is refused unread and why
//! (`bad_mac`, `cookie required`, replay, budget), that each budget is spent only by its own
//! kind, and cookie replies: when they are sent, their rate and size, and that the genuine
//! peer (and only it) gets through with the cookie.

use super::*;
use crate::cookie::{add_macs, mac1_key};
use crate::peer::{
    COOKIE_REPLY_BURST, COOKIE_REPLY_REFILL_MS, INITIATION_BURST, INITIATION_REFILL_MS,
    RESPONSE_BURST,
};
use crate::wire::{
    Version, COOKIE_REPLY_LEN, INITIATION_V2_LEN, INITIATION_V3_LEN, MSG_COOKIE_REPLY,
    MSG_INITIATION_V2, MSG_INITIATION_V3, MSG_RESPONSE_V3, RESPONSE_V3_LEN,
};
use crate::PublicKey;

/// A v3 initiation an attacker who knows `to`'s public key makes: a good `mac1`, garbage
/// Noise (a fresh ephemeral key each `n`), no `mac2`.
fn forged_v3(to: &PublicKey, n: u32) -> Vec<u8> {
    let mut m = vec![MSG_INITIATION_V3, 0, 0, 5];
    m.extend_from_slice(&n.to_le_bytes());
    m.extend((0..INITIATION_V3_LEN - 8).map(|i| (i as u32 * 31 + n * 7) as u8));
    m[8..12].copy_from_slice(&n.to_le_bytes());
    add_macs(&mut m, &mac1_key(to), None);
    m
}

fn forged_v2(n: u32) -> Vec<u8> {
    let mut m = vec![MSG_INITIATION_V2, 0, 0, 5];
    m.extend((0..INITIATION_V2_LEN - 4).map(|i| (i as u32 * 13 + n) as u8));
    m[8..12].copy_from_slice(&n.to_le_bytes());
    m
}

/// The public key of `p`'s peer (of a pair, each knows the other's).
fn key_of_peer(p: &Peer) -> PublicKey {
    p.remote()
}

#[test]
fn without_the_receivers_key_nothing_is_read() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let stranger = PrivateKey::generate().unwrap().public();
    for n in 0..10_000u32 {
        // 10 000 a second: mac1 made for another key, or garbage
        let m = match n % 2 {
            0 => forged_v3(&stranger, n),
            _ => {
                let mut m = forged_v3(&key_of_peer(&a), n);
                m[INITIATION_V3_LEN - 20] ^= 1;
                m
            }
        };
        assert_eq!(receive(&mut b, m, n as u64 / 10), Err(CryptoError::BadMac));
    }
    assert_eq!(b.stats.bad_macs, 10_000);
    assert_eq!(b.stats.handshakes_read, 0);
    assert_eq!(
        b.stats.cookie_replies_sent, 0,
        "no reply to a sender without the key"
    );
    // The genuine peer gets through at once: the flood spent nothing.
    handshake(&mut a, &mut b, 1_000);
    assert_eq!(b.current().unwrap().version(), Version::V3);
}

#[test]
fn under_load_a_cookie_is_required_and_the_peer_gets_one() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let b_key = key_of_peer(&a);
    // Forged initiations with good mac1s: read until the budget runs low (under half its
    // tokens left), then refused unread for want of mac2, each answered with a cookie reply
    // (to the link's peer, a) while the replies' own budget lasts.
    let mut replies = vec![];
    let mut refused = 0;
    for n in 0..1_000u32 {
        let r = receive(&mut b, forged_v3(&b_key, n), 0);
        match r {
            Err(CryptoError::BadHandshake) => {}
            Err(CryptoError::CookieRequired) => refused += 1,
            r => panic!("{r:?}"),
        }
        replies.extend(b.take_cookie_reply());
    }
    let read = INITIATION_BURST - INITIATION_BURST / 2 + 1;
    assert_eq!(b.stats.handshakes_read, read);
    assert_eq!(refused, 1_000 - read);
    assert_eq!(replies.len() as u64, COOKIE_REPLY_BURST);
    assert_eq!(
        b.stats.cookie_replies_suppressed,
        1_000 - read - COOKIE_REPLY_BURST
    );
    for r in &replies {
        // No larger than what it answers: no amplification.
        assert_eq!(r.len(), COOKIE_REPLY_LEN);
        assert!(r.len() < INITIATION_V3_LEN && r[0] == MSG_COOKIE_REPLY);
    }
    // a's initiation without a cookie is refused too.
    let init = a.tick(at(0)).unwrap();
    assert_eq!(receive(&mut b, init, 1), Err(CryptoError::CookieRequired));
    // A cookie reply (any of them: whichever message it answered, only a can open it) gives a
    // the cookie; its next initiation goes at the next tick, not after the backoff, with a
    // mac2, and is answered.
    assert_eq!(
        receive(&mut a, replies[0].clone(), 2),
        Ok(Got::Reply(vec![]))
    );
    assert_eq!(a.stats.cookie_replies_received, 1);
    let init = a.tick(at(100)).expect("an initiation at the next tick");
    assert_eq!(init[0], MSG_INITIATION_V3, "a speaks v3 to b now");
    assert_ne!(init[INITIATION_V3_LEN - 16..], [0; 16]);
    let Got::Reply(resp) = receive(&mut b, init, 100).unwrap() else {
        panic!("no response");
    };
    let Got::Reply(k) = receive(&mut a, resp, 100).unwrap() else {
        panic!("no keepalive");
    };
    assert_eq!(receive(&mut b, k, 100).unwrap(), Got::Plain(vec![]));
    assert_eq!(b.current().unwrap().version(), Version::V3);
    // The same reply again (replayed) changes nothing; one made for another link, or sent
    // back to b, does not open.
    assert_eq!(
        receive(&mut a, replies[1].clone(), 200),
        Ok(Got::Reply(vec![]))
    );
    assert_eq!(
        receive(&mut b, replies[2].clone(), 200),
        Err(CryptoError::BadMac)
    );
    let (mut c, _) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    assert_eq!(
        receive(&mut c, replies[3].clone(), 0),
        Err(CryptoError::BadMac)
    );
    // Cookie replies come back at 10 a second at most.
    let mut more = 0;
    for ms in 1..=1_000u64 {
        let _ = receive(&mut b, forged_v3(&b_key, 5_000 + ms as u32), ms);
        more += b.take_cookie_reply().is_some() as u64;
    }
    assert!(more <= 1_000 / COOKIE_REPLY_REFILL_MS + 1, "{more}");
}

#[test]
fn replays_are_refused_before_any_work() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let init = a.tick(at(0)).unwrap();
    assert!(matches!(
        receive(&mut b, init.clone(), 0),
        Ok(Got::Reply(_))
    ));
    let read = b.stats.handshakes_read;
    for ms in 1..1_000 {
        assert_eq!(receive(&mut b, init.clone(), ms), Err(CryptoError::Replay));
    }
    assert_eq!(b.stats.handshakes_read, read, "a replay is never read");
    assert_eq!(b.stats.initiations_replayed, 999);
    // The budget is untouched: a's next initiation is answered.
    let init = a.tick(at(1_000)).unwrap();
    assert!(matches!(receive(&mut b, init, 1_000), Ok(Got::Reply(_))));
}

#[test]
fn each_kind_has_its_own_budget() {
    // A flood of forged v2 initiations spends the old versions' budget only: v3 is answered.
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let mut throttled = 0;
    for n in 0..1_000 {
        if receive(&mut b, forged_v2(n), 0) == Err(CryptoError::Throttled) {
            throttled += 1;
        }
    }
    assert_eq!(throttled, 1_000 - INITIATION_BURST);
    handshake(&mut a, &mut b, 0);
    assert_eq!(b.current().unwrap().version(), Version::V3);
    // ... while a genuine v2 initiation is refused until the budget refills.
    let (a, mut b2) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let mut a = a.up_to_version(Version::V2);
    for n in 0..100 {
        let _ = receive(&mut b2, forged_v2(n), 0);
    }
    let init = a.tick(at(0)).unwrap();
    assert_eq!(receive(&mut b2, init, 0), Err(CryptoError::Throttled));
    let init = a.tick(at(INITIATION_REFILL_MS * 3)).unwrap();
    assert!(matches!(
        receive(&mut b2, init, INITIATION_REFILL_MS * 3),
        Ok(Got::Reply(_))
    ));

    // Forged v3 responses (good mac1, the pending initiation's index: it travels in clear)
    // spend the responses' budget, and then need a cookie; initiations are untouched. Here
    // at a rekey of a v3 pair.
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    handshake(&mut a, &mut b, 0);
    let t = 120_000;
    let a_key = key_of_peer(&b);
    let init = a.tick(at(t)).unwrap();
    let index = u32::from_le_bytes(init[4..8].try_into().unwrap());
    let forged_response = |n: u32| {
        let mut m = vec![MSG_RESPONSE_V3, 0, 0, 5];
        m.extend((0..RESPONSE_V3_LEN - 4).map(|i| (i as u32 * 29 + n) as u8));
        m[8..12].copy_from_slice(&index.to_le_bytes());
        add_macs(&mut m, &mac1_key(&a_key), None);
        m
    };
    let read = a.stats.handshakes_read;
    let mut to_b = vec![];
    for n in 0..100 {
        let r = receive(&mut a, forged_response(n), t + 1);
        assert!(
            matches!(
                r,
                Err(CryptoError::BadHandshake | CryptoError::CookieRequired)
            ),
            "{r:?}"
        );
        to_b.extend(a.take_cookie_reply());
    }
    assert_eq!(
        a.stats.handshakes_read - read,
        RESPONSE_BURST - RESPONSE_BURST / 2 + 1
    );
    assert_eq!(a.stats.initiations_throttled, 0);
    assert!(a.current().is_some(), "forged responses cancel nothing");
    // b's genuine response has no mac2 (it holds no cookie of a's): refused, unread.
    let Got::Reply(resp) = receive(&mut b, init, t + 2).unwrap() else {
        panic!()
    };
    assert_eq!(
        receive(&mut a, resp, t + 2),
        Err(CryptoError::CookieRequired)
    );
    // With a's cookie reply b answers the next initiation with a mac2, and it is read.
    assert!(!to_b.is_empty());
    assert_eq!(
        receive(&mut b, to_b[0].clone(), t + 3),
        Ok(Got::Reply(vec![]))
    );
    let init = a.tick(at(t + 600)).unwrap();
    assert_eq!(init[0], MSG_INITIATION_V3);
    let Got::Reply(resp) = receive(&mut b, init, t + 600).unwrap() else {
        panic!()
    };
    let Got::Reply(k) = receive(&mut a, resp, t + 600).unwrap() else {
        panic!("the response with mac2 was refused")
    };
    assert_eq!(receive(&mut b, k, t + 600).unwrap(), Got::Plain(vec![]));
    assert_eq!(a.current().unwrap().version(), Version::V3);
    assert_eq!(a.stats.rekeys, 1);
}

#[test]
fn cookie_replies_are_sent_only_for_messages_with_the_key() {
    let (a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    // b under load (good-mac1 forgeries), its cookie replies' budget refilled: a forgery
    // without b's key gets no reply (it is refused for its mac1 first).
    for n in 0..100 {
        let _ = receive(&mut b, forged_v3(&key_of_peer(&a), n), 0);
        let _ = b.take_cookie_reply();
    }
    let required = b.stats.cookies_required;
    assert!(required > 0);
    let stranger = PrivateKey::generate().unwrap().public();
    for n in 0..1_000 {
        let ms = 1_000 + n as u64;
        assert_eq!(
            receive(&mut b, forged_v3(&stranger, n), ms),
            Err(CryptoError::BadMac)
        );
        assert!(b.take_cookie_reply().is_none());
    }
    assert_eq!(b.stats.cookies_required, required);
}
