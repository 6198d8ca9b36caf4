//! The in-place batch API: counter reservation, sealing and opening in place, the replay
//! window with reordered batches and concurrent openers, and no (key, nonce) pair ever sealed
//! twice across threads and rekeys.

use std::collections::HashSet;
use std::sync::{Arc, Barrier};

use proptest::prelude::*;

use super::*;
use crate::wire::{data_header, MAX_CIPHERTEXT};
use crate::{Cipher, Session, DATA_HEADER_LEN, DATA_OVERHEAD, REPLAY_WINDOW, TAG_LEN};

fn established(c: Ciphers, t: Timers) -> (Peer, Peer) {
    let (mut a, mut b) = pair_with(c, c, t);
    handshake(&mut a, &mut b, 0);
    (a, b)
}

/// `plain` laid out for sealing in place.
fn datagram(plain: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; DATA_HEADER_LEN];
    d.extend_from_slice(plain);
    d.extend_from_slice(&[0; TAG_LEN]);
    d
}

/// `n` datagrams sealed on `s` from one reservation; datagram `i` carries `i` (8 bytes LE)
/// and some padding.
fn sealed_batch(s: &Session, n: usize, pad: usize) -> Vec<Vec<u8>> {
    let first = s.reserve(n as u64).unwrap();
    (0..n)
        .map(|i| {
            let mut p = (i as u64 + first).to_le_bytes().to_vec();
            p.resize(8 + pad, 0xa5);
            let mut d = datagram(&p);
            s.seal_in_place(first + i as u64, &mut d).unwrap();
            d
        })
        .collect()
}

#[test]
fn in_place_round_trip_for_both_ciphers() {
    for c in [Ciphers::ALL, Ciphers::CHACHA_ONLY] {
        let (a, b) = established(c, Timers::default());
        let tx = a.sending_session(1).unwrap();
        let rx = b.current().unwrap().clone();
        // The keepalive took counter 0.
        assert_eq!(tx.reserve(3).unwrap(), 1);
        for (counter, plain) in [(1u64, &b""[..]), (2, b"x"), (3, &[7u8; 1400][..])] {
            let mut d = datagram(plain);
            tx.seal_in_place(counter, &mut d).unwrap();
            assert_eq!(
                d[..DATA_HEADER_LEN],
                data_header(5, tx.remote_index, counter)
            );
            // Not for the 1-byte plaintext: its ciphertext equals it once in 256 keys (a CI
            // run failed so).
            if plain.len() >= 8 {
                assert_ne!(&d[DATA_HEADER_LEN..d.len() - TAG_LEN], plain, "encrypted");
            }
            let r = rx.open_in_place(&mut d).unwrap();
            assert_eq!(r, DATA_HEADER_LEN..DATA_HEADER_LEN + plain.len());
            assert_eq!(&d[r], plain);
        }
        // The copying API speaks the same protocol, both ways round.
        let mut d = datagram(b"in place");
        let n = tx.reserve(1).unwrap();
        tx.seal_in_place(n, &mut d).unwrap();
        let mut out = vec![0u8; d.len()];
        assert_eq!(rx.open(n, &d[DATA_HEADER_LEN..], &mut out), Ok(8));
        assert_eq!(&out[..8], b"in place");
        let mut d = vec![];
        tx.seal(&[b"co", b"pied"], &mut vec![], &mut d).unwrap();
        let r = rx.open_in_place(&mut d).unwrap();
        assert_eq!(&d[r], b"copied");
        assert_eq!(rx.received(), 1 + 5);
    }
}

#[test]
fn in_place_refusals() {
    let (a, b) = established(Ciphers::ALL, Timers::default());
    let tx = a.sending_session(1).unwrap();
    let rx = b.current().unwrap().clone();
    let first = tx.reserve(1).unwrap();
    // A counter never reserved, a datagram without room for header and tag, one too large.
    assert_eq!(
        tx.seal_in_place(first + 1, &mut datagram(b"x")),
        Err(CryptoError::NoSession)
    );
    assert_eq!(
        tx.seal_in_place(first, &mut [0u8; DATA_OVERHEAD - 1]),
        Err(CryptoError::Truncated)
    );
    assert_eq!(
        tx.seal_in_place(first, &mut vec![0u8; DATA_HEADER_LEN + MAX_CIPHERTEXT + 1]),
        Err(CryptoError::TooLarge)
    );
    let mut good = datagram(&[3u8; 100]);
    tx.seal_in_place(first, &mut good).unwrap();
    let try_open = |mut d: Vec<u8>| rx.open_in_place(&mut d);
    // Every byte of header, ciphertext and tag matters.
    for i in 0..good.len() {
        let mut d = good.clone();
        d[i] ^= 0x10;
        let want = match i {
            0 => CryptoError::NotCrypto,     // type 0x13: not ours
            1..=7 => CryptoError::NoSession, // another link's VNI, another session's index
            _ => CryptoError::BadAuth,       // counter (the nonce), ciphertext, tag
        };
        assert_eq!(try_open(d), Err(want), "byte {i}");
    }
    for cut in [0, 1, DATA_OVERHEAD - 1] {
        assert_eq!(try_open(good[..cut].to_vec()), Err(CryptoError::Truncated));
    }
    let mut init = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default())
        .0
        .tick(at(0))
        .unwrap();
    assert_eq!(rx.open_in_place(&mut init), Err(CryptoError::NotCrypto));
    // None of that moved the window: the genuine datagram opens, once.
    assert!(try_open(good.clone()).is_ok());
    assert_eq!(try_open(good), Err(CryptoError::Replay));
}

#[test]
fn reserve_refuses_past_the_message_limit() {
    let t = Timers {
        rekey_after_messages: 8,
        reject_after_messages: 12,
        ..Timers::default()
    };
    let (a, _b) = established(Ciphers::ALL, t);
    let s = a.sending_session(1).unwrap();
    assert_eq!(s.reserve(5), Ok(1));
    assert_eq!(s.reserve(7), Err(CryptoError::NoSession), "would pass 12");
    assert_eq!(s.reserve(u64::MAX), Err(CryptoError::NoSession));
    assert_eq!(s.reserve(6), Ok(6));
    assert_eq!(s.reserve(1), Err(CryptoError::NoSession));
    assert_eq!(s.sent(), 12);
    assert!(a.sending_session(1).is_none(), "out of counters");
    let mut out = vec![];
    assert_eq!(
        s.seal(&[b"x"], &mut vec![], &mut out),
        Err(CryptoError::NoSession)
    );
    assert!(out.is_empty());
}

#[test]
fn reordered_batches_within_the_window_are_accepted_and_replays_refused() {
    let (a, b) = established(Ciphers::ALL, Timers::default());
    let tx = a.sending_session(1).unwrap();
    let rx = b.current().unwrap().clone();
    let batches: Vec<Vec<Vec<u8>>> = (0..4).map(|_| sealed_batch(&tx, 64, 40)).collect();
    // The last batch first, then the others, each reversed or interleaved.
    let mut order = vec![];
    order.extend(batches[3].iter().rev());
    order.extend(batches[1].iter().step_by(2));
    order.extend(batches[0].iter());
    order.extend(batches[1].iter().skip(1).step_by(2));
    order.extend(batches[2].iter().rev());
    assert_eq!(order.len(), 256);
    for d in &order {
        let mut d = (*d).clone();
        let r = rx
            .open_in_place(&mut d)
            .expect("reordered within the window");
        assert_eq!(d[r].len(), 48);
    }
    for d in &order {
        assert_eq!(
            rx.open_in_place(&mut (*d).clone()),
            Err(CryptoError::Replay)
        );
    }
    // A batch delayed past the window is refused; one just inside it is accepted.
    let late = sealed_batch(&tx, 2, 0);
    let far = REPLAY_WINDOW as usize - 1;
    let ahead = sealed_batch(&tx, far, 0);
    rx.open_in_place(&mut ahead[far - 1].clone()).unwrap();
    assert_eq!(
        rx.open_in_place(&mut late[0].clone()),
        Err(CryptoError::Replay)
    );
    assert!(
        rx.open_in_place(&mut late[1].clone()).is_ok(),
        "just inside"
    );
}

#[test]
fn concurrent_opens_accept_each_datagram_once() {
    let (a, b) = established(Ciphers::ALL, Timers::default());
    let tx = a.sending_session(1).unwrap();
    let rx = b.current().unwrap().clone();
    let n = 3_000;
    let all = Arc::new(sealed_batch(&tx, n, 64));
    let start = Arc::new(Barrier::new(3));
    // Three threads open every datagram, each in its own order (forward, backward, strided
    // batches), so that they race on the same counters.
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (all, rx, start) = (all.clone(), rx.clone(), start.clone());
            std::thread::spawn(move || {
                let mut idx: Vec<usize> = (0..all.len()).collect();
                match t {
                    0 => {}
                    1 => idx.reverse(),
                    _ => idx.sort_by_key(|i| (i / 64 % 7, *i)),
                }
                start.wait();
                let mut opened = vec![];
                for i in idx {
                    match rx.open_in_place(&mut all[i].clone()) {
                        Ok(_) => opened.push(i),
                        Err(CryptoError::Replay) => {}
                        Err(e) => panic!("datagram {i}: {e}"),
                    }
                }
                opened
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in threads {
        for i in t.join().unwrap() {
            assert!(seen.insert(i), "datagram {i} accepted twice");
        }
    }
    // All within the window: each is accepted exactly once.
    assert_eq!(seen.len(), n);
    assert_eq!(rx.received(), 1 + n as u64);
}

/// The (sending key, counter) of every datagram sealed, checked unique; each datagram must
/// also open on the other side, so the counter in its header is the nonce it was sealed with.
fn seal_concurrently(
    sender: &Peer,
    receiver: &Peer,
    now: u64,
    threads: usize,
    batches: &[usize],
    used: &mut HashSet<([u8; 32], u64)>,
) {
    let tx = sender.sending_session(now).unwrap();
    let start = Arc::new(Barrier::new(threads));
    let sealed: Vec<Vec<u8>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (tx, start) = (tx.clone(), start.clone());
                sc.spawn(move || {
                    start.wait();
                    let mut out = vec![];
                    for (k, &n) in batches.iter().enumerate() {
                        if (k + t) % 3 == 0 {
                            // The copying API draws from the same counter.
                            for _ in 0..n {
                                let mut d = vec![];
                                tx.seal(&[b"copy"], &mut vec![], &mut d).unwrap();
                                out.push(d);
                            }
                        } else {
                            out.extend(sealed_batch(&tx, n, t));
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sealed.len(), threads * batches.iter().sum::<usize>());
    for d in sealed {
        let counter = u64::from_le_bytes(d[8..16].try_into().unwrap());
        assert!(
            used.insert((tx.send_key, counter)),
            "counter {counter} sealed twice under one key"
        );
        let receiver_index = u32::from_le_bytes(d[4..8].try_into().unwrap());
        let rx = receiver.receiving_session(receiver_index, now).unwrap();
        rx.open_in_place(&mut d.clone()).expect("opens");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Several threads reserve and seal on one session at once, in batches of any size, then
    /// the link rekeys (both ways round) and they do it again: no (key, nonce) pair is ever
    /// used twice, and every datagram opens.
    #[test]
    fn no_key_nonce_pair_is_used_twice(
        threads in 2usize..5,
        batches in proptest::collection::vec(1usize..80, 1..8),
        rekeys in 1usize..4,
        aes in any::<bool>(),
    ) {
        let c = if aes { Ciphers::ALL } else { Ciphers::CHACHA_ONLY };
        let (mut a, mut b) = established(c, Timers::default());
        let mut used = HashSet::new();
        let mut keys = HashSet::new();
        let mut now = 1;
        for r in 0..=rekeys {
            for (from, to) in [(&a, &b), (&b, &a)] {
                let s = from.sending_session(now).unwrap();
                prop_assert_eq!(s.cipher(), if aes { Cipher::Aes256Gcm } else { Cipher::ChaCha20Poly1305 });
                keys.insert(s.send_key);
                seal_concurrently(from, to, now, threads, &batches, &mut used);
            }
            if r < rekeys {
                now += 120_000;
                handshake(&mut a, &mut b, now);
                // The new session's counters start again (0 went to the keepalive).
                prop_assert_eq!(a.sending_session(now).unwrap().sent(), 1);
                prop_assert_eq!(b.sending_session(now).unwrap().sent(), 0);
            }
        }
        // Two fresh keys per handshake (one each way), never one seen before.
        prop_assert_eq!(keys.len(), 2 * (rekeys + 1));
        prop_assert_eq!(used.len(), 2 * (rekeys + 1) * threads * batches.iter().sum::<usize>());
    }
}
