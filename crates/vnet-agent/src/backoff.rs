//! How long the agent waits between sessions, and how long its etcd calls may take: pure, so
//! the timing that keeps many agents from hammering an overloaded etcd together is tested.
//! The jitter every wait of the agent is drawn with is here too.

use std::time::Duration;

/// The first wait after a failure (and after a session that was up).
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts to reach etcd (each wait is jittered down to half
/// of it, so that agents failing together do not retry together).
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest whole-call timeout an agent lets its calls grow to under load.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Random factors for the agent's waits, so that agents that fail or start together do not
/// retry, poll or read together. xorshift: no need for good randomness.
#[derive(Debug, Clone)]
pub struct Jitter {
    /// Never 0 (xorshift would stay there).
    state: u64,
}

impl Jitter {
    /// Jitter from `seed` (made odd, so never 0).
    pub fn new(seed: u64) -> Jitter {
        Jitter { state: seed | 1 }
    }

    /// A random fraction in [0, 1), in steps of 1/1000.
    fn fraction(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state % 1000) as f64 / 1000.0
    }

    /// `d` scaled by a random factor in [0.5, 1).
    pub fn scale(&mut self, d: Duration) -> Duration {
        d.mul_f64(0.5 + self.fraction() / 2.0)
    }

    /// A random part of `d`: scaled by a factor in [0, 1).
    pub fn part(&mut self, d: Duration) -> Duration {
        d.mul_f64(self.fraction())
    }
}

/// The wait before the next session: doubling from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`],
/// each wait scaled by a random factor in [0.5, 1).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    jitter: Jitter,
}

impl Backoff {
    /// A backoff whose jitter starts from `seed`.
    pub fn new(seed: u64) -> Backoff {
        Backoff {
            next: FIRST_BACKOFF,
            jitter: Jitter::new(seed),
        }
    }

    /// A session was up before this failure: start again from the first wait.
    pub fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }

    /// The wait before the next attempt; the one after will be twice as long (up to the
    /// maximum).
    pub fn wait(&mut self) -> Duration {
        let w = self.jitter.scale(self.next);
        self.next = (self.next * 2).min(MAX_BACKOFF);
        w
    }
}

/// The call timeout after a call timed out: twice `current`, at most [`MAX_CALL_TIMEOUT`],
/// never below the configured `base`. On an overloaded etcd, giving up and asking again only
/// adds load (at 1,000 hosts, sessions whose first calls timed out at 3 s kept etcd
/// saturated); the agent goes back to `base` once a session is up.
pub fn grown_timeout(current: Duration, base: Duration) -> Duration {
    (current * 2).min(MAX_CALL_TIMEOUT).max(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_maximum_each_jittered_down_to_half() {
        for seed in [1, 2, 0xdead_beef, u64::MAX] {
            let mut b = Backoff::new(seed);
            let mut full = FIRST_BACKOFF;
            for _ in 0..10 {
                let w = b.wait();
                assert!(w >= full / 2 && w < full, "{w:?} for {full:?}");
                full = (full * 2).min(MAX_BACKOFF);
            }
            assert_eq!(b.next, MAX_BACKOFF);
            b.reset();
            assert!(b.wait() < FIRST_BACKOFF);
        }
    }

    #[test]
    fn agents_seeded_apart_do_not_wait_alike() {
        let waits = |seed| {
            let mut b = Backoff::new(seed);
            (0..8).map(|_| b.wait()).collect::<Vec<_>>()
        };
        assert_ne!(waits(3), waits(5));
        // A zero seed would stall xorshift at zero (every wait exactly half): it is made odd.
        let mut full = FIRST_BACKOFF;
        let mut halves = 0;
        for w in waits(0) {
            halves += usize::from(w == full / 2);
            full = (full * 2).min(MAX_BACKOFF);
        }
        assert!(halves < 8, "no jitter");
    }

    #[test]
    fn parts_cover_the_whole_range() {
        let mut j = Jitter::new(9);
        let d = Duration::from_secs(10);
        let parts: Vec<Duration> = (0..1000).map(|_| j.part(d)).collect();
        assert!(parts.iter().all(|p| *p < d));
        // Spread over the range, not bunched: some in each tenth.
        for tenth in 0..10 {
            let (lo, hi) = (d * tenth / 10, d * (tenth + 1) / 10);
            assert!(
                parts.iter().any(|p| *p >= lo && *p < hi),
                "none in tenth {tenth}"
            );
        }
    }

    #[test]
    fn a_timed_out_call_waits_longer_next_time_within_bounds() {
        let base = Duration::from_secs(3);
        assert_eq!(grown_timeout(base, base), Duration::from_secs(6));
        assert_eq!(
            grown_timeout(Duration::from_secs(20), base),
            MAX_CALL_TIMEOUT
        );
        assert_eq!(grown_timeout(MAX_CALL_TIMEOUT, base), MAX_CALL_TIMEOUT);
        // Never below the configured timeout, even above the maximum.
        let big = Duration::from_secs(60);
        assert_eq!(grown_timeout(Duration::from_millis(1), big), big);
    }
}
