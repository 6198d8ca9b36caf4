//! The AEAD that seals data messages: AES-256-GCM or ChaCha20-Poly1305 through `ring`
//! (assembly for this CPU, chosen by ring at run time), under one of the two keys a Noise
//! handshake agreed, with WireGuard's nonce: 4 zero bytes then the message counter, 64 bits
//! little-endian, and no associated data. For ChaCha20-Poly1305 these are exactly the bytes
//! snow's `ChaChaPoly` transport produces with the same key and counter, so a host that seals
//! with this module and one that still uses snow's transport understand each other.
//!
//! Which ciphers a host runs fast ([`Ciphers::detect`]) is what it offers in a handshake; the
//! link uses AES-256-GCM when both sides offer it ([`Ciphers::choose`]).

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::wire::TAG_LEN;
use crate::CryptoError;

/// The data-message cipher of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cipher {
    ChaCha20Poly1305,
    Aes256Gcm,
}

impl Cipher {
    /// As `show links` and the documentation name it.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
        }
    }

    /// Its number in a v2 response (see [`crate::wire`]).
    pub(crate) fn wire_id(self) -> u8 {
        match self {
            Cipher::ChaCha20Poly1305 => 1,
            Cipher::Aes256Gcm => 2,
        }
    }

    pub(crate) fn from_wire_id(id: u8) -> Option<Cipher> {
        match id {
            1 => Some(Cipher::ChaCha20Poly1305),
            2 => Some(Cipher::Aes256Gcm),
            _ => None,
        }
    }
}

/// The ciphers a host runs fast, offered in a v2 initiation. ChaCha20-Poly1305 is always
/// among them (it is fast in software, and every host, old ones too, has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ciphers {
    pub aes_256_gcm: bool,
}

/// Bits of the capabilities byte of a v2 initiation; unknown bits are ignored, so a later
/// version may add ciphers.
const CAP_CHACHA20_POLY1305: u8 = 1;
const CAP_AES_256_GCM: u8 = 2;

impl Ciphers {
    pub const CHACHA_ONLY: Ciphers = Ciphers { aes_256_gcm: false };
    pub const ALL: Ciphers = Ciphers { aes_256_gcm: true };

    /// What this CPU runs fast: AES-256-GCM only with AES and carry-less multiplication
    /// instructions (without them ring's constant-time AES is several times slower than
    /// ChaCha20-Poly1305).
    pub fn detect() -> Ciphers {
        Ciphers {
            aes_256_gcm: aes_in_hardware(),
        }
    }

    pub(crate) fn to_wire(self) -> u8 {
        CAP_CHACHA20_POLY1305 | if self.aes_256_gcm { CAP_AES_256_GCM } else { 0 }
    }

    pub(crate) fn from_wire(b: u8) -> Ciphers {
        Ciphers {
            aes_256_gcm: b & CAP_AES_256_GCM != 0,
        }
    }

    /// The cipher of a link between hosts that run `self` and `peer` fast.
    pub fn choose(self, peer: Ciphers) -> Cipher {
        if self.aes_256_gcm && peer.aes_256_gcm {
            Cipher::Aes256Gcm
        } else {
            Cipher::ChaCha20Poly1305
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn aes_in_hardware() -> bool {
    std::is_x86_feature_detected!("aes") && std::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn aes_in_hardware() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn aes_in_hardware() -> bool {
    false
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// One direction's key.
pub(crate) struct DataKey {
    key: LessSafeKey,
}

impl DataKey {
    pub(crate) fn new(cipher: Cipher, key: &[u8; 32]) -> Result<DataKey, CryptoError> {
        // Both algorithms take 32-byte keys: ring refuses only another length.
        let key =
            UnboundKey::new(cipher.algorithm(), key).map_err(|_| CryptoError::BadHandshake)?;
        Ok(DataKey {
            key: LessSafeKey::new(key),
        })
    }

    /// Encrypts `in_out[..len - TAG_LEN]` in place and writes the tag into its last
    /// `TAG_LEN` bytes. The caller guarantees `counter` is never used twice with this key.
    pub(crate) fn seal(&self, counter: u64, in_out: &mut [u8]) -> Result<(), CryptoError> {
        let n = in_out
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(CryptoError::Truncated)?;
        let (text, tag_space) = in_out.split_at_mut(n);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::empty(), text)
            .map_err(|_| CryptoError::TooLarge)?;
        tag_space.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Authenticates `in_out` (ciphertext, then the tag) and decrypts it in place; returns the
    /// plaintext length. On failure the bytes of `in_out` are unspecified.
    pub(crate) fn open(&self, counter: u64, in_out: &mut [u8]) -> Result<usize, CryptoError> {
        if in_out.len() < TAG_LEN {
            return Err(CryptoError::Truncated);
        }
        self.key
            .open_in_place(nonce(counter), Aad::empty(), in_out)
            .map(|p| p.len())
            .map_err(|_| CryptoError::BadAuth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// The known answer is snow's own ChaChaPoly cipher (what hosts before the v2 handshake
    /// seal with) for the same key and counter: the interoperability this module promises.
    #[test]
    fn chacha_is_byte_for_byte_snows() {
        use snow::resolvers::{CryptoResolver, DefaultResolver};
        let key = [0x42u8; 32];
        let mut theirs = DefaultResolver
            .resolve_cipher(&snow::params::CipherChoice::ChaChaPoly)
            .unwrap();
        theirs.set(&key);
        let ours = DataKey::new(Cipher::ChaCha20Poly1305, &key).unwrap();
        for (counter, len) in [
            (0u64, 0usize),
            (1, 1),
            (0x0102_0304_0506_0708, 1400),
            (u64::MAX - 1, 9000),
        ] {
            let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut expect = vec![0u8; len + TAG_LEN];
            theirs.encrypt(counter, &[], &plain, &mut expect);
            let mut buf = plain.clone();
            buf.extend_from_slice(&[0; TAG_LEN]);
            ours.seal(counter, &mut buf).unwrap();
            assert_eq!(buf, expect, "counter {counter} length {len}");
            assert_eq!(ours.open(counter, &mut buf), Ok(len));
            assert_eq!(&buf[..len], &plain[..]);
        }
    }

    /// Known answers for counter 0 (an all-zero nonce, whatever the byte order) from the GCM
    /// specification (McGrew & Viega, test cases 13 and 14: AES-256, key zero).
    #[test]
    fn aes_gcm_round_trip_and_known_answer() {
        // Test case 13 of "The Galois/Counter Mode of Operation": key and IV all zero, empty
        // plaintext: the tag is 530f8afbc74536b9a963b4f1c4cb738b.
        let k = DataKey::new(Cipher::Aes256Gcm, &[0; 32]).unwrap();
        let mut buf = vec![0u8; TAG_LEN];
        k.seal(0, &mut buf).unwrap();
        assert_eq!(buf, hex("530f8afbc74536b9a963b4f1c4cb738b"));
        // Test case 14: one zero block; ciphertext cea7403d4d606b6e074ec5d3baf39d18, tag
        // d0d1c8a799996bf0265b98b5d48ab919.
        let mut buf = vec![0u8; 16 + TAG_LEN];
        k.seal(0, &mut buf).unwrap();
        assert_eq!(
            buf,
            hex("cea7403d4d606b6e074ec5d3baf39d18d0d1c8a799996bf0265b98b5d48ab919")
        );
        assert_eq!(k.open(0, &mut buf), Ok(16));
        assert_eq!(buf[..16], [0; 16]);
    }

    #[test]
    fn wrong_counter_key_or_tag_is_refused() {
        for c in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            let k = DataKey::new(c, &[1; 32]).unwrap();
            let other = DataKey::new(c, &[2; 32]).unwrap();
            let mut buf = vec![9u8; 100 + TAG_LEN];
            k.seal(5, &mut buf).unwrap();
            assert_eq!(k.open(6, &mut buf.clone()), Err(CryptoError::BadAuth));
            assert_eq!(other.open(5, &mut buf.clone()), Err(CryptoError::BadAuth));
            let mut t = buf.clone();
            *t.last_mut().unwrap() ^= 1;
            assert_eq!(k.open(5, &mut t), Err(CryptoError::BadAuth));
            assert_eq!(
                k.open(5, &mut buf[..TAG_LEN - 1]),
                Err(CryptoError::Truncated)
            );
            assert_eq!(k.open(5, &mut buf), Ok(100));
        }
    }

    #[test]
    fn negotiation() {
        let (aes, cha) = (Ciphers::ALL, Ciphers::CHACHA_ONLY);
        assert_eq!(aes.choose(aes), Cipher::Aes256Gcm);
        assert_eq!(aes.choose(cha), Cipher::ChaCha20Poly1305);
        assert_eq!(cha.choose(aes), Cipher::ChaCha20Poly1305);
        assert_eq!(cha.choose(cha), Cipher::ChaCha20Poly1305);
        for c in [aes, cha] {
            assert_eq!(Ciphers::from_wire(c.to_wire()), c);
        }
        // Unknown bits (a later version's ciphers) are ignored.
        assert_eq!(Ciphers::from_wire(0xfc | CAP_AES_256_GCM), aes);
        assert_eq!(Ciphers::from_wire(0xfc), cha);
        for c in [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm] {
            assert_eq!(Cipher::from_wire_id(c.wire_id()), Some(c));
        }
        assert_eq!(Cipher::from_wire_id(0), None);
        assert_eq!(Cipher::from_wire_id(3), None);
    }
}
