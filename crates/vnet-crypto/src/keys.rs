//! Static X25519 host keys: generation, deriving the public key from the private one, and the
//! private key's text (base64 of the 32 raw bytes, as WireGuard writes them). The public key's
//! type and text form are `vnet-wire`'s ([`PublicKey`], re-exported here): the control
//! language carries keys without linking this crate.

use std::fmt;

use vnet_wire::{decode_key, encode_key, KeyParseError};
pub use vnet_wire::{PublicKey, KEY_LEN};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("key is not base64: {0}")]
    Base64(String),
    #[error("key is {0} bytes, not 32")]
    Length(usize),
    #[error("key generation failed: {0}")]
    Generate(String),
}

impl From<KeyParseError> for KeyError {
    fn from(e: KeyParseError) -> KeyError {
        match e {
            KeyParseError::Base64(why) => KeyError::Base64(why),
            KeyParseError::Length(n) => KeyError::Length(n),
        }
    }
}

/// A host's private key. Never printed (its Debug is redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey(pub [u8; KEY_LEN]);

impl PrivateKey {
    pub fn parse(s: &str) -> Result<PrivateKey, KeyError> {
        Ok(PrivateKey(decode_key(s)?))
    }

    /// A new random key (from the OS's random source, through snow).
    pub fn generate() -> Result<PrivateKey, KeyError> {
        let params: snow::params::NoiseParams = crate::NOISE_PARAMS
            .parse()
            .map_err(|e: snow::Error| KeyError::Generate(e.to_string()))?;
        let kp = snow::Builder::new(params)
            .generate_keypair()
            .map_err(|e| KeyError::Generate(e.to_string()))?;
        let bytes =
            <[u8; KEY_LEN]>::try_from(kp.private.as_slice()).map_err(|_| KeyError::Length(0))?;
        Ok(PrivateKey(bytes))
    }

    /// The X25519 public key (the clamped scalar times the base point).
    pub fn public(&self) -> PublicKey {
        PublicKey(
            curve25519_dalek::montgomery::MontgomeryPoint::mul_base_clamped(self.0).to_bytes(),
        )
    }

    /// The file form: base64 and a newline.
    pub fn to_base64(&self) -> String {
        encode_key(&self.0)
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_public() {
        let k = PrivateKey::generate().unwrap();
        let again = PrivateKey::parse(&format!("{}\n", k.to_base64())).unwrap();
        assert_eq!(k, again);
        let p = k.public();
        assert_eq!(PublicKey::parse(&p.to_string()).unwrap(), p);
        assert_ne!(p.0, k.0);
        assert_ne!(PrivateKey::generate().unwrap(), k);
    }

    #[test]
    fn known_vector() {
        // RFC 7748 section 6.1: Alice's private and public keys.
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let sk = PrivateKey(hex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        assert_eq!(
            sk.public().0,
            hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
    }

    #[test]
    fn bad_keys() {
        assert!(matches!(PrivateKey::parse("!!"), Err(KeyError::Base64(_))));
        assert_eq!(PrivateKey::parse("AAAA"), Err(KeyError::Length(3)));
        assert!(format!("{:?}", PrivateKey([7; 32])).contains(".."));
    }
}

/// Key files: the only I/O in this crate, shared by `vnetd --gen-key`/`--key-file` and
/// `vnetctl keygen`.
pub mod file {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::path::Path;

    use super::{PrivateKey, PublicKey};

    /// Writes a new random private key to `path` (which must not exist), mode 0600; returns
    /// its public key.
    pub fn generate(path: &Path) -> std::io::Result<PublicKey> {
        let key = PrivateKey::generate().map_err(std::io::Error::other)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        writeln!(f, "{}", key.to_base64())?;
        f.sync_all()?;
        Ok(key.public())
    }

    /// Reads a private key; refuses a file that others than its owner may read.
    pub fn read(path: &Path) -> std::io::Result<PrivateKey> {
        let meta = std::fs::metadata(path)?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    meta.permissions().mode() & 0o777
                ),
            ));
        }
        let text = std::fs::read_to_string(path)?;
        PrivateKey::parse(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn generate_and_read() {
            let dir = std::env::temp_dir().join(format!("vnet-key-{}", std::process::id()));
            let _ = std::fs::remove_file(&dir);
            let public = super::generate(&dir).unwrap();
            assert!(super::generate(&dir).is_err(), "never overwrites");
            assert_eq!(super::read(&dir).unwrap().public(), public);
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .unwrap();
            assert!(super::read(&dir).is_err(), "refuses a world-readable key");
            std::fs::remove_file(&dir).unwrap();
        }
    }
}
