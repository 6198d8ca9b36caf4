//! Keeping the state directory in step with the running daemon: a change of the local
//! configuration is appended to the journal (`journal.rs`) and synced before it is
//! acknowledged (a CNI ADD that returned must survive a crash the next instant); the journal is
//! folded into the whole `config.vnet` in the background once it outgrows the file, and at
//! start and stop. The derived configuration and the host record are written in the
//! background, half a second after they changed and at most every half second (they are
//! recoverable: etcd has the former, the devices the latter). Every derived snapshot carries a generation taken under the daemon's
//! lock, so a slower writer never puts an older snapshot over a newer one.
//!
//! Ordering: records are appended (written, not yet synced) under the daemon's state lock, so
//! their order is the order of the changes; each change then syncs after the lock is released,
//! and a sync first syncs the segment before its own when that one was cut since (a change
//! acknowledged in a new segment must not outlive a record it follows that a crash could still
//! lose). A compaction renders the configuration and cuts the journal under the same lock, so
//! the file it writes holds exactly the records up to the cut.

use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing::warn;

use crate::journal::{self, Kind};
use crate::state::{Resources, StateDir, DERIVED};

const BACKGROUND_EVERY: Duration = Duration::from_millis(500);

/// The journal is compacted once it holds more bytes than the file, and at least this many.
const COMPACT_FLOOR: u64 = 64 << 10;

#[derive(Default)]
struct Pending {
    derived: Option<(u64, String)>,
    /// The derived configuration changed: render it from the source when writing (at most
    /// every half second, not on every change: rendering costs the overlay's size).
    derived_dirty: bool,
    resources: Option<Resources>,
    /// The journal outgrew the file: fold it in.
    compact: bool,
}

/// Renders the local configuration for a compaction: the daemon locks its state, renders,
/// and cuts the journal ([`Saver::cut`]) before it unlocks; returns (the cut's sequence, the
/// script).
pub type LocalSource = Box<dyn Fn() -> Option<(u64, String)> + Send + Sync>;

/// Renders the derived configuration with its generation (the daemon's, under its lock).
pub type DerivedSource = Box<dyn Fn() -> Option<(u64, String)> + Send + Sync>;

/// One journal segment file.
struct Segment {
    file: File,
    /// The directory's entry for the file is durable.
    dir_synced: AtomicBool,
    /// The segment before this one, until it is known synced.
    prev: Mutex<Option<Arc<Segment>>>,
}

/// The journal as it is being written (behind a mutex taken under the daemon's state lock).
#[derive(Default)]
struct Journal {
    /// The sequence of the last record appended (or of the last cut).
    last: u64,
    /// The segment records go to; None after a cut (the next append starts one).
    current: Option<Arc<Segment>>,
    /// The segment cut last, until a new one takes it as its `prev`.
    retired: Option<Arc<Segment>>,
    /// Bytes appended since the last cut, and the size of the file that cut wrote.
    bytes: u64,
    file_bytes: u64,
}

/// A record appended and not yet synced: [`Saver::sync`] it before acknowledging.
#[must_use = "sync the record before acknowledging its change"]
pub struct Appended(Option<Arc<Segment>>);

struct Shared {
    dir: StateDir,
    journal: Mutex<Journal>,
    /// The sequence of the `config.vnet` last written (None: not yet in this run).
    local_written: Mutex<Option<u64>>,
    local_source: Mutex<Option<LocalSource>>,
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
    /// `last_seq`: the highest journal sequence on disk (`journal::Replay::highest`).
    pub fn new(dir: StateDir, resources: Resources, last_seq: u64) -> std::io::Result<Saver> {
        if let Err(e) = dir.write_resources(&resources) {
            warn!("state: writing the host record: {e:#}");
        }
        let shared = Arc::new(Shared {
            dir,
            journal: Mutex::new(Journal {
                last: last_seq,
                ..Journal::default()
            }),
            local_written: Mutex::new(None),
            local_source: Mutex::new(None),
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

    /// Appends a change of the local configuration to the journal: called under the daemon's
    /// state lock, so records are in the order of the changes. Sync the result before the
    /// change is acknowledged. A record that cannot be written is said, and the next
    /// compaction (asked for at once) saves the change with the rest.
    pub fn append(&self, kind: Kind, text: &str) -> Appended {
        let mut j = lock(&self.shared.journal);
        let seq = j.last + 1;
        let segment = match &j.current {
            Some(s) => s.clone(),
            None => match self.shared.dir.create_segment(&journal::segment_name(seq)) {
                Ok(file) => {
                    let s = Arc::new(Segment {
                        file,
                        dir_synced: AtomicBool::new(false),
                        prev: Mutex::new(j.retired.take()),
                    });
                    j.current = Some(s.clone());
                    s
                }
                Err(e) => {
                    warn!("state: starting a journal segment: {e:#}");
                    drop(j);
                    self.ask_compaction();
                    return Appended(None);
                }
            },
        };
        let record = journal::encode(seq, kind, text);
        if let Err(e) = (&segment.file).write_all(&record) {
            warn!("state: appending to the journal: {e}");
            // What is in the segment after this is not to be trusted: cut it.
            j.retired = j.current.take();
            drop(j);
            self.ask_compaction();
            return Appended(None);
        }
        j.last = seq;
        j.bytes += record.len() as u64;
        let due = journal::due(j.bytes, j.file_bytes, COMPACT_FLOOR);
        drop(j);
        if due {
            self.ask_compaction();
        }
        Appended(Some(segment))
    }

    /// Makes an appended record durable (with every record before it).
    pub fn sync(&self, a: Appended) {
        if let Some(s) = a.0 {
            if let Err(e) = sync_segment(&self.shared.dir, &s) {
                warn!("state: syncing the journal: {e:#}");
            }
        }
    }

    /// Cuts the journal for a compaction: called under the daemon's state lock, with the
    /// configuration rendered under it; returns the sequence the rendered file includes.
    pub fn cut(&self, file_bytes: usize) -> u64 {
        let mut j = lock(&self.shared.journal);
        if let Some(s) = j.current.take() {
            j.retired = Some(s);
        }
        j.bytes = 0;
        j.file_bytes = file_bytes as u64;
        j.last
    }

    /// Writes the whole local configuration, including the journal up to `seq` (from
    /// [`Saver::cut`]), and removes the segments it includes. A file older than the one
    /// written already is not written.
    pub fn whole(&self, seq: u64, script: &str) {
        write_whole(&self.shared, seq, script);
    }

    /// Where a compaction renders the local configuration from.
    pub fn set_local_source(&self, f: LocalSource) {
        *lock(&self.shared.local_source) = Some(f);
    }

    fn ask_compaction(&self) {
        lock(&self.shared.pending).compact = true;
        self.shared.wake.notify_one();
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

    /// Writes what is pending, folds the journal into the file (so that an older vnetd,
    /// which knows no journal, finds everything in it), and stops the writer.
    pub fn flush(&self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        // Only when this run wrote the file and appended since (a start that failed to
        // restore must leave the saved configuration as it found it).
        let appended = lock(&self.shared.journal).last;
        if lock(&self.shared.local_written).is_some_and(|w| appended > w) {
            lock(&self.shared.pending).compact = true;
        }
        write_pending(&self.shared);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Syncs the segment before `s` if it was not yet known synced (holding `s.prev`'s lock, so
/// no record of `s` is taken as durable before it), then `s` and its directory entry.
fn sync_segment(dir: &StateDir, s: &Segment) -> std::io::Result<()> {
    {
        let mut prev = lock(&s.prev);
        if let Some(p) = prev.as_ref() {
            sync_segment(dir, p)?;
        }
        *prev = None;
    }
    s.file.sync_data()?;
    if !s.dir_synced.load(Relaxed) {
        dir.sync_dir()?;
        s.dir_synced.store(true, Relaxed);
    }
    Ok(())
}

/// Folds the journal into `config.vnet`: rendered (and the journal cut) under the daemon's
/// lock by the source, written here.
fn compact(s: &Shared) {
    let rendered = {
        let source = lock(&s.local_source);
        source.as_ref().and_then(|f| f())
    };
    if let Some((seq, script)) = rendered {
        write_whole(s, seq, &script);
    }
}

fn write_whole(s: &Shared, seq: u64, script: &str) {
    let mut written = lock(&s.local_written);
    if written.is_some_and(|w| seq <= w) {
        return;
    }
    let mut text = journal::header(seq);
    text.push_str(script);
    match s.dir.write(crate::state::LOCAL, &text) {
        Ok(()) => {
            *written = Some(seq);
            if let Err(e) = s.dir.remove_segments_through(seq) {
                warn!("state: removing journal segments: {e:#}");
            }
        }
        Err(e) => warn!("state: writing the configuration: {e:#}"),
    }
}

fn write_pending(s: &Shared) {
    let mut p = std::mem::take(&mut *s.pending.lock().unwrap_or_else(|p| p.into_inner()));
    if p.compact {
        compact(s);
    }
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
                        && !p.compact
                        && p.resources.is_none()
                        && !s.stop.load(Relaxed)
                })
                .unwrap_or_else(|p| p.into_inner());
        }
        // Half a second after the first change before writing (a stop cuts the wait short,
        // and `flush` writes): a burst of changes is written once, after it, rather than in
        // its midst, where rendering and syncing would take the CPU from the burst itself (a
        // move reaching hundreds of daemons on one machine, a cold start); and at most one
        // write per interval.
        {
            let p = s.pending.lock().unwrap_or_else(|p| p.into_inner());
            let _unused = s
                .wake
                .wait_timeout_while(p, BACKGROUND_EVERY, |_| !s.stop.load(Relaxed))
                .unwrap_or_else(|p| p.into_inner());
        }
        if s.stop.load(Relaxed) {
            break;
        }
        write_pending(s);
    }
}
