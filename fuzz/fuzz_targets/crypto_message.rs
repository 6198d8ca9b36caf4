//! A datagram from the wire to an encrypted link: parsed as a handshake or data message and
//! fed to a link's state machine, both before a session exists and after one was
//! established. Nothing may panic, and nothing forged may open or start a session.
#![no_main]
use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use vnet_crypto::{Message, Now, Peer, PrivateKey, Timers};

fn now(ms: u64) -> Now {
    Now { mono_ms: ms, wall_ns: 1_700_000_000_000_000_000 + ms }
}

fn keys() -> (PrivateKey, PrivateKey) {
    (PrivateKey([1; 32]), PrivateKey([2; 32]))
}

/// Two peers with a session between them (made once: a handshake costs four X25519 operations).
fn established() -> (Peer, Peer) {
    let (ka, kb) = keys();
    let mut a = Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 10);
    let mut b = Peer::new(kb, ka.public(), 1, Timers::default(), 20);
    let init = a.tick(now(0)).expect("initiation");
    let resp = b.handle_handshake(&Message::parse(&init).unwrap(), now(0)).unwrap();
    a.handle_handshake(&Message::parse(&resp).unwrap(), now(0)).unwrap();
    (a, b)
}

thread_local! {
    static PAIR: RefCell<(Peer, Peer)> = RefCell::new(established());
}

fn feed(p: &mut Peer, d: &[u8]) {
    match Message::parse(d) {
        Ok(Message::Data { receiver, counter, ciphertext, .. }) => {
            if let Some(s) = p.receiving_session(receiver, 5) {
                let mut out = vec![0u8; ciphertext.len()];
                assert!(s.open(counter, ciphertext, &mut out).is_err(), "a forged data message opened");
            }
        }
        Ok(m) => {
            let _ = p.handle_handshake(&m, now(5));
        }
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    // Before any session: a responder that has seen nothing.
    let (ka, kb) = keys();
    let mut fresh = Peer::new(kb, ka.public(), 1, Timers::default(), 20);
    feed(&mut fresh, data);
    assert_eq!(fresh.state(), "none");
    // After a real handshake.
    PAIR.with(|p| {
        let (a, b) = &mut *p.borrow_mut();
        feed(a, data);
        feed(b, data);
    });
});
