//! Encrypted udp links at the OS edge: the clock, the timer thread that drives handshakes,
//! handshake messages in and out of the VXLAN socket, and the link's counters. The protocol
//! itself is `vnet-crypto`.

use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::{debug, info, warn};
use vnet_control::status::CryptoStatus;
use vnet_core::{DropReason, LockRecover, PortCounters};
use vnet_crypto::{CryptoError, Message, Now, Peer, PrivateKey, PublicKey, Session, Timers};

use crate::reach::PathCell;
use crate::sys::{wait_readable, Wake};
use crate::vxlan_socket::VxlanSocket;
use crate::worker::Worker;

/// How often the timer thread looks at a link (handshake retransmission, rekey, expiry).
const TICK: Duration = Duration::from_millis(100);

/// Test-only: rekey after this many milliseconds instead of every 2 minutes, so that a system
/// test sees several rekeys under load in seconds. Not an operator setting (README, Security).
pub const REKEY_ENV: &str = "VNET_TEST_REKEY_AFTER_MS";

/// vnetd's link timers: the defaults, or the rekey time of [`REKEY_ENV`] in its environment.
pub fn timers_from_env() -> Timers {
    timers_from(std::env::var(REKEY_ENV).ok().as_deref())
}

/// The link timers: the defaults, or the rekey time of [`REKEY_ENV`] when it holds a number of
/// milliseconds from 500 on (anything else is ignored with a warning).
fn timers_from(value: Option<&str>) -> Timers {
    let t = Timers::default();
    let Some(v) = value else {
        return t;
    };
    match v.trim().parse::<u64>() {
        Ok(ms) if ms >= 500 => Timers {
            rekey_after_ms: ms,
            ..t
        },
        _ => {
            warn!("{REKEY_ENV}={v:?} ignored: not a number of milliseconds >= 500");
            t
        }
    }
}

/// Maps a protocol refusal to the drop it is counted as.
pub fn drop_reason(e: CryptoError) -> DropReason {
    match e {
        CryptoError::BadAuth => DropReason::BadAuth,
        CryptoError::Replay => DropReason::Replay,
        CryptoError::NoSession => DropReason::NoSession,
        CryptoError::Truncated => DropReason::Truncated,
        CryptoError::TooLarge => DropReason::Oversize,
        CryptoError::Throttled | CryptoError::CookieRequired => DropReason::RateLimited,
        CryptoError::BadMac => DropReason::BadMac,
        CryptoError::BadHandshake | CryptoError::NotCrypto => DropReason::BadHandshake,
    }
}

/// The receiving session last used in one receive batch, with its link (by address: the
/// batch's snapshot keeps every link alive while the cache lives).
#[derive(Default)]
pub struct OpenCache(Option<(usize, Arc<Session>)>);

/// The crypto state of one encrypted udp link.
pub struct LinkCrypto {
    peer: Mutex<Peer>,
    epoch: Instant,
    sock: Arc<VxlanSocket>,
    /// The link's path: handshakes go where its data goes (a relay too).
    path: Arc<PathCell>,
    name: String,
    pub sealed: AtomicU64,
    pub opened: AtomicU64,
    pub handshakes_received: AtomicU64,
    last_established: AtomicU64,
}

impl LinkCrypto {
    /// The crypto state of a link to `remote` with these handshake timers (vnetd's come from
    /// [`timers_from_env`]; tests rekey fast).
    pub fn new(
        name: &str,
        local: PrivateKey,
        remote: PublicKey,
        vni: u32,
        sock: Arc<VxlanSocket>,
        path: Arc<PathCell>,
        timers: Timers,
    ) -> LinkCrypto {
        // Session indexes need only differ from a previous run's: the clock will do.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
            .unwrap_or(0);
        LinkCrypto {
            peer: Mutex::new(Peer::new(local, remote, vni, timers, seed)),
            epoch: Instant::now(),
            sock,
            path,
            name: name.to_string(),
            sealed: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            handshakes_received: AtomicU64::new(0),
            last_established: AtomicU64::new(0),
        }
    }

    fn now(&self) -> Now {
        Now {
            mono_ms: self.epoch.elapsed().as_millis() as u64,
            wall_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        }
    }

    fn peer(&self) -> std::sync::MutexGuard<'_, Peer> {
        self.peer.lock_or_recover()
    }

    /// The session to seal outgoing datagrams with; `None` drops them (`no_session`).
    pub fn sending_session(&self) -> Option<Arc<Session>> {
        let now = self.now().mono_ms;
        self.peer().sending_session(now)
    }

    /// Whether the segments of a guest's TSO frame may go out with their TCP/UDP checksums
    /// left partial: the session to send on says both hosts deliver such data
    /// ([`Session::partial_checksums`]). Asked once per frame; if a rekey changes the answer
    /// before the frame is sealed, a receiver without it still delivers the segments intact,
    /// one by one, marked partial.
    pub fn partial_checksums(&self) -> bool {
        self.sending_session()
            .is_some_and(|s| s.partial_checksums())
    }

    fn send(&self, msg: &[u8]) {
        let path = self.path.load();
        if let Err(r) = self
            .sock
            .send_parts(&path.to, &[path.prefix().into(), msg.into()], None)
        {
            debug!(link = %self.name, ?r, "handshake message not sent");
        }
    }

    /// Whether a session to send on exists.
    pub fn established(&self) -> bool {
        self.sending_session().is_some()
    }

    /// One timer step: sends an initiation when a handshake is due.
    pub fn tick(&self) {
        let msg = self.peer().tick(self.now());
        if let Some(m) = msg {
            self.send(&m);
        }
    }

    /// A handshake message (or cookie reply) from the link's peer address; what it refused is
    /// counted on `counters`. Answers (a response, a keepalive, a cookie reply) go to the
    /// link's peer address, whatever the message's source port: a forged message can make
    /// this host send only to its peer, and never more bytes than it received.
    pub fn handshake(&self, msg: &Message<'_>, counters: &PortCounters) {
        self.handshakes_received.fetch_add(1, Relaxed);
        let (reply, cookie_reply, established) = {
            let mut p = self.peer();
            let r = p.handle_handshake(msg, self.now());
            (r, p.take_cookie_reply(), p.stats.handshakes_completed)
        };
        match reply {
            Ok(m) if m.is_empty() => {}
            Ok(m) => self.send(&m),
            Err(e) => {
                debug!(link = %self.name, "handshake refused: {e}");
                counters.count_drop(drop_reason(e));
            }
        }
        if let Some(c) = cookie_reply {
            self.send(&c);
        }
        self.note_established(established);
    }

    fn note_established(&self, completed: u64) {
        if self.last_established.swap(completed, Relaxed) != completed {
            info!(link = %self.name, handshakes = completed, "encrypted session established");
        }
    }

    /// Authenticates and decrypts data message `datagram` (header, ciphertext, tag) for this
    /// host's session `receiver` in place; returns where its plaintext now is (empty for a
    /// keepalive, which only confirms the session). `cache` keeps the session between the
    /// datagrams of one receive batch, so a batch takes the link's lock and reads the clock
    /// once (a session that expires during the batch's microseconds is still used for it).
    pub fn open_in_place(
        &self,
        receiver: u32,
        datagram: &mut [u8],
        cache: &mut OpenCache,
    ) -> Result<Range<usize>, CryptoError> {
        let me = self as *const LinkCrypto as usize;
        let s = match &cache.0 {
            Some((link, s)) if *link == me && s.local_index == receiver => s.clone(),
            _ => {
                let now = self.now().mono_ms;
                let s = self
                    .peer()
                    .receiving_session(receiver, now)
                    .ok_or(CryptoError::NoSession)?;
                cache.0 = Some((me, s.clone()));
                s
            }
        };
        let plain = s.open_in_place(datagram)?;
        if !s.is_confirmed() {
            let completed = {
                let mut p = self.peer();
                p.confirm(&s);
                p.stats.handshakes_completed
            };
            self.note_established(completed);
        }
        self.opened.fetch_add(1, Relaxed);
        Ok(plain)
    }

    /// For `show links`.
    pub fn status(&self) -> CryptoStatus {
        let now = self.now().mono_ms;
        let p = self.peer();
        let st = p.stats;
        CryptoStatus {
            peer_key: p.remote().to_string(),
            session: p.state(),
            session_age_ms: p.current().map(|s| s.age_ms(now)),
            session_sent: p.current().map(|s| s.sent()),
            session_received: p.current().map(|s| s.received()),
            sealed: self.sealed.load(Relaxed),
            opened: self.opened.load(Relaxed),
            initiations_sent: st.initiations_sent,
            responses_sent: st.responses_sent,
            handshakes_received: self.handshakes_received.load(Relaxed),
            handshakes_completed: st.handshakes_completed,
            rekeys: st.rekeys,
            initiations_replayed: st.initiations_replayed,
            initiations_throttled: st.initiations_throttled,
            bad_handshakes: st.bad_handshakes,
        }
    }

    /// Starts the thread that drives this link's handshakes; it stops with the link.
    pub fn start_timer(self: &Arc<Self>) -> std::io::Result<Worker> {
        let me = self.clone();
        Worker::spawn(format!("crypto-{}", self.name), move |stop| loop {
            me.tick();
            match wait_readable(stop.as_raw_fd(), &stop, Some(TICK)) {
                Ok(Wake::Timeout) => {}
                Ok(_) => return,
                Err(e) => {
                    warn!(link = %me.name, "crypto timer: {e}");
                    return;
                }
            }
        })
    }
}

/// Two ends of an encrypted link (VNI 7; A initiated, both established), their handshake run
/// in memory; handshake messages they send later go to `sock` itself.
#[cfg(test)]
pub(crate) fn established_pair(sock: Arc<VxlanSocket>) -> (Arc<LinkCrypto>, Arc<LinkCrypto>) {
    let (ka, kb) = (
        PrivateKey::generate().expect("key"),
        PrivateKey::generate().expect("key"),
    );
    let to = Arc::new(PathCell::from_pointee(crate::reach::LinkPath::direct(
        sock.local_addr(),
    )));
    let t = Timers::default();
    let a = LinkCrypto::new("a", ka.clone(), kb.public(), 7, sock.clone(), to.clone(), t);
    let b = LinkCrypto::new("b", kb, ka.public(), 7, sock, to, t);
    let init = a.peer().tick(a.now()).expect("initiation");
    let resp = b
        .peer()
        .handle_handshake(&Message::parse(&init).expect("parse"), b.now())
        .expect("response");
    let mut keepalive = a
        .peer()
        .handle_handshake(&Message::parse(&resp).expect("parse"), a.now())
        .expect("keepalive");
    let Ok(Message::Data { receiver, .. }) = Message::parse(&keepalive) else {
        panic!("the initiator answers with a keepalive");
    };
    let r = b
        .open_in_place(receiver, &mut keepalive, &mut OpenCache::default())
        .expect("keepalive opens");
    assert!(r.is_empty());
    assert!(a.established() && b.established());
    (Arc::new(a), Arc::new(b))
}

#[cfg(test)]
mod timer_tests {
    use super::*;

    #[test]
    fn the_test_rekey_knob_sets_only_the_rekey_time() {
        let d = Timers::default();
        assert_eq!(timers_from(None), d);
        let t = timers_from(Some("1500"));
        assert_eq!(t.rekey_after_ms, 1500);
        assert_eq!(
            Timers {
                rekey_after_ms: d.rekey_after_ms,
                ..t
            },
            d
        );
        // Nonsense and too-short times leave the defaults.
        for bad in ["", "x", "-5", "499"] {
            assert_eq!(timers_from(Some(bad)), d, "{bad:?}");
        }
    }
}
