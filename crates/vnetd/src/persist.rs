//! Keeping the state directory in step with the running daemon: a change of the local
//! configuration is appended to the journal (`journal.rs`) and synced before it is
//! acknowledged (a CNI ADD that returned must survive a crash the next instant); the journal is
//! folded into the whole `config.vnet` in the background once it outgrows the file, and at
//! start and stop. The derived configuration and the host record are written in the
//! background, half a second after they changed and at most every half second (they are
//! recoverable: etcd has the former, the devices the latter). Every derived snapshot carries a
//! generation taken under the daemon's lock, so a slower writer never puts an older snapshot
//! over a newer one.
//!
//! Ordering: records are appended (written, not yet synced) under the daemon's state lock, so
//! their order is the order of the changes; each change then syncs after the lock is released,
//! and a sync first syncs the segment before its own when that one was cut since (a change
//! acknowledged in a new segment must not outlive a record it follows that a crash could still
//! lose). A compaction renders the configuration and cuts the journal under the same lock, so
//! the file it writes holds exactly the records up to the cut.
//!
//! Failures (issue 32: a change was acknowledged though its record could not be written or
//! synced). A record that cannot be written (a full disk: ENOSPC; EIO) is an error to the
//! caller, which undoes the change and refuses the command: nothing changed, nothing to save.
//! A sync that fails is worse: the change is in effect, and after a failed fsync the kernel may
//! have dropped the segment's pages while a later fsync of it succeeds, so the segment is never
//! trusted again (a later sync through it fails too). The whole configuration is then written
//! anew (written beside, synced, renamed): when that works the change is durable after all and
//! acknowledged; when it does not, the command fails saying the change is in effect and not
//! saved, and the writer tries again every few seconds until a whole write works. Every failed
//! write is counted and its error kept for `show stats` and `/metrics`.

use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing::warn;
use vnet_core::{CondvarRecover, LockRecover};

use crate::journal::{self, Kind};
use crate::state::{Resources, StateDir, DERIVED};

const BACKGROUND_EVERY: Duration = Duration::from_millis(500);

/// While the running configuration is not saved, a whole write is tried this often.
const RETRY_EVERY: Duration = Duration::from_secs(2);

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
    /// The last record appended to it.
    last: AtomicU64,
    /// Why a sync of it failed: it is never taken as durable again.
    failed: Mutex<Option<String>>,
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
pub struct Appended {
    segment: Arc<Segment>,
    seq: u64,
}

/// How the writes to the state directory go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The last write of the local configuration (a record, its sync, the whole file) failed.
    pub failing: bool,
    /// The running configuration has changes that are not on disk.
    pub unsaved: bool,
    /// Writes that failed, of any state file.
    pub errors: u64,
    pub last_error: Option<String>,
}

/// The writes a test can make fail ([`Saver::inject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    SegmentWrite,
    SegmentSync,
    WholeWrite,
}

struct Shared {
    dir: StateDir,
    journal: Mutex<Journal>,
    /// The sequence of the `config.vnet` last written (None: not yet in this run).
    local_written: Mutex<Option<u64>>,
    /// The same, for a sync to read without waiting on a write in progress.
    durable_through: AtomicU64,
    local_source: Mutex<Option<LocalSource>>,
    derived_written: Mutex<u64>,
    pending: Mutex<Pending>,
    wake: Condvar,
    stop: AtomicBool,
    /// What host.json holds now.
    resources: Mutex<Resources>,
    derived_source: Mutex<Option<DerivedSource>>,
    health: Mutex<Health>,
    /// Injected faults: the OS error each write of that kind fails with, while set.
    #[cfg(test)]
    faults: Mutex<Vec<(Io, i32)>>,
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
        let shared = Arc::new(Shared {
            dir,
            journal: Mutex::new(Journal {
                last: last_seq,
                ..Journal::default()
            }),
            local_written: Mutex::new(None),
            durable_through: AtomicU64::new(0),
            local_source: Mutex::new(None),
            derived_written: Mutex::new(0),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            resources: Mutex::new(resources.clone()),
            derived_source: Mutex::new(None),
            health: Mutex::new(Health::default()),
            #[cfg(test)]
            faults: Mutex::new(Vec::new()),
        });
        if let Err(e) = shared.dir.write_resources(&resources) {
            shared.failed(format!("writing the host record: {e:#}"), false);
        }
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

    /// How the writes go (`show stats`).
    pub fn health(&self) -> Health {
        self.shared.health.lock_or_recover().clone()
    }

    /// Makes every write of kind `io` fail with the OS error `errno` (None: work again). An
    /// injected fault: a real failing fsync cannot be made in a unit test (it takes a disk that
    /// fails under a file system), and a full disk takes a file system of its own (the system
    /// test mounts one).
    #[cfg(test)]
    pub fn inject(&self, io: Io, errno: Option<i32>) {
        let mut f = self.shared.faults.lock_or_recover();
        f.retain(|(k, _)| *k != io);
        if let Some(e) = errno {
            f.push((io, e));
        }
    }

    /// Appends a change of the local configuration to the journal: called under the daemon's
    /// state lock, so records are in the order of the changes. Sync the result before the
    /// change is acknowledged. Err: the record could not be written, and the caller undoes
    /// the change (the segment it went to is cut: what is in it after this is not trusted).
    pub fn append(&self, kind: Kind, text: &str) -> Result<Appended, String> {
        if text.len() + 1 > journal::MAX_PAYLOAD {
            return Err(format!(
                "the change's record would be {} bytes, more than a journal record holds ({})",
                text.len() + 1,
                journal::MAX_PAYLOAD
            ));
        }
        let mut j = self.shared.journal.lock_or_recover();
        let Some(seq) = journal::next_seq(j.last) else {
            drop(j);
            return Err(self
                .shared
                .failed("the journal's sequence numbers are used up".into(), false));
        };
        let segment = match &j.current {
            Some(s) => s.clone(),
            None => match self
                .shared
                .check(Io::SegmentWrite)
                .and_then(|()| self.shared.dir.create_segment(&journal::segment_name(seq)))
            {
                Ok(file) => {
                    let s = Arc::new(Segment {
                        file,
                        dir_synced: AtomicBool::new(false),
                        prev: Mutex::new(j.retired.take()),
                        last: AtomicU64::new(0),
                        failed: Mutex::new(None),
                    });
                    j.current = Some(s.clone());
                    s
                }
                Err(e) => {
                    drop(j);
                    return Err(self
                        .shared
                        .failed(format!("starting a journal segment: {e}"), false));
                }
            },
        };
        let record = journal::encode(seq, kind, text);
        let written = self
            .shared
            .check(Io::SegmentWrite)
            .and_then(|()| (&segment.file).write_all(&record));
        if let Err(e) = written {
            // What is in the segment after this is not to be trusted: cut it (the next record
            // starts a segment of its own, with this sequence).
            j.retired = j.current.take();
            drop(j);
            return Err(self
                .shared
                .failed(format!("appending to the journal: {e}"), false));
        }
        j.last = seq;
        segment.last.store(seq, Relaxed);
        j.bytes += record.len() as u64;
        let due = journal::due(j.bytes, j.file_bytes, COMPACT_FLOOR);
        drop(j);
        if due {
            self.ask_compaction();
        }
        Ok(Appended { segment, seq })
    }

    /// Makes an appended record durable (with every record before it). When its segment
    /// cannot be synced, the whole configuration is written instead; Err: that failed too,
    /// and the change is in effect but not saved (the writer keeps trying).
    pub fn sync(&self, a: Appended) -> Result<(), String> {
        let s = &self.shared;
        if s.durable_through.load(Relaxed) >= a.seq {
            return Ok(());
        }
        let why = match sync_segment(s, &a.segment) {
            Ok(()) => {
                s.succeeded();
                return Ok(());
            }
            Err(e) => s.failed(format!("syncing the journal: {e}"), false),
        };
        warn!("state: {why}; writing the whole configuration instead");
        // The next record starts a segment of its own.
        {
            let mut j = s.journal.lock_or_recover();
            if j.current
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(c, &a.segment))
            {
                j.retired = j.current.take();
            }
        }
        match compact(s) {
            Ok(_) if s.durable_through.load(Relaxed) >= a.seq => Ok(()),
            Ok(_) => {
                s.set_unsaved();
                Err(why)
            }
            Err(e) => {
                s.set_unsaved();
                Err(format!("{why}; writing the whole configuration: {e}"))
            }
        }
    }

    /// Cuts the journal for a compaction: called under the daemon's state lock, with the
    /// configuration rendered under it; returns the sequence the rendered file includes.
    pub fn cut(&self, file_bytes: usize) -> u64 {
        let mut j = self.shared.journal.lock_or_recover();
        if let Some(s) = j.current.take() {
            j.retired = Some(s);
        }
        j.bytes = 0;
        j.file_bytes = file_bytes as u64;
        j.last
    }

    /// Writes the whole local configuration, including the journal up to `seq` (from
    /// [`Saver::cut`]), and removes the segments it includes. A file older than the one
    /// written already is not written. Err: not written, and the running configuration is
    /// taken as unsaved until a whole write works (the writer tries again).
    pub fn whole(&self, seq: u64, script: &str) -> Result<(), String> {
        write_whole(&self.shared, seq, script).inspect_err(|_| self.shared.set_unsaved())
    }

    /// Where a compaction renders the local configuration from.
    pub fn set_local_source(&self, f: LocalSource) {
        *self.shared.local_source.lock_or_recover() = Some(f);
    }

    fn ask_compaction(&self) {
        self.shared.pending.lock_or_recover().compact = true;
        self.shared.wake.notify_one();
    }

    /// Where the derived configuration is rendered from when [`Saver::derived_changed`] says
    /// it changed.
    pub fn set_derived_source(&self, f: DerivedSource) {
        *self.shared.derived_source.lock_or_recover() = Some(f);
    }

    /// The derived configuration changed: rendered from the source and written within half
    /// a second.
    pub fn derived_changed(&self) {
        let mut p = self.shared.pending.lock_or_recover();
        p.derived_dirty = true;
        self.shared.wake.notify_one();
    }

    /// The derived configuration changed: written within half a second.
    pub fn derived(&self, generation: u64, script: String) {
        let mut p = self.shared.pending.lock_or_recover();
        if p.derived.as_ref().is_none_or(|(g, _)| *g < generation) {
            p.derived = Some((generation, script));
            self.shared.wake.notify_one();
        }
    }

    /// Changes the host record (devices made, the lease) with `f`; written in the background
    /// when it changed.
    pub fn update_resources(&self, f: impl FnOnce(&mut Resources)) {
        let mut r = self.shared.resources.lock_or_recover();
        let before = r.clone();
        f(&mut r);
        if *r != before {
            let mut p = self.shared.pending.lock_or_recover();
            p.resources = Some(r.clone());
            self.shared.wake.notify_one();
        }
    }

    pub fn resources(&self) -> Resources {
        self.shared.resources.lock_or_recover().clone()
    }

    /// Writes what is pending, folds the journal into the file (so that an older vnetd,
    /// which knows no journal, finds everything in it), and stops the writer.
    pub fn flush(&self) {
        self.shared.stop.store(true, Relaxed);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock_or_recover().take() {
            let _ = t.join();
        }
        // Only when this run wrote the file and appended since, or could not save what runs
        // (a start that failed to restore must leave the saved configuration as it found it).
        let appended = self.shared.journal.lock_or_recover().last;
        if self
            .shared
            .local_written
            .lock_or_recover()
            .is_some_and(|w| appended > w)
            || self.shared.health.lock_or_recover().unsaved
        {
            self.shared.pending.lock_or_recover().compact = true;
        }
        write_pending(&self.shared);
    }
}

impl Shared {
    /// Counts a failed write and keeps its error; `failing` too when it was the local
    /// configuration's (`other`: a derived or host record). Returns the error.
    fn failed(&self, what: String, other: bool) -> String {
        let mut h = self.health.lock_or_recover();
        h.errors += 1;
        h.last_error = Some(what.clone());
        if !other {
            h.failing = true;
        }
        what
    }

    fn succeeded(&self) {
        self.health.lock_or_recover().failing = false;
    }

    fn set_unsaved(&self) {
        self.health.lock_or_recover().unsaved = true;
        self.wake.notify_one();
    }

    /// An injected fault for this kind of write, if a test set one.
    #[cfg(test)]
    fn check(&self, io: Io) -> std::io::Result<()> {
        match self.faults.lock_or_recover().iter().find(|(k, _)| *k == io) {
            Some((_, errno)) => Err(std::io::Error::from_raw_os_error(*errno)),
            None => Ok(()),
        }
    }

    #[cfg(not(test))]
    fn check(&self, _: Io) -> std::io::Result<()> {
        Ok(())
    }
}

/// Syncs the segment before `s` if it was not yet known synced or included in the file
/// (holding `s.prev`'s lock, so no record of `s` is taken as durable before it), then `s` and
/// its directory entry. A segment whose sync failed once fails every later sync through it.
fn sync_segment(sh: &Shared, s: &Segment) -> std::io::Result<()> {
    {
        let mut prev = s.prev.lock_or_recover();
        if let Some(p) = prev.as_ref() {
            if p.last.load(Relaxed) > sh.durable_through.load(Relaxed) {
                sync_segment(sh, p)?;
            }
        }
        *prev = None;
    }
    if let Some(why) = s.failed.lock_or_recover().clone() {
        return Err(std::io::Error::other(format!(
            "a sync of this segment failed before ({why}): it is not trusted again"
        )));
    }
    let synced = sh
        .check(Io::SegmentSync)
        .and_then(|()| s.file.sync_data())
        .and_then(|()| {
            if s.dir_synced.load(Relaxed) {
                return Ok(());
            }
            sh.dir.sync_dir()?;
            s.dir_synced.store(true, Relaxed);
            Ok(())
        });
    if let Err(e) = &synced {
        *s.failed.lock_or_recover() = Some(e.to_string());
    }
    synced
}

/// Folds the journal into `config.vnet`: rendered (and the journal cut) under the daemon's
/// lock by the source, written here. Ok(None): no source to render from.
fn compact(s: &Shared) -> Result<Option<u64>, String> {
    let rendered = {
        let source = s.local_source.lock_or_recover();
        source.as_ref().and_then(|f| f())
    };
    match rendered {
        Some((seq, script)) => write_whole(s, seq, &script).map(|()| Some(seq)),
        None => Ok(None),
    }
}

fn write_whole(s: &Shared, seq: u64, script: &str) -> Result<(), String> {
    let mut written = s.local_written.lock_or_recover();
    if written.is_some_and(|w| seq <= w) {
        return Ok(());
    }
    let mut text = journal::header(seq);
    text.push_str(script);
    let result = s
        .check(Io::WholeWrite)
        .map_err(anyhow::Error::from)
        .and_then(|()| s.dir.write(crate::state::LOCAL, &text));
    match result {
        Ok(()) => {
            *written = Some(seq);
            s.durable_through.fetch_max(seq, Relaxed);
            {
                let mut h = s.health.lock_or_recover();
                h.failing = false;
                h.unsaved = false;
            }
            if let Err(e) = s.dir.remove_segments_through(seq) {
                warn!("state: removing journal segments: {e:#}");
            }
            Ok(())
        }
        Err(e) => Err(s.failed(format!("writing the configuration: {e:#}"), false)),
    }
}

fn write_pending(s: &Shared) {
    let mut p = std::mem::take(&mut *s.pending.lock_or_recover());
    if p.compact {
        if let Err(e) = compact(s) {
            warn!("state: {e}");
        }
    }
    if p.derived_dirty {
        let source = s.derived_source.lock_or_recover();
        if let Some(rendered) = source.as_ref().and_then(|f| f()) {
            if p.derived.as_ref().is_none_or(|(g, _)| *g < rendered.0) {
                p.derived = Some(rendered);
            }
        }
    }
    if let Some((generation, text)) = p.derived {
        let mut last = s.derived_written.lock_or_recover();
        if generation > *last {
            match s.dir.write(DERIVED, &text) {
                Ok(()) => *last = generation,
                Err(e) => warn!(
                    "state: {}",
                    s.failed(format!("writing the derived configuration: {e:#}"), true)
                ),
            }
        }
    }
    if let Some(r) = p.resources {
        if let Err(e) = s.dir.write_resources(&r) {
            warn!(
                "state: {}",
                s.failed(format!("writing the host record: {e:#}"), true)
            );
        }
    }
}

fn background(s: &Shared) {
    while !s.stop.load(Relaxed) {
        {
            let p = s.pending.lock_or_recover();
            let idle = |p: &mut Pending| {
                p.derived.is_none()
                    && !p.derived_dirty
                    && !p.compact
                    && p.resources.is_none()
                    && !s.stop.load(Relaxed)
            };
            // While the running configuration is not saved, a whole write every few seconds.
            if s.health.lock_or_recover().unsaved {
                let (mut p, _) = s.wake.wait_timeout_while_or_recover(p, RETRY_EVERY, idle);
                p.compact |= s.health.lock_or_recover().unsaved;
            } else {
                let _unused = s.wake.wait_while_or_recover(p, idle);
            }
        }
        // Half a second after the first change before writing (a stop cuts the wait short,
        // and `flush` writes): a burst of changes is written once, after it, rather than in
        // its midst, where rendering and syncing would take the CPU from the burst itself (a
        // move reaching hundreds of daemons on one machine, a cold start); and at most one
        // write per interval.
        {
            let p = s.pending.lock_or_recover();
            let _unused = s
                .wake
                .wait_timeout_while_or_recover(p, BACKGROUND_EVERY, |_| !s.stop.load(Relaxed));
        }
        if s.stop.load(Relaxed) {
            break;
        }
        write_pending(s);
    }
}
