//! Message formats of encrypted links, carried in UDP datagrams on the VXLAN port.
//!
//! Every message starts with a type byte and the 24-bit VNI of the link (big-endian, as in a
//! VXLAN header), so the receiver finds the link by (source IP, VNI) as for plaintext VXLAN:
//!
//! ```text
//! initiation v1 (1): type | vni[3] | sender index[4] | Noise KK message 1 (e, es, ss; payload: timestamp[8])           = 64 bytes
//! response v1   (2): type | vni[3] | sender index[4] | receiver index[4] | Noise KK message 2 (e, ee, se; empty payload) = 60 bytes
//! data          (3): type | vni[3] | receiver index[4] | counter[8] | AEAD(VXLAN header + frame) | tag[16]
//! initiation v2 (4): type | vni[3] | sender index[4] | Noise KK message 1 (payload: timestamp[8] | ciphers[1])       = 65 bytes
//! response v2   (5): type | vni[3] | sender index[4] | receiver index[4] | Noise KK message 2 (payload: cipher[1])  = 61 bytes
//! initiation v3 (6): the v2 initiation (type 6) | mac1[16] | mac2[16]                                                  = 97 bytes
//! response v3   (7): the v2 response (type 7) | mac1[16] | mac2[16]                                                    = 93 bytes
//! cookie reply (16): type | vni[3] | receiver index[4] | nonce[24] | XChaCha20-Poly1305(cookie[16] | epoch[8]) | tag[16] = 72 bytes
//! ```
//!
//! Indexes, counters, the timestamp and the epoch are little-endian. A VXLAN header's first
//! byte has the I flag (0x08) set, and no type here has it, so no message here is valid VXLAN
//! and no VXLAN datagram is one of these.
//!
//! The handshake is Noise `KK` (`Noise_KK_25519_ChaChaPoly_BLAKE2s`) with the prologue
//! `"vnet-kk-v1"`, `"vnet-kk-v2"` or `"vnet-kk-v3"`, zero-padded to 12 bytes, then the VNI (4
//! bytes, big-endian): a message of one version cannot complete a handshake of another. Its
//! split gives two 32-byte keys, the first for initiator-to-responder data, the second for the
//! other direction, used with the session's AEAD (AES-256-GCM or ChaCha20-Poly1305) under the
//! nonce `0[4] | counter[8, little-endian]` and no associated data. With ChaCha20-Poly1305 this
//! is snow's own transport encryption, so a v1 session carries the same bytes as before v2.
//!
//! v2 negotiates the data cipher: `ciphers` is a bit set of what the initiator runs fast (1:
//! ChaCha20-Poly1305, always set; 2: AES-256-GCM, set only with AES instructions; other bits
//! are ignored), and `cipher` the responder's choice (1: ChaCha20-Poly1305, 2: AES-256-GCM,
//! only if both offered it). Both travel encrypted and authenticated inside the Noise
//! messages. A v1 session always uses ChaCha20-Poly1305. v3's Noise messages and payloads are
//! v2's.
//!
//! Partial checksums: bit 0x80 of `ciphers` says the initiator delivers data whose inner
//! TCP/UDP checksum was left partial (the field holds only the pseudo-header sum, as a
//! virtio-net device passes a TSO segment on), and the responder ORs 0x80 into `cipher` when
//! the initiation had it and it does too (only then: a host from before reads `cipher` as a
//! number). On a session where both said so, a sender that cuts a guest's TSO frame into
//! segments skips their checksums; the receiver recognises such a segment by its field (equal
//! to the pseudo-header sum), merges it unverified and hands it to the guest marked partial,
//! or completes the checksum before the frame leaves toward a network. The AEAD authenticates
//! every byte, so the checksum guards nothing here that the tag does not; elsewhere the
//! checksums stay complete.
//!
//! v3: MACs and cookies (as WireGuard's, whitepaper section 5.4.4; the computations are in
//! `cookie.rs`). Reading an initiation or a response costs two X25519 operations; v3 lets
//! the receiver refuse a forgery before any of them:
//!
//! - `mac1` = BLAKE2s-128, keyed with BLAKE2s-256("vnet-mac1-v3----" | receiver's static
//!   public key), of every byte before it. A sender who does not know the receiver's public
//!   key cannot make one; the receiver checks it first and refuses a bad one unread
//!   (`bad_mac`).
//! - `mac2` = BLAKE2s-128, keyed with the cookie the receiver last gave the sender, of every
//!   byte before it (`mac1` included); zeros when the sender holds no cookie. The receiver
//!   checks it only while the link's handshake budget runs low (under load): a message
//!   without a valid one is then refused unread, and answered with a cookie reply (itself
//!   rate-limited: at most 4 in a burst, then 10 a second per link, each no larger than the
//!   message it answers).
//! - The cookie = BLAKE2s-128, keyed with a random secret the receiver replaces every 2
//!   minutes, of the sender's static public key; `epoch` is the receiver's wall-clock time
//!   (ns) when it made that secret. A cookie reply is sealed with XChaCha20-Poly1305 under
//!   BLAKE2s-256("vnet-cookie-v3--" | X25519(static, static) | replier's public key), a random
//!   nonce, and the first 8 bytes of the reply as associated data. Unlike WireGuard's (keyed by
//!   the replier's public key and bound to the answered message's mac1), only the two hosts of
//!   the link can open it: vnet knows the link (and so the peer's key) from the source address
//!   and VNI before any cryptography, so the static-static secret is computed once per link.
//!   This is what lets cookie replies be rate-limited without being starved: whichever
//!   message (genuine or forged) a reply answers, it goes only to the link's configured peer
//!   address, and only the genuine peer can read the cookie in it and make `mac2`. The receiver
//!   index names the message answered and is informative only.
//! - A host keeps the cookie of the highest epoch it received (an older one, replayed, is
//!   ignored) for 2 minutes; a receiver accepts `mac2` made with its current or previous
//!   secret, so a cookie works from 2 to 4 minutes.
//!
//! Rolling upgrades: a host before v2 reads types 1 to 3 only, one before v3 types 1 to 5 (they
//! drop the others as not VXLAN). A responder answers each version in its own. An initiator
//! rotates v3, v2, v1 on its retransmissions until a response arrives, and starts again with
//! v3 at the next handshake (a rekey), so an upgraded peer is noticed within one rekey. Once a
//! v3 handshake completed with the peer, a link initiates only v3 (three attempts, 1.5 s)
//! before it tries v2, v1 and v3 in turn: a peer rolled back to an older vnetd is found within
//! a rekey interval and 3.5 s (at once if it initiates itself, as it does at its start, and no
//! flood spends the old versions' budget). v1 and
//! v2 messages are never refused for the version alone, but they have their own budgets
//! (without MACs, a forgery cannot be told from them before reading it): forged old-version
//! messages can spend only those, and so delay only old-version handshakes. Someone who can
//! drop datagrams can make two v2 (or v3) hosts settle on an older version until the next
//! rekey (they could as well drop everything): it costs speed, not security (the session is
//! the same Noise KK).

use crate::CryptoError;

pub const MSG_INITIATION: u8 = 1;
pub const MSG_RESPONSE: u8 = 2;
pub const MSG_DATA: u8 = 3;
pub const MSG_INITIATION_V2: u8 = 4;
pub const MSG_RESPONSE_V2: u8 = 5;
pub const MSG_INITIATION_V3: u8 = 6;
pub const MSG_RESPONSE_V3: u8 = 7;
/// (Not 8: every type leaves bit 0x08, VXLAN's I flag, clear.)
pub const MSG_COOKIE_REPLY: u8 = 16;

/// Noise KK message 1: ephemeral key, then the encrypted 8-byte timestamp and its tag.
pub const INITIATION_NOISE_LEN: usize = 32 + 8 + TAG_LEN;
/// Noise KK message 2: ephemeral key, then an empty payload's tag.
pub const RESPONSE_NOISE_LEN: usize = 32 + TAG_LEN;
pub const INITIATION_LEN: usize = 8 + INITIATION_NOISE_LEN;
pub const RESPONSE_LEN: usize = 12 + RESPONSE_NOISE_LEN;
/// The payload of a v2 (and v3) initiation: the timestamp and the ciphers byte.
pub const INITIATION_V2_PAYLOAD_LEN: usize = 8 + 1;
/// The payload of a v2 (and v3) response: the chosen cipher.
pub const RESPONSE_V2_PAYLOAD_LEN: usize = 1;
pub const INITIATION_V2_NOISE_LEN: usize = 32 + INITIATION_V2_PAYLOAD_LEN + TAG_LEN;
pub const RESPONSE_V2_NOISE_LEN: usize = 32 + RESPONSE_V2_PAYLOAD_LEN + TAG_LEN;
pub const INITIATION_V2_LEN: usize = 8 + INITIATION_V2_NOISE_LEN;
pub const RESPONSE_V2_LEN: usize = 12 + RESPONSE_V2_NOISE_LEN;
/// A MAC of a v3 handshake message (mac1, mac2) and a cookie.
pub const MAC_LEN: usize = 16;
/// The two MACs that end a v3 handshake message.
pub const MACS_LEN: usize = 2 * MAC_LEN;
pub const INITIATION_V3_LEN: usize = INITIATION_V2_LEN + MACS_LEN;
pub const RESPONSE_V3_LEN: usize = RESPONSE_V2_LEN + MACS_LEN;
/// A cookie reply's nonce (XChaCha20-Poly1305's).
pub const COOKIE_NONCE_LEN: usize = 24;
/// What a cookie reply seals: the cookie and its epoch.
pub const COOKIE_PLAIN_LEN: usize = MAC_LEN + 8;
pub const COOKIE_REPLY_LEN: usize = 8 + COOKIE_NONCE_LEN + COOKIE_PLAIN_LEN + TAG_LEN;
pub const DATA_HEADER_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
/// Bytes a data message adds to the VXLAN datagram it carries.
pub const DATA_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;
/// The largest ciphertext Noise allows in one message.
pub const MAX_CIPHERTEXT: usize = 65535;

/// The handshake's version: v1 (types 1 and 2, every host), v2 (types 4 and 5, which
/// negotiate the data cipher) or v3 (types 6 and 7: v2's messages with MACs, and cookie
/// replies, type 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V1,
    V2,
    V3,
}

impl Version {
    /// The message types of this version's initiation and response.
    pub fn types(self) -> (u8, u8) {
        match self {
            Version::V1 => (MSG_INITIATION, MSG_RESPONSE),
            Version::V2 => (MSG_INITIATION_V2, MSG_RESPONSE_V2),
            Version::V3 => (MSG_INITIATION_V3, MSG_RESPONSE_V3),
        }
    }

    /// The lengths of this version's Noise messages 1 and 2.
    pub fn noise_lens(self) -> (usize, usize) {
        match self {
            Version::V1 => (INITIATION_NOISE_LEN, RESPONSE_NOISE_LEN),
            Version::V2 | Version::V3 => (INITIATION_V2_NOISE_LEN, RESPONSE_V2_NOISE_LEN),
        }
    }

    /// Whether this version's messages carry MACs (v3).
    pub fn has_macs(self) -> bool {
        self == Version::V3
    }
}

/// A parsed message, borrowing the datagram. `raw` is the whole message: v3's MACs are
/// computed over its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    Initiation {
        vni: u32,
        version: Version,
        sender: u32,
        noise: &'a [u8],
        raw: &'a [u8],
    },
    Response {
        vni: u32,
        version: Version,
        sender: u32,
        receiver: u32,
        noise: &'a [u8],
        raw: &'a [u8],
    },
    Data {
        vni: u32,
        receiver: u32,
        counter: u64,
        ciphertext: &'a [u8],
    },
    /// A cookie reply to a v3 message this host sent (`receiver`: that message's sender
    /// index).
    CookieReply {
        vni: u32,
        receiver: u32,
        raw: &'a [u8],
    },
}

/// Whether a datagram's first byte says it is one of these messages (not VXLAN).
pub fn is_crypto(datagram: &[u8]) -> bool {
    matches!(
        datagram.first(),
        Some(&(MSG_INITIATION..=MSG_RESPONSE_V3 | MSG_COOKIE_REPLY))
    )
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn vni_of(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[1], b[2], b[3]])
}

pub(crate) fn header(kind: u8, vni: u32) -> [u8; 4] {
    let v = vni.to_be_bytes();
    [kind, v[1], v[2], v[3]]
}

impl<'a> Message<'a> {
    /// Parses a datagram. Handshake messages and cookie replies must have their exact length;
    /// a data message must hold at least a tag.
    pub fn parse(b: &'a [u8]) -> Result<Message<'a>, CryptoError> {
        let kind = *b.first().ok_or(CryptoError::Truncated)?;
        let need = match kind {
            MSG_INITIATION => INITIATION_LEN,
            MSG_RESPONSE => RESPONSE_LEN,
            MSG_INITIATION_V2 => INITIATION_V2_LEN,
            MSG_RESPONSE_V2 => RESPONSE_V2_LEN,
            MSG_INITIATION_V3 => INITIATION_V3_LEN,
            MSG_RESPONSE_V3 => RESPONSE_V3_LEN,
            MSG_COOKIE_REPLY => COOKIE_REPLY_LEN,
            MSG_DATA => DATA_HEADER_LEN + TAG_LEN,
            _ => return Err(CryptoError::NotCrypto),
        };
        if b.len() < need {
            return Err(CryptoError::Truncated);
        }
        let vni = vni_of(b);
        // (Of a handshake message: data messages and cookie replies have no version.)
        let version = match kind {
            MSG_INITIATION | MSG_RESPONSE => Version::V1,
            MSG_INITIATION_V2 | MSG_RESPONSE_V2 => Version::V2,
            _ => Version::V3,
        };
        let macs = if version.has_macs() { MACS_LEN } else { 0 };
        match kind {
            MSG_INITIATION | MSG_INITIATION_V2 | MSG_INITIATION_V3 if b.len() == need => {
                Ok(Message::Initiation {
                    vni,
                    version,
                    sender: u32_at(b, 4),
                    noise: &b[8..need - macs],
                    raw: b,
                })
            }
            MSG_RESPONSE | MSG_RESPONSE_V2 | MSG_RESPONSE_V3 if b.len() == need => {
                Ok(Message::Response {
                    vni,
                    version,
                    sender: u32_at(b, 4),
                    receiver: u32_at(b, 8),
                    noise: &b[12..need - macs],
                    raw: b,
                })
            }
            MSG_COOKIE_REPLY if b.len() == need => Ok(Message::CookieReply {
                vni,
                receiver: u32_at(b, 4),
                raw: b,
            }),
            MSG_DATA if b.len() - DATA_HEADER_LEN <= MAX_CIPHERTEXT => {
                let mut c = [0u8; 8];
                c.copy_from_slice(&b[8..16]);
                Ok(Message::Data {
                    vni,
                    receiver: u32_at(b, 4),
                    counter: u64::from_le_bytes(c),
                    ciphertext: &b[DATA_HEADER_LEN..],
                })
            }
            MSG_DATA => Err(CryptoError::TooLarge),
            _ => Err(CryptoError::BadHandshake),
        }
    }

    pub fn vni(&self) -> u32 {
        match self {
            Message::Initiation { vni, .. }
            | Message::Response { vni, .. }
            | Message::Data { vni, .. }
            | Message::CookieReply { vni, .. } => *vni,
        }
    }
}

/// Writes a data message's header.
pub fn data_header(vni: u32, receiver: u32, counter: u64) -> [u8; DATA_HEADER_LEN] {
    let mut h = [0u8; DATA_HEADER_LEN];
    h[..4].copy_from_slice(&header(MSG_DATA, vni));
    h[4..8].copy_from_slice(&receiver.to_le_bytes());
    h[8..16].copy_from_slice(&counter.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn vxlan_is_never_crypto() {
        // A VXLAN header: flags 0x08, reserved, VNI, reserved.
        assert!(!is_crypto(&[0x08, 0, 0, 0, 0, 0, 1, 0]));
        assert_eq!(
            Message::parse(&[0x08, 0, 0, 0, 0, 0, 1, 0]),
            Err(CryptoError::NotCrypto)
        );
    }

    #[test]
    fn data_round_trip() {
        let mut d = data_header(0xabcdef, 7, 1 << 40).to_vec();
        d.extend_from_slice(&[9; 20]);
        match Message::parse(&d).unwrap() {
            Message::Data {
                vni,
                receiver,
                counter,
                ciphertext,
            } => {
                assert_eq!((vni, receiver, counter), (0xabcdef, 7, 1 << 40));
                assert_eq!(ciphertext, &[9; 20]);
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn lengths() {
        assert_eq!(Message::parse(&[]), Err(CryptoError::Truncated));
        assert_eq!(
            Message::parse(&[MSG_INITIATION; INITIATION_LEN - 1]),
            Err(CryptoError::Truncated)
        );
        assert_eq!(
            Message::parse(&[MSG_INITIATION; INITIATION_LEN + 1]),
            Err(CryptoError::BadHandshake)
        );
        assert_eq!(
            Message::parse(&[MSG_DATA; DATA_OVERHEAD - 1]),
            Err(CryptoError::Truncated)
        );
        assert!(Message::parse(&[MSG_RESPONSE; RESPONSE_LEN]).is_ok());
        // v2 messages are one byte longer than v1's, v3's 32 bytes longer than v2's; a cookie
        // reply is shorter than either v3 message it answers; each type has its exact length.
        assert_eq!((INITIATION_V2_LEN, RESPONSE_V2_LEN), (65, 61));
        assert_eq!((INITIATION_V3_LEN, RESPONSE_V3_LEN), (97, 93));
        assert_eq!(COOKIE_REPLY_LEN, 72);
        for (kind, len) in [
            (MSG_INITIATION_V2, INITIATION_V2_LEN),
            (MSG_RESPONSE_V2, RESPONSE_V2_LEN),
            (MSG_INITIATION_V3, INITIATION_V3_LEN),
            (MSG_RESPONSE_V3, RESPONSE_V3_LEN),
            (MSG_COOKIE_REPLY, COOKIE_REPLY_LEN),
        ] {
            assert!(is_crypto(&[kind]));
            assert!(Message::parse(&vec![kind; len]).is_ok());
            assert_eq!(
                Message::parse(&vec![kind; len - 1]),
                Err(CryptoError::Truncated)
            );
            assert_eq!(
                Message::parse(&vec![kind; len + 1]),
                Err(CryptoError::BadHandshake)
            );
        }
        // A v1 message under a v2 type (or the reverse) has the wrong length.
        assert!(Message::parse(&[MSG_INITIATION_V2; INITIATION_LEN]).is_err());
        assert!(Message::parse(&[MSG_RESPONSE; RESPONSE_V2_LEN]).is_err());
        assert!(Message::parse(&[MSG_INITIATION_V3; INITIATION_V2_LEN]).is_err());
        assert_eq!(Message::parse(&[9; 80]), Err(CryptoError::NotCrypto));
        assert!(!is_crypto(&[0]) && !is_crypto(&[9]) && !is_crypto(&[]));
        // No type has VXLAN's I flag.
        for t in [1, 2, 3, 4, 5, 6, 7, MSG_COOKIE_REPLY] {
            assert!(is_crypto(&[t]) && t & 0x08 == 0, "{t}");
        }
        assert!(!is_crypto(&[8]) && !is_crypto(&[0x0c]) && !is_crypto(&[0x88]));
    }

    #[test]
    fn versions_parse() {
        let mut m = vec![0u8; INITIATION_V2_LEN];
        m[..4].copy_from_slice(&header(MSG_INITIATION_V2, 0x123456));
        m[4..8].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            Message::parse(&m).unwrap(),
            Message::Initiation {
                vni: 0x123456,
                version: Version::V2,
                sender: 9,
                noise: &m[8..],
                raw: &m,
            }
        );
        // v3: the Noise message stops before the MACs.
        let mut m = vec![0u8; INITIATION_V3_LEN];
        m[..4].copy_from_slice(&header(MSG_INITIATION_V3, 0x123456));
        match Message::parse(&m).unwrap() {
            Message::Initiation {
                version,
                noise,
                raw,
                ..
            } => {
                assert_eq!(version, Version::V3);
                assert_eq!(noise.len(), INITIATION_V2_NOISE_LEN);
                assert_eq!(raw.len(), INITIATION_V3_LEN);
            }
            m => panic!("{m:?}"),
        }
        let m = vec![MSG_RESPONSE_V3; RESPONSE_V3_LEN];
        match Message::parse(&m).unwrap() {
            Message::Response { version, noise, .. } => {
                assert_eq!((version, noise.len()), (Version::V3, RESPONSE_V2_NOISE_LEN))
            }
            m => panic!("{m:?}"),
        }
        let mut m = vec![0u8; RESPONSE_LEN];
        m[..4].copy_from_slice(&header(MSG_RESPONSE, 7));
        m[8..12].copy_from_slice(&3u32.to_le_bytes());
        match Message::parse(&m).unwrap() {
            Message::Response {
                version, receiver, ..
            } => assert_eq!((version, receiver), (Version::V1, 3)),
            m => panic!("{m:?}"),
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::parse(&b);
        }
    }
}
