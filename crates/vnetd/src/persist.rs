//! Keeping the state directory in step with the running daemon: the local configuration is
//! written before a change is acknowledged (a CNI ADD that returned must survive a crash the
//! next instant), the derived configuration and the host record in the background, at most
//! every half second (they are recoverable: etcd has the former, the devices the latter).
//! Every snapshot carries a generation taken under the daemon's lock, so a slower writer never
//! puts an older snapshot over a newer one.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing::warn;

use crate::state::{Resources, StateDir, DERIVED, LOCAL};

const BACKGROUND_EVERY: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Pending {
    derived: Option<(u64, String)>,
    /// The derived configuration changed: render it from the source when writing (at most
    /// every half second, not on every change: rendering costs the overlay's size).
    derived_dirty: bool,
    resources: Option<Resources>,
}

/// Renders the derived configuration with its generation (the daemon's, under its lock).
pub type DerivedSource = Box<dyn Fn() -> Option<(u64, String)> + Send + Sync>;

struct Shared {
    dir: StateDir,
    /// The generation of the local configuration last written.
    local_written: Mutex<u64>,
    derived_written: Mutex<u64>,
    pending: Mutex<Pending>,
    wake: Condvar,
    stop: AtomicBool,
    /// What host.json holds now.
    resources: Mutex<Resources>,
    derived_source: Mutex<Option<DerivedSource>>,
}

/// The daemon's writer of its state directory.
pub struct Saver {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Saver {
    /// Starts the writer; the host record is written at once (a teardown after a crash must
    /// find where this daemon pins its fast path even if nothing changed since).
    pub fn new(dir: StateDir, resources: Resources) -> std::io::Result<Saver> {
        if let Err(e) = dir.write_resources(&resources) {
            warn!("state: writing the host record: {e:#}");
        }
        let shared = Arc::new(Shared {
            dir,
            local_written: Mutex::new(0),
            derived_written: Mutex::new(0),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            resources: Mutex::new(resources),
            derived_source: Mutex::new(None),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || background(&s))?;
        Ok(Saver {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn dir(&self) -> &StateDir {
        &self.shared.dir
    }

    /// Writes the local configuration now (the caller acknowledges the change after this).
    pub fn local(&self, generation: u64, script: &str) {
        let mut last = self
            .shared
            .local_written
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if generation <= *last {
            return;
        }
        match self.shared.dir.write(LOCAL, script) {
            Ok(()) => *last = generation,
            Err(e) => warn!("state: writing the configuration: {e:#}"),
        }
    }

    /// Where the derived configuration is rendered from when [`Saver::derived_changed`] says
    /// it changed.
    pub fn set_derived_source(&self, f: DerivedSource) {
        *self
            .shared
            .derived_source
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// The derived configuration changed: rendered from the source and written within half
    /// a second.
    pub fn derived_changed(&self) {
        let mut p = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        p.derived_dirty = true;
        self.shared.wake.notify_one();
    }

    /// The derived configuration changed: written within half a second.
    pub fn derived(&self, generation: u64, script: String) {
        let mut p = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if p.derived.as_ref().is_none_or(|(g, _)| *g < generation) {
            p.derived = Some((generation, script));
            self.shared.wake.notify_one();
        }
    }

    /// Changes the host record (devices made, the lease) with `f`; written in the background
    /// when it changed.
    pub fn update_resources(&self, f: impl FnOnce(&mut Resources)) {
        let mut r = self
            .shared
            .resources
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = r.clone();
        f(&mut r);
        if *r != before {
            let mut p = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            p.resources = Some(r.clone());
            self.shared.wake.notify_one();
        }
    }

    pub fn resources(&self) -> Resources {
        self.shared
            .resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes what is pending and stops the writer.
    pub fn flush(&self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        write_pending(&self.shared);
    }
}

fn write_pending(s: &Shared) {
    let mut p = std::mem::take(&mut *s.pending.lock().unwrap_or_else(|p| p.into_inner()));
    if p.derived_dirty {
        let source = s.derived_source.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rendered) = source.as_ref().and_then(|f| f()) {
            if p.derived.as_ref().is_none_or(|(g, _)| *g < rendered.0) {
                p.derived = Some(rendered);
            }
        }
    }
    if let Some((generation, text)) = p.derived {
        let mut last = s.derived_written.lock().unwrap_or_else(|p| p.into_inner());
        if generation > *last {
            match s.dir.write(DERIVED, &text) {
                Ok(()) => *last = generation,
                Err(e) => warn!("state: writing the derived configuration: {e:#}"),
            }
        }
    }
    if let Some(r) = p.resources {
        if let Err(e) = s.dir.write_resources(&r) {
            warn!("state: writing the host record: {e:#}");
        }
    }
}

fn background(s: &Shared) {
    while !s.stop.load(Relaxed) {
        {
            let p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            let _unused = s
                .wake
                .wait_while(p, |p| {
                    p.derived.is_none()
                        && !p.derived_dirty
                        && p.resources.is_none()
                        && !s.stop.load(Relaxed)
                })
                .unwrap_or_else(|p| p.into_inner());
        }
        if s.stop.load(Relaxed) {
            break;
        }
        write_pending(s);
        // At most one write per interval; a stop cuts the wait short.
        let p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
        let _unused = s
            .wake
            .wait_timeout_while(p, BACKGROUND_EVERY, |_| !s.stop.load(Relaxed))
            .unwrap_or_else(|p| p.into_inner());
    }
}
