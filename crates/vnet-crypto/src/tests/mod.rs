//! Tests across the crate's modules: cipher negotiation, interoperation with hosts before
//! v2 and v3, the in-place batch API under threads, rekeying under load, v3's MACs, cookies
//! and budgets, the downgrade rule, and floods of forged handshake messages. Helpers here drive two
//! peers (or a peer and an emulated old host) by hand.

mod batch;
mod cookies;
mod downgrade;
mod flood;
mod interop;
mod negotiation;
mod rekey;

use snow::{HandshakeState, StatelessTransportState};

use crate::{Ciphers, CryptoError, Message, Now, Peer, PrivateKey, Timers};

pub(crate) fn at(ms: u64) -> Now {
    Now {
        mono_ms: ms,
        wall_ns: 1_700_000_000_000_000_000 + ms * 1_000_000,
    }
}

/// Two peers of one link (VNI 5) offering the given ciphers; `a` is the first returned.
pub(crate) fn pair_with(ca: Ciphers, cb: Ciphers, t: Timers) -> (Peer, Peer) {
    let (a, b) = (
        PrivateKey::generate().unwrap(),
        PrivateKey::generate().unwrap(),
    );
    (
        Peer::new(a.clone(), b.public(), 5, t, 100).with_ciphers(ca),
        Peer::new(b, a.public(), 5, t, 900).with_ciphers(cb),
    )
}

/// What a peer made of a datagram.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    /// A data message's plaintext (empty for a keepalive), opened in place.
    Plain(Vec<u8>),
    /// A handshake message's answer (a response, or a keepalive after a response).
    Reply(Vec<u8>),
}

/// Hands a datagram to `p` as the data path would: a data message is opened in place on the
/// session its receiver index names (which then confirms it), any other message goes to the
/// handshake.
pub(crate) fn receive(p: &mut Peer, mut d: Vec<u8>, now: u64) -> Result<Got, CryptoError> {
    let receiver = match Message::parse(&d)? {
        Message::Data { receiver, .. } => receiver,
        m => return p.handle_handshake(&m, at(now)).map(Got::Reply),
    };
    let s = p
        .receiving_session(receiver, now)
        .ok_or(CryptoError::NoSession)?;
    let r = s.open_in_place(&mut d)?;
    p.confirm(&s);
    Ok(Got::Plain(d[r].to_vec()))
}

/// `plain` sealed by `from` at `now` ms opens at `to` to the same bytes.
pub(crate) fn assert_delivers(from: &Peer, to: &mut Peer, plain: &[u8], now: u64) {
    let d = seal(from, plain, now);
    assert_eq!(receive(to, d, now).unwrap(), Got::Plain(plain.to_vec()));
}

/// Seals `plain` on `p`'s sending session with the in-place API.
pub(crate) fn seal(p: &Peer, plain: &[u8], now: u64) -> Vec<u8> {
    let s = p.sending_session(now).expect("a session to send on");
    let mut d = vec![0u8; crate::DATA_HEADER_LEN];
    d.extend_from_slice(plain);
    d.extend_from_slice(&[0; crate::TAG_LEN]);
    let c = s.reserve(1).unwrap();
    s.seal_in_place(c, &mut d).unwrap();
    d
}

/// A full handshake, `a` initiating with its next initiation (whatever its version).
pub(crate) fn handshake(a: &mut Peer, b: &mut Peer, now: u64) {
    let init = a.tick(at(now)).expect("initiation");
    let Got::Reply(resp) = receive(b, init, now).unwrap() else {
        panic!("no response")
    };
    let Got::Reply(keepalive) = receive(a, resp, now).unwrap() else {
        panic!("no keepalive")
    };
    assert_eq!(receive(b, keepalive, now).unwrap(), Got::Plain(vec![]));
}

/// A host as it was before v2, written against snow alone (not this crate's code): v1
/// messages, snow's stateless transport for data; a datagram of another type is not one of
/// its messages (it takes it for VXLAN, which the missing I flag refuses).
pub(crate) struct OldHost {
    local: PrivateKey,
    remote: crate::PublicKey,
    vni: u32,
    prologue: [u8; 16],
    index: u32,
    pending: Option<(HandshakeState, u32)>,
    /// (transport, our index, their index, next counter)
    pub transport: Option<(StatelessTransportState, u32, u32, u64)>,
}

/// What an old host made of a datagram.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OldGot {
    NotMine,
    Reply(Vec<u8>),
    Plain(Vec<u8>),
}

impl OldHost {
    pub fn new(local: PrivateKey, remote: crate::PublicKey, vni: u32) -> OldHost {
        let mut prologue = *b"vnet-kk-v1\0\0\0\0\0\0";
        prologue[12..].copy_from_slice(&vni.to_be_bytes());
        OldHost {
            local,
            remote,
            vni,
            prologue,
            index: 4242,
            pending: None,
            transport: None,
        }
    }

    fn builder(&self) -> snow::Builder<'_> {
        snow::Builder::new("Noise_KK_25519_ChaChaPoly_BLAKE2s".parse().unwrap())
            .local_private_key(&self.local.0)
            .remote_public_key(&self.remote.0)
            .prologue(&self.prologue)
    }

    fn head(&self, kind: u8) -> Vec<u8> {
        let v = self.vni.to_be_bytes();
        vec![kind, v[1], v[2], v[3]]
    }

    pub fn initiate(&mut self, wall_ns: u64) -> Vec<u8> {
        self.index += 1;
        let mut hs = self.builder().build_initiator().unwrap();
        let mut m = self.head(1);
        m.extend_from_slice(&self.index.to_le_bytes());
        let mut buf = [0u8; 200];
        let n = hs.write_message(&wall_ns.to_le_bytes(), &mut buf).unwrap();
        m.extend_from_slice(&buf[..n]);
        assert_eq!(m.len(), 64);
        self.pending = Some((hs, self.index));
        m
    }

    pub fn seal(&mut self, plain: &[u8]) -> Vec<u8> {
        let (t, _, theirs, counter) = self.transport.as_mut().expect("old host's session");
        let mut m = vec![3];
        m.extend_from_slice(&self.vni.to_be_bytes()[1..]);
        m.extend_from_slice(&theirs.to_le_bytes());
        m.extend_from_slice(&counter.to_le_bytes());
        let mut buf = vec![0u8; plain.len() + 16];
        let n = t.write_message(*counter, plain, &mut buf).unwrap();
        *counter += 1;
        m.extend_from_slice(&buf[..n]);
        m
    }

    pub fn receive(&mut self, d: &[u8]) -> Result<OldGot, snow::Error> {
        let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
        let mut buf = vec![0u8; 70000];
        match d.first() {
            Some(1) if d.len() == 64 => {
                let mut hs = self.builder().build_responder().unwrap();
                let n = hs.read_message(&d[8..], &mut buf)?;
                assert_eq!(n, 8);
                self.index += 1;
                let mut m = self.head(2);
                m.extend_from_slice(&self.index.to_le_bytes());
                m.extend_from_slice(&d[4..8]);
                let n = hs.write_message(&[], &mut buf)?;
                m.extend_from_slice(&buf[..n]);
                self.transport = Some((
                    hs.into_stateless_transport_mode()?,
                    self.index,
                    le32(&d[4..8]),
                    0,
                ));
                Ok(OldGot::Reply(m))
            }
            Some(2) if d.len() == 60 => {
                let (mut hs, index) = self.pending.take().expect("an initiation");
                assert_eq!(le32(&d[8..12]), index);
                hs.read_message(&d[12..], &mut buf)?;
                self.transport = Some((
                    hs.into_stateless_transport_mode()?,
                    index,
                    le32(&d[4..8]),
                    0,
                ));
                Ok(OldGot::Reply(self.seal(&[])))
            }
            Some(3) if d.len() >= 32 => {
                let (t, ours, _, _) = self.transport.as_ref().expect("old host's session");
                assert_eq!(le32(&d[4..8]), *ours);
                let counter = u64::from_le_bytes(d[8..16].try_into().unwrap());
                let n = t.read_message(counter, &d[16..], &mut buf)?;
                Ok(OldGot::Plain(buf[..n].to_vec()))
            }
            _ => Ok(OldGot::NotMine),
        }
    }
}
