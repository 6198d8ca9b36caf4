//! How much handshake work a link does for what arrives from its peer's address: token
//! buckets on the monotonic clock (what may be read, at two X25519 operations each), the "under
//! load" signal v3 answers with cookies, and the fingerprints of messages already read, so that
//! a replayed one is refused before it costs anything. Pure: time comes in as an argument.

use std::collections::{HashSet, VecDeque};

/// A token bucket: `burst` tokens, one more every `refill_ms`. It is under load while it runs
/// low (fewer than half its tokens left) and for [`LOAD_HOLD_MS`] after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    burst: u64,
    refill_ms: u64,
    tokens: u64,
    refilled_ms: u64,
    load_until_ms: u64,
}

/// How long a budget stays under load after it last ran low (WireGuard keeps a device under
/// load for a second after its queue was last long).
pub const LOAD_HOLD_MS: u64 = 1_000;

impl Budget {
    pub const fn new(burst: u64, refill_ms: u64) -> Budget {
        Budget {
            burst,
            refill_ms,
            tokens: burst,
            refilled_ms: 0,
            load_until_ms: 0,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let refills = now_ms.saturating_sub(self.refilled_ms) / self.refill_ms.max(1);
        if refills > 0 {
            self.tokens = self.tokens.saturating_add(refills).min(self.burst);
            self.refilled_ms = self
                .refilled_ms
                .saturating_add(refills.saturating_mul(self.refill_ms));
        }
        if self.tokens * 2 < self.burst {
            self.load_until_ms = now_ms.saturating_add(LOAD_HOLD_MS);
        }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        self.refill(now_ms);
        true
    }

    /// Whether the budget runs low now or did within the last [`LOAD_HOLD_MS`].
    pub fn under_load(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        now_ms < self.load_until_ms
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}

/// Fingerprints (the first 16 bytes of the ephemeral key) of the last [`SEEN_CAPACITY`]
/// handshake messages a link read. A genuine message always has a fresh ephemeral key, so one
/// seen before is a replay, refused before any X25519 work (and before a budget is spent).
#[derive(Debug, Default)]
pub struct Seen {
    set: HashSet<[u8; 16]>,
    order: VecDeque<[u8; 16]>,
}

/// Budgets let a link read about 16 handshake messages a second at most, so this covers the
/// last 16 s of them even under a flood. An older genuine message replayed is read once more
/// (and refused for its old time) only while its budget is not under load: under load it
/// needs a `mac2`, which only the peer's messages of the last 4 minutes carry (a handful,
/// all of them here). About 10 KB per link.
pub const SEEN_CAPACITY: usize = 256;

impl Seen {
    /// The fingerprint of a Noise handshake message (its ephemeral key comes first).
    pub fn fingerprint(noise: &[u8]) -> Option<[u8; 16]> {
        noise.get(..16)?.try_into().ok()
    }

    pub fn contains(&self, f: &[u8; 16]) -> bool {
        self.set.contains(f)
    }

    /// Notes a message read; the oldest is forgotten beyond [`SEEN_CAPACITY`].
    pub fn insert(&mut self, f: [u8; 16]) {
        if !self.set.insert(f) {
            return;
        }
        self.order.push_back(f);
        if self.order.len() > SEEN_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refills_and_runs_low() {
        let mut b = Budget::new(8, 250);
        assert!(!b.under_load(0));
        for _ in 0..4 {
            assert!(b.take(0));
        }
        assert!(!b.under_load(0), "4 of 8 left: not low yet");
        assert!(b.take(0));
        assert!(b.under_load(0), "3 of 8 left: low");
        for _ in 0..3 {
            assert!(b.take(0));
        }
        assert!(!b.take(100), "empty until the first refill");
        assert!(b.take(250));
        assert!(!b.take(251));
        // It stays under load for a second after it last ran low (1000 ms: 3 tokens left),
        // then no longer is.
        assert!(b.under_load(1_000));
        assert_eq!(b.tokens(), 3);
        assert!(b.under_load(1_999));
        assert_eq!(b.tokens(), 6);
        assert!(!b.under_load(1_000 + LOAD_HOLD_MS));
        // The refills never exceed the burst.
        let mut b = Budget::new(8, 250);
        assert!(b.take(1_000_000));
        assert_eq!(b.tokens(), 7);
    }

    #[test]
    fn seen_forgets_the_oldest() {
        let mut s = Seen::default();
        let f = |i: usize| {
            let mut a = [0u8; 16];
            a[..8].copy_from_slice(&(i as u64).to_le_bytes());
            a
        };
        for i in 0..SEEN_CAPACITY + 10 {
            s.insert(f(i));
            s.insert(f(i)); // twice: kept once
        }
        assert_eq!(s.len(), SEEN_CAPACITY);
        assert!(!s.contains(&f(9)) && s.contains(&f(10)));
        assert!(s.contains(&f(SEEN_CAPACITY + 9)));
        assert_eq!(Seen::fingerprint(&[7; 15]), None);
        assert_eq!(Seen::fingerprint(&[7; 40]), Some([7; 16]));
    }
}
