//! Message formats of encrypted links, carried in UDP datagrams on the VXLAN port.
//!
//! Every message starts with a type byte and the 24-bit VNI of the link (big-endian, as in a
//! VXLAN header), so the receiver finds the link by (source IP, VNI) as for plaintext VXLAN:
//!
//! ```text
//! initiation (1): type | vni[3] | sender index[4] | Noise KK message 1 (e, es, ss; payload: timestamp[8])  = 64 bytes
//! response   (2): type | vni[3] | sender index[4] | receiver index[4] | Noise KK message 2 (e, ee, se)    = 60 bytes
//! data       (3): type | vni[3] | receiver index[4] | counter[8] | ChaCha20-Poly1305(VXLAN header + frame) + tag[16]
//! ```
//!
//! Indexes and counters are little-endian. A VXLAN header's first byte is 0x08 (the I flag),
//! so no message here is valid VXLAN and no VXLAN datagram is one of these.

use crate::CryptoError;

pub const MSG_INITIATION: u8 = 1;
pub const MSG_RESPONSE: u8 = 2;
pub const MSG_DATA: u8 = 3;

/// Noise KK message 1: ephemeral key, then the encrypted 8-byte timestamp and its tag.
pub const INITIATION_NOISE_LEN: usize = 32 + 8 + TAG_LEN;
/// Noise KK message 2: ephemeral key, then an empty payload's tag.
pub const RESPONSE_NOISE_LEN: usize = 32 + TAG_LEN;
pub const INITIATION_LEN: usize = 8 + INITIATION_NOISE_LEN;
pub const RESPONSE_LEN: usize = 12 + RESPONSE_NOISE_LEN;
pub const DATA_HEADER_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
/// Bytes a data message adds to the VXLAN datagram it carries.
pub const DATA_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;
/// The largest ciphertext Noise allows in one message.
pub const MAX_CIPHERTEXT: usize = 65535;

/// A parsed message, borrowing the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    Initiation {
        vni: u32,
        sender: u32,
        noise: &'a [u8],
    },
    Response {
        vni: u32,
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
        Some(&MSG_INITIATION) | Some(&MSG_RESPONSE) | Some(&MSG_DATA)
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
            MSG_DATA => DATA_HEADER_LEN + TAG_LEN,
            _ => return Err(CryptoError::NotCrypto),
        };
        if b.len() < need {
            return Err(CryptoError::Truncated);
        }
        let vni = vni_of(b);
        match kind {
            MSG_INITIATION if b.len() == need => Ok(Message::Initiation {
                vni,
                sender: u32_at(b, 4),
                noise: &b[8..],
            }),
            MSG_RESPONSE if b.len() == need => Ok(Message::Response {
                vni,
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
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::parse(&b);
        }
    }
}
