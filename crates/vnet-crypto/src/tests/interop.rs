//! Rolling upgrades: a current host and one before v2 (emulated with snow alone, as its code
//! was) establish a ChaCha20-Poly1305 session whichever initiates, and their data messages
//! open on the other side: the in-place AEAD is byte for byte snow's transport.

use super::*;
use crate::wire::{Version, MSG_INITIATION, MSG_INITIATION_V2, MSG_RESPONSE, RESPONSE_LEN};
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
    // The v2 initiation is nothing to the old host; the retransmission 500 ms later is v1.
    let v2 = new.tick(at(0)).unwrap();
    assert_eq!(v2[0], MSG_INITIATION_V2);
    assert_eq!(old.receive(&v2).unwrap(), OldGot::NotMine);
    assert!(new.tick(at(400)).is_none());
    let v1 = new.tick(at(500)).unwrap();
    assert_eq!(v1[0], MSG_INITIATION);
    old_host_answers(&mut new, &mut old, &v1, 510);
    data_flows(&mut new, &mut old, 600);
    // At the rekey the current host tries v2 first again, then v1; the old session carries
    // data all along.
    let v2 = new.tick(at(120_600)).unwrap();
    assert_eq!(v2[0], MSG_INITIATION_V2);
    assert_eq!(old.receive(&v2).unwrap(), OldGot::NotMine);
    let d = seal(&new, b"during the rekey", 120_700);
    assert_eq!(
        old.receive(&d).unwrap(),
        OldGot::Plain(b"during the rekey".to_vec())
    );
    let v1 = new.tick(at(121_100)).unwrap();
    assert_eq!(v1[0], MSG_INITIATION);
    old_host_answers(&mut new, &mut old, &v1, 121_110);
    assert_eq!((new.stats.rekeys, new.stats.handshakes_v1), (1, 2));
    data_flows(&mut new, &mut old, 121_200);
}
