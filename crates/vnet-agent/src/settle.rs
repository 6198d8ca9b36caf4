//! A start that does not stampede (issue #19): before its first read of the overlay, an agent
//! waits for the hosts' registrations to settle. Pure, so the waits are tested without etcd.
//!
//! Why: when many hosts start together (a data centre powering on, every host after an etcd
//! restore), an agent that reads the overlay at once and then watches receives every later
//! registration as a watch message, and every agent after it does the same: N^2/2 messages
//! through etcd and as many incremental derivations. An agent that registers, then waits
//! until the count of host records stops changing, reads them all in one snapshot instead. And
//! agents that settle in the same quiet spell ask for the same snapshot, which etcd's gRPC
//! proxy can then answer from its cache (`vnet_etcd::Client::snapshot_paged`).
//!
//! The count is polled (linearizable, which etcd answers from its index alone) at jittered
//! intervals doubling from [`FIRST_POLL`] to [`MAX_POLL`]; the registrations have settled
//! when two polls in a row count as many hosts. The wait is bounded by [`MAX_SETTLE`]: in an
//! overlay where hosts keep joining, the agent reads anyway. The first poll's revision is the
//! floor of the snapshot: a cached one older than that (older than this host's own
//! registration) is not taken.
//!
//! Settling lines the agents that start together up: without more, they would all read at
//! once, the stampede this is meant to prevent (at 1,000 hosts straight to etcd, 1,000 reads
//! of 9,000 keys each in flight together, each slow; through a proxy, 1,000 agents decoding
//! and deriving together). So each spreads its read over a window as long as etcd would take
//! to serve all of them, as far as the agent can tell: the hosts that registered from just
//! before its own registration until it settled (those starting with it, itself included),
//! times the hosts it will read, times etcd's cost per host of a read
//! ([`READ_COST_PER_HOST`]), at most [`MAX_READ_SPREAD`]; it reads at a random point of it. A
//! host starting alone into a quiet overlay counts itself only and reads at once (10 ms of
//! spread at most at 1,000 hosts).

use std::time::{Duration, Instant};

use crate::backoff::Jitter;

/// The first interval between two polls of the host count (jittered down to half of it): the
/// delay a start into a quiet overlay pays.
pub const FIRST_POLL: Duration = Duration::from_millis(500);
/// The longest interval between two polls (jittered down to half of it).
pub const MAX_POLL: Duration = Duration::from_secs(2);
/// The longest an agent waits for the registrations to settle before it reads anyway.
pub const MAX_SETTLE: Duration = Duration::from_secs(10);
/// etcd's CPU for one host's keys (a host record and 8 placements) in a snapshot read: 10.5 ms
/// for 1,000 hosts in one page, measured on the 2-core machine of `bench/README.md`.
pub const READ_COST_PER_HOST: Duration = Duration::from_micros(10);
/// The longest window an agent spreads its read over.
pub const MAX_READ_SPREAD: Duration = Duration::from_secs(30);

/// What to do after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Poll again after this long.
    Poll(Duration),
    /// Read the snapshot, at least as recent as revision `floor`, after waiting `after` (the
    /// agent's part of the spread of the reads of those starting with it).
    Read { floor: i64, after: Duration },
}

/// The wait of one start for the registrations to settle.
#[derive(Debug, Clone)]
pub struct Settle {
    started: Instant,
    /// The host count before this host registered (when it did).
    before: Option<i64>,
    /// The first poll's revision and host count.
    first: Option<(i64, i64)>,
    /// The host count of the last poll.
    last: Option<i64>,
    /// The next interval, before jitter.
    next: Duration,
    polls: u32,
}

impl Settle {
    /// A wait starting at `now` (before the first poll); `before`: the host count just before
    /// this host registered, if it did.
    pub fn new(now: Instant, before: Option<i64>) -> Settle {
        Settle {
            started: now,
            before,
            first: None,
            last: None,
            next: FIRST_POLL,
            polls: 0,
        }
    }

    /// A poll counted `hosts` host records at `revision`, at `now`: poll again after a
    /// jittered interval, or read.
    pub fn polled(&mut self, hosts: i64, revision: i64, now: Instant, jitter: &mut Jitter) -> Next {
        self.polls += 1;
        let (floor, first_hosts) = *self.first.get_or_insert((revision, hosts));
        let settled = self.last == Some(hosts);
        self.last = Some(hosts);
        let waited = now.saturating_duration_since(self.started);
        if settled || waited >= MAX_SETTLE {
            let joined = (hosts - self.before.unwrap_or(first_hosts)).max(0);
            let after = jitter.part(read_spread(joined, hosts));
            return Next::Read { floor, after };
        }
        let wait = jitter.scale(self.next).min(MAX_SETTLE - waited);
        self.next = (self.next * 2).min(MAX_POLL);
        Next::Poll(wait)
    }

    /// How many polls were answered.
    pub fn polls(&self) -> u32 {
        self.polls
    }
}

/// The window the reads of `joined` agents starting together are spread over, each reading
/// `hosts` hosts: as long as etcd takes to serve them all, at most [`MAX_READ_SPREAD`].
pub fn read_spread(joined: i64, hosts: i64) -> Duration {
    let host_reads = u32::try_from(joined.max(0).saturating_mul(hosts.max(0))).unwrap_or(u32::MAX);
    READ_COST_PER_HOST
        .checked_mul(host_reads)
        .map_or(MAX_READ_SPREAD, |d| d.min(MAX_READ_SPREAD))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls answered with `counts` at revisions 10, 11, ..., each as soon as the previous
    /// answer says: the waits asked for, and the final answer.
    fn run(counts: &[i64], seed: u64) -> (Vec<Duration>, Option<Next>) {
        run_from(None, counts, seed)
    }

    /// [`run`] by an agent that counted `before` hosts before it registered.
    fn run_from(before: Option<i64>, counts: &[i64], seed: u64) -> (Vec<Duration>, Option<Next>) {
        let start = Instant::now();
        let (mut s, mut jitter) = (Settle::new(start, before), Jitter::new(seed));
        let (mut now, mut waits) = (start, Vec::new());
        for (i, &c) in counts.iter().enumerate() {
            match s.polled(c, 10 + i as i64, now, &mut jitter) {
                Next::Poll(d) => {
                    waits.push(d);
                    now += d;
                }
                read => return (waits, Some(read)),
            }
        }
        (waits, None)
    }

    #[test]
    fn a_quiet_overlay_is_read_after_one_short_wait() {
        let (waits, next) = run(&[5, 5], 7);
        // Nobody registered meanwhile: no spread.
        assert_eq!(
            next,
            Some(Next::Read {
                floor: 10,
                after: Duration::ZERO
            })
        );
        assert_eq!(waits.len(), 1);
        assert!(waits[0] >= FIRST_POLL / 2 && waits[0] < FIRST_POLL);
    }

    #[test]
    fn registrations_under_way_are_waited_out_with_growing_jittered_polls() {
        // Hosts register for four polls, then the count stays.
        let (waits, next) = run(&[3, 40, 200, 700, 1000, 1000], 3);
        // The floor is the first poll's revision, not the last one's: a snapshot between the
        // two is as good, and the agents that settled first may have cached it.
        let Some(Next::Read { floor, after }) = next else {
            panic!("{next:?}")
        };
        assert_eq!(floor, 10);
        // 997 hosts started with this one, each to read 1,000 hosts: spread over 10 s.
        assert!(after < read_spread(997, 1000));
        assert_eq!(waits.len(), 5);
        let mut full = FIRST_POLL;
        for w in &waits {
            assert!(*w >= full / 2 && *w < full, "{w:?} for {full:?}");
            full = (full * 2).min(MAX_POLL);
        }
        // The interval stops growing at MAX_POLL.
        assert!(waits[3] < MAX_POLL && waits[4] < MAX_POLL);
        assert!(waits[4] >= MAX_POLL / 2);
    }

    #[test]
    fn a_count_that_never_settles_is_read_after_the_bound() {
        let counts: Vec<i64> = (1..100).collect();
        let (waits, next) = run(&counts, 11);
        assert!(matches!(next, Some(Next::Read { floor: 10, .. })));
        let total: Duration = waits.iter().sum();
        // The last wait is cut to end at the bound exactly; the poll there reads.
        assert_eq!(total, MAX_SETTLE);
    }

    #[test]
    fn reads_are_spread_over_what_etcd_needs_to_serve_them_within_a_bound() {
        assert_eq!(read_spread(0, 1000), Duration::ZERO);
        assert_eq!(read_spread(1000, 1000), Duration::from_secs(10));
        assert_eq!(read_spread(1, 1000), Duration::from_millis(10));
        assert_eq!(read_spread(10_000, 10_000), MAX_READ_SPREAD);
        assert_eq!(read_spread(i64::MAX, i64::MAX), MAX_READ_SPREAD);
        // Hosts that left while this one waited are no reads.
        assert_eq!(read_spread(-5, 1000), Duration::ZERO);
        // Agents settling together read at points spread over the window.
        let reads: Vec<Duration> = (1..200)
            .filter_map(|seed| match run(&[1, 1000, 1000], seed).1 {
                Some(Next::Read { after, .. }) => Some(after),
                _ => None,
            })
            .collect();
        let window = read_spread(999, 1000);
        assert!(reads.iter().all(|a| *a < window));
        assert!(reads.iter().any(|a| *a < window / 4) && reads.iter().any(|a| *a > window * 3 / 4));
    }

    #[test]
    fn an_agent_that_registered_counts_the_hosts_registering_around_it() {
        // It registered as the 600th of a mass start: by its first poll the others were
        // done, yet it spreads its read as one of 1,000.
        let (_, next) = run_from(Some(599), &[1000, 1000], 5);
        let Some(Next::Read { after, .. }) = next else {
            panic!("{next:?}")
        };
        assert!(after < read_spread(401, 1000));
        let spread_of = |seed| match run_from(Some(599), &[1000, 1000], seed).1 {
            Some(Next::Read { after, .. }) => after,
            n => panic!("{n:?}"),
        };
        assert!((1..50).any(|seed| spread_of(seed) > read_spread(200, 1000)));
        // Alone into a quiet overlay: itself only.
        let (_, next) = run_from(Some(999), &[1000, 1000], 5);
        assert!(matches!(next, Some(Next::Read { after, .. }) if after < read_spread(1, 1000)));
    }

    #[test]
    fn agents_seeded_apart_poll_apart() {
        let (a, _) = run(&[1, 2, 3, 4, 5], 3);
        let (b, _) = run(&[1, 2, 3, 4, 5], 5);
        assert_ne!(a, b);
    }

    #[test]
    fn polls_are_counted() {
        let start = Instant::now();
        let mut s = Settle::new(start, None);
        let mut j = Jitter::new(1);
        assert_eq!(s.polls(), 0);
        s.polled(1, 5, start, &mut j);
        s.polled(1, 6, start, &mut j);
        assert_eq!(s.polls(), 2);
    }
}
