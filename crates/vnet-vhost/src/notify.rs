//! When to notify (signal the call eventfd of) a receive queue: per batch, or optimistically
//! (VNET/P+, dissertation section 4.3). Pure: the caller reads the ring's indices and the
//! guest's `used_event`, this decides.
//!
//! `batch`: at the end of each processed batch, notify if the guest asked for it (the virtio
//! rule: `used_event` lies among the entries published since the last notification, or, without
//! `EVENT_IDX`, always).
//!
//! `optimistic`: an *early* notification (EVI) when a receive burst begins, before any frame
//! is moved, if the guest is waiting (armed for the next entry), so its interrupt handling
//! overlaps our copying. If the guest is busy (masked), the early notification is suppressed
//! and the end-of-burst one stands in for it. At the end of the burst (EoC): notify if the
//! guest re-armed for entries already published (it ran ahead of us); if it has not moved
//! since the early notification, decide from the receive density RD (bytes per second since
//! it): `α ≤ RD ≤ β` notifies, colder or hotter does not. Skipped end-of-burst decisions are
//! re-checked by the backstop (`Notifier::backstop_due`): a guest that took the early
//! notification before any frame was there and went back to sleep is woken then, and that
//! is counted (the early notification "found nothing").

use std::num::Wrapping;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyPolicy {
    Batch,
    Optimistic,
}

/// What the caller should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Notify,
    Skip,
}

/// What the ring looks like now.
#[derive(Debug, Clone, Copy)]
pub struct RingView {
    /// The index the next used entry gets.
    pub next_used: Wrapping<u16>,
    /// The guest's `used_event` (with `EVENT_IDX`), or `None` without it.
    pub used_event: Option<Wrapping<u16>>,
    /// Without `EVENT_IDX`: whether the guest set `VRING_AVAIL_F_NO_INTERRUPT`.
    pub no_interrupt: bool,
}

/// The virtio "need event" test: `event` lies in `(old, new]`.
pub fn need_event(event: Wrapping<u16>, new: Wrapping<u16>, old: Wrapping<u16>) -> bool {
    (new - event - Wrapping(1)) < (new - old)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NotifyCounters {
    pub notifications: u64,
    pub early: u64,
    pub early_masked: u64,
    pub end_of_burst: u64,
    pub skipped_cold: u64,
    pub skipped_hot: u64,
    /// Backstop notifications: the guest had not moved since an early notification.
    pub early_found_nothing: u64,
    pub frames: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Early {
    at: Instant,
    used_at: Wrapping<u16>,
}

#[derive(Debug)]
pub struct Notifier {
    pub policy: NotifyPolicy,
    /// α and β, in bytes per second.
    pub alpha: f64,
    pub beta: f64,
    pub backstop: Duration,
    /// `next_used` when the guest was last notified (virtio's "old").
    signalled: Wrapping<u16>,
    in_burst: bool,
    burst_bytes: u64,
    early: Option<Early>,
    /// A skipped end-of-burst decision to re-check.
    pending_since: Option<Instant>,
    pub counters: NotifyCounters,
}

impl Notifier {
    pub fn new(policy: NotifyPolicy, alpha: f64, beta: f64) -> Notifier {
        Notifier {
            policy,
            alpha,
            beta,
            backstop: Duration::from_millis(1),
            signalled: Wrapping(0),
            in_burst: false,
            burst_bytes: 0,
            early: None,
            pending_since: None,
            counters: NotifyCounters::default(),
        }
    }

    /// The ring was (re)started at `next_used`.
    pub fn reset(&mut self, next_used: Wrapping<u16>) {
        self.signalled = next_used;
        self.in_burst = false;
        self.early = None;
        self.pending_since = None;
        self.burst_bytes = 0;
    }

    fn guest_waiting(v: &RingView) -> bool {
        match v.used_event {
            Some(e) => e == v.next_used,
            None => !v.no_interrupt,
        }
    }

    fn guest_asked(&self, v: &RingView) -> bool {
        match v.used_event {
            Some(e) => need_event(e, v.next_used, self.signalled),
            None => !v.no_interrupt && v.next_used != self.signalled,
        }
    }

    fn notified(&mut self, v: &RingView) -> Action {
        self.signalled = v.next_used;
        self.counters.notifications += 1;
        self.pending_since = None;
        Action::Notify
    }

    /// A frame is about to be written into the ring. Call before moving its bytes.
    pub fn before_frame(&mut self, v: &RingView, now: Instant) -> Action {
        if self.in_burst {
            return Action::Skip;
        }
        self.in_burst = true;
        self.burst_bytes = 0;
        if self.policy != NotifyPolicy::Optimistic {
            return Action::Skip;
        }
        if Self::guest_waiting(v) {
            self.counters.early += 1;
            self.early = Some(Early {
                at: now,
                used_at: v.next_used,
            });
            // The early notification covers no entry yet: `signalled` stays, so an end-of-burst
            // check still sees entries the guest may not have been told about.
            self.counters.notifications += 1;
            self.pending_since = None;
            Action::Notify
        } else {
            self.counters.early_masked += 1;
            self.early = None;
            Action::Skip
        }
    }

    /// A frame of `bytes` was published.
    pub fn after_frame(&mut self, bytes: usize) {
        self.burst_bytes += bytes as u64;
        self.counters.frames += 1;
        self.counters.bytes += bytes as u64;
    }

    /// The burst (a processed batch) ended.
    pub fn end_of_burst(&mut self, v: &RingView, now: Instant) -> Action {
        if !self.in_burst {
            return Action::Skip;
        }
        self.in_burst = false;
        if v.next_used == self.signalled {
            return Action::Skip;
        }
        match (self.policy, self.early) {
            (NotifyPolicy::Batch, _) | (NotifyPolicy::Optimistic, None) => {
                if self.guest_asked(v) {
                    self.counters.end_of_burst += 1;
                    self.notified(v)
                } else {
                    Action::Skip
                }
            }
            (NotifyPolicy::Optimistic, Some(e)) => {
                let moved = v.used_event.is_some_and(|ev| ev != e.used_at);
                if moved && self.guest_asked(v) {
                    // It handled the early notification and re-armed for entries already there.
                    self.counters.end_of_burst += 1;
                    return self.notified(v);
                }
                if v.used_event.is_none() && self.guest_asked(v) {
                    // Without EVENT_IDX the guest says only "interrupts on"; it is waiting.
                    self.counters.end_of_burst += 1;
                    return self.notified(v);
                }
                self.by_density(v, now, e)
            }
        }
    }

    fn by_density(&mut self, v: &RingView, now: Instant, e: Early) -> Action {
        let secs = now.duration_since(e.at).as_secs_f64().max(1e-6);
        let rd = self.burst_bytes as f64 / secs;
        if rd < self.alpha {
            self.counters.skipped_cold += 1;
        } else if rd > self.beta {
            self.counters.skipped_hot += 1;
        } else {
            self.counters.end_of_burst += 1;
            return self.notified(v);
        }
        self.pending_since = Some(now);
        Action::Skip
    }

    /// Whether a skipped decision is due for a re-check, and when.
    pub fn backstop_deadline(&self) -> Option<Instant> {
        self.pending_since.map(|t| t + self.backstop)
    }

    /// The backstop: entries are published that the guest was never told about and it is not
    /// polling them (it still sits at the early notification's index, or asks for them).
    pub fn backstop_due(&mut self, v: &RingView, now: Instant) -> Action {
        let Some(since) = self.pending_since else {
            return Action::Skip;
        };
        if now < since + self.backstop {
            return Action::Skip;
        }
        self.pending_since = None;
        if self.in_burst || v.next_used == self.signalled {
            return Action::Skip;
        }
        let stuck = match (self.early, v.used_event) {
            (Some(e), Some(ev)) => ev == e.used_at,
            _ => false,
        };
        if stuck {
            self.counters.early_found_nothing += 1;
            return self.notified(v);
        }
        if self.guest_asked(v) {
            return self.notified(v);
        }
        Action::Skip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(next_used: u16, ev: u16) -> RingView {
        RingView {
            next_used: Wrapping(next_used),
            used_event: Some(Wrapping(ev)),
            no_interrupt: false,
        }
    }

    /// A notifier with `policy`, `alpha` and `beta`, whose ring's next used entry is
    /// `next_used`, and the time it starts at.
    fn notifier(
        policy: NotifyPolicy,
        alpha: f64,
        beta: f64,
        next_used: u16,
    ) -> (Notifier, Instant) {
        let mut n = Notifier::new(policy, alpha, beta);
        n.reset(Wrapping(next_used));
        (n, Instant::now())
    }

    #[test]
    fn need_event_matches_virtio() {
        assert!(need_event(Wrapping(5), Wrapping(6), Wrapping(5)));
        assert!(!need_event(Wrapping(6), Wrapping(6), Wrapping(5)));
        assert!(need_event(Wrapping(65535), Wrapping(2), Wrapping(65530)));
    }

    #[test]
    fn batch_notifies_once_when_asked() {
        let (mut n, t) = notifier(NotifyPolicy::Batch, 1e6, 1e9, 0);
        assert_eq!(n.before_frame(&view(0, 0), t), Action::Skip);
        n.after_frame(100);
        n.after_frame(100);
        assert_eq!(n.end_of_burst(&view(2, 0), t), Action::Notify);
        // The guest is polling (did not re-arm past 0): no notification for the next burst.
        n.before_frame(&view(2, 0), t);
        assert_eq!(n.end_of_burst(&view(3, 0), t), Action::Skip);
        assert_eq!(n.counters.notifications, 1);
    }

    #[test]
    fn optimistic_notifies_early_when_the_guest_waits() {
        let (mut n, t) = notifier(NotifyPolicy::Optimistic, 1e6, 1e9, 0);
        assert_eq!(n.before_frame(&view(0, 0), t), Action::Notify);
        n.after_frame(1500);
        // Guest still at 0 (handling it): density decides; 1500 B in 1 ms = 1.5 MB/s, just right.
        let r = n.end_of_burst(&view(1, 0), t + Duration::from_millis(1));
        assert_eq!(r, Action::Notify);
        assert_eq!(n.counters.early, 1);
    }

    #[test]
    fn masked_early_is_followed_by_end_of_burst_when_asked() {
        let (mut n, t) = notifier(NotifyPolicy::Optimistic, 1e6, 1e9, 10);
        // Guest busy: its used_event lags behind.
        assert_eq!(n.before_frame(&view(10, 7), t), Action::Skip);
        assert_eq!(n.counters.early_masked, 1);
        n.after_frame(64);
        // It re-armed at 10 meanwhile: entry 10 is published, so it must be told.
        assert_eq!(n.end_of_burst(&view(11, 10), t), Action::Notify);
    }

    #[test]
    fn cold_skip_is_caught_by_the_backstop() {
        let (mut n, t) = notifier(NotifyPolicy::Optimistic, 1e9, 1e12, 0);
        assert_eq!(n.before_frame(&view(0, 0), t), Action::Notify);
        n.after_frame(64);
        assert_eq!(n.end_of_burst(&view(1, 0), t), Action::Skip);
        assert_eq!(n.counters.skipped_cold, 1);
        assert!(n.backstop_deadline().is_some());
        assert_eq!(n.backstop_due(&view(1, 0), t), Action::Skip, "not yet due");
        let later = t + Duration::from_millis(2);
        assert_eq!(n.backstop_due(&view(1, 0), later), Action::Notify);
        assert_eq!(n.counters.early_found_nothing, 1);
    }

    #[test]
    fn hot_skip_with_a_guest_that_consumed_needs_nothing() {
        let (mut n, t) = notifier(NotifyPolicy::Optimistic, 1.0, 10.0, 0);
        n.before_frame(&view(0, 0), t);
        n.after_frame(1_000_000);
        assert_eq!(
            n.end_of_burst(&view(1, 0), t + Duration::from_millis(1)),
            Action::Skip
        );
        assert_eq!(n.counters.skipped_hot, 1);
        // The guest consumed entry 0 and re-armed at 1 (nothing new yet): nothing to do.
        let later = t + Duration::from_millis(5);
        assert_eq!(n.backstop_due(&view(1, 1), later), Action::Skip);
    }
}
