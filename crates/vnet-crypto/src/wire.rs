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
//! ```
//!
//! Indexes, counters and the timestamp are little-endian. A VXLAN header's first byte is 0x08
//! (the I flag), so no message here is valid VXLAN and no VXLAN datagram is one of these.
//!
//! The handshake is Noise `KK` (`Noise_KK_25519_ChaChaPoly_BLAKE2s`) with the prologue
//! `"vnet-kk-v1"` (v1) or `"vnet-kk-v2"` (v2), zero-padded to 12 bytes, then the VNI (4 bytes,
//! big-endian): a message of one version cannot complete a handshake of the other. Its split
//! gives two 32-byte keys, the first for initiator-to-responder data, the second for the other
//! direction, used with the session's AEAD (AES-256-GCM or ChaCha20-Poly1305) under the nonce
//! `0[4] | counter[8, little-endian]` and no associated data. With ChaCha20-Poly1305 this is
//! snow's own transport encryption, so a v1 session carries the same bytes as before v2.
//!
//! v2 negotiates the data cipher: `ciphers` is a bit set of what the initiator runs fast (1:
//! ChaCha20-Poly1305, always set; 2: AES-256-GCM, set only with AES instructions; other bits
//! are ignored), and `cipher` the responder's choice (1: ChaCha20-Poly1305, 2: AES-256-GCM,
//! only if both offered it). Both travel encrypted and authenticated inside the Noise
//! messages. A v1 session always uses ChaCha20-Poly1305.
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
//! Rolling upgrades: a host before v2 reads types 1 to 3 only (it drops 4 and 5 as not
//! VXLAN). A responder answers v1 with v1 and v2 with v2; an initiator alternates v2 and v1
//! on its retransmissions until a response arrives, and starts again with v2 at the next
//! handshake (a rekey), so an upgraded peer is noticed within one rekey. Someone who can drop
//! datagrams can make two v2 hosts settle on ChaCha20-Poly1305 until the next rekey (they could
//! as well drop everything): it costs speed, not security.

use crate::CryptoError;

pub const MSG_INITIATION: u8 = 1;
pub const MSG_RESPONSE: u8 = 2;
pub const MSG_DATA: u8 = 3;
pub const MSG_INITIATION_V2: u8 = 4;
pub const MSG_RESPONSE_V2: u8 = 5;

/// Noise KK message 1: ephemeral key, then the encrypted 8-byte timestamp and its tag.
pub const INITIATION_NOISE_LEN: usize = 32 + 8 + TAG_LEN;
/// Noise KK message 2: ephemeral key, then an empty payload's tag.
pub const RESPONSE_NOISE_LEN: usize = 32 + TAG_LEN;
pub const INITIATION_LEN: usize = 8 + INITIATION_NOISE_LEN;
pub const RESPONSE_LEN: usize = 12 + RESPONSE_NOISE_LEN;
/// The payload of a v2 initiation: the timestamp and the ciphers byte.
pub const INITIATION_V2_PAYLOAD_LEN: usize = 8 + 1;
/// The payload of a v2 response: the chosen cipher.
pub const RESPONSE_V2_PAYLOAD_LEN: usize = 1;
pub const INITIATION_V2_NOISE_LEN: usize = 32 + INITIATION_V2_PAYLOAD_LEN + TAG_LEN;
pub const RESPONSE_V2_NOISE_LEN: usize = 32 + RESPONSE_V2_PAYLOAD_LEN + TAG_LEN;
pub const INITIATION_V2_LEN: usize = 8 + INITIATION_V2_NOISE_LEN;
pub const RESPONSE_V2_LEN: usize = 12 + RESPONSE_V2_NOISE_LEN;
pub const DATA_HEADER_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
/// Bytes a data message adds to the VXLAN datagram it carries.
pub const DATA_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;
/// The largest ciphertext Noise allows in one message.
pub const MAX_CIPHERTEXT: usize = 65535;

/// The handshake's version: v1 (types 1 and 2, every host) or v2 (types 4 and 5, which
/// negotiate the data cipher).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The message types of this version's initiation and response.
    pub fn types(self) -> (u8, u8) {
        match self {
            Version::V1 => (MSG_INITIATION, MSG_RESPONSE),
            Version::V2 => (MSG_INITIATION_V2, MSG_RESPONSE_V2),
        }
    }

    /// The lengths of this version's Noise messages 1 and 2.
    pub fn noise_lens(self) -> (usize, usize) {
        match self {
            Version::V1 => (INITIATION_NOISE_LEN, RESPONSE_NOISE_LEN),
            Version::V2 => (INITIATION_V2_NOISE_LEN, RESPONSE_V2_NOISE_LEN),
        }
    }
}

/// A parsed message, borrowing the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    Initiation {
        vni: u32,
        version: Version,
        sender: u32,
        noise: &'a [u8],
    },
    Response {
        vni: u32,
        version: Version,
        sender: u32,
        receiver: u32,
        noise: &'a [u8],
    },
    Data {
        vni: u32,
        receiver: u32,
        counter: u64,
        ciphertext: &'a [u8],
    },
}

/// Whether a datagram's first byte says it is one of these messages (not VXLAN).
pub fn is_crypto(datagram: &[u8]) -> bool {
    matches!(
        datagram.first(),
        Some(&(MSG_INITIATION | MSG_RESPONSE | MSG_DATA | MSG_INITIATION_V2 | MSG_RESPONSE_V2))
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
    /// Parses a datagram. Handshake messages must have their exact length; a data message
    /// must hold at least a tag.
    pub fn parse(b: &'a [u8]) -> Result<Message<'a>, CryptoError> {
        let kind = *b.first().ok_or(CryptoError::Truncated)?;
        let need = match kind {
            MSG_INITIATION => INITIATION_LEN,
            MSG_RESPONSE => RESPONSE_LEN,
            MSG_INITIATION_V2 => INITIATION_V2_LEN,
            MSG_RESPONSE_V2 => RESPONSE_V2_LEN,
            MSG_DATA => DATA_HEADER_LEN + TAG_LEN,
            _ => return Err(CryptoError::NotCrypto),
        };
        if b.len() < need {
            return Err(CryptoError::Truncated);
        }
        let vni = vni_of(b);
        // (Of a handshake message: data messages have no version.)
        let version = if kind == MSG_INITIATION || kind == MSG_RESPONSE {
            Version::V1
        } else {
            Version::V2
        };
        match kind {
            MSG_INITIATION | MSG_INITIATION_V2 if b.len() == need => Ok(Message::Initiation {
                vni,
                version,
                sender: u32_at(b, 4),
                noise: &b[8..],
            }),
            MSG_RESPONSE | MSG_RESPONSE_V2 if b.len() == need => Ok(Message::Response {
                vni,
                version,
                sender: u32_at(b, 4),
                receiver: u32_at(b, 8),
                noise: &b[12..],
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
            | Message::Data { vni, .. } => *vni,
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
        // v2 messages are one byte longer than v1's, and each type has its exact length.
        assert_eq!((INITIATION_V2_LEN, RESPONSE_V2_LEN), (65, 61));
        for (kind, len) in [
            (MSG_INITIATION_V2, INITIATION_V2_LEN),
            (MSG_RESPONSE_V2, RESPONSE_V2_LEN),
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
        assert_eq!(Message::parse(&[6; 80]), Err(CryptoError::NotCrypto));
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
                noise: &m[8..]
            }
        );
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
