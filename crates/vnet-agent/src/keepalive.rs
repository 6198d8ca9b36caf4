//! The lease keep-alive thread: renews the session's lease every TTL/3, on a thread and an etcd
//! connection of its own (`Client::with_own_connection`) so that a slow etcd call of the agent
//! cannot make it late, nor a big answer on the agent's connection delay its answers. Each renewal
//! goes to the member that serves the watch, with a deadline of the interval: a member that does
//! not answer (frozen, partitioned) while another one does is reported so the agent watches
//! through that one; the renewal is retried at once through any member that answers. When no
//! renewal has been answered for the lease's whole TTL, the lease may have lapsed at etcd whatever
//! the transport says (a cut-off host's streams can stay open for half a minute), so the session
//! ends, as etcd's own client ends its keep-alive; the next session asks the store whether the
//! lease lives before it registers again (renewals through a busy gRPC proxy arrive late rather
//! than never). What the answers mean is decided by pure functions below.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use vnet_etcd::Client;

use crate::machine::LeaseFindings;

/// What the agent and its keep-alive thread share.
pub struct KeepAlive {
    /// The lease to renew (0: none).
    pub lease: AtomicI64,
    /// Renewal interval, milliseconds.
    pub every_ms: AtomicI64,
    /// The endpoint serving the session's watch (usize::MAX: none); keep-alives go there.
    pub watch_endpoint: AtomicUsize,
    /// The session (see `session`) in which the store said the lease is gone (0: none).
    pub expired: AtomicU64,
    /// The session in which no renewal was answered for the lease's whole TTL (0: none).
    pub lapsed: AtomicU64,
    /// The session in which the watch's member did not answer a keep-alive in time (0: none).
    pub member_silent: AtomicU64,
    /// Bumped by each session's start (the first session is 2): a renewal sent before it is
    /// not about this session (its lease may be the one just given up; its lapse clock starts
    /// over), and a finding is about the session it names.
    pub session: AtomicU64,
    /// The session thread is done with the lease: it revoked it at a clean stop, or tried to,
    /// or keeps it for the next daemon.
    pub released: AtomicBool,
}

impl Default for KeepAlive {
    fn default() -> KeepAlive {
        KeepAlive {
            lease: AtomicI64::new(0),
            every_ms: AtomicI64::new(1000),
            watch_endpoint: AtomicUsize::new(usize::MAX),
            expired: AtomicU64::new(0),
            lapsed: AtomicU64::new(0),
            member_silent: AtomicU64::new(0),
            session: AtomicU64::new(1),
            released: AtomicBool::new(false),
        }
    }
}

impl KeepAlive {
    /// A session starts with `lease`, renewed every `every_ms`: nothing is known of it yet.
    pub fn start(&self, lease: i64, every_ms: i64) {
        self.every_ms.store(every_ms, Relaxed);
        self.watch_endpoint.store(usize::MAX, Relaxed);
        self.lease.store(lease, Relaxed);
        self.session.fetch_add(1, Ordering::Release);
    }

    /// What the thread found since the session started.
    pub fn findings(&self) -> LeaseFindings {
        let session = self.session.load(Ordering::Acquire);
        LeaseFindings {
            expired: self.expired.load(Relaxed) == session,
            lapsed: self.lapsed.load(Relaxed) == session,
            member_silent: self.member_silent.load(Relaxed) == session,
        }
    }
}

/// The renewal interval (at least 100 ms) for `every_ms`, and how long a renewal may take
/// before it is given up: half the TTL. An overloaded etcd answers late, and a renewal that
/// waits in its queue is better than one that times out and is sent again (at 1,000 hosts on
/// one etcd, 3 s call timeouts let leases expire, and each expiry's deletions and
/// re-registration added to the load).
pub fn timing(every_ms: i64) -> (Duration, Duration) {
    let every = Duration::from_millis(every_ms.max(100) as u64);
    (every, every * 3 / 2)
}

/// Whether the member serving the watch (`watch_member`) is silent: it did not answer, and
/// the retry through any member was answered (`retry_answered`) by another one
/// (`answered_by`). When none answers, the store is down or overloaded, and moving the watch
/// would only add a full catch-up to its load (at 300 hosts on one loaded etcd, every late
/// keep-alive restarted a session).
pub fn member_silent(retry_answered: bool, answered_by: usize, watch_member: usize) -> bool {
    retry_answered && answered_by != watch_member
}

/// Until when a lease surely lives, after a renewal sent at `sent` was answered with `ttl`
/// seconds: etcd counts the TTL from when it took the renewal, which is after `sent`.
pub fn alive_until(sent: Instant, ttl: i64) -> Instant {
    sent + Duration::from_secs(ttl.max(0) as u64)
}

/// Whether a lease whose last answered renewal keeps it alive until `until` has lapsed at
/// `now` (no answer since: the renewals went unanswered for the whole TTL).
pub fn lapsed(until: Instant, now: Instant) -> bool {
    now > until
}

/// What a renewal's answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease is gone (TTL 0 or less): the session must end and register again.
    Expired,
    Alive,
    /// No member answered: the next attempt comes sooner than a full interval.
    Failed,
}

impl Renewal {
    pub fn of<E>(answer: &Result<i64, E>) -> Renewal {
        match answer {
            Ok(ttl) if *ttl <= 0 => Renewal::Expired,
            Ok(_) => Renewal::Alive,
            Err(_) => Renewal::Failed,
        }
    }
}

/// Whether the thread ends: once the agent stops, at once for a crash (a crashed host renews
/// nothing), else once the session thread has released the lease. A clean stop revokes the
/// lease, and renewals go on until then: at 1,000 agents stopping together, revokes through
/// the proxies took longer than a TTL for up to 174 of them, and those leases expired instead.
pub fn thread_done(stop: bool, crash: bool, released: bool) -> bool {
    stop && (crash || released)
}

/// The thread's loop, until [`thread_done`].
pub fn run(client: &Client, stop: &AtomicBool, crash: &AtomicBool, ka: &KeepAlive) {
    let mut next = Instant::now();
    // The session being renewed (a lease changes only with a session), and until when its
    // lease surely lives (from its last answered renewal; at a session's start, which renewed
    // or granted it just before, from when this thread first saw it, a TTL being three
    // intervals).
    let mut tracked: Option<(u64, Instant)> = None;
    while !thread_done(
        stop.load(Relaxed),
        crash.load(Relaxed),
        ka.released.load(Relaxed),
    ) {
        // Short enough to notice a new lease or a stop soon, long enough that a thousand
        // idle agents in one harness process cost little.
        let wait = next.saturating_duration_since(Instant::now());
        std::thread::sleep(wait.clamp(Duration::from_millis(10), Duration::from_millis(100)));
        let session = ka.session.load(Ordering::Acquire);
        let lease = ka.lease.load(Relaxed);
        let (every, patience) = timing(ka.every_ms.load(Relaxed));
        if lease == 0 || Instant::now() < next {
            continue;
        }
        let sent = Instant::now();
        if tracked.map(|(s, _)| s) != Some(session) {
            tracked = Some((session, sent + every * 3));
        }
        next = sent + every;
        let endpoint = ka.watch_endpoint.load(Relaxed);
        let mut silent = None;
        let answer = if endpoint == usize::MAX || client.endpoints().len() == 1 {
            client.lease_keepalive_within(lease, patience)
        } else {
            match client.lease_keepalive_via(lease, endpoint, every) {
                Err(e) if e.is_unreachable() => {
                    client.avoid_endpoint(endpoint);
                    let r = client.lease_keepalive_within(lease, patience);
                    if member_silent(r.is_ok(), client.current_endpoint(), endpoint) {
                        silent = Some(e);
                    }
                    r
                }
                r => r,
            }
        };
        if ka.session.load(Ordering::Acquire) != session {
            // A session started while this renewal was out: what it found is about the one
            // before (perhaps a lease given up since); the next round renews the new one.
            // (Findings name their session, so one stored just as a session starts is
            // harmless.)
            tracked = None;
            next = Instant::now();
            continue;
        }
        if let Some(e) = silent {
            warn!(
                endpoint = client.endpoints().get(endpoint).map(String::as_str),
                "etcd: the watch's member did not answer a keep-alive: {e}"
            );
            ka.member_silent.store(session, Relaxed);
        }
        match Renewal::of(&answer) {
            Renewal::Expired => ka.expired.store(session, Relaxed),
            Renewal::Alive => {
                if let Ok(ttl) = answer {
                    tracked = Some((session, alive_until(sent, ttl)));
                }
            }
            Renewal::Failed => {
                if let Err(e) = &answer {
                    debug!("etcd: lease keep-alive failed: {e}");
                }
                if tracked.is_some_and(|(_, until)| lapsed(until, Instant::now()))
                    && ka.lapsed.swap(session, Relaxed) != session
                {
                    warn!("etcd: no keep-alive answered for the lease's whole TTL; it may have lapsed");
                }
                next = Instant::now() + every / 4;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_are_about_the_session_they_name() {
        let ka = KeepAlive::default();
        assert_eq!(ka.findings(), LeaseFindings::default(), "no session yet");
        ka.start(7, 1000);
        let first = ka.session.load(Relaxed);
        assert_eq!(ka.findings(), LeaseFindings::default());
        ka.lapsed.store(first, Relaxed);
        assert!(ka.findings().lapsed);
        // The next session keeps the lease: the lapse of the one before is not its own.
        ka.start(7, 1000);
        assert_eq!(ka.findings(), LeaseFindings::default());
        // An answer about the session before (a lease given up since), stored late: not this
        // session's either.
        ka.expired.store(first, Relaxed);
        ka.member_silent.store(first, Relaxed);
        assert_eq!(ka.findings(), LeaseFindings::default());
    }

    #[test]
    fn renewals_end_at_a_crash_at_once_and_at_a_clean_stop_once_the_lease_is_released() {
        assert!(!thread_done(false, false, false), "running");
        assert!(!thread_done(false, false, true), "not stopping");
        assert!(
            thread_done(true, true, false),
            "a crash renews nothing more"
        );
        assert!(
            !thread_done(true, false, false),
            "renewing until the revoke is done"
        );
        assert!(thread_done(true, false, true));
    }

    #[test]
    fn a_member_is_silent_only_if_another_answered_in_its_place() {
        // The retry was answered by another member: move the watch there.
        assert!(member_silent(true, 1, 0));
        // Answered by the same member after all (it was only slow): stay.
        assert!(!member_silent(true, 0, 0));
        // Nobody answered: the store is down or overloaded; moving would only add load.
        assert!(!member_silent(false, 1, 0));
    }

    #[test]
    fn renewals_come_every_third_of_the_ttl_and_may_take_half_of_it() {
        assert_eq!(
            timing(1000),
            (Duration::from_millis(1000), Duration::from_millis(1500))
        );
        // A bound below: a store cannot make the thread spin.
        assert_eq!(timing(0).0, Duration::from_millis(100));
        assert_eq!(timing(-5).0, Duration::from_millis(100));
    }

    #[test]
    fn a_lease_lapses_a_ttl_after_its_last_answered_renewal_was_sent() {
        let sent = Instant::now();
        let until = alive_until(sent, 3);
        assert_eq!(until, sent + Duration::from_secs(3));
        assert!(!lapsed(until, sent + Duration::from_millis(2999)));
        assert!(!lapsed(until, until));
        assert!(lapsed(until, until + Duration::from_millis(1)));
        // An answer of no TTL keeps nothing alive.
        assert!(lapsed(
            alive_until(sent, -1),
            sent + Duration::from_millis(1)
        ));
    }

    #[test]
    fn what_a_renewal_answer_says() {
        assert_eq!(Renewal::of::<()>(&Ok(0)), Renewal::Expired);
        assert_eq!(Renewal::of::<()>(&Ok(-1)), Renewal::Expired);
        assert_eq!(Renewal::of::<()>(&Ok(30)), Renewal::Alive);
        assert_eq!(Renewal::of(&Err(())), Renewal::Failed);
    }
}
