//! Rekeying under load, by the `now` clock: both hosts send a datagram every millisecond for
//! several rekey periods over a link that delays and reorders; neither ever lacks a session
//! to send on once the first handshake is done, and every datagram opens, those sealed on the
//! old session and delivered after the switch included.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::Cipher;

#[test]
fn rekeys_under_load_without_a_stall() {
    let (a, b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let mut p = [a, b];
    // (arrival ms, sequence) -> (to, datagram)
    let mut link: BTreeMap<(u64, u64), (usize, Vec<u8>)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut send = |link: &mut BTreeMap<_, _>, at_ms: u64, to: usize, d: Vec<u8>| {
        seq += 1;
        link.insert((at_ms, seq), (to, d));
    };
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut sent, mut opened, mut on_previous) = ([0u64; 2], [0u64; 2], 0u64);
    let end = 400_000;
    for now in 0..end {
        while let Some(e) = link.first_entry() {
            if e.key().0 > now {
                break;
            }
            let (to, mut d) = e.remove();
            let receiver = match Message::parse(&d).unwrap() {
                Message::Data { receiver, .. } => receiver,
                m => {
                    let reply = p[to]
                        .handle_handshake(&m, at(now))
                        .unwrap_or_else(|e| panic!("{now} ms: handshake refused by {to}: {e}"));
                    send(&mut link, now + 3, 1 - to, reply);
                    continue;
                }
            };
            let s = p[to]
                .receiving_session(receiver, now)
                .unwrap_or_else(|| panic!("{now} ms: no session at {to} for {receiver}"));
            let r = s
                .open_in_place(&mut d)
                .unwrap_or_else(|e| panic!("{now} ms: {to} refused a datagram: {e}"));
            p[to].confirm(&s);
            if !r.is_empty() {
                opened[to] += 1;
                if !Arc::ptr_eq(&s, p[to].current().unwrap()) {
                    on_previous += 1;
                }
            }
        }
        if now % 100 == 0 {
            for (i, q) in p.iter_mut().enumerate() {
                if let Some(m) = q.tick(at(now)) {
                    send(&mut link, now + 3, 1 - i, m);
                }
            }
        }
        for (i, q) in p.iter().enumerate() {
            if q.sending_session(now).is_none() {
                // Only before the first handshake completes.
                assert!(now < 20, "{now} ms: side {i} has no session to send on");
                continue;
            }
            let d = seal(q, &now.to_le_bytes(), now);
            // 1 to 30 ms on the way: datagrams overtake each other and handshake messages.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            send(&mut link, now + 1 + rng % 30, 1 - i, d);
            sent[i] += 1;
        }
    }
    let in_flight = |to: usize| link.values().filter(|(t, _)| *t == to).count() as u64;
    assert_eq!(opened[1] + in_flight(1), sent[0]);
    assert_eq!(opened[0] + in_flight(0), sent[1]);
    assert!(sent[0] > end - 20 && sent[1] > end - 20);
    // Several rekeys, each switching under traffic.
    assert!(
        p[0].stats.rekeys + p[1].stats.rekeys >= 3,
        "{:?}",
        p[0].stats
    );
    assert!(on_previous > 0, "no datagram crossed a switch");
    for q in &p {
        assert_eq!(q.current().unwrap().cipher(), Cipher::Aes256Gcm);
        assert_eq!(q.stats.bad_handshakes + q.stats.initiations_replayed, 0);
    }
}
