//! What a port lets in, checked on the shared ingress path (`forward::process`) so
//! TAP and vhost-user guests, UDP and TCP links all get it: an interface's guest may send only
//! with its own source MAC (unless `any-source`), and any port may have a token-bucket rate
//! limit on what it receives. Both can change at run time without a new snapshot.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use vnet_control::status::{PolicyStatus, RateStatus};
use vnet_control::{PortPolicy, RateLimit};
use vnet_core::{DropReason, LockRecover, TokenBucket};
use vnet_wire::MacAddr;

#[derive(Debug)]
pub struct PortGuard {
    /// The guest's MAC (interfaces only): frames from the guest must carry it as source.
    own_mac: Option<MacAddr>,
    any_source: AtomicBool,
    /// Whether `bucket` holds a limit: a port without one never takes the lock.
    limited: AtomicBool,
    /// Off when the kernel fast path charges this port's frames before they reach vnetd (a
    /// punted frame must not pay twice); the policy is still shown.
    enforce_rate: AtomicBool,
    bucket: Mutex<Option<(RateLimit, TokenBucket)>>,
    epoch: Instant,
}

impl PortGuard {
    /// The guard of an interface whose guest owns `mac`.
    pub fn interface(mac: MacAddr, policy: &PortPolicy) -> PortGuard {
        let g = PortGuard::new(Some(mac));
        g.set(policy);
        g
    }

    /// The guard of a link (no source check; `any_source` is ignored).
    pub fn link(policy: &PortPolicy) -> PortGuard {
        let g = PortGuard::new(None);
        g.set(policy);
        g
    }

    fn new(own_mac: Option<MacAddr>) -> PortGuard {
        PortGuard {
            own_mac,
            any_source: AtomicBool::new(false),
            limited: AtomicBool::new(false),
            enforce_rate: AtomicBool::new(true),
            bucket: Mutex::new(None),
            epoch: Instant::now(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Applies a new policy. A changed rate starts with a full bucket; an unchanged one keeps
    /// its state.
    pub fn set(&self, p: &PortPolicy) {
        self.any_source.store(p.any_source, Relaxed);
        let mut b = self.bucket.lock_or_recover();
        let same = matches!((&*b, p.rate), (Some((old, _)), Some(new)) if *old == new);
        if !same {
            *b = p.rate.map(|r| {
                (
                    r,
                    TokenBucket::new(r.rate_bps(), r.burst_bytes(), self.now_ns()),
                )
            });
        }
        self.limited.store(b.is_some(), Relaxed);
    }

    /// Whether a frame of `len` bytes with source `src` may enter through this port.
    #[inline]
    pub fn check(&self, src: MacAddr, len: usize) -> Result<(), DropReason> {
        if let Some(own) = self.own_mac {
            // One 6-byte compare per frame; the atomic is read only for a foreign source.
            if src != own && !self.any_source.load(Relaxed) {
                return Err(DropReason::SpoofedSrc);
            }
        }
        if self.limited.load(Relaxed) && self.enforce_rate.load(Relaxed) && !self.admit(len) {
            return Err(DropReason::RateLimited);
        }
        Ok(())
    }

    fn admit(&self, len: usize) -> bool {
        let now = self.now_ns();
        let mut b = self.bucket.lock_or_recover();
        match &mut *b {
            Some((_, bucket)) => bucket.admit(now, len),
            None => true,
        }
    }

    /// Leaves the rate to someone else who charges every frame before it gets here (the kernel
    /// fast path for the ports it serves).
    pub fn set_rate_enforced(&self, on: bool) {
        self.enforce_rate.store(on, Relaxed);
    }

    /// Whether a rate limit is set.
    pub fn is_limited(&self) -> bool {
        self.limited.load(Relaxed)
    }

    /// For `show stats`: the policy and the bucket's fill.
    pub fn status(&self) -> PolicyStatus {
        let now = self.now_ns();
        let mut b = self.bucket.lock_or_recover();
        PolicyStatus {
            rate: b.as_mut().map(|(r, bucket)| RateStatus {
                mbit: r.mbit,
                burst_kb: r.burst_kb,
                available_bytes: bucket.available(now),
            }),
            any_source: self
                .own_mac
                .is_some()
                .then(|| self.any_source.load(Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(last: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, last])
    }

    #[test]
    fn source_check_and_toggle() {
        let g = PortGuard::interface(mac(1), &PortPolicy::default());
        assert_eq!(g.check(mac(1), 60), Ok(()));
        assert_eq!(g.check(mac(2), 60), Err(DropReason::SpoofedSrc));
        g.set(&PortPolicy {
            any_source: true,
            rate: None,
        });
        assert_eq!(g.check(mac(2), 60), Ok(()));
        // links check no source
        let l = PortGuard::link(&PortPolicy::default());
        assert_eq!(l.check(mac(9), 60), Ok(()));
    }

    #[test]
    fn rate_limit_and_change() {
        // 1 Mbit/s with a 1 KB bucket: a quick burst gets about 1 KB through.
        let r = RateLimit {
            mbit: 1,
            burst_kb: 1,
        };
        let g = PortGuard::link(&PortPolicy {
            any_source: false,
            rate: Some(r),
        });
        assert!(g.is_limited());
        let passed = (0..100).filter(|_| g.check(mac(1), 100).is_ok()).count();
        assert!((10..=12).contains(&passed), "{passed}");
        assert_eq!(g.check(mac(1), 100), Err(DropReason::RateLimited));
        // the same rate again keeps the (empty) bucket; removing it lets all through
        g.set(&PortPolicy {
            any_source: false,
            rate: Some(r),
        });
        assert_eq!(g.check(mac(1), 100), Err(DropReason::RateLimited));
        g.set(&PortPolicy::default());
        assert!(!g.is_limited());
        assert_eq!(g.check(mac(1), 100_000), Ok(()));
        assert!(g.status().rate.is_none());
    }

    #[test]
    fn a_rate_charged_elsewhere_is_shown_not_enforced() {
        let r = RateLimit {
            mbit: 1,
            burst_kb: 1,
        };
        let g = PortGuard::interface(
            mac(1),
            &PortPolicy {
                any_source: false,
                rate: Some(r),
            },
        );
        g.set_rate_enforced(false);
        assert!((0..100).all(|_| g.check(mac(1), 1000).is_ok()));
        assert!(g.status().rate.is_some());
        // The source check still applies.
        assert_eq!(g.check(mac(2), 60), Err(DropReason::SpoofedSrc));
    }
}
