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

use std::time::{Duration, Instant};

use crate::backoff::Jitter;

/// The first interval between two polls of the host count (jittered down to half of it): the
/// delay a start into a quiet overlay pays.
pub const FIRST_POLL: Duration = Duration::from_millis(500);
/// The longest interval between two polls (jittered down to half of it).
pub const MAX_POLL: Duration = Duration::from_secs(2);
/// The longest an agent waits for the registrations to settle before it reads anyway.
pub const MAX_SETTLE: Duration = Duration::from_secs(10);

/// What to do after a poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Poll again after this long.
    Poll(Duration),
    /// Read the snapshot: at least as recent as revision `floor`.
    Read { floor: i64 },
}

/// The wait of one start for the registrations to settle.
#[derive(Debug, Clone)]
pub struct Settle {
    started: Instant,
    /// The first poll's revision.
    floor: Option<i64>,
    /// The host count of the last poll.
    last: Option<i64>,
    /// The next interval, before jitter.
    next: Duration,
    polls: u32,
}

impl Settle {
    /// A wait starting at `now` (before the first poll).
    pub fn new(now: Instant) -> Settle {
        Settle {
            started: now,
            floor: None,
            last: None,
            next: FIRST_POLL,
            polls: 0,
        }
    }

    /// A poll counted `hosts` host records at `revision`, at `now`: poll again after a
    /// jittered interval, or read.
    pub fn polled(&mut self, hosts: i64, revision: i64, now: Instant, jitter: &mut Jitter) -> Next {
        self.polls += 1;
        let floor = *self.floor.get_or_insert(revision);
        let settled = self.last == Some(hosts);
        self.last = Some(hosts);
        let waited = now.saturating_duration_since(self.started);
        if settled || waited >= MAX_SETTLE {
            return Next::Read { floor };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls answered with `counts` at revisions 10, 11, ..., each as soon as the previous
    /// answer says: the waits asked for, and the final answer.
    fn run(counts: &[i64], seed: u64) -> (Vec<Duration>, Option<Next>) {
        let start = Instant::now();
        let (mut s, mut jitter) = (Settle::new(start), Jitter::new(seed));
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
        assert_eq!(next, Some(Next::Read { floor: 10 }));
        assert_eq!(waits.len(), 1);
        assert!(waits[0] >= FIRST_POLL / 2 && waits[0] < FIRST_POLL);
    }

    #[test]
    fn registrations_under_way_are_waited_out_with_growing_jittered_polls() {
        // Hosts register for four polls, then the count stays.
        let (waits, next) = run(&[3, 40, 200, 700, 1000, 1000], 3);
        // The floor is the first poll's revision, not the last one's: a snapshot between the
        // two is as good, and the agents that settled first may have cached it.
        assert_eq!(next, Some(Next::Read { floor: 10 }));
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
        assert!(matches!(next, Some(Next::Read { floor: 10 })));
        let total: Duration = waits.iter().sum();
        // The last wait is cut to end at the bound exactly; the poll there reads.
        assert_eq!(total, MAX_SETTLE);
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
        let mut s = Settle::new(start);
        let mut j = Jitter::new(1);
        assert_eq!(s.polls(), 0);
        s.polled(1, 5, start, &mut j);
        s.polled(1, 6, start, &mut j);
        assert_eq!(s.polls(), 2);
    }
}
