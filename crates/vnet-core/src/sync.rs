//! Locks that outlive a panic: `lock_or_recover`, `read_or_recover`, `write_or_recover` and
//! the condition-variable waits, each taking a poisoned lock as if it were not.
//!
//! Why: std poisons a `Mutex` or `RwLock` when a thread panics while holding it, and every
//! later `lock().unwrap()` then panics in turn. One bug in one thread (a control connection's
//! handler, a forwarding thread, the reach thread) would so take the daemon's every other
//! thread down with it, and with them every guest's network. With these, the thread that
//! panicked loses its own work and the rest go on.
//!
//! Why what a recovered lock guards is still sound: poisoning only says that a critical section
//! was cut short by a panic. Unwinding never leaves memory unsafe, and std's collections stay
//! valid when a call on them unwinds; what a cut can break is an invariant *between* fields.
//! The locks recovered this way guard data where a cut leaves nothing wrong for good:
//! - values replaced or taken whole (a thread's handle, a channel's sender, an `Option` set or
//!   taken, a timestamp, a status record, the process's owner): a cut leaves the old value;
//! - queues and lists changed by single std calls (`push`, `drain`, `remove`, `clear`): a cut
//!   leaves a valid queue, at worst short of the entry whose push was cut;
//! - counters, caches and scratch space (the traffic matrix, token buckets, route caches,
//!   name indexes, a scrape's rows, a forwarding thread's buffers and coalescers): a cut loses
//!   counts or the batch in hand, or leaves a cache entry stale until its source next changes;
//! - state that the protocol already refreshes: a crypto peer's handshake (one cut short is
//!   what a lost message leaves, and the peer's timers start a new one), the relay's bindings
//!   and rate buckets (the members' pings bind them again);
//! - the journal's files, where a write cut short is what a crash leaves, and reading a
//!   segment already stops at a record torn short.
//!
//! A lock whose data a cut could leave wrong for good (not only until the next change, tick or
//! handshake) must not use these: let its poison propagate.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::{PoisonError, WaitTimeoutResult};
use std::time::Duration;

/// `Mutex::lock` that takes a poisoned lock as it is (see the module's header for when).
pub trait LockRecover<T: ?Sized> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockRecover<T> for Mutex<T> {
    #[inline]
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `RwLock::read` and `RwLock::write` that take a poisoned lock as it is.
pub trait RwLockRecover<T: ?Sized> {
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T>;
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockRecover<T> for RwLock<T> {
    #[inline]
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `Condvar`'s waits that take the lock back even when it was poisoned meanwhile.
pub trait CondvarRecover {
    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);

    fn wait_while_or_recover<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        cond: F,
    ) -> MutexGuard<'a, T>
    where
        F: FnMut(&mut T) -> bool;

    fn wait_timeout_while_or_recover<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
        cond: F,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult)
    where
        F: FnMut(&mut T) -> bool;
}

impl CondvarRecover for Condvar {
    #[inline]
    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, dur)
            .unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn wait_while_or_recover<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        cond: F,
    ) -> MutexGuard<'a, T>
    where
        F: FnMut(&mut T) -> bool,
    {
        self.wait_while(guard, cond)
            .unwrap_or_else(PoisonError::into_inner)
    }

    #[inline]
    fn wait_timeout_while_or_recover<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
        cond: F,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult)
    where
        F: FnMut(&mut T) -> bool,
    {
        self.wait_timeout_while(guard, dur, cond)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Panics in another thread while holding `hold`'s guard, poisoning the lock.
    fn poison_with(hold: impl FnOnce() + Send + 'static) {
        let r = std::thread::spawn(hold).join();
        assert!(r.is_err(), "the thread was meant to panic");
    }

    #[test]
    fn mutex_poisoned_mid_change_keeps_its_data() {
        let m = Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        poison_with(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("a bug while the lock is held");
        });
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_or_recover(), vec![1, 2]);
        m.lock_or_recover().push(3);
        assert_eq!(*m.lock_or_recover(), vec![1, 2, 3]);
    }

    #[test]
    fn rwlock_poisoned_by_a_writer_reads_and_writes() {
        let l = Arc::new(RwLock::new(String::from("a")));
        let l2 = l.clone();
        poison_with(move || {
            let mut g = l2.write().unwrap();
            g.push('b');
            panic!("a bug while the lock is held");
        });
        assert!(l.is_poisoned());
        assert_eq!(*l.read_or_recover(), "ab");
        l.write_or_recover().push('c');
        assert_eq!(*l.read_or_recover(), "abc");
    }

    #[test]
    fn condvar_waits_on_a_poisoned_lock() {
        let m = Arc::new(Mutex::new(0u32));
        let m2 = m.clone();
        poison_with(move || {
            let _g = m2.lock().unwrap();
            panic!("a bug while the lock is held");
        });
        let cv = Condvar::new();
        let (g, t) = cv.wait_timeout_or_recover(m.lock_or_recover(), Duration::from_millis(1));
        assert!(t.timed_out());
        let (g, t) = cv.wait_timeout_while_or_recover(g, Duration::from_millis(1), |n| *n == 0);
        assert!(t.timed_out());
        // The condition is already false: no wait.
        let g = cv.wait_while_or_recover(g, |n| *n != 0);
        assert_eq!(*g, 0);
    }
}
