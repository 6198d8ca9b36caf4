//! The handshake and session state of one encrypted link, driven by the caller's clock.
//!
//! - Each side starts a handshake (an initiation) as soon as it has no usable session, and
//!   retransmits it (a fresh one each time) with exponential backoff until a response arrives.
//!   Both sides may initiate at once; both handshakes then complete and either session works.
//! - The initiation carries the sender's wall-clock time, encrypted and authenticated; a
//!   responder refuses an initiation whose time is not later than the last it accepted, so a
//!   replayed initiation cannot make it start a session ([`CryptoError::Replay`]). A host that
//!   restarts initiates with a later time, and its peer accepts it: the sessions start over.
//! - The initiator's session is usable when the response arrives; it then sends an empty data
//!   message (a keepalive) so that the responder's session is confirmed too (the responder
//!   sends on it only after a first authentic data message, which proves the initiator holds
//!   the keys).
//! - A session is replaced after [`Timers::rekey_after_ms`] or
//!   [`Timers::rekey_after_messages`], and refused in both directions after the `reject_*`
//!   bounds. The previous session keeps receiving until replaced again, so datagrams in flight
//!   during a rekey are not lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use snow::{HandshakeState, StatelessTransportState};

use crate::keys::{PrivateKey, PublicKey};
use crate::replay::ReplayWindow;
use crate::wire::{self, Message, DATA_HEADER_LEN, MAX_CIPHERTEXT, TAG_LEN};
use crate::{CryptoError, NOISE_PARAMS};

/// The caller's clock: a monotonic time for timers and the wall-clock time that initiations
/// carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub mono_ms: u64,
    pub wall_ns: u64,
}

/// Timer and counter bounds (WireGuard's, but for the message bounds, which are lower).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    pub rekey_after_ms: u64,
    pub reject_after_ms: u64,
    pub rekey_after_messages: u64,
    pub reject_after_messages: u64,
    /// First retransmission of an unanswered initiation; doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            rekey_after_ms: 120_000,
            reject_after_ms: 180_000,
            rekey_after_messages: 1 << 32,
            reject_after_messages: (1 << 32) + (1 << 30),
            retry_initial_ms: 500,
            retry_max_ms: 5_000,
        }
    }
}

/// Counters of one link's handshakes, for `show links`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeerStats {
    pub initiations_sent: u64,
    pub responses_sent: u64,
    pub handshakes_completed: u64,
    pub rekeys: u64,
    pub initiations_replayed: u64,
    pub bad_handshakes: u64,
    /// Initiations refused unread because the link's budget was spent (a flood).
    pub initiations_throttled: u64,
}

/// Initiations a link reads (two X25519 operations each) in a burst, and then one per
/// `INITIATION_REFILL_MS`. A peer sends at most one per half second (retries back off from
/// there, rekeys come every two minutes), so a genuine peer stays inside it; a flood of forged
/// ones costs at most this much work, whatever its rate.
pub const INITIATION_BURST: u64 = 8;
pub const INITIATION_REFILL_MS: u64 = 250;

/// One direction-pair of keys agreed by a handshake.
pub struct Session {
    transport: StatelessTransportState,
    vni: u32,
    pub local_index: u32,
    pub remote_index: u32,
    pub initiator: bool,
    created_ms: u64,
    send_counter: AtomicU64,
    received: AtomicU64,
    confirmed: AtomicBool,
    replay: Mutex<ReplayWindow>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("local_index", &self.local_index)
            .field("remote_index", &self.remote_index)
            .field("initiator", &self.initiator)
            .field("sent", &self.sent())
            .finish()
    }
}

impl Session {
    /// Messages sealed so far.
    pub fn sent(&self) -> u64 {
        self.send_counter.load(Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.received.load(Relaxed)
    }

    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.created_ms)
    }

    fn expired(&self, now_ms: u64, t: &Timers) -> bool {
        self.age_ms(now_ms) >= t.reject_after_ms || self.sent() >= t.reject_after_messages
    }

    /// Appends a data message carrying `plaintext` (gathered from its parts) to `out`, using
    /// `scratch` to gather. Fails only when the plaintext is too large for one message or the
    /// counter ran out (the caller must rekey first; [`Peer::sending_session`] does).
    pub fn seal(
        &self,
        parts: &[&[u8]],
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        scratch.clear();
        for p in parts {
            scratch.extend_from_slice(p);
        }
        if scratch.len() + TAG_LEN > MAX_CIPHERTEXT {
            return Err(CryptoError::TooLarge);
        }
        let counter = self.send_counter.fetch_add(1, Relaxed);
        if counter == u64::MAX {
            return Err(CryptoError::NoSession);
        }
        out.extend_from_slice(&wire::data_header(self.vni, self.remote_index, counter));
        let at = out.len();
        out.resize(at + scratch.len() + TAG_LEN, 0);
        match self
            .transport
            .write_message(counter, scratch, &mut out[at..])
        {
            Ok(n) => {
                out.truncate(at + n);
                Ok(())
            }
            Err(_) => {
                out.truncate(at - DATA_HEADER_LEN);
                Err(CryptoError::TooLarge)
            }
        }
    }

    /// Authenticates and decrypts a data message's ciphertext into `out` (at least as long as
    /// the ciphertext), then checks its counter against the replay window; returns the
    /// plaintext length.
    pub fn open(
        &self,
        counter: u64,
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CryptoError> {
        if ciphertext.len() < TAG_LEN || out.len() < ciphertext.len() {
            return Err(CryptoError::Truncated);
        }
        // Refuse a counter the window already rules out before spending a decryption on it.
        if !self
            .replay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(counter)
        {
            return Err(CryptoError::Replay);
        }
        let n = self
            .transport
            .read_message(counter, ciphertext, out)
            .map_err(|_| CryptoError::BadAuth)?;
        if !self
            .replay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .accept(counter)
        {
            return Err(CryptoError::Replay);
        }
        self.received.fetch_add(1, Relaxed);
        Ok(n)
    }

    pub fn is_confirmed(&self) -> bool {
        self.confirmed.load(Relaxed)
    }
}

struct Pending {
    handshake: HandshakeState,
    index: u32,
}

/// The handshake state machine of one link.
pub struct Peer {
    local: PrivateKey,
    remote: PublicKey,
    vni: u32,
    prologue: [u8; 16],
    timers: Timers,
    pending: Option<Pending>,
    /// The session data is sent on.
    current: Option<Arc<Session>>,
    /// The session before `current`, still accepted on receive.
    previous: Option<Arc<Session>>,
    /// A session this side answered, waiting for the initiator's first data message.
    next: Option<Arc<Session>>,
    /// The latest initiation time accepted from the peer.
    last_initiation_ns: u64,
    /// When to (re)send an initiation if still needed, and the current backoff.
    retry_at_ms: u64,
    backoff_ms: u64,
    next_index: u32,
    /// The initiation budget: tokens left, and when the last one was added.
    initiation_tokens: u64,
    initiation_refill_ms: u64,
    pub stats: PeerStats,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("remote", &self.remote)
            .field("vni", &self.vni)
            .field("state", &self.state())
            .finish()
    }
}

fn prologue(vni: u32) -> [u8; 16] {
    let mut p = *b"vnet-kk-v1\0\0\0\0\0\0";
    p[12..].copy_from_slice(&vni.to_be_bytes());
    p
}

impl Peer {
    /// `index_seed` makes this process's session indexes differ from a previous run's (any
    /// changing number will do: indexes need not be secret).
    pub fn new(
        local: PrivateKey,
        remote: PublicKey,
        vni: u32,
        timers: Timers,
        index_seed: u32,
    ) -> Peer {
        Peer {
            local,
            remote,
            vni,
            prologue: prologue(vni),
            timers,
            pending: None,
            current: None,
            previous: None,
            next: None,
            last_initiation_ns: 0,
            retry_at_ms: 0,
            backoff_ms: timers.retry_initial_ms,
            next_index: index_seed,
            initiation_tokens: INITIATION_BURST,
            initiation_refill_ms: 0,
            stats: PeerStats::default(),
        }
    }

    pub fn remote(&self) -> PublicKey {
        self.remote
    }

    fn alloc_index(&mut self) -> u32 {
        self.next_index = self.next_index.wrapping_add(1);
        self.next_index
    }

    fn builder(&self) -> Result<snow::Builder<'_>, CryptoError> {
        let params = NOISE_PARAMS
            .parse()
            .map_err(|_| CryptoError::BadHandshake)?;
        Ok(snow::Builder::new(params)
            .local_private_key(&self.local.0)
            .remote_public_key(&self.remote.0)
            .prologue(&self.prologue))
    }

    /// `established` (a session to send on), `handshaking` or `none`.
    pub fn state(&self) -> &'static str {
        if self.current.is_some() {
            "established"
        } else if self.pending.is_some() {
            "handshaking"
        } else {
            "none"
        }
    }

    pub fn current(&self) -> Option<&Arc<Session>> {
        self.current.as_ref()
    }

    fn drop_expired(&mut self, now_ms: u64) {
        let t = self.timers;
        for s in [&mut self.current, &mut self.previous, &mut self.next] {
            if s.as_ref().is_some_and(|s| s.expired(now_ms, &t)) {
                *s = None;
            }
        }
    }

    fn needs_handshake(&self, now_ms: u64) -> bool {
        match &self.current {
            None => true,
            Some(s) => {
                // The responder waits a little longer, so that both sides rarely rekey at once.
                let slack = if s.initiator { 0 } else { 10_000 };
                s.age_ms(now_ms) >= self.timers.rekey_after_ms + slack
                    || s.sent() >= self.timers.rekey_after_messages
            }
        }
    }

    /// Called now and then (every 100 ms or so): expires sessions, and returns an initiation
    /// to send when a handshake is needed and the backoff allows.
    pub fn tick(&mut self, now: Now) -> Option<Vec<u8>> {
        self.drop_expired(now.mono_ms);
        if !self.needs_handshake(now.mono_ms) {
            self.pending = None;
            return None;
        }
        if now.mono_ms < self.retry_at_ms {
            return None;
        }
        let msg = self.initiate(now).ok()?;
        self.retry_at_ms = now.mono_ms + self.backoff_ms;
        self.backoff_ms = (self.backoff_ms * 2).min(self.timers.retry_max_ms);
        Some(msg)
    }

    /// A new initiation (replacing any unanswered one).
    fn initiate(&mut self, now: Now) -> Result<Vec<u8>, CryptoError> {
        let index = self.alloc_index();
        let mut hs = self
            .builder()?
            .build_initiator()
            .map_err(|_| CryptoError::BadHandshake)?;
        let mut msg = Vec::with_capacity(wire::INITIATION_LEN);
        msg.extend_from_slice(&wire::header(wire::MSG_INITIATION, self.vni));
        msg.extend_from_slice(&index.to_le_bytes());
        let mut noise = [0u8; wire::INITIATION_NOISE_LEN];
        let n = hs
            .write_message(&now.wall_ns.to_le_bytes(), &mut noise)
            .map_err(|_| CryptoError::BadHandshake)?;
        if n != noise.len() {
            return Err(CryptoError::BadHandshake);
        }
        msg.extend_from_slice(&noise);
        self.pending = Some(Pending {
            handshake: hs,
            index,
        });
        self.stats.initiations_sent += 1;
        Ok(msg)
    }

    /// Handles a message that is not data; returns what to send back (a response to an
    /// initiation, a keepalive after a response). Errors are counted by the caller:
    /// [`CryptoError::Replay`] for an old initiation, [`CryptoError::BadHandshake`] otherwise.
    pub fn handle_handshake(
        &mut self,
        msg: &Message<'_>,
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        let r = match *msg {
            Message::Initiation { vni, sender, noise } if vni == self.vni => {
                self.on_initiation(sender, noise, now)
            }
            Message::Response {
                vni,
                sender,
                receiver,
                noise,
            } if vni == self.vni => self.on_response(sender, receiver, noise, now),
            _ => Err(CryptoError::BadHandshake),
        };
        match r {
            Err(CryptoError::Replay) => self.stats.initiations_replayed += 1,
            Err(CryptoError::Throttled) => self.stats.initiations_throttled += 1,
            Err(_) => self.stats.bad_handshakes += 1,
            Ok(_) => {}
        }
        r
    }

    /// Takes one token of the initiation budget, refilled by the monotonic clock.
    fn admit_initiation(&mut self, now_ms: u64) -> bool {
        let refills = now_ms.saturating_sub(self.initiation_refill_ms) / INITIATION_REFILL_MS;
        if refills > 0 {
            self.initiation_tokens = self
                .initiation_tokens
                .saturating_add(refills)
                .min(INITIATION_BURST);
            self.initiation_refill_ms = self
                .initiation_refill_ms
                .saturating_add(refills.saturating_mul(INITIATION_REFILL_MS));
        }
        if self.initiation_tokens == 0 {
            return false;
        }
        self.initiation_tokens -= 1;
        true
    }

    fn on_initiation(
        &mut self,
        sender: u32,
        noise: &[u8],
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        if !self.admit_initiation(now.mono_ms) {
            return Err(CryptoError::Throttled);
        }
        let mut hs = self
            .builder()?
            .build_responder()
            .map_err(|_| CryptoError::BadHandshake)?;
        let mut payload = [0u8; 64];
        let n = hs
            .read_message(noise, &mut payload)
            .map_err(|_| CryptoError::BadHandshake)?;
        if n != 8 {
            return Err(CryptoError::BadHandshake);
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&payload[..8]);
        let ts = u64::from_le_bytes(ts);
        if ts <= self.last_initiation_ns {
            return Err(CryptoError::Replay);
        }
        let index = self.alloc_index();
        let mut out = Vec::with_capacity(wire::RESPONSE_LEN);
        out.extend_from_slice(&wire::header(wire::MSG_RESPONSE, self.vni));
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&sender.to_le_bytes());
        let mut reply = [0u8; wire::RESPONSE_NOISE_LEN];
        let n = hs
            .write_message(&[], &mut reply)
            .map_err(|_| CryptoError::BadHandshake)?;
        if n != reply.len() {
            return Err(CryptoError::BadHandshake);
        }
        out.extend_from_slice(&reply);
        let transport = hs
            .into_stateless_transport_mode()
            .map_err(|_| CryptoError::BadHandshake)?;
        self.last_initiation_ns = ts;
        self.next = Some(Arc::new(self.session(transport, index, sender, false, now)));
        self.stats.responses_sent += 1;
        Ok(out)
    }

    fn on_response(
        &mut self,
        sender: u32,
        receiver: u32,
        noise: &[u8],
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        let pending = match &mut self.pending {
            Some(p) if p.index == receiver => p,
            _ => return Err(CryptoError::BadHandshake),
        };
        // The sender index of our initiation travels in clear, so anyone can forge a response
        // to it: the pending handshake is kept until a response authenticates (snow restores
        // the handshake's state when a read fails), and only then taken.
        let mut payload = [0u8; 64];
        let n = pending
            .handshake
            .read_message(noise, &mut payload)
            .map_err(|_| CryptoError::BadHandshake)?;
        if n != 0 {
            return Err(CryptoError::BadHandshake);
        }
        let Some(Pending { handshake, .. }) = self.pending.take() else {
            return Err(CryptoError::BadHandshake);
        };
        let transport = handshake
            .into_stateless_transport_mode()
            .map_err(|_| CryptoError::BadHandshake)?;
        let s = Arc::new(self.session(transport, receiver, sender, true, now));
        s.confirmed.store(true, Relaxed);
        self.install(s.clone());
        self.backoff_ms = self.timers.retry_initial_ms;
        self.retry_at_ms = 0;
        let mut keepalive = Vec::with_capacity(wire::DATA_OVERHEAD);
        s.seal(&[], &mut Vec::new(), &mut keepalive)?;
        Ok(keepalive)
    }

    fn session(
        &self,
        transport: StatelessTransportState,
        local_index: u32,
        remote_index: u32,
        initiator: bool,
        now: Now,
    ) -> Session {
        Session {
            transport,
            vni: self.vni,
            local_index,
            remote_index,
            initiator,
            created_ms: now.mono_ms,
            send_counter: AtomicU64::new(0),
            received: AtomicU64::new(0),
            confirmed: AtomicBool::new(false),
            replay: Mutex::new(ReplayWindow::default()),
        }
    }

    fn install(&mut self, s: Arc<Session>) {
        self.previous = self.current.replace(s);
        if self.previous.is_some() {
            self.stats.rekeys += 1;
        }
        self.stats.handshakes_completed += 1;
    }

    /// The session to seal outgoing data with, if one is usable now.
    pub fn sending_session(&self, now_ms: u64) -> Option<Arc<Session>> {
        self.current
            .as_ref()
            .filter(|s| !s.expired(now_ms, &self.timers))
            .cloned()
    }

    /// The session a data message addressed to `index` belongs to, if any is usable.
    pub fn receiving_session(&self, index: u32, now_ms: u64) -> Option<Arc<Session>> {
        [&self.current, &self.next, &self.previous]
            .into_iter()
            .flatten()
            .find(|s| s.local_index == index)
            .filter(|s| !s.expired(now_ms, &self.timers))
            .cloned()
    }

    /// Called after a data message authenticated on `s`: a responder's session becomes the
    /// one to send on at its first authentic message.
    pub fn confirm(&mut self, s: &Arc<Session>) {
        if s.confirmed.swap(true, Relaxed) {
            return;
        }
        if self.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, s)) {
            self.next = None;
            self.install(s.clone());
            self.backoff_ms = self.timers.retry_initial_ms;
            self.retry_at_ms = 0;
        }
    }
}

#[cfg(test)]
mod tests;
