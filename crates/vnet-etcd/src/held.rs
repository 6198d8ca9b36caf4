//! What keeps a gRPC stream's request side open while its answers are wanted, and ends it
//! when they no longer are.
//!
//! Why: etcd's gRPC proxy tears down a watch or keep-alive stream whose client has half-closed
//! it, before answering, so the request side must stay open while the call lasts. But a
//! request side that pends forever keeps the HTTP/2 stream open after its answers are dropped:
//! the stream is done only when both sides are, and then it is reset. Until stop 28 the
//! request sides pended forever, so etcd and its proxies kept every watch the agents had
//! dropped (and sent them events) and every keep-alive stream, one per renewal.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// A handle on request sides made by [`Held::stream`]: they end at [`Held::release`].
#[derive(Clone, Default)]
pub(crate) struct Held(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    released: bool,
    wakers: Vec<Waker>,
}

impl Held {
    /// A stream of no items that ends once `release` is called.
    pub(crate) fn stream<T>(&self) -> HeldStream<T> {
        HeldStream(self.clone(), PhantomData)
    }

    /// A handle already released (its streams end at once).
    fn released() -> Held {
        let h = Held::default();
        h.release();
        h
    }

    /// Ends every stream of this handle.
    pub(crate) fn release(&self) {
        let wakers = {
            let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            s.released = true;
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// Owns a [`Held`] and ends its streams when dropped (a call that failed or was given up, a
/// watch dropped), unless [`ReleaseOnDrop::keep`] takes the handle out first.
pub(crate) struct ReleaseOnDrop(Option<Held>);

impl ReleaseOnDrop {
    pub(crate) fn new() -> ReleaseOnDrop {
        ReleaseOnDrop(Some(Held::default()))
    }

    /// A stream of no items that ends when this guard (or the handle kept from it) releases.
    pub(crate) fn stream<T>(&self) -> HeldStream<T> {
        self.0
            .as_ref()
            .map_or_else(Held::released, Held::clone)
            .stream()
    }

    /// The handle, which this guard no longer ends: its new owner does.
    pub(crate) fn keep(mut self) -> Held {
        self.0.take().unwrap_or_else(Held::released)
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.release();
        }
    }
}

pub(crate) struct HeldStream<T>(Held, PhantomData<fn() -> T>);

impl<T> tokio_stream::Stream for HeldStream<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = (self.0).0.lock().unwrap_or_else(PoisonError::into_inner);
        if s.released {
            return Poll::Ready(None);
        }
        // One waker per stream of the handle (the watch's endpoints are tried one at a time,
        // each with a stream of its own): keep only the current one of this task.
        s.wakers.retain(|w| !w.will_wake(cx.waker()));
        s.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[test]
    fn a_held_stream_ends_when_released_and_not_before() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let held = Held::default();
        let mut s = held.stream::<u8>();
        rt.block_on(async {
            let waited = tokio::time::timeout(std::time::Duration::from_millis(50), s.next()).await;
            assert!(waited.is_err(), "pending while held");
            let h = held.clone();
            let release = async move {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                h.release();
            };
            tokio::spawn(release);
            assert_eq!(s.next().await, None, "ended once released");
        });
    }
}
