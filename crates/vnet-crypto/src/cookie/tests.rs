//! Known vectors (computed apart from this code by `vectors.py` beside this file, with Python's
//! hashlib BLAKE2s and the `cryptography` package's X25519 and ChaCha20-Poly1305, HChaCha20
//! written out), tampering, and the cookies' lifetimes.

use super::*;
use crate::wire::{Message, INITIATION_V3_LEN, MSG_INITIATION_V3};

fn hex<const N: usize>(s: &str) -> [u8; N] {
    let v: Vec<u8> = (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

fn keys() -> (PrivateKey, PrivateKey) {
    let a: [u8; 32] = std::array::from_fn(|i| i as u8 + 1);
    let b: [u8; 32] = std::array::from_fn(|i| i as u8 + 101);
    (PrivateKey(a), PrivateKey(b))
}

/// The v3 initiation of the vectors: type 6, VNI 5, sender index 9, Noise bytes 0..56.
fn initiation() -> Vec<u8> {
    let mut m = vec![MSG_INITIATION_V3, 0, 0, 5, 9, 0, 0, 0];
    m.extend(0..57u8);
    m.resize(INITIATION_V3_LEN, 0);
    m
}

const SECRET: [u8; 32] = [0x5c; 32];

#[test]
fn known_vectors() {
    let (a, b) = keys();
    let (pa, pb) = (a.public(), b.public());
    assert_eq!(
        pb.0,
        hex("5714769d116bf76436ae74bc793d2c30ad1903c59ac5273805c7e2698b410c36")
    );
    let ss = static_static(&a, &pb);
    assert_eq!(ss, static_static(&b, &pa), "the same on both hosts");
    assert_eq!(
        ss,
        hex("c9ea6a3f79a000b60b076d4afc990b272f3f0b5aaa3f0b8713c209273e363863")
    );
    assert_eq!(
        mac1_key(&pb),
        hex("e991b7a2cb093b268f7b14a33d875f87ac353a01f234cce562a5520fc46b23fe")
    );
    let cookie = cookie_of(&SECRET, &pa);
    assert_eq!(cookie, hex("c5b78dd93a5ffdc82e89feb7225d4f33"));
    let mut m = initiation();
    add_macs(&mut m, &mac1_key(&pb), Some(&cookie));
    let want: [u8; INITIATION_V3_LEN] = hex(concat!(
        "0600000509000000000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
        "202122232425262728292a2b2c2d2e2f303132333435363738",
        "631cb95e8dec8d45bae1cd114e3ef25f",
        "11c6c37783f477f26b27c131070fa073"
    ));
    assert_eq!(m, want);
    assert!(mac1_ok(&m, &mac1_key(&pb)) && mac2_ok(&m, &cookie));
    // Without a cookie, mac2 is zeros and mac1 the same.
    let mut bare = initiation();
    add_macs(&mut bare, &mac1_key(&pb), None);
    assert_eq!(bare[..81], want[..81]);
    assert_eq!(bare[81..], [0; 16]);
    assert!(!mac2_ok(&bare, &cookie));

    let key = cookie_reply_key(&ss, &pb);
    assert_eq!(
        key,
        hex("deaaa6be8960eca28c9c16eb664bcc6e2f1e4419483cb0c220d5fa21d37227a5")
    );
    let nonce: [u8; 24] = std::array::from_fn(|i| 200 + i as u8);
    let epoch = 1_700_000_000_123_456_789;
    let reply = seal_cookie_reply(&key, 5, 9, &nonce, &cookie, epoch).unwrap();
    let want: [u8; COOKIE_REPLY_LEN] = hex(concat!(
        "1000000509000000c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf",
        "e2983e99e71f5230d83de11c326c8615d86dd2a2ce8e3489bca76cd612ef5efd7780be110f75d287"
    ));
    assert_eq!(reply, want);
    assert_eq!(open_cookie_reply(&key, &reply), Ok((cookie, epoch)));
    assert!(matches!(
        Message::parse(&reply),
        Ok(Message::CookieReply {
            vni: 5,
            receiver: 9,
            ..
        })
    ));
}

#[test]
fn tampering_is_refused() {
    let (a, b) = keys();
    let (pa, pb) = (a.public(), b.public());
    let cookie = cookie_of(&SECRET, &pa);
    let mut m = initiation();
    add_macs(&mut m, &mac1_key(&pb), Some(&cookie));
    for i in 0..m.len() {
        let mut t = m.clone();
        t[i] ^= 0x10;
        // mac1 covers every byte before it; mac2 every byte before it, mac1 included.
        assert_eq!(mac1_ok(&t, &mac1_key(&pb)), i >= 81, "byte {i}");
        assert!(!mac2_ok(&t, &cookie), "byte {i}");
    }
    // Made for another receiver (the sender's own key) or with another cookie.
    assert!(!mac1_ok(&m, &mac1_key(&pa)));
    assert!(!mac2_ok(&m, &cookie_of(&[0x5d; 32], &pa)));
    assert!(!mac2_ok(&m, &cookie_of(&SECRET, &pb)));
    assert!(!mac1_ok(&m[..20], &mac1_key(&pb)) && !mac2_ok(&m[..20], &cookie));
    assert!(!mac1_ok(&[], &mac1_key(&pb)) && !mac2_ok(&[1; 16], &cookie));

    let ss = static_static(&a, &pb);
    let key = cookie_reply_key(&ss, &pb);
    let reply = seal_cookie_reply(&key, 5, 9, &[1; 24], &cookie, 7).unwrap();
    for i in 0..reply.len() {
        let mut t = reply;
        t[i] ^= 1;
        assert_eq!(
            open_cookie_reply(&key, &t),
            Err(CryptoError::BadMac),
            "byte {i}"
        );
    }
    // Only the two hosts of the link can open it: not with a key made from the public keys
    // alone, nor the other direction's key (a reply reflected back to its sender).
    let public_only = hash(&[b"vnet-cookie-v3--", &pb.0]);
    assert!(open_cookie_reply(&public_only, &reply).is_err());
    assert!(open_cookie_reply(&cookie_reply_key(&ss, &pa), &reply).is_err());
    assert_eq!(
        open_cookie_reply(&key, &reply[..71]),
        Err(CryptoError::Truncated)
    );
}

#[test]
fn the_secret_rotates_every_two_minutes() {
    let (a, _) = keys();
    let pa = a.public();
    let mut jar = CookieJar::default();
    let mut n = 0u8;
    let mut fresh = || {
        n += 1;
        Some([n; 32])
    };
    jar.rotate(1_000, 50, &pa, &mut fresh);
    let (c1, e1) = jar.current().unwrap();
    assert_eq!((c1, e1), (cookie_of(&[1; 32], &pa), 50));
    let mut m = initiation();
    add_macs(&mut m, &[0; 32], Some(&c1));
    // Not due before two minutes: the secret stays (and no randomness is drawn).
    jar.rotate(1_000 + COOKIE_LIFETIME_MS - 1, 60, &pa, || panic!("drawn"));
    assert_eq!(jar.current().unwrap().0, c1);
    // Due: a new secret, a later epoch even if the wall clock went back; the previous cookie
    // still works.
    jar.rotate(1_000 + COOKIE_LIFETIME_MS, 40, &pa, &mut fresh);
    let (c2, e2) = jar.current().unwrap();
    assert_ne!(c2, c1);
    assert_eq!(e2, 51);
    assert!(jar.mac2_ok(&m, 1_000 + COOKIE_LIFETIME_MS));
    // At the next rotation it is gone.
    jar.rotate(1_000 + 2 * COOKIE_LIFETIME_MS, 10_000, &pa, &mut fresh);
    assert!(!jar.mac2_ok(&m, 1_000 + 2 * COOKIE_LIFETIME_MS));
    assert_eq!(jar.current().unwrap().1, 10_000);
    // A jar left alone past two lifetimes accepts no old cookie either.
    let mut jar = CookieJar::default();
    jar.rotate(0, 1, &pa, || Some([1; 32]));
    assert!(jar.mac2_ok(&m, 2 * COOKIE_LIFETIME_MS - 1));
    assert!(!jar.mac2_ok(&m, 2 * COOKIE_LIFETIME_MS));
    // Without randomness no secret is made.
    let mut jar = CookieJar::default();
    jar.rotate(0, 1, &pa, || None);
    assert_eq!(jar.current(), None);
}

#[test]
fn a_held_cookie_lasts_two_minutes_and_only_a_later_epoch_replaces_it() {
    let mut h = HeldCookie::default();
    assert_eq!(h.get(0), None);
    assert!(h.accept([1; 16], 100, 0));
    assert_eq!(h.get(COOKIE_LIFETIME_MS - 1), Some([1; 16]));
    // A replayed older reply, or the same epoch again, changes nothing (and does not renew it).
    assert!(!h.accept([9; 16], 99, 10));
    assert!(!h.accept([1; 16], 100, 10));
    assert_eq!(h.get(COOKIE_LIFETIME_MS), None, "expired");
    // A later epoch replaces it; once it expired, any epoch is taken (the peer's clock may
    // have gone back across a restart).
    assert!(h.accept([2; 16], 101, 20));
    assert_eq!(h.get(30), Some([2; 16]));
    assert!(h.accept([3; 16], 5, 20 + COOKIE_LIFETIME_MS));
    assert_eq!(h.get(30 + COOKIE_LIFETIME_MS), Some([3; 16]));
}
