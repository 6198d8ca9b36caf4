//! `peer`'s tests: two peers driven against each other's messages and a shared clock:
//! handshakes, retransmission, rekeying, replays, expiry, forgeries, and generated hostile or
//! truncated messages.

use super::*;
use proptest::prelude::*;

fn pair() -> (Peer, Peer) {
    let (a, b) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let t = Timers::default();
    (
        Peer::new(a.clone(), b.public(), 5, t, 100),
        Peer::new(b, a.public(), 5, t, 900),
    )
}

fn at(ms: u64) -> Now {
    Now {
        mono_ms: ms,
        wall_ns: 1_700_000_000_000_000_000 + ms * 1_000_000,
    }
}

/// Delivers one data message from `from` to `to`; returns the plaintext.
fn deliver(to: &mut Peer, dgram: &[u8], now: u64) -> Result<Vec<u8>, CryptoError> {
    match Message::parse(dgram)? {
        Message::Data {
            receiver,
            counter,
            ciphertext,
            ..
        } => {
            let s = to
                .receiving_session(receiver, now)
                .ok_or(CryptoError::NoSession)?;
            let mut out = vec![0u8; ciphertext.len()];
            let n = s.open(counter, ciphertext, &mut out)?;
            to.confirm(&s);
            out.truncate(n);
            Ok(out)
        }
        m => to.handle_handshake(&m, at(now)).map(|_| vec![]),
    }
}

/// `to`'s answer to the handshake message `msg` at `now` ms (a response, or the keepalive that
/// confirms one).
fn answer(to: &mut Peer, msg: &[u8], now: u64) -> Result<Vec<u8>, CryptoError> {
    to.handle_handshake(&Message::parse(msg).unwrap(), at(now))
}

fn seal(p: &Peer, data: &[u8], now: u64) -> Vec<u8> {
    let mut out = Vec::new();
    p.sending_session(now)
        .expect("session")
        .seal(&[data], &mut Vec::new(), &mut out)
        .unwrap();
    out
}

/// A full handshake, a initiating; returns nothing, both sides established.
fn handshake(a: &mut Peer, b: &mut Peer, now: u64) {
    let init = a.tick(at(now)).expect("initiation");
    let resp = answer(b, &init, now).unwrap();
    let keepalive = answer(a, &resp, now).unwrap();
    assert_eq!(deliver(b, &keepalive, now).unwrap(), Vec::<u8>::new());
}

#[test]
fn handshake_and_data() {
    let (mut a, mut b) = pair();
    assert_eq!(a.state(), "none");
    assert!(a.sending_session(0).is_none());
    handshake(&mut a, &mut b, 0);
    assert_eq!((a.state(), b.state()), ("established", "established"));
    let d = seal(&a, b"hello", 1);
    assert_eq!(d.len(), 5 + crate::DATA_OVERHEAD);
    assert_eq!(deliver(&mut b, &d, 1).unwrap(), b"hello");
    let back = seal(&b, b"world", 1);
    assert_eq!(deliver(&mut a, &back, 1).unwrap(), b"world");
    // Replayed data is refused.
    assert_eq!(deliver(&mut b, &d, 2), Err(CryptoError::Replay));
}

#[test]
fn tampering_is_detected() {
    let (mut a, mut b) = pair();
    handshake(&mut a, &mut b, 0);
    let d = seal(&a, &[0x55; 100], 1);
    for i in [16, 40, d.len() - 1] {
        let mut t = d.clone();
        t[i] ^= 1;
        assert_eq!(
            deliver(&mut b, &t, 1),
            Err(CryptoError::BadAuth),
            "byte {i}"
        );
    }
    // A changed counter is a different nonce: authentication fails too.
    let mut t = d.clone();
    t[9] ^= 1;
    assert_eq!(deliver(&mut b, &t, 1), Err(CryptoError::BadAuth));
    // A counter moved back onto one already accepted (the keepalive's 0) is a replay.
    let mut t = d.clone();
    t[8] = 0;
    assert_eq!(deliver(&mut b, &t, 1), Err(CryptoError::Replay));
    // Tampering did not consume the counter: the genuine message still arrives.
    assert_eq!(deliver(&mut b, &d, 1).unwrap(), vec![0x55; 100]);
}

#[test]
fn replayed_initiation_is_refused() {
    let (mut a, mut b) = pair();
    let init = a.tick(at(0)).unwrap();
    let m = Message::parse(&init).unwrap();
    assert!(b.handle_handshake(&m, at(0)).is_ok());
    assert_eq!(b.handle_handshake(&m, at(10)), Err(CryptoError::Replay));
    assert_eq!(b.stats.initiations_replayed, 1);
}

#[test]
fn wrong_key_gets_no_session() {
    let (mut a, _) = pair();
    let (_, mut c) = pair(); // c expects someone else
                             // A v3 initiation's mac1 is for b's key: c refuses it unread.
    let init = a.tick(at(0)).unwrap();
    assert_eq!(init[0], wire::MSG_INITIATION_V3);
    assert_eq!(answer(&mut c, &init, 0), Err(CryptoError::BadMac));
    assert_eq!(c.stats.bad_macs, 1);
    // The v2 retransmission has no MAC: c reads it, and it does not authenticate.
    let init = a.tick(at(500)).unwrap();
    assert_eq!(init[0], wire::MSG_INITIATION_V2);
    assert_eq!(answer(&mut c, &init, 500), Err(CryptoError::BadHandshake));
    assert_eq!(c.stats.bad_handshakes, 1);
    assert_eq!(c.state(), "none");
}

#[test]
fn retransmits_with_backoff() {
    let (mut a, _) = pair();
    let mut sent = vec![];
    for ms in (0..20_000).step_by(100) {
        if a.tick(at(ms)).is_some() {
            sent.push(ms);
        }
    }
    // 0, 500, 1500, 3500, 7500, then every 5 s.
    assert_eq!(&sent[..5], &[0, 500, 1500, 3500, 7500]);
    assert_eq!(sent[5] - sent[4], 5000);
    // Each retransmission is a fresh initiation (new index), so a late response to an old
    // one is refused.
    assert_eq!(a.stats.initiations_sent as usize, sent.len());
}

#[test]
fn peer_restart_rehandshakes() {
    let (mut a, mut b) = pair();
    handshake(&mut a, &mut b, 0);
    let d = seal(&a, b"x", 1);
    deliver(&mut b, &d, 1).unwrap();
    // b restarts: same keys, no state. Its new initiation carries a later time.
    let (bk, ak) = (b.local.clone(), a.local.public());
    let mut b2 = Peer::new(bk, ak, 5, Timers::default(), 7);
    // a's old session is useless to b2.
    assert_eq!(
        deliver(&mut b2, &seal(&a, b"y", 2), 2),
        Err(CryptoError::NoSession)
    );
    handshake(&mut b2, &mut a, 5_000);
    assert_eq!(
        deliver(&mut b2, &seal(&a, b"z", 5_001), 5_001).unwrap(),
        b"z"
    );
    assert_eq!(
        deliver(&mut a, &seal(&b2, b"w", 5_001), 5_001).unwrap(),
        b"w"
    );
}

#[test]
fn rekeys_after_time_and_keeps_previous() {
    let (mut a, mut b) = pair();
    handshake(&mut a, &mut b, 0);
    let old = seal(&a, b"in flight", 1);
    assert!(a.tick(at(60_000)).is_none());
    handshake(&mut a, &mut b, 120_000);
    assert_eq!(a.stats.rekeys, 1);
    // The old session still receives until it expires.
    assert_eq!(deliver(&mut b, &old, 120_001).unwrap(), b"in flight");
    let new = seal(&a, b"new", 120_001);
    assert_eq!(deliver(&mut b, &new, 120_001).unwrap(), b"new");
}

#[test]
fn rekeys_after_messages() {
    let (a, b) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let t = Timers {
        rekey_after_messages: 10,
        reject_after_messages: 20,
        ..Timers::default()
    };
    let mut pa = Peer::new(a.clone(), b.public(), 1, t, 1);
    let mut pb = Peer::new(b, a.public(), 1, t, 2);
    handshake(&mut pa, &mut pb, 0);
    // The keepalive was message 1.
    for _ in 0..8 {
        seal(&pa, b"m", 1);
    }
    assert!(pa.tick(at(2)).is_none(), "9 messages: no rekey yet");
    seal(&pa, b"m", 1);
    assert!(pa.tick(at(3)).is_some(), "rekey after 10 messages");
    for _ in 0..10 {
        seal(&pa, b"m", 3);
    }
    assert!(pa.sending_session(3).is_none(), "refused after 20 messages");
}

#[test]
fn expired_session_is_dropped() {
    let (mut a, mut b) = pair();
    handshake(&mut a, &mut b, 0);
    let d = seal(&a, b"late", 1);
    b.tick(at(180_000));
    assert_eq!(deliver(&mut b, &d, 180_000), Err(CryptoError::NoSession));
}

#[test]
fn simultaneous_initiations_both_work() {
    let (mut a, mut b) = pair();
    let ia = a.tick(at(0)).unwrap();
    let ib = b.tick(at(0)).unwrap();
    let ra = answer(&mut b, &ia, 0).unwrap();
    let rb = answer(&mut a, &ib, 0).unwrap();
    let ka = answer(&mut a, &ra, 0).unwrap();
    let kb = answer(&mut b, &rb, 0).unwrap();
    deliver(&mut b, &ka, 0).unwrap();
    deliver(&mut a, &kb, 0).unwrap();
    assert_eq!(deliver(&mut b, &seal(&a, b"1", 1), 1).unwrap(), b"1");
    assert_eq!(deliver(&mut a, &seal(&b, b"2", 1), 1).unwrap(), b"2");
}

#[test]
fn forged_response_does_not_cancel_the_handshake() {
    let (mut a, mut b) = pair();
    let init = a.tick(at(0)).unwrap();
    let resp = answer(&mut b, &init, 0).unwrap();
    // An attacker who saw the initiation answers first, with the right receiver index and
    // garbage where the Noise message goes: refused unread for its MAC, or, if it knows a's
    // public key and makes a good mac1, read and refused.
    let mut forged = resp.clone();
    for x in &mut forged[12..] {
        *x ^= 0x5a;
    }
    assert_eq!(answer(&mut a, &forged, 1), Err(CryptoError::BadMac));
    crate::cookie::add_macs(
        &mut forged,
        &crate::cookie::mac1_key(&a.local.public()),
        None,
    );
    assert_eq!(answer(&mut a, &forged, 1), Err(CryptoError::BadHandshake));
    // The genuine response still completes the handshake, and data flows.
    let keepalive = answer(&mut a, &resp, 2).unwrap();
    assert_eq!(deliver(&mut b, &keepalive, 2).unwrap(), Vec::<u8>::new());
    let d = seal(&a, b"after a forged response", 3);
    assert_eq!(deliver(&mut b, &d, 3).unwrap(), b"after a forged response");
}

#[test]
fn stray_response_is_refused() {
    let (mut a, mut b) = pair();
    let init = a.tick(at(0)).unwrap();
    let resp = answer(&mut b, &init, 0).unwrap();
    let m = Message::parse(&resp).unwrap();
    assert!(a.handle_handshake(&m, at(0)).is_ok());
    // The same response again: no pending initiation any more.
    assert_eq!(
        a.handle_handshake(&m, at(1)),
        Err(CryptoError::BadHandshake)
    );
}

proptest! {
    /// Arbitrary or mutated messages give errors, never panics, and never a session.
    #[test]
    fn hostile_messages(
        bytes in proptest::collection::vec(any::<u8>(), 0..120),
        flip in 0usize..128,
        kind in proptest::sample::select(vec![1u8, 2, 3, 4, 5, 6, 7, wire::MSG_COOKIE_REPLY]),
    ) {
        let (mut a, mut b) = pair();
        let mut m = bytes.clone();
        if !m.is_empty() { m[0] = kind; }
        if let Ok(msg) = Message::parse(&m) {
            let is_data = matches!(msg, Message::Data { .. });
            prop_assert!(is_data || b.handle_handshake(&msg, at(0)).is_err());
        }
        let _ = deliver(&mut b, &m, 0);
        prop_assert_eq!(b.state(), "none");
        // A real (v3) initiation with one bit flipped before its mac2 is refused unread. (mac2
        // is read only under load: a flipped one does not matter otherwise.)
        let mut init = a.tick(at(0)).unwrap();
        let i = flip % init.len();
        if (8..init.len() - wire::MAC_LEN).contains(&i) {
            init[i] ^= 1;
            let r = answer(&mut b, &init, 0);
            prop_assert_eq!(r, Err(CryptoError::BadMac));
            prop_assert_eq!(b.stats.responses_sent, 0);
        }
    }

    #[test]
    fn truncated_data_is_an_error(cut in 0usize..60) {
        let (mut a, mut b) = pair();
        handshake(&mut a, &mut b, 0);
        let d = seal(&a, &[1u8; 40], 1);
        let r = deliver(&mut b, &d[..cut.min(d.len() - 1)], 1);
        prop_assert!(r.is_err());
    }
}
