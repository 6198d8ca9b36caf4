//! Rolling upgrades: a current host and one before v2 (emulated with snow alone, as its code
//! was) establish a ChaCha20-Poly1305 session whichever initiates, and their data messages
//! open on the other side: the in-place AEAD is byte for byte snow's transport. A current host
//! and one before v3 (this crate's peer limited to v2) establish a v2 session whichever
//! initiates.

use super::*;
use crate::wire::{
    Version, MSG_INITIATION, MSG_INITIATION_V2, MSG_INITIATION_V3, MSG_RESPONSE, MSG_RESPONSE_V2,
    RESPONSE_LEN,
};
use crate::Cipher;

fn hosts() -> (Peer, OldHost) {
    let (knew, kold) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    let new =
        Peer::new(knew.clone(), kold.public(), 5, Timers::default(), 77).with_ciphers(Ciphers::ALL);
    (new, OldHost::new(kold, knew.public(), 5))
}

/// Data both ways, through both of the current host's APIs.
fn data_flows(new: &mut Peer, old: &mut OldHost, now: u64) {
    let s = new.sending_session(now).expect("session");
    assert_eq!(s.cipher(), Cipher::ChaCha20Poly1305);
    assert_eq!(s.version(), Version::V1);
    for len in [0usize, 1, 100, 1400, 9000] {
        let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        // In place.
        let d = seal(new, &plain, now);
        assert_eq!(old.receive(&d).unwrap(), OldGot::Plain(plain.clone()));
        // The copying API of before.
        let mut d = vec![];
        s.seal(&[&plain[..len / 2], &plain[len / 2..]], &mut vec![], &mut d)
            .unwrap();
        assert_eq!(old.receive(&d).unwrap(), OldGot::Plain(plain.clone()));
        // From the old host.
        let d = old.seal(&plain);
        assert_eq!(
            receive(new, d.clone(), now).unwrap(),
            Got::Plain(plain.clone())
        );
        assert_eq!(receive(new, d, now), Err(CryptoError::Replay));
    }
}

/// The old host answers `new`'s v1 initiation `v1`; `new` completes the handshake at `now`
/// with a keepalive, which the old host takes as empty data.
fn old_host_answers(new: &mut Peer, old: &mut OldHost, v1: &[u8], now: u64) {
    let OldGot::Reply(resp) = old.receive(v1).unwrap() else {
        panic!("no response")
    };
    let Got::Reply(keepalive) = receive(new, resp, now).unwrap() else {
        panic!("no keepalive")
    };
    assert_eq!(old.receive(&keepalive).unwrap(), OldGot::Plain(vec![]));
}

#[test]
fn old_initiator_new_responder() {
    let (mut new, mut old) = hosts();
    let init = old.initiate(at(0).wall_ns);
    let Got::Reply(resp) = receive(&mut new, init, 0).unwrap() else {
        panic!("no response")
    };
    assert_eq!((resp[0], resp.len()), (MSG_RESPONSE, RESPONSE_LEN));
    let OldGot::Reply(keepalive) = old.receive(&resp).unwrap() else {
        panic!("no keepalive")
    };
    assert_eq!(receive(&mut new, keepalive, 0).unwrap(), Got::Plain(vec![]));
    assert_eq!(new.state(), "established");
    assert_eq!(new.stats.handshakes_v1, 1);
    data_flows(&mut new, &mut old, 1);
}

#[test]
fn new_initiator_old_responder() {
    let (mut new, mut old) = hosts();
    // The v3 and v2 initiations are nothing to the old host; the one 1.5 s later is v1.
    for (ms, kind) in [(0, MSG_INITIATION_V3), (500, MSG_INITIATION_V2)] {
        let m = new.tick(at(ms)).unwrap();
        assert_eq!(m[0], kind);
        assert_eq!(old.receive(&m).unwrap(), OldGot::NotMine);
    }
    assert!(new.tick(at(1400)).is_none());
    let v1 = new.tick(at(1500)).unwrap();
    assert_eq!(v1[0], MSG_INITIATION);
    old_host_answers(&mut new, &mut old, &v1, 1510);
    data_flows(&mut new, &mut old, 1600);
    // At the rekey the current host tries v3 and v2 first again, then v1; the old session
    // carries data all along.
    let t = 121_600;
    for (ms, kind) in [(t, MSG_INITIATION_V3), (t + 500, MSG_INITIATION_V2)] {
        let m = new.tick(at(ms)).unwrap();
        assert_eq!(m[0], kind);
        assert_eq!(old.receive(&m).unwrap(), OldGot::NotMine);
    }
    let d = seal(&new, b"during the rekey", t + 700);
    assert_eq!(
        old.receive(&d).unwrap(),
        OldGot::Plain(b"during the rekey".to_vec())
    );
    let v1 = new.tick(at(t + 1500)).unwrap();
    assert_eq!(v1[0], MSG_INITIATION);
    old_host_answers(&mut new, &mut old, &v1, t + 1510);
    assert_eq!((new.stats.rekeys, new.stats.handshakes_v1), (1, 2));
    data_flows(&mut new, &mut old, t + 1600);
}

/// A current host and a host before v3 (which takes types 6, 7 and 16 for something else).
fn v2_hosts() -> (Peer, Peer) {
    let (knew, kold) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    (
        Peer::new(knew.clone(), kold.public(), 5, Timers::default(), 1),
        Peer::new(kold, knew.public(), 5, Timers::default(), 2).up_to_version(Version::V2),
    )
}

#[test]
fn v2_initiator_v3_responder() {
    let (mut new, mut old) = v2_hosts();
    let init = old.tick(at(0)).unwrap();
    assert_eq!(init[0], MSG_INITIATION_V2);
    handshake_with(&mut old, &mut new, init, 0);
    assert_eq!(new.current().unwrap().version(), Version::V2);
    assert!(!new.peer_speaks_v3());
    assert_delivers(&new, &mut old, b"to the old host", 1);
    assert_delivers(&old, &mut new, b"from it", 1);
}

#[test]
fn v3_initiator_v2_responder() {
    let (mut new, mut old) = v2_hosts();
    let v3 = new.tick(at(0)).unwrap();
    assert_eq!(v3[0], MSG_INITIATION_V3);
    assert_eq!(receive(&mut old, v3, 0), Err(CryptoError::NotCrypto));
    assert_eq!(old.stats.responses_sent, 0);
    let v2 = new.tick(at(500)).unwrap();
    assert_eq!(v2[0], MSG_INITIATION_V2);
    handshake_with(&mut new, &mut old, v2, 500);
    assert_eq!(old.current().unwrap().version(), Version::V2);
    assert_delivers(&new, &mut old, b"over v2", 501);
    // The rekey tries v3 first again.
    assert_eq!(new.tick(at(120_500)).unwrap()[0], MSG_INITIATION_V3);
}

/// `a`'s initiation `init` answered by `b` at `now`, and the handshake completed.
fn handshake_with(a: &mut Peer, b: &mut Peer, init: Vec<u8>, now: u64) {
    let Got::Reply(resp) = receive(b, init, now).unwrap() else {
        panic!("no response")
    };
    assert!(resp[0] == MSG_RESPONSE_V2 || resp[0] == MSG_RESPONSE);
    let Got::Reply(keepalive) = receive(a, resp, now).unwrap() else {
        panic!("no keepalive")
    };
    assert_eq!(receive(b, keepalive, now).unwrap(), Got::Plain(vec![]));
}
