//! v3's MACs and cookies (the formats are in [`crate::wire`]): the computations, kept apart
//! from the handshake so that they are checked against fixed vectors, and the two pieces of
//! cookie state a link holds: the secret it makes cookies for its peer from (rotated every two
//! minutes), and the cookie its peer last gave it.
//!
//! They exist so that a receiver can refuse a forged handshake message before any X25519
//! work: `mac1` proves the sender knows the receiver's public key, `mac2` (checked only under
//! load) that it holds the cookie the receiver sent to the link's peer, which only that peer
//! can read.

use blake2::digest::consts::U16;
use blake2::digest::{FixedOutput, KeyInit, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::XChaCha20Poly1305;
use subtle::ConstantTimeEq;

use crate::keys::{PrivateKey, PublicKey};
use crate::wire::{
    self, COOKIE_NONCE_LEN, COOKIE_PLAIN_LEN, COOKIE_REPLY_LEN, MACS_LEN, MAC_LEN,
    MSG_COOKIE_REPLY, TAG_LEN,
};
use crate::CryptoError;

/// A MAC, or a cookie.
pub type Tag16 = [u8; MAC_LEN];

const LABEL_MAC1: &[u8] = b"vnet-mac1-v3----";
const LABEL_COOKIE: &[u8] = b"vnet-cookie-v3--";

/// A cookie secret is replaced after this long (WireGuard's `COOKIE_REFRESH_TIME`); a cookie
/// received is used for as long.
pub const COOKIE_LIFETIME_MS: u64 = 120_000;

/// BLAKE2s-256 of the parts, in order.
pub fn hash(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

/// BLAKE2s in its keyed mode (RFC 7693) with a 16-byte digest, of `data`: WireGuard's `MAC`.
/// `key` is at most 32 bytes.
pub fn mac(key: &[u8], data: &[u8]) -> Tag16 {
    let mut m = match <Blake2sMac<U16> as KeyInit>::new_from_slice(key) {
        Ok(m) => m,
        // Only a key over 32 bytes is refused, and every key here is 16 or 32 bytes.
        Err(_) => return [0; MAC_LEN],
    };
    Update::update(&mut m, data);
    m.finalize_fixed().into()
}

/// The key of the `mac1` of messages to the holder of `receiver`.
pub fn mac1_key(receiver: &PublicKey) -> [u8; 32] {
    hash(&[LABEL_MAC1, &receiver.0])
}

/// The key cookie replies from `replier` to its peer are sealed with: only the two hosts of
/// the link know `static_static` (X25519 of one's private key and the other's public key).
pub fn cookie_reply_key(static_static: &[u8; 32], replier: &PublicKey) -> [u8; 32] {
    hash(&[LABEL_COOKIE, static_static, &replier.0])
}

/// X25519 of this host's private key and the peer's public key (the same on both hosts).
pub fn static_static(local: &PrivateKey, remote: &PublicKey) -> [u8; 32] {
    curve25519_dalek::montgomery::MontgomeryPoint(remote.0)
        .mul_clamped(local.0)
        .to_bytes()
}

/// The cookie a secret gives the peer whose public key is `peer`.
pub fn cookie_of(secret: &[u8; 32], peer: &PublicKey) -> Tag16 {
    mac(secret, &peer.0)
}

fn eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// Writes the MACs over the last [`MACS_LEN`] bytes of the v3 message `msg`: `mac1` keyed by
/// `mac1_key`, `mac2` keyed by `cookie` (zeros without one).
pub fn add_macs(msg: &mut [u8], mac1_key: &[u8; 32], cookie: Option<&Tag16>) {
    let Some(at) = msg.len().checked_sub(MACS_LEN) else {
        return;
    };
    let m1 = mac(mac1_key, &msg[..at]);
    msg[at..at + MAC_LEN].copy_from_slice(&m1);
    let m2 = match cookie {
        Some(c) => mac(c, &msg[..at + MAC_LEN]),
        None => [0; MAC_LEN],
    };
    msg[at + MAC_LEN..].copy_from_slice(&m2);
}

/// Whether the v3 message `msg` carries a good `mac1` for `mac1_key`.
pub fn mac1_ok(msg: &[u8], mac1_key: &[u8; 32]) -> bool {
    match msg.len().checked_sub(MACS_LEN) {
        Some(at) => eq(&mac(mac1_key, &msg[..at]), &msg[at..at + MAC_LEN]),
        None => false,
    }
}

/// Whether the v3 message `msg` carries a good `mac2` for `cookie`.
pub fn mac2_ok(msg: &[u8], cookie: &Tag16) -> bool {
    match msg.len().checked_sub(MAC_LEN) {
        Some(at) if at >= MAC_LEN => eq(&mac(cookie, &msg[..at]), &msg[at..]),
        _ => false,
    }
}

fn aead(key: &[u8; 32]) -> XChaCha20Poly1305 {
    <XChaCha20Poly1305 as chacha20poly1305::KeyInit>::new(key.into())
}

/// A cookie reply: `cookie` and its `epoch`, sealed under `key` with `nonce`, to the message
/// whose sender index was `receiver`.
pub fn seal_cookie_reply(
    key: &[u8; 32],
    vni: u32,
    receiver: u32,
    nonce: &[u8; COOKIE_NONCE_LEN],
    cookie: &Tag16,
    epoch: u64,
) -> Result<[u8; COOKIE_REPLY_LEN], CryptoError> {
    let mut m = [0u8; COOKIE_REPLY_LEN];
    m[..4].copy_from_slice(&wire::header(MSG_COOKIE_REPLY, vni));
    m[4..8].copy_from_slice(&receiver.to_le_bytes());
    m[8..8 + COOKIE_NONCE_LEN].copy_from_slice(nonce);
    let (head, rest) = m.split_at_mut(8 + COOKIE_NONCE_LEN);
    let (plain, tag) = rest.split_at_mut(COOKIE_PLAIN_LEN);
    plain[..MAC_LEN].copy_from_slice(cookie);
    plain[MAC_LEN..].copy_from_slice(&epoch.to_le_bytes());
    let t = aead(key)
        .encrypt_in_place_detached(nonce.into(), &head[..8], plain)
        .map_err(|_| CryptoError::BadAuth)?;
    tag.copy_from_slice(&t);
    Ok(m)
}

/// Opens a cookie reply sealed under `key`: its cookie and epoch.
pub fn open_cookie_reply(key: &[u8; 32], msg: &[u8]) -> Result<(Tag16, u64), CryptoError> {
    if msg.len() != COOKIE_REPLY_LEN {
        return Err(CryptoError::Truncated);
    }
    let nonce = &msg[8..8 + COOKIE_NONCE_LEN];
    let mut plain = [0u8; COOKIE_PLAIN_LEN];
    plain.copy_from_slice(&msg[8 + COOKIE_NONCE_LEN..COOKIE_REPLY_LEN - TAG_LEN]);
    let tag = &msg[COOKIE_REPLY_LEN - TAG_LEN..];
    aead(key)
        .decrypt_in_place_detached(nonce.into(), &msg[..8], &mut plain, tag.into())
        .map_err(|_| CryptoError::BadMac)?;
    let mut cookie = [0u8; MAC_LEN];
    cookie.copy_from_slice(&plain[..MAC_LEN]);
    let mut epoch = [0u8; 8];
    epoch.copy_from_slice(&plain[MAC_LEN..]);
    Ok((cookie, u64::from_le_bytes(epoch)))
}

/// One secret's cookie for the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Issued {
    cookie: Tag16,
    /// The wall-clock time (ns) the secret was made: a later secret has a larger epoch.
    epoch: u64,
    made_ms: u64,
}

/// The cookies this host gives its peer: made from a random secret that is replaced every
/// [`COOKIE_LIFETIME_MS`]; `mac2` is accepted with the current secret's cookie or the
/// previous one's (so a cookie works from 2 to 4 minutes). Only the cookie is kept: it is
/// all a secret is used for.
#[derive(Debug, Default)]
pub struct CookieJar {
    current: Option<Issued>,
    previous: Option<Issued>,
}

impl CookieJar {
    /// Replaces the secret when it is due (or there is none yet) with `secret`, made at
    /// `now`; `secret` is called only then. Without randomness (`None`) the old one stays.
    pub fn rotate(
        &mut self,
        mono_ms: u64,
        wall_ns: u64,
        peer: &PublicKey,
        secret: impl FnOnce() -> Option<[u8; 32]>,
    ) {
        let due = self
            .current
            .is_none_or(|c| mono_ms.saturating_sub(c.made_ms) >= COOKIE_LIFETIME_MS);
        if !due {
            return;
        }
        let Some(s) = secret() else {
            return;
        };
        // A later secret always has a larger epoch, even if the wall clock stepped back.
        let epoch = match self.current {
            Some(c) => wall_ns.max(c.epoch + 1),
            None => wall_ns,
        };
        self.previous = self.current.replace(Issued {
            cookie: cookie_of(&s, peer),
            epoch,
            made_ms: mono_ms,
        });
    }

    /// The cookie to send now, and its epoch (after [`CookieJar::rotate`]).
    pub fn current(&self) -> Option<(Tag16, u64)> {
        self.current.map(|c| (c.cookie, c.epoch))
    }

    /// Whether the v3 message `msg` carries a `mac2` made with a cookie this host gave out
    /// within the last two secrets' lifetimes.
    pub fn mac2_ok(&self, msg: &[u8], mono_ms: u64) -> bool {
        [self.current, self.previous]
            .into_iter()
            .flatten()
            .filter(|c| mono_ms.saturating_sub(c.made_ms) < 2 * COOKIE_LIFETIME_MS)
            .any(|c| mac2_ok(msg, &c.cookie))
    }
}

/// The cookie this host's peer last gave it, used for the `mac2` of what it sends there.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeldCookie {
    held: Option<(Tag16, u64, u64)>, // (cookie, epoch, received_ms)
}

impl HeldCookie {
    /// The cookie to make `mac2` with, if one younger than [`COOKIE_LIFETIME_MS`] is held.
    pub fn get(&self, mono_ms: u64) -> Option<Tag16> {
        self.held
            .filter(|&(_, _, at)| mono_ms.saturating_sub(at) < COOKIE_LIFETIME_MS)
            .map(|(c, _, _)| c)
    }

    /// Takes a cookie from an authentic cookie reply; returns whether it is new (a later
    /// epoch than the one held, or none held). One of an earlier epoch (a replayed reply) is
    /// ignored while the held one lasts; the same epoch again changes nothing, so replaying a
    /// reply cannot keep a cookie alive past its lifetime.
    pub fn accept(&mut self, cookie: Tag16, epoch: u64, mono_ms: u64) -> bool {
        let held = self
            .held
            .filter(|&(_, _, at)| mono_ms.saturating_sub(at) < COOKIE_LIFETIME_MS);
        match held {
            Some((_, e, _)) if epoch <= e => false,
            _ => {
                self.held = Some((cookie, epoch, mono_ms));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests;
