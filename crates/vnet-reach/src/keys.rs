//! The keys that authenticate reach messages: a pair key per pair of hosts, from the X25519 of
//! one host's private probe key and the other's public one, so only those two can make or
//! read a probe between them; and a host's tag, the short name a relay header uses.

use std::fmt;

use curve25519_dalek::montgomery::MontgomeryPoint;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use ring::hkdf;
use vnet_crypto::{PrivateKey, PublicKey};

use crate::ReachError;

/// The salt of the pair key's derivation: a key for this protocol and version only.
const PAIR_SALT: &[u8] = b"vnet-reach-v1";
pub const TAG_LEN: usize = 8;
pub const NONCE_LEN: usize = 12;
pub const AEAD_TAG_LEN: usize = 16;

/// A host's short name in relay headers: the first 8 bytes of SHA-256 of its probe key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub [u8; TAG_LEN]);

impl Tag {
    pub fn of(key: &PublicKey) -> Tag {
        let d = ring::digest::digest(&ring::digest::SHA256, &key.0);
        let mut t = [0; TAG_LEN];
        t.copy_from_slice(&d.as_ref()[..TAG_LEN]);
        Tag(t)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({self})")
    }
}

/// The symmetric key two hosts share for their probes (the same on both sides).
pub struct PairKey(LessSafeKey);

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey(..)")
    }
}

struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        CHACHA20_POLY1305.key_len()
    }
}

impl PairKey {
    /// The pair key of `mine` and `theirs`; `None` when their key is a point of small order
    /// (the shared secret would be all zeros, known to anyone).
    pub fn derive(
        mine: &PrivateKey,
        mine_public: &PublicKey,
        theirs: &PublicKey,
    ) -> Option<PairKey> {
        let shared = MontgomeryPoint(theirs.0).mul_clamped(mine.0).to_bytes();
        if shared.iter().all(|b| *b == 0) {
            return None;
        }
        let (lo, hi) = if mine_public.0 <= theirs.0 {
            (mine_public, theirs)
        } else {
            (theirs, mine_public)
        };
        let info: [&[u8]; 2] = [&lo.0, &hi.0];
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, PAIR_SALT).extract(&shared);
        let okm = prk.expand(&info, KeyLen).ok()?;
        let mut key = [0u8; 32];
        okm.fill(&mut key).ok()?;
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key).ok()?;
        Some(PairKey(LessSafeKey::new(unbound)))
    }

    /// Encrypts `body` in place and appends the tag; `aad` is authenticated, not encrypted.
    pub fn seal(&self, nonce: [u8; NONCE_LEN], aad: &[u8], body: &mut Vec<u8>) {
        // Sealing fails only for a body longer than ChaCha20's counter allows (256 GiB).
        let _ = self.0.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            body,
        );
    }

    /// Decrypts `sealed` (ciphertext and tag) in place; returns the plaintext's length.
    pub fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        sealed: &mut [u8],
    ) -> Result<usize, ReachError> {
        self.0
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), sealed)
            .map(|p| p.len())
            .map_err(|_| ReachError::BadAuth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> (PrivateKey, PublicKey) {
        let k = PrivateKey([b; 32]);
        let p = k.public();
        (k, p)
    }

    #[test]
    fn both_sides_derive_the_same_key() {
        let (a, ap) = key(1);
        let (b, bp) = key(2);
        let ab = PairKey::derive(&a, &ap, &bp).unwrap();
        let ba = PairKey::derive(&b, &bp, &ap).unwrap();
        let mut body = b"hello".to_vec();
        ab.seal([7; 12], b"hdr", &mut body);
        assert_eq!(body.len(), 5 + AEAD_TAG_LEN);
        let n = ba.open([7; 12], b"hdr", &mut body).unwrap();
        assert_eq!(&body[..n], b"hello");
    }

    #[test]
    fn a_third_host_cannot_open_it() {
        let (a, ap) = key(1);
        let (_, bp) = key(2);
        let (c, cp) = key(3);
        let ab = PairKey::derive(&a, &ap, &bp).unwrap();
        let cb = PairKey::derive(&c, &cp, &bp).unwrap();
        let mut body = b"hello".to_vec();
        ab.seal([7; 12], b"hdr", &mut body);
        assert_eq!(
            cb.open([7; 12], b"hdr", &mut body.clone()),
            Err(ReachError::BadAuth)
        );
        // Nor does the header change without notice.
        let ba = PairKey::derive(&PrivateKey([2; 32]), &bp, &ap).unwrap();
        assert_eq!(
            ba.open([7; 12], b"hdX", &mut body),
            Err(ReachError::BadAuth)
        );
    }

    #[test]
    fn small_order_keys_are_refused() {
        let (a, ap) = key(1);
        assert!(PairKey::derive(&a, &ap, &PublicKey([0; 32])).is_none());
    }

    #[test]
    fn tags_differ_by_key() {
        let (_, ap) = key(1);
        let (_, bp) = key(2);
        assert_ne!(Tag::of(&ap), Tag::of(&bp));
        assert_eq!(Tag::of(&ap), Tag::of(&ap));
        assert_eq!(format!("{}", Tag([0xab; 8])), "abababababababab");
    }
}
