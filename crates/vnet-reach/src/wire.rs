//! Reach messages on the VXLAN socket: authenticated pings and pongs between two hosts, and the
//! relay header. The first byte tells every kind on that socket apart: VXLAN `0x08`, encrypted
//! links below `0x20`, STUN `0x00`/`0x01` (with its magic cookie), these `0x20..=0x22`.
//!
//! ```text
//! ping  (0x20): type | ver | flags | 0 | sender probe key[32] | nonce[12] | sealed body | tag[16]
//! pong  (0x21): the same header
//! relay (0x22): type | ver | 0 | 0 | peer tag[8] | payload
//! ping body: txid[12] | wall clock ms (u64 LE) | zero padding
//! pong body: txid[12] | wall clock ms (u64 LE) | family (4 or 6) | port (u16 BE) | address[16] | zero padding
//! ```
//!
//! The body is sealed with the pair key (`keys`), the 48-byte header as associated data, so a
//! flag or the sender's key cannot be changed either. Padding makes a ping a path-MTU probe:
//! with [`FLAG_PAD_REPLY`] the pong is padded to the ping's length.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use vnet_crypto::PublicKey;

use crate::keys::{PairKey, Tag, AEAD_TAG_LEN, NONCE_LEN, TAG_LEN};
use crate::ReachError;

pub const MSG_PING: u8 = 0x20;
pub const MSG_PONG: u8 = 0x21;
pub const MSG_RELAY: u8 = 0x22;
pub const VERSION: u8 = 1;

/// Ping flag: record my binding (I use you as a relay).
pub const FLAG_BIND: u8 = 1;
/// Ping flag: pad your pong to this ping's length (a path-MTU probe of both directions).
pub const FLAG_PAD_REPLY: u8 = 2;

pub const PROBE_HEADER_LEN: usize = 4 + 32 + NONCE_LEN;
pub const TXID_LEN: usize = 12;
const PING_BODY_LEN: usize = TXID_LEN + 8;
const PONG_BODY_LEN: usize = TXID_LEN + 8 + 1 + 2 + 16;
/// The smallest ping and pong on the wire.
pub const PING_LEN: usize = PROBE_HEADER_LEN + PING_BODY_LEN + AEAD_TAG_LEN;
pub const PONG_LEN: usize = PROBE_HEADER_LEN + PONG_BODY_LEN + AEAD_TAG_LEN;
/// The largest probe: a jumbo frame's path (9216 bytes of IP packet) less IP and UDP headers.
pub const MAX_PROBE_LEN: usize = 9216 - 28;
pub const RELAY_HEADER_LEN: usize = 4 + TAG_LEN;

/// What a datagram on the VXLAN socket is, as far as this crate is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ping,
    Pong,
    Relay,
}

/// The reach kind of a datagram, from its first byte (`None`: not one of ours).
pub fn kind_of(buf: &[u8]) -> Option<Kind> {
    match *buf.first()? {
        MSG_PING => Some(Kind::Ping),
        MSG_PONG => Some(Kind::Pong),
        MSG_RELAY => Some(Kind::Relay),
        _ => None,
    }
}

/// A probe's header, readable before anything is authenticated (to find the pair key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeHeader {
    pub kind: Kind,
    pub flags: u8,
    pub sender: PublicKey,
    pub nonce: [u8; NONCE_LEN],
}

impl ProbeHeader {
    fn bytes(&self) -> [u8; PROBE_HEADER_LEN] {
        let mut h = [0u8; PROBE_HEADER_LEN];
        h[0] = match self.kind {
            Kind::Ping => MSG_PING,
            _ => MSG_PONG,
        };
        h[1] = VERSION;
        h[2] = self.flags;
        h[4..36].copy_from_slice(&self.sender.0);
        h[36..48].copy_from_slice(&self.nonce);
        h
    }
}

/// A ping's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ping {
    pub txid: [u8; TXID_LEN],
    pub wall_ms: u64,
}

/// A pong's body: which ping it answers and where that ping came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pong {
    pub txid: [u8; TXID_LEN],
    pub wall_ms: u64,
    pub observed: SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeBody {
    Ping(Ping),
    Pong(Pong),
}

/// Reads a probe's header (not yet authenticated).
pub fn peek_probe(buf: &[u8]) -> Result<ProbeHeader, ReachError> {
    let kind = match kind_of(buf) {
        Some(k @ (Kind::Ping | Kind::Pong)) => k,
        _ => return Err(ReachError::NotReach),
    };
    let min = match kind {
        Kind::Ping => PING_LEN,
        _ => PONG_LEN,
    };
    if buf.len() < min {
        return Err(ReachError::Truncated);
    }
    if buf.len() > MAX_PROBE_LEN {
        return Err(ReachError::TooLong);
    }
    if buf[1] != VERSION {
        return Err(ReachError::BadVersion);
    }
    if buf[3] != 0 {
        return Err(ReachError::Malformed);
    }
    let mut sender = [0u8; 32];
    sender.copy_from_slice(&buf[4..36]);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&buf[36..48]);
    Ok(ProbeHeader {
        kind,
        flags: buf[2],
        sender: PublicKey(sender),
        nonce,
    })
}

/// A sealed probe of `len` bytes at least (padding up to it, at most [`MAX_PROBE_LEN`]).
pub fn seal_probe(key: &PairKey, hdr: &ProbeHeader, body: &ProbeBody, len: usize) -> Vec<u8> {
    let h = hdr.bytes();
    let mut plain = Vec::with_capacity(len.max(PONG_LEN));
    match body {
        ProbeBody::Ping(p) => {
            plain.extend_from_slice(&p.txid);
            plain.extend_from_slice(&p.wall_ms.to_le_bytes());
        }
        ProbeBody::Pong(p) => {
            plain.extend_from_slice(&p.txid);
            plain.extend_from_slice(&p.wall_ms.to_le_bytes());
            let (family, addr) = match p.observed.ip().to_canonical() {
                IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
                IpAddr::V6(v6) => (6u8, v6.octets()),
            };
            plain.push(family);
            plain.extend_from_slice(&p.observed.port().to_be_bytes());
            plain.extend_from_slice(&addr);
        }
    }
    let target = len.min(MAX_PROBE_LEN);
    let body_len = target.saturating_sub(PROBE_HEADER_LEN + AEAD_TAG_LEN);
    if plain.len() < body_len {
        plain.resize(body_len, 0);
    }
    key.seal(hdr.nonce, &h, &mut plain);
    let mut out = Vec::with_capacity(h.len() + plain.len());
    out.extend_from_slice(&h);
    out.extend_from_slice(&plain);
    out
}

/// Authenticates and reads a probe whose header [`peek_probe`] accepted.
pub fn open_probe(key: &PairKey, buf: &[u8]) -> Result<(ProbeHeader, ProbeBody), ReachError> {
    let hdr = peek_probe(buf)?;
    let mut sealed = buf[PROBE_HEADER_LEN..].to_vec();
    let n = key.open(hdr.nonce, &buf[..PROBE_HEADER_LEN], &mut sealed)?;
    let plain = &sealed[..n];
    let mut txid = [0u8; TXID_LEN];
    txid.copy_from_slice(&plain[..TXID_LEN]);
    let mut wall = [0u8; 8];
    wall.copy_from_slice(&plain[TXID_LEN..TXID_LEN + 8]);
    let wall_ms = u64::from_le_bytes(wall);
    let body = match hdr.kind {
        Kind::Ping => ProbeBody::Ping(Ping { txid, wall_ms }),
        _ => {
            // The length was checked against PONG_LEN before opening.
            let rest = &plain[TXID_LEN + 8..PONG_BODY_LEN];
            let port = u16::from_be_bytes([rest[1], rest[2]]);
            let mut a = [0u8; 16];
            a.copy_from_slice(&rest[3..19]);
            let ip = match rest[0] {
                4 => {
                    let v6 = Ipv6Addr::from(a);
                    match v6.to_ipv4_mapped() {
                        Some(v4) => IpAddr::V4(v4),
                        None => return Err(ReachError::Malformed),
                    }
                }
                6 => IpAddr::V6(Ipv6Addr::from(a)),
                _ => return Err(ReachError::Malformed),
            };
            ProbeBody::Pong(Pong {
                txid,
                wall_ms,
                observed: SocketAddr::new(ip, port),
            })
        }
    };
    Ok((hdr, body))
}

/// The relay header naming `tag` (the destination towards a relay, the source from it).
pub fn relay_header(tag: Tag) -> [u8; RELAY_HEADER_LEN] {
    let mut h = [0u8; RELAY_HEADER_LEN];
    h[0] = MSG_RELAY;
    h[1] = VERSION;
    h[4..].copy_from_slice(&tag.0);
    h
}

/// A relay datagram's tag and where its payload starts.
pub fn parse_relay(buf: &[u8]) -> Result<(Tag, usize), ReachError> {
    if kind_of(buf) != Some(Kind::Relay) {
        return Err(ReachError::NotReach);
    }
    if buf.len() <= RELAY_HEADER_LEN {
        return Err(ReachError::Truncated);
    }
    if buf[1] != VERSION {
        return Err(ReachError::BadVersion);
    }
    if buf[2] != 0 || buf[3] != 0 {
        return Err(ReachError::Malformed);
    }
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(&buf[4..RELAY_HEADER_LEN]);
    Ok((Tag(t), RELAY_HEADER_LEN))
}

/// Rewrites a relay datagram's tag in place (the relay names the source instead of the
/// destination); the caller checked it with [`parse_relay`].
pub fn set_relay_tag(buf: &mut [u8], tag: Tag) {
    if buf.len() >= RELAY_HEADER_LEN {
        buf[4..RELAY_HEADER_LEN].copy_from_slice(&tag.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_crypto::PrivateKey;

    fn pair() -> (PairKey, PairKey, PublicKey) {
        let a = PrivateKey([1; 32]);
        let b = PrivateKey([2; 32]);
        let (ap, bp) = (a.public(), b.public());
        (
            PairKey::derive(&a, &ap, &bp).unwrap(),
            PairKey::derive(&b, &bp, &ap).unwrap(),
            ap,
        )
    }

    fn hdr(kind: Kind, sender: PublicKey) -> ProbeHeader {
        ProbeHeader {
            kind,
            flags: FLAG_BIND,
            sender,
            nonce: [9; 12],
        }
    }

    #[test]
    fn ping_round_trip() {
        let (ab, ba, ap) = pair();
        let body = ProbeBody::Ping(Ping {
            txid: [3; 12],
            wall_ms: 1234,
        });
        let m = seal_probe(&ab, &hdr(Kind::Ping, ap), &body, 0);
        assert_eq!(m.len(), PING_LEN);
        assert_eq!(kind_of(&m), Some(Kind::Ping));
        let (h, b) = open_probe(&ba, &m).unwrap();
        assert_eq!(h, hdr(Kind::Ping, ap));
        assert_eq!(b, body);
    }

    #[test]
    fn pong_round_trip_both_families_and_padding() {
        let (ab, ba, ap) = pair();
        for obs in ["203.0.113.9:40000", "[2001:db8::7]:4789"] {
            let body = ProbeBody::Pong(Pong {
                txid: [4; 12],
                wall_ms: 99,
                observed: obs.parse().unwrap(),
            });
            let m = seal_probe(&ab, &hdr(Kind::Pong, ap), &body, 1400);
            assert_eq!(m.len(), 1400);
            assert_eq!(open_probe(&ba, &m).unwrap().1, body);
        }
    }

    #[test]
    fn tampering_is_refused() {
        let (ab, ba, ap) = pair();
        let body = ProbeBody::Ping(Ping {
            txid: [3; 12],
            wall_ms: 1,
        });
        let m = seal_probe(&ab, &hdr(Kind::Ping, ap), &body, 0);
        for i in [0usize, 2, 10, 40, 50, m.len() - 1] {
            let mut t = m.clone();
            t[i] ^= 1;
            let r = open_probe(&ba, &t);
            assert!(r.is_err(), "byte {i}: {r:?}");
        }
        // A ping's header with a pong's type is not a pong (and too short for one).
        let mut t = m.clone();
        t[0] = MSG_PONG;
        assert_eq!(open_probe(&ba, &t), Err(ReachError::Truncated));
    }

    #[test]
    fn bad_headers() {
        assert_eq!(peek_probe(&[]), Err(ReachError::NotReach));
        assert_eq!(peek_probe(&[0x08; 100]), Err(ReachError::NotReach));
        assert_eq!(peek_probe(&[MSG_PING; 10]), Err(ReachError::Truncated));
        let mut m = vec![0u8; PING_LEN];
        m[0] = MSG_PING;
        m[1] = 2;
        assert_eq!(peek_probe(&m), Err(ReachError::BadVersion));
        m[1] = VERSION;
        m[3] = 1;
        assert_eq!(peek_probe(&m), Err(ReachError::Malformed));
        let mut big = vec![0u8; MAX_PROBE_LEN + 1];
        big[0] = MSG_PING;
        assert_eq!(peek_probe(&big), Err(ReachError::TooLong));
    }

    #[test]
    fn relay_headers() {
        let mut m = relay_header(Tag([5; 8])).to_vec();
        assert_eq!(parse_relay(&m), Err(ReachError::Truncated));
        m.push(0x08);
        assert_eq!(parse_relay(&m), Ok((Tag([5; 8]), RELAY_HEADER_LEN)));
        set_relay_tag(&mut m, Tag([6; 8]));
        assert_eq!(parse_relay(&m).unwrap().0, Tag([6; 8]));
        m[2] = 1;
        assert_eq!(parse_relay(&m), Err(ReachError::Malformed));
        assert_eq!(parse_relay(&[0x08, 0, 0]), Err(ReachError::NotReach));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let (_, ba, _) = pair();
            let _ = peek_probe(&data);
            let _ = open_probe(&ba, &data);
            let _ = parse_relay(&data);
        }
    }
}
