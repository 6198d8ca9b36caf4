//! When a frame leaves, or why it does not: the path's model, without I/O or clocks (the caller
//! passes the time), so that it is tested exactly.
//!
//! A frame arriving at `now` first meets the bottleneck (the `rate`, if any): it starts being
//! serialized when the bottleneck is free and is dropped (`QueueFull`) if the bytes already
//! waiting there exceed the byte limit. Then it travels `delay ± jitter` (uniform). Without
//! `reorder` a frame never leaves before the one ahead of it (its departure is raised to the
//! previous one's), so jitter shows as spread, not reordering: as a real path of one queue,
//! which also means a jitter larger than the gap between frames raises their mean delay. Loss
//! is drawn independently per frame before anything else.

use crate::spec::Impairment;

/// Nanoseconds on the caller's monotonic clock.
pub type Nanos = u64;

/// A small, seedable, fast PRNG (xoshiro256**, seeded with splitmix64): the draws of loss and
/// jitter must be reproducible in tests and cheap per frame.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Why a frame was not forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// The random loss.
    Loss,
    /// The bottleneck's queue (byte limit) or the delay line (frame or byte limit) is full.
    QueueFull,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Depart(Nanos),
    Drop(Drop),
}

/// The schedule of one direction.
#[derive(Debug)]
pub struct Schedule {
    imp: Impairment,
    rng: Rng,
    /// When the bottleneck has finished serializing the frames admitted so far.
    link_free: Nanos,
    /// The departure of the last frame admitted (FIFO order unless `reorder`).
    last_depart: Nanos,
}

impl Schedule {
    pub fn new(imp: Impairment, seed: u64) -> Self {
        Schedule {
            imp,
            rng: Rng::new(seed),
            link_free: 0,
            last_depart: 0,
        }
    }

    pub fn impairment(&self) -> &Impairment {
        &self.imp
    }

    /// Nanoseconds the bottleneck needs for `len` bytes (0 without a rate).
    fn serialization(&self, len: usize) -> Nanos {
        match self.imp.rate_bps {
            Some(bps) => ((len as u128 * 8 * 1_000_000_000) / bps as u128) as Nanos,
            None => 0,
        }
    }

    /// Decides a frame of `len` bytes arriving at `now`. A frame given a departure is counted
    /// on the bottleneck: the caller must then queue it (or call nothing else for it: a frame
    /// refused by the delay line after this still occupied the bottleneck, as a real link's
    /// frame that is lost after serialization).
    pub fn admit(&mut self, now: Nanos, len: usize) -> Verdict {
        if self.imp.loss > 0.0 && self.rng.unit() < self.imp.loss {
            return Verdict::Drop(Drop::Loss);
        }
        let start = self.link_free.max(now);
        if self.imp.rate_bps.is_some() {
            // bytes waiting ahead of this frame at the bottleneck
            let backlog_ns = start - now;
            let backlog_bytes =
                (backlog_ns as u128 * self.imp.rate_bps.unwrap_or(0) as u128) / 8 / 1_000_000_000;
            if backlog_bytes + len as u128 > self.imp.limit_bytes as u128 {
                return Verdict::Drop(Drop::QueueFull);
            }
        }
        let done = start + self.serialization(len);
        self.link_free = done;
        let mut delay = self.imp.delay.as_nanos() as i128;
        let jitter = self.imp.jitter.as_nanos() as i128;
        if jitter > 0 {
            // uniform in [-jitter, +jitter]
            delay += ((self.rng.unit() * 2.0 - 1.0) * jitter as f64) as i128;
        }
        let mut depart = done.saturating_add(delay.max(0) as u64);
        if !self.imp.reorder {
            depart = depart.max(self.last_depart);
        }
        self.last_depart = self.last_depart.max(depart);
        Verdict::Depart(depart)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse;

    fn sched(spec: &str) -> Schedule {
        Schedule::new(parse(spec, &Impairment::default()).unwrap(), 7)
    }

    const MS: Nanos = 1_000_000;

    #[test]
    fn fixed_delay() {
        let mut s = sched("delay=10ms");
        assert_eq!(s.admit(0, 100), Verdict::Depart(10 * MS));
        assert_eq!(s.admit(5 * MS, 1500), Verdict::Depart(15 * MS));
    }

    #[test]
    fn jitter_stays_in_its_band_and_never_reorders() {
        let mut s = sched("delay=10ms,jitter=2ms");
        let mut last = 0;
        let mut min = u64::MAX;
        let mut max = 0;
        for i in 0..10_000u64 {
            // frames 5 ms apart: the clamp never binds, so the raw spread shows
            let now = i * 5 * MS;
            let Verdict::Depart(d) = s.admit(now, 100) else {
                panic!("dropped without loss")
            };
            assert!(d >= last, "reordered");
            last = d;
            min = min.min(d - now);
            max = max.max(d - now);
        }
        assert!(min >= 8 * MS && max <= 12 * MS, "{min} {max}");
        assert!(
            min < 8 * MS + MS / 10 && max > 12 * MS - MS / 10,
            "{min} {max}"
        );
    }

    #[test]
    fn reorder_when_asked() {
        let mut s = sched("delay=10ms,jitter=5ms,reorder");
        let mut reordered = 0;
        let mut last = 0;
        for i in 0..1000u64 {
            let Verdict::Depart(d) = s.admit(i * 10_000, 100) else {
                panic!()
            };
            if d < last {
                reordered += 1;
            }
            last = d;
        }
        assert!(reordered > 100, "{reordered}");
    }

    #[test]
    fn back_to_back_frames_under_jitter_keep_order() {
        let mut s = sched("delay=10ms,jitter=5ms");
        let mut last = 0;
        for i in 0..1000u64 {
            let Verdict::Depart(d) = s.admit(i * 10_000, 100) else {
                panic!()
            };
            assert!(d >= last);
            last = d;
        }
    }

    #[test]
    fn loss_rate_close_to_asked() {
        let mut s = sched("loss=5%");
        let n = 100_000;
        let lost = (0..n)
            .filter(|&i| s.admit(i, 100) == Verdict::Drop(Drop::Loss))
            .count();
        let p = lost as f64 / n as f64;
        assert!((p - 0.05).abs() < 0.004, "{p}");
        let mut none = sched("loss=0");
        assert!((0..10_000).all(|i| matches!(none.admit(i, 100), Verdict::Depart(_))));
    }

    #[test]
    fn the_same_seed_gives_the_same_drops() {
        let run = || {
            let mut s = sched("loss=30%,jitter=1ms,delay=2ms");
            (0..500).map(|i| s.admit(i * MS, 64)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn rate_serializes_and_bounds_the_backlog() {
        // 8 Mbit/s: 1000 bytes take 1 ms; at most 3000 bytes may wait
        let mut s = sched("rate=8mbit,limit-bytes=3000");
        assert_eq!(s.admit(0, 1000), Verdict::Depart(MS));
        assert_eq!(s.admit(0, 1000), Verdict::Depart(2 * MS));
        assert_eq!(s.admit(0, 1000), Verdict::Depart(3 * MS));
        // 3000 bytes waiting ahead: a fourth does not fit
        assert_eq!(s.admit(0, 1000), Verdict::Drop(Drop::QueueFull));
        // once the bottleneck has drained a frame there is room again
        assert_eq!(s.admit(MS, 1000), Verdict::Depart(4 * MS));
        // an idle link starts at once
        assert_eq!(s.admit(100 * MS, 1000), Verdict::Depart(101 * MS));
    }

    #[test]
    fn rate_then_delay() {
        let mut s = sched("rate=8mbit,delay=10ms");
        assert_eq!(s.admit(0, 1000), Verdict::Depart(11 * MS));
        assert_eq!(s.admit(0, 1000), Verdict::Depart(12 * MS));
    }

    #[test]
    fn long_run_throughput_matches_rate() {
        let mut s = sched("rate=100mbit,limit-bytes=100000000");
        let mut last = 0;
        for _ in 0..10_000 {
            if let Verdict::Depart(d) = s.admit(0, 1250) {
                last = d;
            }
        }
        // 10,000 x 1250 B = 100 Mbit: one second
        assert_eq!(last, 1_000_000_000);
    }
}
