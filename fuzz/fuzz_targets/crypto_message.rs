//! A datagram from the wire to an encrypted link: parsed as a handshake (v1 or v2) or data
//! message and fed to a link's state machine, both before a session exists and after one was
//! established (AES-256-GCM and ChaCha20-Poly1305 through v2, ChaCha20-Poly1305 through v1);
//! data messages go through both the copying `open` and the in-place `open_in_place`. Then a
//! genuine datagram with the input XORed over it, and `seal_in_place` with the input's counter
//! and length. Nothing may panic, and nothing forged or altered may open or start a session.
#![no_main]
use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use vnet_crypto::wire::MSG_INITIATION;
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
/// operations). With `v1`, the v2 initiation is lost and the v1 retransmission answered.
fn established(ciphers: Ciphers, v1: bool) -> (Peer, Peer) {
    let (ka, kb) = keys();
    let mut a = Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 10).with_ciphers(ciphers);
    let mut b = Peer::new(kb, ka.public(), 1, Timers::default(), 20).with_ciphers(ciphers);
    let mut init = a.tick(now(0)).expect("initiation");
    if v1 {
        init = a.tick(now(500)).expect("retransmission");
        assert_eq!(init[0], MSG_INITIATION);
    }
    let resp = b.handle_handshake(&Message::parse(&init).unwrap(), now(500)).unwrap();
    let mut keepalive = a.handle_handshake(&Message::parse(&resp).unwrap(), now(500)).unwrap();
    let Ok(Message::Data { receiver, .. }) = Message::parse(&keepalive) else { panic!("keepalive") };
    let s = b.receiving_session(receiver, 500).expect("b's session");
    s.open_in_place(&mut keepalive).expect("keepalive opens");
    b.confirm(&s);
    (a, b)
}

thread_local! {
    static PAIRS: RefCell<Vec<(Peer, Peer)>> = RefCell::new(vec![
        established(Ciphers::ALL, false),
        established(Ciphers::CHACHA_ONLY, false),
        established(Ciphers::ALL, true),
    ]);
}

fn feed(p: &mut Peer, d: &[u8]) {
    match Message::parse(d) {
        Ok(Message::Data { receiver, counter, ciphertext, .. }) => {
            if let Some(s) = p.receiving_session(receiver, 600) {
                let mut out = vec![0u8; ciphertext.len()];
                assert!(s.open(counter, ciphertext, &mut out).is_err(), "a forged data message opened");
                assert!(s.open_in_place(&mut d.to_vec()).is_err(), "a forged data message opened in place");
            }
        }
        Ok(m) => {
            let _ = p.handle_handshake(&m, now(600));
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
    let mut fresh = Peer::new(kb, ka.public(), 1, Timers::default(), 20);
    feed(&mut fresh, data);
    assert_eq!(fresh.state(), "none");
    PAIRS.with(|p| {
        for (a, b) in p.borrow_mut().iter_mut() {
            // After a real handshake.
            feed(a, data);
            feed(b, data);
            let (tx, rx) = (a.sending_session(600).expect("session"), b.current().expect("session").clone());
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
