//! One session of an encrypted link: the two data keys a handshake agreed and the cipher they
//! are used with, the send counter that every sealing thread draws from, and the receive
//! side's replay window. Data messages are sealed and opened in place.
//!
//! The nonce of a data message is its counter, so a counter must never be sealed twice under
//! one key: counters come only from [`Session::reserve`] (one atomic operation hands out a
//! batch, so threads sealing for one session at once get disjoint batches), and a session's
//! keys are new with every handshake (a rekey makes a new session, whose counters start at 0).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::aead::{Cipher, DataKey};
use crate::replay::ReplayWindow;
use crate::wire::{
    self, Message, Version, DATA_HEADER_LEN, DATA_OVERHEAD, MAX_CIPHERTEXT, TAG_LEN,
};
use crate::CryptoError;

/// One direction-pair of keys agreed by a handshake.
pub struct Session {
    version: Version,
    cipher: Cipher,
    partial_checksums: bool,
    send: DataKey,
    recv: DataKey,
    vni: u32,
    pub local_index: u32,
    pub remote_index: u32,
    pub initiator: bool,
    created_ms: u64,
    /// No counter at or past this is handed out (the `reject_after_messages` bound).
    counter_limit: u64,
    /// The next counter to hand out.
    send_counter: AtomicU64,
    received: AtomicU64,
    pub(crate) confirmed: AtomicBool,
    replay: Mutex<ReplayWindow>,
    /// The sending key, for the test that no (key, nonce) pair is used twice.
    #[cfg(test)]
    pub(crate) send_key: [u8; 32],
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("local_index", &self.local_index)
            .field("remote_index", &self.remote_index)
            .field("initiator", &self.initiator)
            .field("sent", &self.sent())
            .finish()
    }
}

/// What a completed handshake hands to a new session.
pub(crate) struct SessionInit {
    pub version: Version,
    pub cipher: Cipher,
    pub partial_checksums: bool,
    pub send_key: [u8; 32],
    pub recv_key: [u8; 32],
    pub vni: u32,
    pub local_index: u32,
    pub remote_index: u32,
    pub initiator: bool,
    pub created_ms: u64,
    pub counter_limit: u64,
}

impl Session {
    pub(crate) fn new(i: SessionInit) -> Result<Session, CryptoError> {
        Ok(Session {
            version: i.version,
            cipher: i.cipher,
            partial_checksums: i.partial_checksums,
            send: DataKey::new(i.cipher, &i.send_key)?,
            recv: DataKey::new(i.cipher, &i.recv_key)?,
            vni: i.vni,
            local_index: i.local_index,
            remote_index: i.remote_index,
            initiator: i.initiator,
            created_ms: i.created_ms,
            counter_limit: i.counter_limit,
            send_counter: AtomicU64::new(0),
            received: AtomicU64::new(0),
            confirmed: AtomicBool::new(false),
            replay: Mutex::new(ReplayWindow::default()),
            #[cfg(test)]
            send_key: i.send_key,
        })
    }

    /// The version of the handshake that made this session.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The data cipher the two hosts agreed on.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Whether both hosts said in the handshake that they deliver data whose inner TCP/UDP
    /// checksum was left partial (`peer::CAP_PARTIAL_CHECKSUMS`): a sender on this session may
    /// then skip the checksum of the segments it cuts, as the AEAD covers every byte.
    pub fn partial_checksums(&self) -> bool {
        self.partial_checksums
    }

    /// Counters handed out so far (messages sealed, or about to be).
    pub fn sent(&self) -> u64 {
        self.send_counter.load(Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.received.load(Relaxed)
    }

    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.created_ms)
    }

    pub fn is_confirmed(&self) -> bool {
        self.confirmed.load(Relaxed)
    }

    /// Past its age limit or out of counters: refused in both directions.
    pub(crate) fn expired(&self, now_ms: u64, reject_after_ms: u64) -> bool {
        self.age_ms(now_ms) >= reject_after_ms || self.sent() >= self.counter_limit
    }

    fn replay(&self) -> MutexGuard<'_, ReplayWindow> {
        self.replay.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `n` consecutive counters for the caller alone; returns the first. Refused
    /// ([`CryptoError::NoSession`]) when they would pass the session's message limit: the
    /// caller must then use a newer session ([`crate::Peer::sending_session`] gives it once
    /// the rekey, started well before that limit, has completed).
    pub fn reserve(&self, n: u64) -> Result<u64, CryptoError> {
        self.send_counter
            .fetch_update(Relaxed, Relaxed, |c| {
                c.checked_add(n).filter(|&end| end <= self.counter_limit)
            })
            .map_err(|_| CryptoError::NoSession)
    }

    /// Seals one data message in place. `datagram` is `[16 bytes of header space][plaintext]
    /// [16 bytes of tag space]`; the header (type, VNI, receiver index, `counter`) is written,
    /// the plaintext encrypted and the tag written. `counter` must come from
    /// [`Session::reserve`] and be sealed once: one that was never reserved is refused
    /// ([`CryptoError::NoSession`]).
    pub fn seal_in_place(&self, counter: u64, datagram: &mut [u8]) -> Result<(), CryptoError> {
        if datagram.len() < DATA_OVERHEAD {
            return Err(CryptoError::Truncated);
        }
        if datagram.len() - DATA_HEADER_LEN > MAX_CIPHERTEXT {
            return Err(CryptoError::TooLarge);
        }
        if counter >= self.send_counter.load(Relaxed) {
            return Err(CryptoError::NoSession);
        }
        let (header, body) = datagram.split_at_mut(DATA_HEADER_LEN);
        header.copy_from_slice(&wire::data_header(self.vni, self.remote_index, counter));
        self.send.seal(counter, body)
    }

    /// Authenticates and decrypts one data message (header, ciphertext, tag) in place; returns
    /// where its plaintext now is. The counter is checked against the replay window before the
    /// decryption (a replay costs no work) and accepted after it (a forgery cannot move the
    /// window); of two threads opening the same message at once, one gets
    /// [`CryptoError::Replay`]. A message for another session is [`CryptoError::NoSession`].
    pub fn open_in_place(&self, datagram: &mut [u8]) -> Result<Range<usize>, CryptoError> {
        let (vni, receiver, counter) = match Message::parse(datagram)? {
            Message::Data {
                vni,
                receiver,
                counter,
                ..
            } => (vni, receiver, counter),
            _ => return Err(CryptoError::NotCrypto),
        };
        if receiver != self.local_index || vni != self.vni {
            return Err(CryptoError::NoSession);
        }
        let n = self.open_counted(counter, &mut datagram[DATA_HEADER_LEN..])?;
        Ok(DATA_HEADER_LEN..DATA_HEADER_LEN + n)
    }

    /// Opens ciphertext-and-tag `in_out` sealed under `counter`, with the replay window.
    fn open_counted(&self, counter: u64, in_out: &mut [u8]) -> Result<usize, CryptoError> {
        if !self.replay().check(counter) {
            return Err(CryptoError::Replay);
        }
        let n = self.recv.open(counter, in_out)?;
        if !self.replay().accept(counter) {
            return Err(CryptoError::Replay);
        }
        self.received.fetch_add(1, Relaxed);
        Ok(n)
    }

    /// Appends a data message carrying `plaintext` (gathered from its parts) to `out`. Fails
    /// only when the plaintext is too large for one message or the counters ran out (the
    /// caller must rekey first; [`crate::Peer::sending_session`] does). The same protocol as
    /// [`Session::seal_in_place`], with a copy; `_scratch` is no longer used.
    pub fn seal(
        &self,
        parts: &[&[u8]],
        _scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len + TAG_LEN > MAX_CIPHERTEXT {
            return Err(CryptoError::TooLarge);
        }
        let counter = self.reserve(1)?;
        let at = out.len();
        out.resize(at + DATA_HEADER_LEN, 0);
        for p in parts {
            out.extend_from_slice(p);
        }
        out.resize(out.len() + TAG_LEN, 0);
        self.seal_in_place(counter, &mut out[at..])
            .inspect_err(|_| {
                out.truncate(at);
            })
    }

    /// Authenticates and decrypts a data message's ciphertext into `out` (at least as long as
    /// the ciphertext), then checks its counter against the replay window; returns the
    /// plaintext length. The same protocol as [`Session::open_in_place`], with a copy.
    pub fn open(
        &self,
        counter: u64,
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CryptoError> {
        if ciphertext.len() < TAG_LEN || out.len() < ciphertext.len() {
            return Err(CryptoError::Truncated);
        }
        let out = &mut out[..ciphertext.len()];
        out.copy_from_slice(ciphertext);
        self.open_counted(counter, out)
    }
}
