//! The sliding replay window of a session's receive side (RFC 6479 style, as WireGuard): a
//! counter is accepted once, and only if it is within [`REPLAY_WINDOW`] of the greatest counter
//! accepted so far. Datagrams may be reordered by the underlay (and by several dispatcher
//! threads) within the window.

/// Counters older than this many below the greatest accepted one are refused.
pub const REPLAY_WINDOW: u64 = 8192;
const WORDS: usize = (REPLAY_WINDOW / 64) as usize;

#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// The greatest counter accepted, if any.
    greatest: Option<u64>,
    /// Bit `n % REPLAY_WINDOW` is set when counter `n` (within the window) was accepted.
    bits: Box<[u64; WORDS]>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            greatest: None,
            bits: Box::new([0; WORDS]),
        }
    }
}

impl ReplayWindow {
    fn bit(n: u64) -> (usize, u64) {
        let b = n % REPLAY_WINDOW;
        ((b / 64) as usize, 1u64 << (b % 64))
    }

    /// Whether `n` would be accepted now (nothing changes).
    pub fn check(&self, n: u64) -> bool {
        match self.greatest {
            None => true,
            Some(g) if n > g => true,
            Some(g) if g - n >= REPLAY_WINDOW => false,
            Some(_) => {
                let (w, m) = Self::bit(n);
                self.bits[w] & m == 0
            }
        }
    }

    /// Accepts `n` if it was never accepted and is within the window; call only after the
    /// datagram authenticated, so a forger cannot move the window.
    pub fn accept(&mut self, n: u64) -> bool {
        if !self.check(n) {
            return false;
        }
        match self.greatest {
            Some(g) if n <= g => {}
            Some(g) => {
                // Forget the counters the window slides past.
                if n - g >= REPLAY_WINDOW {
                    self.bits.fill(0);
                } else {
                    let mut k = g + 1;
                    while k <= n {
                        let (w, _) = Self::bit(k);
                        if k % 64 == 0 && n - k >= 63 {
                            self.bits[w] = 0;
                            k += 64;
                        } else {
                            let (w, m) = Self::bit(k);
                            self.bits[w] &= !m;
                            k += 1;
                        }
                    }
                }
                self.greatest = Some(n);
            }
            None => self.greatest = Some(n),
        }
        let (w, m) = Self::bit(n);
        self.bits[w] |= m;
        true
    }

    pub fn greatest(&self) -> Option<u64> {
        self.greatest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn basics() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(5));
        assert!(w.accept(3));
        assert!(!w.accept(3));
        assert!(w.accept(REPLAY_WINDOW + 5));
        assert!(!w.accept(5), "too old");
        assert!(w.accept(6), "just inside the window");
        assert!(!w.accept(6));
        assert!(w.accept(u64::MAX));
        assert!(!w.accept(u64::MAX));
        assert!(!w.accept(0));
    }

    /// The model: accepted iff never accepted before and not older than the window.
    fn model(seen: &mut HashSet<u64>, greatest: &mut Option<u64>, n: u64) -> bool {
        if seen.contains(&n) {
            return false;
        }
        if let Some(g) = *greatest {
            if n < g && g - n >= REPLAY_WINDOW {
                return false;
            }
        }
        seen.insert(n);
        *greatest = Some(greatest.map_or(n, |g| g.max(n)));
        true
    }

    proptest! {
        #[test]
        fn matches_model(steps in proptest::collection::vec((0u8..4, 0u64..3 * REPLAY_WINDOW), 1..400)) {
            let mut w = ReplayWindow::default();
            let (mut seen, mut greatest) = (HashSet::new(), None);
            let mut last = 0u64;
            for (kind, v) in steps {
                // Mostly near the last counter (reordering), sometimes far (jumps).
                let n = match kind {
                    0 => last.saturating_add(v % 70),
                    1 => last.saturating_sub(v % (REPLAY_WINDOW + 70)),
                    2 => v,
                    _ => last,
                };
                last = n;
                prop_assert_eq!(w.accept(n), model(&mut seen, &mut greatest, n), "counter {}", n);
            }
        }
    }
}
