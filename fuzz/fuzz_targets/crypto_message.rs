//! A datagram from the wire to an encrypted link: parsed as a handshake (v1, v2 or v3),
//! cookie reply or data message and fed to a link's state machine, both before a session
//! exists and after one was established (AES-256-GCM and ChaCha20-Poly1305 through v3 and v2,
//! ChaCha20-Poly1305 through v1); data messages go through both the copying `open` and the
//! in-place `open_in_place`. Whatever a peer sends back for it (a response, a cookie reply) is
//! never larger than what came in. Then a genuine datagram, a genuine v3 initiation and a
//! genuine cookie reply with the input XORed over each: the data opens, the MACs check and the
//! cookie opens exactly when nothing covered changed; and `seal_in_place` with the input's
//! counter and length. Nothing may panic, and nothing forged or altered may open or start a
//! session.
#![no_main]
use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use vnet_crypto::cookie;
use vnet_crypto::wire::{MACS_LEN, MAC_LEN, MSG_INITIATION, MSG_INITIATION_V2, MSG_INITIATION_V3};
use vnet_crypto::{
    Cipher, Ciphers, CryptoError, Message, Now, Peer, PrivateKey, Timers, DATA_HEADER_LEN,
    TAG_LEN,
};

fn now(ms: u64) -> Now {
    Now { mono_ms: ms, wall_ns: 1_700_000_000_000_000_000 + ms }
}

fn keys() -> (PrivateKey, PrivateKey) {
    (PrivateKey([1; 32]), PrivateKey([2; 32]))
}

/// Two peers with a session between them (made once: a handshake costs four X25519
/// operations), of the handshake's version `kind`: v3 (the first initiation), v2 or v1 (the
/// earlier ones lost, a retransmission answered).
fn established(ciphers: Ciphers, kind: u8) -> (Peer, Peer) {
    let (ka, kb) = keys();
    let mut a = Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 10).with_ciphers(ciphers);
    let mut b = Peer::new(kb, ka.public(), 1, Timers::default(), 20).with_ciphers(ciphers);
    let mut init = a.tick(now(0)).expect("initiation");
    for at in [100, 500, 1500] {
        if init[0] == kind {
            break;
        }
        if let Some(m) = a.tick(now(at)) {
            init = m;
        }
    }
    assert_eq!(init[0], kind);
    let resp = b.handle_handshake(&Message::parse(&init).unwrap(), now(1500)).unwrap();
    let mut keepalive = a.handle_handshake(&Message::parse(&resp).unwrap(), now(1500)).unwrap();
    let Ok(Message::Data { receiver, .. }) = Message::parse(&keepalive) else { panic!("keepalive") };
    let s = b.receiving_session(receiver, 1500).expect("b's session");
    s.open_in_place(&mut keepalive).expect("keepalive opens");
    b.confirm(&s);
    (a, b)
}

thread_local! {
    static PAIRS: RefCell<Vec<(Peer, Peer)>> = RefCell::new(vec![
        established(Ciphers::ALL, MSG_INITIATION_V3),
        established(Ciphers::CHACHA_ONLY, MSG_INITIATION_V3),
        established(Ciphers::ALL, MSG_INITIATION_V2),
        established(Ciphers::ALL, MSG_INITIATION),
    ]);
    /// A genuine v3 initiation from a to b, with a mac2 (cookie `COOKIE`), and a genuine
    /// cookie reply from b to a.
    static GENUINE: (Vec<u8>, Vec<u8>) = {
        let (ka, kb) = keys();
        let mut a = Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 10);
        let mut init = a.tick(now(0)).expect("initiation");
        assert_eq!(init[0], MSG_INITIATION_V3);
        cookie::add_macs(&mut init, &cookie::mac1_key(&kb.public()), Some(&COOKIE));
        let key = cookie::cookie_reply_key(&cookie::static_static(&kb, &ka.public()), &kb.public());
        let reply = cookie::seal_cookie_reply(&key, 1, 11, &[7; 24], &COOKIE, 42).expect("seal");
        (init, reply.to_vec())
    };
}

const COOKIE: [u8; MAC_LEN] = [0x3c; MAC_LEN];

/// `genuine` with `data` XORed over it from its first byte; whether any byte changed.
fn xored(genuine: &[u8], data: &[u8]) -> (Vec<u8>, bool) {
    let mut d = genuine.to_vec();
    let mut changed = false;
    for (x, y) in data.iter().zip(d.iter_mut()) {
        *y ^= x;
        changed |= *x != 0;
    }
    (d, changed)
}

fn feed(p: &mut Peer, d: &[u8]) {
    match Message::parse(d) {
        Ok(Message::Data { receiver, counter, ciphertext, .. }) => {
            if let Some(s) = p.receiving_session(receiver, 1600) {
                let mut out = vec![0u8; ciphertext.len()];
                assert!(s.open(counter, ciphertext, &mut out).is_err(), "a forged data message opened");
                assert!(s.open_in_place(&mut d.to_vec()).is_err(), "a forged data message opened in place");
            }
        }
        Ok(m) => {
            if let Ok(reply) = p.handle_handshake(&m, now(1600)) {
                // No amplification: a response is shorter than the initiation it answers.
                assert!(reply.len() <= d.len(), "a {}-byte answer to {} bytes", reply.len(), d.len());
            }
            if let Some(c) = p.take_cookie_reply() {
                assert!(c.len() <= d.len(), "a {}-byte cookie reply to {} bytes", c.len(), d.len());
            }
        }
        Err(_) => {}
    }
    // Whatever it is, opening it in place on any session of the peer fails cleanly.
    if let Some(s) = p.current() {
        assert!(s.open_in_place(&mut d.to_vec()).is_err(), "forged bytes opened in place");
    }
}

fuzz_target!(|data: &[u8]| {
    // Before any session: a responder that has seen nothing.
    let (ka, kb) = keys();
    let mut fresh = Peer::new(kb.clone(), ka.public(), 1, Timers::default(), 20);
    feed(&mut fresh, data);
    assert_eq!(fresh.state(), "none");
    // A genuine v3 initiation and cookie reply with the input XORed over them: the MACs check,
    // and the cookie opens, exactly when nothing they cover changed.
    GENUINE.with(|(init, reply)| {
        let (m, changed) = xored(init, data);
        let covered = |n: usize| data.iter().take(n).any(|&x| x != 0);
        let mac2_at = init.len() - MAC_LEN;
        let mac1_at = init.len() - MACS_LEN;
        assert_eq!(cookie::mac1_ok(&m, &cookie::mac1_key(&kb.public())), !covered(mac2_at));
        assert_eq!(cookie::mac2_ok(&m, &COOKIE), !changed);
        assert!(mac1_at < mac2_at);
        let key = cookie::cookie_reply_key(&cookie::static_static(&kb, &ka.public()), &kb.public());
        let (r, changed) = xored(reply, data);
        match cookie::open_cookie_reply(&key, &r) {
            Ok(got) => assert!(!changed && got == (COOKIE, 42)),
            Err(_) => assert!(changed),
        }
    });
    PAIRS.with(|p| {
        for (a, b) in p.borrow_mut().iter_mut() {
            // After a real handshake.
            feed(a, data);
            feed(b, data);
            let (tx, rx) = (a.sending_session(1600).expect("session"), b.current().expect("session").clone());
            assert!(tx.cipher() == Cipher::ChaCha20Poly1305 || a.ciphers().aes_256_gcm);
            // A genuine datagram with the input XORed over it (from its first byte): opens
            // exactly when nothing changed.
            let len = DATA_HEADER_LEN + data.len().min(2000) + TAG_LEN;
            let mut d = vec![0x5a; len];
            let c = tx.reserve(1).expect("counter");
            tx.seal_in_place(c, &mut d).expect("seal");
            let changed = data.iter().zip(d.iter_mut()).fold(false, |ch, (x, y)| {
                *y ^= x;
                ch || *x != 0
            });
            let r = rx.open_in_place(&mut d);
            if changed {
                assert!(r.is_err(), "an altered datagram opened");
            } else {
                assert_eq!(r, Ok(DATA_HEADER_LEN..len - TAG_LEN));
            }
            // Sealing with the input's counter and length: only reserved counters and sane
            // lengths are accepted.
            if data.len() >= 10 {
                let counter = u64::from_le_bytes(data[..8].try_into().unwrap());
                let n = u16::from_le_bytes([data[8], data[9]]) as usize;
                let mut buf = vec![0u8; n];
                match tx.seal_in_place(counter, &mut buf) {
                    Ok(()) => assert!(counter < tx.sent() && n >= DATA_HEADER_LEN + TAG_LEN),
                    Err(CryptoError::NoSession) => assert!(counter >= tx.sent()),
                    Err(CryptoError::Truncated) => assert!(n < DATA_HEADER_LEN + TAG_LEN),
                    Err(CryptoError::TooLarge) => {}
                    Err(e) => panic!("seal_in_place: {e}"),
                }
            }
        }
    });
});
