//! Encrypted, authenticated UDP links for vnet: the pure protocol, no I/O.
//!
//! Two hosts that share a link know each other's static X25519 public key (from the link's
//! `encrypt PEER_KEY` option). They run a Noise `KK` handshake
//! (`Noise_KK_25519_ChaChaPoly_BLAKE2s`, via the `snow` crate) over the link's own UDP socket,
//! in which (v2) they also agree on the data cipher: AES-256-GCM when both run it in hardware,
//! else ChaCha20-Poly1305. Every VXLAN datagram (VXLAN header and inner frame) is then sealed
//! in place with that AEAD (`ring`'s assembly) under one of the handshake's two split keys and
//! an explicit 64-bit counter, checked against a sliding replay window, as WireGuard does.
//! The message formats and the negotiation are in [`wire`]; the AEAD in [`aead`]; a session's
//! keys, counters and in-place sealing in [`session`]; the replay window in [`replay`]; the
//! per-link handshake state machine, driven by a `now` argument, in [`peer`]; what it spends on
//! what arrives (budgets, replays) in [`budget`], and v3's MACs and cookies, which let it refuse
//! forged handshake messages before any X25519 work, in [`cookie`].
//!
//! The first byte of every message is its type (1 to 7, and 16); a VXLAN header's first byte
//! has the I flag (0x08) set, which no type has, so plaintext VXLAN and these messages are
//! never confused.

#![forbid(unsafe_code)]

pub mod aead;
pub mod budget;
pub mod cookie;
pub mod keys;
pub mod peer;
pub mod replay;
pub mod session;
pub mod wire;

pub use aead::{Cipher, Ciphers};
pub use keys::{KeyError, PrivateKey, PublicKey, KEY_LEN};
pub use peer::{Now, Peer, PeerStats, Timers};
pub use replay::{ReplayWindow, REPLAY_WINDOW};
pub use session::Session;
pub use wire::{Message, DATA_HEADER_LEN, DATA_OVERHEAD, TAG_LEN};

/// Why a message was refused. Every refusal is a counted drop in the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("message truncated")]
    Truncated,
    #[error("not an encrypted-link message")]
    NotCrypto,
    #[error("handshake message refused")]
    BadHandshake,
    #[error("handshake or data message replayed")]
    Replay,
    #[error("no session for this message")]
    NoSession,
    #[error("authentication failed")]
    BadAuth,
    #[error("message too large")]
    TooLarge,
    #[error("handshake messages over the link's budget")]
    Throttled,
    #[error("handshake message without a valid MAC (the sender does not know this host's key)")]
    BadMac,
    #[error("under load: handshake message without a valid cookie MAC")]
    CookieRequired,
}

/// The Noise protocol name: both hosts know each other's static key in advance (KK).
pub const NOISE_PARAMS: &str = "Noise_KK_25519_ChaChaPoly_BLAKE2s";

#[cfg(test)]
mod tests;
