//! A datagram from the wire to an encrypted link: parsed as a handshake or data message and
//! fed to a link's state machine, both before a session exists and after one was
//! established. Nothing may panic, and nothing forged may open.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vnet_crypto::{Message, Now, Peer, PrivateKey, Timers};

fn now(ms: u64) -> Now {
    Now { mono_ms: ms, wall_ns: 1_700_000_000_000_000_000 + ms }
}

fuzz_target!(|data: &[u8]| {
    let (ka, kb) = (PrivateKey([1; 32]), PrivateKey([2; 32]));
    let mut a = Peer::new(ka.clone(), kb.public(), 1, Timers::default(), 10);
    let mut b = Peer::new(kb, ka.public(), 1, Timers::default(), 20);
    let feed = |p: &mut Peer, d: &[u8]| match Message::parse(d) {
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
    };
    // Before any session.
    feed(&mut b, data);
    assert_eq!(b.state(), "none");
    // After a real handshake.
    let mut b = Peer::new(PrivateKey([2; 32]), PrivateKey([1; 32]).public(), 1, Timers::default(), 20);
    let Some(init) = a.tick(now(0)) else { return };
    let Ok(resp) = b.handle_handshake(&Message::parse(&init).unwrap(), now(0)) else { return };
    let _ = a.handle_handshake(&Message::parse(&resp).unwrap(), now(0));
    feed(&mut a, data);
    feed(&mut b, data);
});
