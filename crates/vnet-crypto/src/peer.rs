//! The handshake and session state of one encrypted link, driven by the caller's clock.
//!
//! - Each side starts a handshake (an initiation) as soon as it has no usable session, and
//!   retransmits it (a fresh one each time) with exponential backoff until a response arrives.
//!   Both sides may initiate at once; both handshakes then complete and either session works.
//! - Initiations rotate through v3, v2 (which a host before v3 answers) and v1 (a host before
//!   v2), starting with v3 at every handshake; a responder answers each in its own version.
//!   Once a v3 handshake completed with the peer (or an authentic cookie reply came from it),
//!   only v3 is sent until three v3 initiations in a row went unanswered (see
//!   [`crate::wire`], rolling upgrades). A v2 or v3 session uses AES-256-GCM when both hosts
//!   run it fast, any other ChaCha20-Poly1305.
//! - What arrives costs bounded work ([`crate::budget`]): before any X25519 operation, a v3
//!   message's `mac1` is checked ([`CryptoError::BadMac`]), then, while the budget of its kind
//!   runs low, its `mac2` (without one: [`CryptoError::CookieRequired`], and a cookie reply
//!   for the peer, [`Peer::take_cookie_reply`]), then whether it was read before
//!   ([`CryptoError::Replay`]), then the budget ([`CryptoError::Throttled`]): v3 initiations,
//!   v3 responses, v1/v2 initiations and v1/v2 responses each have their own, so forged
//!   old-version messages delay only old-version handshakes.
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
//!   bounds. The sessions it replaced keep receiving until they expire (the last
//!   [`KEEP_PREVIOUS`] of them), so datagrams in flight during a rekey are not lost, even when
//!   both hosts rekey at once and each installs two sessions in a row (the peer may still be
//!   sending on the older one).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ring::rand::{SecureRandom, SystemRandom};
use snow::HandshakeState;

use crate::aead::{Cipher, Ciphers};
use crate::budget::{Budget, Seen};
use crate::cookie::{self, CookieJar, HeldCookie};
use crate::keys::{PrivateKey, PublicKey};
pub use crate::session::Session;
use crate::session::SessionInit;
use crate::wire::{self, Message, Version, COOKIE_NONCE_LEN, MACS_LEN};
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
    /// Initiations refused as replays (seen before, or a time not later than the last).
    pub initiations_replayed: u64,
    pub bad_handshakes: u64,
    /// Initiations refused unread because their budget was spent (a flood).
    pub initiations_throttled: u64,
    /// Handshakes completed with v1 messages: the peer predates cipher negotiation (or its v2
    /// messages were lost), and the session uses ChaCha20-Poly1305.
    pub handshakes_v1: u64,
    /// Handshakes completed with v3 messages (MACs and cookies).
    pub handshakes_v3: u64,
    /// v3 messages refused unread for a bad `mac1` (the sender does not know this host's
    /// public key), and cookie replies that did not open.
    pub bad_macs: u64,
    /// v3 messages refused unread under load for want of a valid `mac2`.
    pub cookies_required: u64,
    /// Responses refused unread because their budget was spent, or read before.
    pub responses_throttled: u64,
    pub responses_replayed: u64,
    /// Cookie replies sent to the peer, and those not sent because their budget was spent.
    pub cookie_replies_sent: u64,
    pub cookie_replies_suppressed: u64,
    /// Authentic cookie replies received from the peer.
    pub cookie_replies_received: u64,
    /// Handshake messages read (two X25519 operations each), whatever came of them.
    pub handshakes_read: u64,
}

/// Initiations a link reads (two X25519 operations each) in a burst, and then one per
/// `INITIATION_REFILL_MS`, for v3 and for v1/v2 each. A peer sends at most one per half second
/// (retries back off from there, rekeys come every two minutes), so a genuine peer stays
/// inside it; a flood of forged ones costs at most this much work, whatever its rate, and v3
/// keeps the genuine peer inside it too (MACs and cookies).
pub const INITIATION_BURST: u64 = 8;
pub const INITIATION_REFILL_MS: u64 = 250;
/// Responses to this host's pending initiation a link reads, likewise (v3 and v1/v2 each).
pub const RESPONSE_BURST: u64 = 8;
pub const RESPONSE_REFILL_MS: u64 = 250;
/// Cookie replies a link sends: the peer needs one every two minutes; more only in case some
/// are lost.
pub const COOKIE_REPLY_BURST: u64 = 4;
pub const COOKIE_REPLY_REFILL_MS: u64 = 100;
/// v3 initiations sent in a row without a v3 answer before a link that knew its peer as v3
/// tries older versions again (the peer may have been rolled back to an older vnetd).
pub const V3_ATTEMPTS_BEFORE_FALLBACK: u32 = 3;

/// Replaced sessions a link keeps for receiving. Two would do (when both hosts rekey at once,
/// each installs two sessions in a row, and the peer may still be sending on the one before
/// them); one more for a handshake that crossed a retransmission.
pub const KEEP_PREVIOUS: usize = 3;

struct Pending {
    handshake: HandshakeState,
    index: u32,
    version: Version,
    /// Whether this initiation offered [`CAP_PARTIAL_CHECKSUMS`].
    offered_partial: bool,
}

/// A bit of a v2 initiation's capabilities byte (beside the ciphers' bits, [`Ciphers`]) and of
/// a v2 response's choice byte (beside the cipher's number): "this host delivers data whose
/// inner TCP/UDP checksum the sender left partial" (marked partial for the guest, completed
/// before it goes to a network). A responder sets it only when the initiation did and it does
/// too, so a host before it (which reads only the cipher number there) never sees it; a
/// session on which both said so lets its senders skip the checksum (see [`crate::wire`]).
pub const CAP_PARTIAL_CHECKSUMS: u8 = 0x80;

/// A v2 response's choice byte: the cipher and whether both hosts take partial checksums.
/// Refused: a cipher this host did not offer, or partial checksums it did not offer.
pub(crate) fn parse_choice(
    b: u8,
    offered: Ciphers,
    offered_partial: bool,
) -> Result<(Cipher, bool), CryptoError> {
    let partial = b & CAP_PARTIAL_CHECKSUMS != 0;
    match Cipher::from_wire_id(b & !CAP_PARTIAL_CHECKSUMS) {
        _ if partial && !offered_partial => Err(CryptoError::BadHandshake),
        Some(Cipher::Aes256Gcm) if !offered.aes_256_gcm => Err(CryptoError::BadHandshake),
        Some(c) => Ok((c, partial)),
        None => Err(CryptoError::BadHandshake),
    }
}

/// What a link spends on what arrives from its peer's address ([`crate::budget`]).
#[derive(Debug)]
struct Budgets {
    initiations: Budget,
    legacy_initiations: Budget,
    responses: Budget,
    legacy_responses: Budget,
    cookie_replies: Budget,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            initiations: Budget::new(INITIATION_BURST, INITIATION_REFILL_MS),
            legacy_initiations: Budget::new(INITIATION_BURST, INITIATION_REFILL_MS),
            responses: Budget::new(RESPONSE_BURST, RESPONSE_REFILL_MS),
            legacy_responses: Budget::new(RESPONSE_BURST, RESPONSE_REFILL_MS),
            cookie_replies: Budget::new(COOKIE_REPLY_BURST, COOKIE_REPLY_REFILL_MS),
        }
    }
}

impl Budgets {
    /// The budget of initiations (or responses) of `version`.
    fn of(&mut self, initiation: bool, version: Version) -> &mut Budget {
        match (initiation, version.has_macs()) {
            (true, true) => &mut self.initiations,
            (true, false) => &mut self.legacy_initiations,
            (false, true) => &mut self.responses,
            (false, false) => &mut self.legacy_responses,
        }
    }
}

/// The v3 keys of a link, fixed by the two static keys.
struct LinkKeys {
    /// `mac1` of messages to the peer (its public key), and to this host (its own).
    mac1_out: [u8; 32],
    mac1_in: [u8; 32],
    /// Cookie replies this host seals, and those it opens (from the peer).
    cookie_out: [u8; 32],
    cookie_in: [u8; 32],
}

impl LinkKeys {
    fn new(local: &PrivateKey, remote: &PublicKey) -> LinkKeys {
        let me = local.public();
        let ss = cookie::static_static(local, remote);
        LinkKeys {
            mac1_out: cookie::mac1_key(remote),
            mac1_in: cookie::mac1_key(&me),
            cookie_out: cookie::cookie_reply_key(&ss, &me),
            cookie_in: cookie::cookie_reply_key(&ss, remote),
        }
    }
}

/// `N` bytes from the operating system's random source (none if it fails).
fn random<const N: usize>() -> Option<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new().fill(&mut b).ok()?;
    Some(b)
}

/// The handshake state machine of one link.
pub struct Peer {
    local: PrivateKey,
    remote: PublicKey,
    vni: u32,
    /// The ciphers this host offers in v2/v3 initiations and accepts in v2/v3 responses.
    ciphers: Ciphers,
    /// Whether this host offers (and accepts) [`CAP_PARTIAL_CHECKSUMS`].
    partial_checksums: bool,
    /// The newest version this host speaks: v3, but for tests that play an older host.
    max_version: Version,
    timers: Timers,
    keys: LinkKeys,
    pending: Option<Pending>,
    /// The session data is sent on.
    current: Option<Arc<Session>>,
    /// The sessions `current` replaced, newest first, still accepted on receive.
    previous: Vec<Arc<Session>>,
    /// A session this side answered, waiting for the initiator's first data message.
    next: Option<Arc<Session>>,
    /// The latest initiation time accepted from the peer.
    last_initiation_ns: u64,
    /// When to (re)send an initiation if still needed, and the current backoff.
    retry_at_ms: u64,
    backoff_ms: u64,
    /// Initiations sent for the handshake under way (they rotate through the versions).
    attempts: u32,
    /// Whether the peer speaks v3 (a v3 handshake completed, or an authentic cookie reply
    /// came); cleared when a v1/v2 handshake completes.
    v3_peer: bool,
    /// v3 initiations sent since the peer last answered in v3.
    v3_unanswered: u32,
    next_index: u32,
    budgets: Budgets,
    seen: Seen,
    /// The cookies this host gives its peer, and the one the peer last gave it.
    jar: CookieJar,
    held: HeldCookie,
    /// A cookie reply waiting to be sent.
    cookie_reply: Option<Vec<u8>>,
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

/// The Noise prologue: the handshake's version and the link's VNI, so that neither a
/// message of another version nor one of another link completes a handshake.
fn prologue(vni: u32, version: Version) -> [u8; 16] {
    let mut p = match version {
        Version::V1 => *b"vnet-kk-v1\0\0\0\0\0\0",
        Version::V2 => *b"vnet-kk-v2\0\0\0\0\0\0",
        Version::V3 => *b"vnet-kk-v3\0\0\0\0\0\0",
    };
    p[12..].copy_from_slice(&vni.to_be_bytes());
    p
}

/// The largest handshake message this side writes (a v2/v3 initiation or response).
const MAX_NOISE_LEN: usize = if wire::INITIATION_V2_NOISE_LEN > wire::RESPONSE_V2_NOISE_LEN {
    wire::INITIATION_V2_NOISE_LEN
} else {
    wire::RESPONSE_V2_NOISE_LEN
};

/// Appends `hs`'s next handshake message, carrying `payload`, to `out`; it must be
/// `noise_len` bytes, what the wire format allots it.
fn write_noise(
    hs: &mut HandshakeState,
    payload: &[u8],
    noise_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), CryptoError> {
    let mut noise = [0u8; MAX_NOISE_LEN];
    let n = hs
        .write_message(payload, &mut noise)
        .map_err(|_| CryptoError::BadHandshake)?;
    if n != noise_len {
        return Err(CryptoError::BadHandshake);
    }
    out.extend_from_slice(&noise[..n]);
    Ok(())
}

/// The two keys of a finished handshake's split: initiator-to-responder, then the reverse.
/// They are Noise's transport keys (snow's own transport would use them the same way), taken
/// out so that data messages can be sealed in place by the chosen AEAD.
fn split(hs: &mut HandshakeState) -> Result<([u8; 32], [u8; 32]), CryptoError> {
    if !hs.is_handshake_finished() {
        return Err(CryptoError::BadHandshake);
    }
    Ok(hs.dangerously_get_raw_split())
}

impl Peer {
    /// `index_seed` makes this process's session indexes differ from a previous run's (any
    /// changing number will do: indexes need not be secret). The peer offers the ciphers this
    /// CPU runs fast ([`Ciphers::detect`]); see [`Peer::with_ciphers`].
    pub fn new(
        local: PrivateKey,
        remote: PublicKey,
        vni: u32,
        timers: Timers,
        index_seed: u32,
    ) -> Peer {
        Peer {
            keys: LinkKeys::new(&local, &remote),
            local,
            remote,
            vni,
            ciphers: Ciphers::detect(),
            partial_checksums: true,
            max_version: Version::V3,
            timers,
            pending: None,
            current: None,
            previous: Vec::new(),
            next: None,
            last_initiation_ns: 0,
            retry_at_ms: 0,
            backoff_ms: timers.retry_initial_ms,
            attempts: 0,
            v3_peer: false,
            v3_unanswered: 0,
            next_index: index_seed,
            budgets: Budgets::default(),
            seen: Seen::default(),
            jar: CookieJar::default(),
            held: HeldCookie::default(),
            cookie_reply: None,
            stats: PeerStats::default(),
        }
    }

    /// Offers (and accepts) `ciphers` instead of what this CPU runs fast: for tests, and for
    /// an administrator who wants ChaCha20-Poly1305 whatever the hardware.
    pub fn with_ciphers(mut self, ciphers: Ciphers) -> Peer {
        self.ciphers = ciphers;
        self
    }

    pub fn ciphers(&self) -> Ciphers {
        self.ciphers
    }

    /// Without [`CAP_PARTIAL_CHECKSUMS`]: plays a v2 host from before it (tests of rolling
    /// upgrades).
    pub fn without_partial_checksums(mut self) -> Peer {
        self.partial_checksums = false;
        self
    }

    /// Speaks no version newer than `v`: plays a host from before it (tests of rolling
    /// upgrades). Such a host takes the newer messages for something else than these.
    pub fn up_to_version(mut self, v: Version) -> Peer {
        self.max_version = v;
        self
    }

    pub fn remote(&self) -> PublicKey {
        self.remote
    }

    /// Whether this link takes its peer for a v3 host (see [`crate::wire`], rolling upgrades).
    pub fn peer_speaks_v3(&self) -> bool {
        self.v3_peer
    }

    fn alloc_index(&mut self) -> u32 {
        self.next_index = self.next_index.wrapping_add(1);
        self.next_index
    }

    fn handshake_state(
        &self,
        version: Version,
        initiator: bool,
    ) -> Result<HandshakeState, CryptoError> {
        let params = NOISE_PARAMS
            .parse()
            .map_err(|_| CryptoError::BadHandshake)?;
        let prologue = prologue(self.vni, version);
        let b = snow::Builder::new(params)
            .local_private_key(&self.local.0)
            .remote_public_key(&self.remote.0)
            .prologue(&prologue);
        if initiator {
            b.build_initiator()
        } else {
            b.build_responder()
        }
        .map_err(|_| CryptoError::BadHandshake)
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
        let reject_ms = self.timers.reject_after_ms;
        for s in [&mut self.current, &mut self.next] {
            if s.as_ref().is_some_and(|s| s.expired(now_ms, reject_ms)) {
                *s = None;
            }
        }
        self.previous.retain(|s| !s.expired(now_ms, reject_ms));
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

    /// The version of the next initiation: v3, v2 and v1 in turn; to a peer known to speak
    /// v3, v3 until it has left [`V3_ATTEMPTS_BEFORE_FALLBACK`] of them unanswered, then v2,
    /// v1 and v3 in turn (it may have been rolled back to an older vnetd).
    fn next_version(&self) -> Version {
        const ROTATION: [Version; 3] = [Version::V3, Version::V2, Version::V1];
        let versions = match self.max_version {
            Version::V3 => &ROTATION[..],
            Version::V2 => &ROTATION[1..],
            Version::V1 => &ROTATION[2..],
        };
        let turn = if self.max_version == Version::V3 && self.v3_peer {
            if self.v3_unanswered < V3_ATTEMPTS_BEFORE_FALLBACK {
                return Version::V3;
            }
            self.attempts.saturating_sub(V3_ATTEMPTS_BEFORE_FALLBACK) as usize + 1
        } else {
            self.attempts as usize
        };
        versions[turn % versions.len()]
    }

    /// Called now and then (every 100 ms or so): expires sessions, and returns an initiation
    /// to send when a handshake is needed and the backoff allows.
    pub fn tick(&mut self, now: Now) -> Option<Vec<u8>> {
        self.drop_expired(now.mono_ms);
        if !self.needs_handshake(now.mono_ms) {
            self.pending = None;
            self.attempts = 0;
            return None;
        }
        if now.mono_ms < self.retry_at_ms {
            return None;
        }
        let version = self.next_version();
        let msg = self.initiate(now, version).ok()?;
        self.attempts = self.attempts.wrapping_add(1);
        if version == Version::V3 && self.v3_peer {
            self.v3_unanswered = self.v3_unanswered.saturating_add(1);
        }
        self.retry_at_ms = now.mono_ms + self.backoff_ms;
        self.backoff_ms = (self.backoff_ms * 2).min(self.timers.retry_max_ms);
        Some(msg)
    }

    /// Appends the MACs of a v3 message to `out` (whose message starts at `start`): `mac1`
    /// for the peer's key, `mac2` with the cookie the peer gave, if one is held.
    fn append_macs(&self, out: &mut Vec<u8>, start: usize, now_ms: u64) {
        out.resize(out.len() + MACS_LEN, 0);
        let cookie = self.held.get(now_ms);
        cookie::add_macs(&mut out[start..], &self.keys.mac1_out, cookie.as_ref());
    }

    /// A new initiation (replacing any unanswered one). Its payload is the wall-clock time,
    /// then (v2, v3) the ciphers this host offers.
    fn initiate(&mut self, now: Now, version: Version) -> Result<Vec<u8>, CryptoError> {
        let index = self.alloc_index();
        let mut hs = self.handshake_state(version, true)?;
        let mut payload = [0u8; wire::INITIATION_V2_PAYLOAD_LEN];
        payload[..8].copy_from_slice(&now.wall_ns.to_le_bytes());
        let partial = match self.partial_checksums {
            true => CAP_PARTIAL_CHECKSUMS,
            false => 0,
        };
        payload[8] = self.ciphers.to_wire() | partial;
        let payload = match version {
            Version::V1 => &payload[..8],
            Version::V2 | Version::V3 => &payload[..],
        };
        let (kind, _) = version.types();
        let (noise_len, _) = version.noise_lens();
        let mut msg = Vec::with_capacity(8 + noise_len + MACS_LEN);
        msg.extend_from_slice(&wire::header(kind, self.vni));
        msg.extend_from_slice(&index.to_le_bytes());
        write_noise(&mut hs, payload, noise_len, &mut msg)?;
        if version.has_macs() {
            self.append_macs(&mut msg, 0, now.mono_ms);
        }
        self.pending = Some(Pending {
            handshake: hs,
            index,
            version,
            offered_partial: version != Version::V1 && self.partial_checksums,
        });
        self.stats.initiations_sent += 1;
        Ok(msg)
    }

    /// Handles a message that is not data; returns what to send back (a response to an
    /// initiation, a keepalive after a response; nothing, empty, after a cookie reply). Errors
    /// are counted by the caller: [`CryptoError::Replay`] for a message read before or an old
    /// initiation, [`CryptoError::BadMac`], [`CryptoError::CookieRequired`] and
    /// [`CryptoError::Throttled`] for messages refused unread, [`CryptoError::BadHandshake`]
    /// otherwise. A refusal may leave a cookie reply to send ([`Peer::take_cookie_reply`]).
    pub fn handle_handshake(
        &mut self,
        msg: &Message<'_>,
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        let initiation = matches!(msg, Message::Initiation { .. });
        let r = match *msg {
            Message::Initiation { version, .. } | Message::Response { version, .. }
                if version > self.max_version =>
            {
                Err(CryptoError::NotCrypto)
            }
            Message::CookieReply { .. } if self.max_version < Version::V3 => {
                Err(CryptoError::NotCrypto)
            }
            Message::Initiation {
                vni,
                version,
                sender,
                noise,
                raw,
            } if vni == self.vni => self.on_initiation(version, sender, noise, raw, now),
            Message::Response {
                vni,
                version,
                sender,
                receiver,
                noise,
                raw,
            } if vni == self.vni => self.on_response(version, sender, receiver, noise, raw, now),
            Message::CookieReply { vni, raw, .. } if vni == self.vni => {
                self.on_cookie_reply(raw, now)
            }
            _ => Err(CryptoError::BadHandshake),
        };
        let s = &mut self.stats;
        match r {
            Err(CryptoError::Replay) if initiation => s.initiations_replayed += 1,
            Err(CryptoError::Replay) => s.responses_replayed += 1,
            Err(CryptoError::Throttled) if initiation => s.initiations_throttled += 1,
            Err(CryptoError::Throttled) => s.responses_throttled += 1,
            Err(CryptoError::BadMac) => s.bad_macs += 1,
            Err(CryptoError::CookieRequired) => s.cookies_required += 1,
            Err(_) => s.bad_handshakes += 1,
            Ok(_) => {}
        }
        r
    }

    /// The cookie reply a refusal left to send to the peer, if any.
    pub fn take_cookie_reply(&mut self) -> Option<Vec<u8>> {
        self.cookie_reply.take()
    }

    /// What is checked of a handshake message before it is read (in this order, all cheap):
    /// a v3 message's `mac1`; under load, its `mac2` (without it a cookie reply is left to
    /// send); whether it was read before; its budget. Then it is noted as read.
    fn admit(
        &mut self,
        initiation: bool,
        version: Version,
        sender: u32,
        noise: &[u8],
        raw: &[u8],
        now: Now,
    ) -> Result<(), CryptoError> {
        let fingerprint = Seen::fingerprint(noise).ok_or(CryptoError::BadHandshake)?;
        if version.has_macs() {
            if !cookie::mac1_ok(raw, &self.keys.mac1_in) {
                return Err(CryptoError::BadMac);
            }
            if self.budgets.of(initiation, version).under_load(now.mono_ms) {
                self.rotate_cookie(now);
                if !self.jar.mac2_ok(raw, now.mono_ms) {
                    self.queue_cookie_reply(sender, now);
                    return Err(CryptoError::CookieRequired);
                }
            }
        }
        if self.seen.contains(&fingerprint) {
            return Err(CryptoError::Replay);
        }
        if !self.budgets.of(initiation, version).take(now.mono_ms) {
            return Err(CryptoError::Throttled);
        }
        self.seen.insert(fingerprint);
        self.stats.handshakes_read += 1;
        Ok(())
    }

    fn rotate_cookie(&mut self, now: Now) {
        self.jar
            .rotate(now.mono_ms, now.wall_ns, &self.remote, random::<32>);
    }

    /// Leaves a cookie reply to the message whose sender index was `receiver`, if the cookie
    /// replies' budget allows one.
    fn queue_cookie_reply(&mut self, receiver: u32, now: Now) {
        if !self.budgets.cookie_replies.take(now.mono_ms) {
            self.stats.cookie_replies_suppressed += 1;
            return;
        }
        let (Some((cookie, epoch)), Some(nonce)) =
            (self.jar.current(), random::<COOKIE_NONCE_LEN>())
        else {
            return;
        };
        if let Ok(m) = cookie::seal_cookie_reply(
            &self.keys.cookie_out,
            self.vni,
            receiver,
            &nonce,
            &cookie,
            epoch,
        ) {
            self.cookie_reply = Some(m.to_vec());
            self.stats.cookie_replies_sent += 1;
        }
    }

    /// A cookie reply from the peer: its cookie is used for `mac2` from now on. A new one
    /// (the peer is under load and had none of this host's messages with it) has the pending
    /// initiation, which it probably refused, sent again at the next tick.
    fn on_cookie_reply(&mut self, raw: &[u8], now: Now) -> Result<Vec<u8>, CryptoError> {
        let (cookie, epoch) = cookie::open_cookie_reply(&self.keys.cookie_in, raw)?;
        self.stats.cookie_replies_received += 1;
        // Only a new cookie says anything: an old reply may be replayed by anyone who saw it.
        if self.held.accept(cookie, epoch, now.mono_ms) {
            // Only the peer can seal one: it speaks v3 (now).
            self.v3_peer = true;
            self.v3_unanswered = 0;
            if self.pending.is_some() {
                self.retry_at_ms = self.retry_at_ms.min(now.mono_ms);
            }
        }
        Ok(Vec::new())
    }

    /// Answers an initiation in its own version: v1 gets a ChaCha20-Poly1305 session, v2 and
    /// v3 the best cipher both hosts run fast, named in the response.
    fn on_initiation(
        &mut self,
        version: Version,
        sender: u32,
        noise: &[u8],
        raw: &[u8],
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        self.admit(true, version, sender, noise, raw, now)?;
        let mut hs = self.handshake_state(version, false)?;
        let mut payload = [0u8; 64];
        let n = hs
            .read_message(noise, &mut payload)
            .map_err(|_| CryptoError::BadHandshake)?;
        let (cipher, partial) = match (version, n) {
            (Version::V1, 8) => (Cipher::ChaCha20Poly1305, false),
            (Version::V2 | Version::V3, wire::INITIATION_V2_PAYLOAD_LEN) => (
                self.ciphers.choose(Ciphers::from_wire(payload[8])),
                self.partial_checksums && payload[8] & CAP_PARTIAL_CHECKSUMS != 0,
            ),
            _ => return Err(CryptoError::BadHandshake),
        };
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&payload[..8]);
        let ts = u64::from_le_bytes(ts);
        if ts <= self.last_initiation_ns {
            return Err(CryptoError::Replay);
        }
        let index = self.alloc_index();
        let (_, kind) = version.types();
        let (_, noise_len) = version.noise_lens();
        let mut out = Vec::with_capacity(12 + noise_len + MACS_LEN);
        out.extend_from_slice(&wire::header(kind, self.vni));
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&sender.to_le_bytes());
        let choice = [cipher.wire_id()
            | match partial {
                true => CAP_PARTIAL_CHECKSUMS,
                false => 0,
            }];
        let payload: &[u8] = match version {
            Version::V1 => &[],
            Version::V2 | Version::V3 => &choice,
        };
        write_noise(&mut hs, payload, noise_len, &mut out)?;
        if version.has_macs() {
            self.append_macs(&mut out, 0, now.mono_ms);
        }
        let (to_responder, to_initiator) = split(&mut hs)?;
        let s = self.session(
            (version, cipher, partial),
            (to_initiator, to_responder),
            index,
            sender,
            false,
            now,
        )?;
        self.last_initiation_ns = ts;
        self.next = Some(Arc::new(s));
        self.stats.responses_sent += 1;
        Ok(out)
    }

    fn on_response(
        &mut self,
        version: Version,
        sender: u32,
        receiver: u32,
        noise: &[u8],
        raw: &[u8],
        now: Now,
    ) -> Result<Vec<u8>, CryptoError> {
        if !self
            .pending
            .as_ref()
            .is_some_and(|p| p.index == receiver && p.version == version)
        {
            return Err(CryptoError::BadHandshake);
        }
        self.admit(false, version, sender, noise, raw, now)?;
        let Some(pending) = self.pending.as_mut() else {
            return Err(CryptoError::BadHandshake);
        };
        // The sender index of our initiation travels in clear, so anyone can forge a response
        // to it: the pending handshake is kept until a response authenticates (snow restores
        // the handshake's state when a read fails), and only then taken.
        let mut payload = [0u8; 64];
        let n = pending
            .handshake
            .read_message(noise, &mut payload)
            .map_err(|_| CryptoError::BadHandshake)?;
        let Some(Pending {
            mut handshake,
            offered_partial,
            ..
        }) = self.pending.take()
        else {
            return Err(CryptoError::BadHandshake);
        };
        // An authentic response names a cipher this host offered (v1: ChaCha20-Poly1305).
        let (cipher, partial) = match (version, n) {
            (Version::V1, 0) => (Cipher::ChaCha20Poly1305, false),
            (Version::V2 | Version::V3, wire::RESPONSE_V2_PAYLOAD_LEN) => {
                parse_choice(payload[0], self.ciphers, offered_partial)?
            }
            _ => return Err(CryptoError::BadHandshake),
        };
        let (to_responder, to_initiator) = split(&mut handshake)?;
        let s = Arc::new(self.session(
            (version, cipher, partial),
            (to_responder, to_initiator),
            receiver,
            sender,
            true,
            now,
        )?);
        s.confirmed.store(true, Relaxed);
        self.install(s.clone());
        self.backoff_ms = self.timers.retry_initial_ms;
        self.retry_at_ms = 0;
        self.attempts = 0;
        let mut keepalive = Vec::with_capacity(wire::DATA_OVERHEAD);
        s.seal(&[], &mut Vec::new(), &mut keepalive)?;
        Ok(keepalive)
    }

    /// A session of what the handshake agreed (`version`, `cipher`, whether both hosts take
    /// partial checksums), with `keys` = (sending, receiving).
    fn session(
        &self,
        (version, cipher, partial_checksums): (Version, Cipher, bool),
        keys: ([u8; 32], [u8; 32]),
        local_index: u32,
        remote_index: u32,
        initiator: bool,
        now: Now,
    ) -> Result<Session, CryptoError> {
        Session::new(SessionInit {
            version,
            cipher,
            partial_checksums,
            send_key: keys.0,
            recv_key: keys.1,
            vni: self.vni,
            local_index,
            remote_index,
            initiator,
            created_ms: now.mono_ms,
            counter_limit: self.timers.reject_after_messages,
        })
    }

    /// Installs the session of a completed handshake. A v3 one tells that the peer speaks v3;
    /// a v1 or v2 one (which only the genuine peer can complete) that it may no longer.
    fn install(&mut self, s: Arc<Session>) {
        match s.version() {
            Version::V1 => self.stats.handshakes_v1 += 1,
            Version::V2 => {}
            Version::V3 => self.stats.handshakes_v3 += 1,
        }
        self.v3_peer = s.version() == Version::V3;
        self.v3_unanswered = 0;
        if let Some(old) = self.current.replace(s) {
            self.previous.insert(0, old);
            self.previous.truncate(KEEP_PREVIOUS);
            self.stats.rekeys += 1;
        }
        self.stats.handshakes_completed += 1;
    }

    /// The session to seal outgoing data with, if one is usable now.
    pub fn sending_session(&self, now_ms: u64) -> Option<Arc<Session>> {
        self.current
            .as_ref()
            .filter(|s| !s.expired(now_ms, self.timers.reject_after_ms))
            .cloned()
    }

    /// The session a data message addressed to `index` belongs to, if any is usable.
    pub fn receiving_session(&self, index: u32, now_ms: u64) -> Option<Arc<Session>> {
        [&self.current, &self.next]
            .into_iter()
            .flatten()
            .chain(&self.previous)
            .find(|s| s.local_index == index)
            .filter(|s| !s.expired(now_ms, self.timers.reject_after_ms))
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
            self.attempts = 0;
        }
    }
}

#[cfg(test)]
mod tests;
