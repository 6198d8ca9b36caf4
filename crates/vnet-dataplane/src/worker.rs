//! A data-path thread with a stop eventfd, joined on drop: how the data path starts its
//! side threads (TCP links, the crypto edge, the underlay watch), so none outlives what owns
//! it.

use std::sync::Arc;
use std::thread::JoinHandle;

use std::io;

use crate::sys::EventFd;

/// A thread of the data path that runs until told to stop. Dropping it stops and joins it.
pub struct Worker {
    stop: Arc<EventFd>,
    stopper: Option<Box<dyn FnOnce() + Send>>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Runs `body` on a new thread; `body` must return soon after its stop eventfd is signalled.
    pub fn spawn(
        name: String,
        body: impl FnOnce(Arc<EventFd>) + Send + 'static,
    ) -> io::Result<Worker> {
        Self::spawn_with_stopper(name, body, || {})
    }

    /// Like `spawn`, with an extra action to run when stopping (to wake a thread that blocks
    /// somewhere other than `poll`).
    pub fn spawn_with_stopper(
        name: String,
        body: impl FnOnce(Arc<EventFd>) + Send + 'static,
        stopper: impl FnOnce() + Send + 'static,
    ) -> io::Result<Worker> {
        let stop = Arc::new(crate::sys::eventfd()?);
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(s))?;
        Ok(Worker {
            stop,
            stopper: Some(Box::new(stopper)),
            handle: Some(handle),
        })
    }

    pub fn stop(&mut self) {
        crate::sys::signal(&self.stop);
        if let Some(f) = self.stopper.take() {
            f();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}
