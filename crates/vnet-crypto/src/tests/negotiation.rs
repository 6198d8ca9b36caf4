//! The cipher negotiation (v2, and v3 which carries it unchanged) between two current hosts,
//! and the rotation of versions in initiations.

use super::*;
use crate::wire::{
    Version, MSG_INITIATION, MSG_INITIATION_V2, MSG_INITIATION_V3, MSG_RESPONSE, MSG_RESPONSE_V2,
    MSG_RESPONSE_V3,
};
use crate::{Cipher, PublicKey, Session};

/// What `f` says of each side's current session.
fn both<T>(a: &Peer, b: &Peer, f: impl Fn(&Session) -> T) -> (T, T) {
    (
        f(a.current().expect("a's session")),
        f(b.current().expect("b's session")),
    )
}

fn established_cipher(a: &Peer, b: &Peer) -> (Cipher, Cipher) {
    both(a, b, Session::cipher)
}

#[test]
fn both_offering_aes_gcm_get_it() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    handshake(&mut a, &mut b, 0);
    assert_eq!(
        established_cipher(&a, &b),
        (Cipher::Aes256Gcm, Cipher::Aes256Gcm)
    );
    assert_eq!(a.current().unwrap().version(), Version::V3);
    assert_eq!((a.stats.handshakes_v1, b.stats.handshakes_v1), (0, 0));
    assert_delivers(&a, &mut b, b"over aes", 1);
    assert_delivers(&b, &mut a, b"and back", 1);
}

#[test]
fn one_side_without_aes_gets_chacha() {
    for (ca, cb) in [
        (Ciphers::ALL, Ciphers::CHACHA_ONLY),
        (Ciphers::CHACHA_ONLY, Ciphers::ALL),
        (Ciphers::CHACHA_ONLY, Ciphers::CHACHA_ONLY),
    ] {
        let (mut a, mut b) = pair_with(ca, cb, Timers::default());
        handshake(&mut a, &mut b, 0);
        assert_eq!(
            established_cipher(&a, &b),
            (Cipher::ChaCha20Poly1305, Cipher::ChaCha20Poly1305),
            "{ca:?} initiating to {cb:?}"
        );
        assert_eq!(a.current().unwrap().version(), Version::V3);
        assert_delivers(&b, &mut a, b"chacha", 1);
    }
}

#[test]
fn initiations_rotate_and_restart_with_v3() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let mut kinds = vec![];
    let mut last_v1 = None;
    for ms in (0..3_000).step_by(100) {
        if let Some(m) = a.tick(at(ms)) {
            kinds.push(m[0]);
            if m[0] == MSG_INITIATION {
                last_v1 = Some((m, ms));
            }
        }
    }
    // (at 0, 500 and 1500 ms; the next would be v3 at 3500)
    assert_eq!(
        kinds,
        [MSG_INITIATION_V3, MSG_INITIATION_V2, MSG_INITIATION]
    );
    // The v1 one gets through (say the others were lost): a ChaCha20-Poly1305 session.
    let (init, ms) = last_v1.unwrap();
    let Got::Reply(resp) = receive(&mut b, init, ms).unwrap() else {
        panic!()
    };
    assert_eq!(resp[0], MSG_RESPONSE);
    let Got::Reply(k) = receive(&mut a, resp, ms).unwrap() else {
        panic!()
    };
    receive(&mut b, k, ms).unwrap();
    assert_eq!(
        established_cipher(&a, &b),
        (Cipher::ChaCha20Poly1305, Cipher::ChaCha20Poly1305)
    );
    assert_eq!((a.stats.handshakes_v1, b.stats.handshakes_v1), (1, 1));
    assert!(!a.peer_speaks_v3());
    // The rekey starts again with v3, and two current hosts get AES-256-GCM.
    assert!(a.tick(at(ms + 119_900)).is_none());
    handshake(&mut a, &mut b, ms + 120_000);
    assert_eq!(
        established_cipher(&a, &b),
        (Cipher::Aes256Gcm, Cipher::Aes256Gcm)
    );
    assert_eq!(a.current().unwrap().version(), Version::V3);
    assert_eq!(a.stats.rekeys, 1);
    assert_eq!(a.stats.handshakes_v1, 1);
    assert!(a.peer_speaks_v3() && b.peer_speaks_v3());
}

#[test]
fn a_response_of_the_other_version_is_refused() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    let init = a.tick(at(0)).unwrap();
    let Got::Reply(resp) = receive(&mut b, init, 0).unwrap() else {
        panic!()
    };
    assert_eq!(resp[0], MSG_RESPONSE_V3);
    // Relabelled as v2 or v1 (and cut to its length): the receiver index matches the
    // pending initiation, the version does not.
    let mut v2 = resp.clone();
    v2[0] = MSG_RESPONSE_V2;
    v2.truncate(crate::wire::RESPONSE_V2_LEN);
    assert_eq!(
        receive(&mut a, v2.clone(), 1),
        Err(CryptoError::BadHandshake)
    );
    let mut v1 = v2;
    v1[0] = MSG_RESPONSE;
    v1.pop();
    assert_eq!(receive(&mut a, v1, 1), Err(CryptoError::BadHandshake));
    assert_eq!(a.state(), "handshaking");
    // The genuine response still completes the handshake.
    let Got::Reply(k) = receive(&mut a, resp, 2).unwrap() else {
        panic!()
    };
    assert_eq!(receive(&mut b, k, 2).unwrap(), Got::Plain(vec![]));
}

/// A responder that holds `key` and answers a v2 initiation with its own payload (what a
/// buggy or malicious peer could send), on the v2 prologue.
fn answer_v2(key: &PrivateKey, initiator: PublicKey, init: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut prologue = *b"vnet-kk-v2\0\0\0\0\0\0";
    prologue[12..].copy_from_slice(&5u32.to_be_bytes());
    let mut hs = snow::Builder::new(crate::NOISE_PARAMS.parse().unwrap())
        .local_private_key(&key.0)
        .remote_public_key(&initiator.0)
        .prologue(&prologue)
        .build_responder()
        .unwrap();
    let mut buf = [0u8; 200];
    hs.read_message(&init[8..], &mut buf).unwrap();
    let mut m = vec![MSG_RESPONSE_V2, 0, 0, 5, 1, 0, 0, 0];
    m.extend_from_slice(&init[4..8]);
    let n = hs.write_message(payload, &mut buf).unwrap();
    m.extend_from_slice(&buf[..n]);
    m
}

#[test]
fn a_responder_cannot_impose_a_cipher_not_offered() {
    let (ka, kb) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let mut a = Peer::new(ka.clone(), kb.public(), 5, Timers::default(), 1)
        .with_ciphers(Ciphers::CHACHA_ONLY);
    // Authentic responses naming AES-256-GCM (not offered) or an unknown cipher: refused.
    // (Initiations rotate v3, v2, v1: each v2 one is answered while it is pending.)
    let mut now = 0;
    let mut next_v2 = |a: &mut Peer| loop {
        let m = a.tick(at(now));
        now += 100;
        if let Some(m) = m.filter(|m| m[0] == MSG_INITIATION_V2) {
            return (m, now);
        }
    };
    for choice in [2u8, 0, 3, 0xff] {
        let (init, now) = next_v2(&mut a);
        let resp = answer_v2(&kb, ka.public(), &init, &[choice]);
        assert_eq!(
            receive(&mut a, resp, now),
            Err(CryptoError::BadHandshake),
            "choice {choice}"
        );
        assert!(a.current().is_none());
    }
    // Naming ChaCha20-Poly1305 works.
    let (init, now) = next_v2(&mut a);
    let resp = answer_v2(&kb, ka.public(), &init, &[1]);
    assert!(matches!(receive(&mut a, resp, now), Ok(Got::Reply(_))));
    assert_eq!(a.current().unwrap().cipher(), Cipher::ChaCha20Poly1305);
}

#[test]
fn a_v2_initiation_on_the_v1_prologue_is_refused() {
    let (ka, kb) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let mut b = Peer::new(kb.clone(), ka.public(), 5, Timers::default(), 1);
    for (kind, prologue) in [
        (MSG_INITIATION_V2, *b"vnet-kk-v1\0\0\0\0\0\0"),
        (MSG_INITIATION, *b"vnet-kk-v2\0\0\0\0\0\0"),
    ] {
        let mut prologue = prologue;
        prologue[12..].copy_from_slice(&5u32.to_be_bytes());
        let mut hs = snow::Builder::new(crate::NOISE_PARAMS.parse().unwrap())
            .local_private_key(&ka.0)
            .remote_public_key(&kb.public().0)
            .prologue(&prologue)
            .build_initiator()
            .unwrap();
        let payload = [1u8, 2, 3, 4, 5, 6, 7, 8, 3];
        let payload = if kind == MSG_INITIATION {
            &payload[..8]
        } else {
            &payload[..]
        };
        let mut m = vec![kind, 0, 0, 5, 9, 0, 0, 0];
        let mut buf = [0u8; 200];
        let n = hs.write_message(payload, &mut buf).unwrap();
        m.extend_from_slice(&buf[..n]);
        assert_eq!(
            receive(&mut b, m, 0),
            Err(CryptoError::BadHandshake),
            "type {kind}"
        );
    }
    assert_eq!(b.stats.bad_handshakes, 2);
}

/// Whether each side's sending session lets it leave checksums partial.
fn partial_both(a: &Peer, b: &Peer) -> (bool, bool) {
    both(a, b, Session::partial_checksums)
}

#[test]
fn partial_checksums_only_when_both_hosts_take_them() {
    // (initiator takes them, responder takes them): a host without them plays an older v2
    // host; the handshake completes either way (the older host never sees the bit in the
    // response), the cipher is negotiated as before, and neither sender may leave checksums
    // partial unless both said so.
    for (ta, tb) in [(true, true), (false, true), (true, false)] {
        let (a, b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
        let older = |p: Peer, takes: bool| {
            if takes {
                p
            } else {
                p.without_partial_checksums()
            }
        };
        let (mut a, mut b) = (older(a, ta), older(b, tb));
        handshake(&mut a, &mut b, 0);
        let both_take = ta && tb;
        assert_eq!(partial_both(&a, &b), (both_take, both_take), "{ta} {tb}");
        assert_eq!(
            established_cipher(&a, &b),
            (Cipher::Aes256Gcm, Cipher::Aes256Gcm)
        );
        assert_delivers(&a, &mut b, b"there", 1);
        assert_delivers(&b, &mut a, b"and back", 1);
    }
}

#[test]
fn a_v1_session_never_takes_partial_checksums() {
    let (mut a, mut b) = pair_with(Ciphers::ALL, Ciphers::ALL, Timers::default());
    // the v3 and v2 initiations are lost; the v1 retransmission is answered
    let _lost = a.tick(at(0)).expect("v3 initiation");
    let _lost = a.tick(at(600)).expect("v2 initiation");
    let init = a.tick(at(1600)).expect("v1 retransmission");
    assert_eq!(init[0], MSG_INITIATION);
    let Got::Reply(resp) = receive(&mut b, init, 1600).unwrap() else {
        panic!("no response")
    };
    let Got::Reply(keepalive) = receive(&mut a, resp, 1600).unwrap() else {
        panic!("no keepalive")
    };
    receive(&mut b, keepalive, 1600).unwrap();
    assert_eq!(a.current().unwrap().version(), Version::V1);
    assert_eq!(partial_both(&a, &b), (false, false));
}

#[test]
fn a_response_choice_is_read_strictly() {
    use crate::peer::{parse_choice as parse, CAP_PARTIAL_CHECKSUMS as P};
    let (aes, chacha) = (Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305);
    assert_eq!(parse(2, Ciphers::ALL, true), Ok((aes, false)));
    assert_eq!(parse(2 | P, Ciphers::ALL, true), Ok((aes, true)));
    assert_eq!(parse(1 | P, Ciphers::CHACHA_ONLY, true), Ok((chacha, true)));
    // partial checksums this host did not offer, a cipher it did not offer, or no cipher
    assert_eq!(
        parse(2 | P, Ciphers::ALL, false),
        Err(CryptoError::BadHandshake)
    );
    assert_eq!(
        parse(2, Ciphers::CHACHA_ONLY, true),
        Err(CryptoError::BadHandshake)
    );
    for b in [0, P, 3, 3 | P, 0x7f, 0xff] {
        assert_eq!(
            parse(b, Ciphers::ALL, true),
            Err(CryptoError::BadHandshake),
            "{b:#x}"
        );
    }
}
