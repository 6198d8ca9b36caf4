//! Host keys as vnet writes them: 32 raw bytes, in text as standard base64 (as WireGuard
//! writes its keys). A link's `encrypt` and `reach` options, the cluster's host records and
//! the reach probes name a peer by its [`PublicKey`].
//!
//! Why here and not in `vnet-crypto`: the control language and the cluster's schema carry and
//! check keys but never compute with them, so they take the type from this leaf crate and do
//! not link the crypto. `vnet-crypto` re-exports [`PublicKey`] (one type everywhere) and does
//! the arithmetic (deriving it from a private key, the handshake).

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// Bytes of a host key, public or private (X25519).
pub const KEY_LEN: usize = 32;

/// Why a key's text is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyParseError {
    #[error("key is not base64: {0}")]
    Base64(String),
    #[error("key is {0} bytes, not 32")]
    Length(usize),
}

/// A key's 32 bytes from its base64 text (surrounding whitespace ignored: a key file ends in a
/// newline).
pub fn decode_key(s: &str) -> Result<[u8; KEY_LEN], KeyParseError> {
    let bytes = STANDARD
        .decode(s.trim())
        .map_err(|e| KeyParseError::Base64(e.to_string()))?;
    <[u8; KEY_LEN]>::try_from(bytes.as_slice()).map_err(|_| KeyParseError::Length(bytes.len()))
}

/// A key's base64 text.
pub fn encode_key(key: &[u8; KEY_LEN]) -> String {
    STANDARD.encode(key)
}

/// A host's public key: what a peer's link names with `encrypt`, and a reach probe with
/// `reach`. Displayed as its base64 text, which [`PublicKey::parse`] reads back.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl PublicKey {
    pub fn parse(s: &str) -> Result<PublicKey, KeyParseError> {
        decode_key(s).map(PublicKey)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&encode_key(&self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let k = PublicKey(core::array::from_fn(|i| i as u8 * 7));
        let text = k.to_string();
        assert_eq!(text, "AAcOFRwjKjE4P0ZNVFtiaXB3foWMk5qhqK+2vcTL0tk=");
        assert_eq!(PublicKey::parse(&text), Ok(k));
        assert_eq!(PublicKey::parse(&format!(" {text}\n")), Ok(k));
        assert_eq!(format!("{k:?}"), format!("PublicKey({text})"));
    }

    #[test]
    fn bad_keys() {
        assert!(matches!(
            PublicKey::parse("!!"),
            Err(KeyParseError::Base64(_))
        ));
        assert_eq!(PublicKey::parse("AAAA"), Err(KeyParseError::Length(3)));
        assert_eq!(
            PublicKey::parse("AAAA").unwrap_err().to_string(),
            "key is 3 bytes, not 32"
        );
    }
}
