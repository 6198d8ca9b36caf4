//! A token bucket for per-port rate limits (`rate MBIT [burst KB]`): a flood from one guest or
//! one link is cut to its rate, so it cannot take the forwarding threads and the wire from the
//! others. Pure: the caller passes the time in, so tests need no clock.

/// Scale of the token count: one byte is `8 * 1e9` units, so that `elapsed_ns * rate_bps`
/// adds tokens exactly, with no rounding lost between frames.
const UNITS_PER_BYTE: i128 = 8 * 1_000_000_000;

/// A token bucket over bytes. It starts full; a frame passes while the bucket holds any tokens
/// and then takes its whole length, so the count may go below zero by at most one frame. That
/// lets a 64 KB GSO frame through a bucket smaller than it (no frame size is ever starved), and
/// the long-run rate is still exact: the debt is repaid before the next frame passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    rate_bps: u64,
    burst_bytes: u64,
    /// Tokens, in units of `1 / UNITS_PER_BYTE` byte; at most the burst.
    tokens: i128,
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket that refills at `rate_bps` bits per second and holds up to `burst_bytes`
    /// (both at least 1).
    pub fn new(rate_bps: u64, burst_bytes: u64, now_ns: u64) -> TokenBucket {
        let burst_bytes = burst_bytes.max(1);
        TokenBucket {
            rate_bps: rate_bps.max(1),
            burst_bytes,
            tokens: burst_bytes as i128 * UNITS_PER_BYTE,
            last_ns: now_ns,
        }
    }

    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    fn refill(&mut self, now_ns: u64) {
        // A clock that went backwards (another thread's older reading) adds nothing.
        let elapsed = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let cap = self.burst_bytes as i128 * UNITS_PER_BYTE;
        let added = (elapsed as i128).saturating_mul(self.rate_bps as i128);
        self.tokens = self.tokens.saturating_add(added).min(cap);
    }

    /// Whether a frame of `len` bytes may pass at `now_ns`; if so its bytes are taken.
    pub fn admit(&mut self, now_ns: u64, len: usize) -> bool {
        self.refill(now_ns);
        if self.tokens <= 0 {
            return false;
        }
        self.tokens -= len as i128 * UNITS_PER_BYTE;
        true
    }

    /// The whole bytes the bucket holds at `now_ns` (negative while in debt).
    pub fn available(&mut self, now_ns: u64) -> i64 {
        self.refill(now_ns);
        (self.tokens / UNITS_PER_BYTE) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn starts_full_then_limits() {
        // 8 Mbit/s = 1 MB/s, burst 10 KB.
        let mut b = TokenBucket::new(8_000_000, 10_000, 0);
        let passed = (0..20).filter(|_| b.admit(0, 1000)).count();
        assert_eq!(passed, 10);
        assert!(!b.admit(0, 1000));
        // 1 ms refills 1000 bytes: exactly one more frame.
        assert!(b.admit(MS, 1000));
        assert!(!b.admit(MS, 1000));
    }

    #[test]
    fn refill_is_capped_at_the_burst() {
        let mut b = TokenBucket::new(8_000_000, 5_000, 0);
        assert!(b.admit(0, 5_000));
        assert_eq!(b.available(10 * S), 5_000);
    }

    #[test]
    fn a_frame_larger_than_the_burst_passes_into_debt() {
        let mut b = TokenBucket::new(8_000_000, 1_500, 0);
        assert!(b.admit(0, 65_000));
        assert_eq!(b.available(0), 1_500 - 65_000);
        // The debt is repaid at the rate before anything else passes: 63.5 ms.
        assert!(!b.admit(63 * MS, 60));
        assert!(b.admit(64 * MS, 60));
    }

    #[test]
    fn time_going_backwards_adds_nothing() {
        let mut b = TokenBucket::new(8_000_000, 1_000, 10 * MS);
        assert!(b.admit(10 * MS, 1_000));
        assert!(!b.admit(5 * MS, 1));
        assert!(!b.admit(10 * MS, 1));
        assert!(b.admit(11 * MS, 1));
    }

    #[test]
    fn extremes_do_not_overflow() {
        let mut b = TokenBucket::new(u64::MAX, u64::MAX, 0);
        assert!(b.admit(u64::MAX, usize::MAX));
        let mut z = TokenBucket::new(0, 0, 0);
        assert!(z.admit(0, 1));
        assert!(!z.admit(0, 1));
    }

    proptest! {
        /// Over any run of frames and times, the bytes admitted never exceed the burst plus
        /// the rate times the elapsed time plus one frame (the debt allowance).
        #[test]
        fn long_run_rate_holds(
            rate_mbit in 1u64..10_000,
            burst in 1u64..1_000_000,
            steps in proptest::collection::vec((0u64..2 * MS, 1usize..65_536), 1..400),
        ) {
            let rate = rate_mbit * 1_000_000;
            let mut b = TokenBucket::new(rate, burst, 0);
            let (mut now, mut admitted, mut biggest) = (0u64, 0u128, 0usize);
            for (dt, len) in steps {
                now += dt;
                if b.admit(now, len) {
                    admitted += len as u128;
                    biggest = biggest.max(len);
                }
            }
            let allowance = burst as u128 + (now as u128 * rate as u128) / (8 * S as u128) + biggest as u128;
            prop_assert!(admitted <= allowance, "admitted {admitted} > {allowance}");
        }

        /// A sender that waits long enough is never refused: after `len` bytes' worth of time
        /// (and a full bucket's worth), every frame passes.
        #[test]
        fn a_paced_sender_is_never_refused(
            rate_mbit in 1u64..1_000,
            len in 64usize..9_000,
            n in 1usize..200,
        ) {
            let rate = rate_mbit * 1_000_000;
            let mut b = TokenBucket::new(rate, len as u64, 0);
            let gap = (len as u64 * 8 * S).div_ceil(rate);
            for i in 0..n as u64 {
                prop_assert!(b.admit(i * gap, len));
            }
        }
    }
}
