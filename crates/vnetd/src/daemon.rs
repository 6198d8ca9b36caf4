//! The daemon's state: the configuration model and the engine that realizes it, and the
//! answers to control-language commands.
//!
//! A change of the local configuration is acknowledged only once it is on disk (issue 32): a
//! journal record that cannot be written undoes the change and refuses the command (nothing
//! changed); a record that cannot be synced is saved by a whole write instead, and when that
//! fails too the command fails saying the change is in effect and not saved (`persist.rs`).
//!
//! A change holds the state lock while the engine works (netlink, BPF writes: seconds at
//! worst for a device), so readers (`show`, `/metrics`) do not queue behind it: a change that
//! reaches the engine first publishes what readers see ([`View`]), rendered from the state as
//! it is (the last acknowledged one), and takes it back before it unlocks; a reader that finds
//! the lock taken answers from it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, TryLockError};

use vnet_agent::SyncReport;
use vnet_cluster::ClusterState;
use vnet_control::status::{
    ClusterReport, ClusterStatus, DaemonCounters, InterfaceStatus, InterfaceTable, LinkStatus,
    LinkTable, ListenerTable, MatrixReport, RouteStatus, RouteTable, StateStatus, StatsReport,
};
use vnet_control::Interface;
use vnet_control::{
    parse_config, parse_line, parse_script, Change, Command, Config, DestKind, RouteChange,
    ShowWhat,
};
use vnet_dataplane::{Engine, Leave};
use vnet_wire::MacAddr;

use crate::delta::local_delta;
use crate::derived::DerivedRecord;
use crate::journal::{self, Kind};
use crate::pending::Pending;
use crate::persist::{Appended, Saver};

pub struct State {
    /// The running configuration: the local one (config file and control port) plus the
    /// objects derived from etcd (`derived`).
    pub cfg: Config,
    pub engine: Engine,
    /// What the etcd agent applied to `cfg` and has not taken back (empty without `--etcd`).
    pub derived: DerivedRecord,
    /// `derived` is exactly the agent's last derivation, and the local configuration has not
    /// changed since (the value of `local_changes` then): the agent's next delta applies to
    /// it as it is. None after a refused command, a restore, or before the first sync.
    pub derived_in_step: Option<u64>,
    /// Routes of the local configuration waiting for their link (`pending.rs`): saved with
    /// it, not in `cfg`.
    pub pending: Pending,
    /// Called by a change that reaches the engine, before it does (tests: a slow change).
    #[cfg(test)]
    pub before_engine: Option<Box<dyn FnMut() + Send>>,
}

impl State {
    /// The local configuration alone: the running one without the derived objects.
    pub fn local_config(&self) -> Config {
        self.derived.local_config(&self.cfg)
    }

    /// The local configuration's script, rendered from the running one (no copy of it), with
    /// the routes waiting for their link after it: what is saved.
    pub fn local_script(&self) -> String {
        let mut s = self.derived.local_script(&self.cfg);
        s.push_str(&self.pending.script());
        s
    }
}

pub struct Daemon {
    pub state: Mutex<State>,
    /// Refused control connections, bad control lines and failed authentications.
    pub control_errors: AtomicU64,
    /// Bumped by every change of the local configuration, so the etcd agent re-derives and
    /// re-publishes.
    pub local_changes: AtomicU64,
    /// The etcd agent's status for `show cluster` (None without `--etcd`).
    pub cluster_status: Mutex<Option<ClusterStatus>>,
    /// The cluster state of the last synchronisation and when it was (for the metrics and the
    /// live view; None before the first).
    pub cluster_seen: Mutex<Option<(std::time::Instant, ClusterState)>>,
    /// The state directory's writer (None without one: unit tests).
    saver: Option<Saver>,
    /// Generation of the configuration snapshots handed to the saver (bumped under `state`).
    generation: AtomicU64,
    /// `teardown` was asked for on the control port: the daemon removes everything it made
    /// on its way out.
    pub teardown: AtomicBool,
    /// The control port takes no token (every local user controls the daemon): said in
    /// `show stats` and `/metrics`.
    pub control_without_token: AtomicBool,
    /// What readers see while a change is in the engine (None otherwise): see the header.
    published: Mutex<Option<Arc<View>>>,
    /// The reach thread's handle (`--etcd`): `show reach`.
    pub reach: std::sync::OnceLock<Arc<crate::reach::Handle>>,
}

/// Every answer a reader can ask for, rendered from one state.
struct View {
    stats: StatsReport,
    links: Vec<LinkStatus>,
    interfaces: Vec<Interface>,
    interface_table: InterfaceTable,
    routes: Vec<RouteStatus>,
    listeners: ListenerTable,
    derived: Vec<String>,
    local_config: Config,
    /// `show config`'s lines for the routes waiting for their link.
    pending_shown: String,
    matrix: MatrixReport,
}

impl View {
    fn of(st: &State) -> View {
        View {
            stats: stats_report(st, 0),
            links: link_rows(st),
            interfaces: st.cfg.interfaces.clone(),
            interface_table: interface_rows(st),
            routes: route_rows(st),
            listeners: ListenerTable(st.cfg.listeners.clone()),
            derived: derived_lines(st),
            local_config: st.local_config(),
            pending_shown: st.pending.shown(),
            matrix: matrix_of(st),
        }
    }
}

/// Takes the published view back when the change is done (before its lock is released: the
/// guard is declared after the lock's guard, or dropped explicitly before it).
struct Published<'a>(&'a Mutex<Option<Arc<View>>>);

impl Drop for Published<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// What is left to do for the state directory after a change of the local configuration,
/// once the lock is released: its journal record synced (before the change is acknowledged),
/// and the devices made for it recorded when ports changed.
struct Saving {
    appended: Option<Appended>,
    ports: Option<Ports>,
}

/// The devices vnetd made and the forwarding values it changed (for `host.json`).
struct Ports {
    made: Vec<vnet_dataplane::made::MadeDevice>,
    forwarding: Vec<vnet_fastpath::ForwardingOriginal>,
}

impl Ports {
    fn of(st: &State) -> Ports {
        Ports {
            made: st.engine.made_devices(),
            forwarding: st.engine.kernel_forwarding_originals(),
        }
    }
}

/// What a successful apply did, enough to take it back.
#[derive(Default)]
struct Applied {
    changes: Vec<Change>,
    /// The configuration before (None: a change of routes only, taken back by its changes).
    before: Option<Config>,
}

/// What a start's restore did.
pub struct Restore {
    /// What was left out, in words.
    pub notes: Vec<String>,
    /// Whether the configuration as restored is on disk (Err: why not).
    pub saved: Result<(), String>,
}

/// The whole local configuration with the journal cut at `seq` (a start, a compaction).
struct Whole {
    seq: u64,
    script: String,
    ports: Ports,
}

impl Daemon {
    pub fn new(engine: Engine, saver: Option<Saver>) -> Daemon {
        Daemon {
            state: Mutex::new(State {
                cfg: Config::default(),
                engine,
                derived: DerivedRecord::default(),
                derived_in_step: None,
                pending: Pending::default(),
                #[cfg(test)]
                before_engine: None,
            }),
            control_errors: AtomicU64::new(0),
            local_changes: AtomicU64::new(0),
            cluster_status: Mutex::new(None),
            cluster_seen: Mutex::new(None),
            saver,
            generation: AtomicU64::new(0),
            teardown: AtomicBool::new(false),
            control_without_token: AtomicBool::new(false),
            published: Mutex::new(None),
            reach: std::sync::OnceLock::new(),
        }
    }

    /// Before a change that reaches the engine (`slow`: any command but routes, whose
    /// changes are brief): publishes the view of the state as it is, for the readers meanwhile.
    fn publish_before<'a>(&'a self, st: &State, slow: bool) -> Option<Published<'a>> {
        if !slow {
            return None;
        }
        let view = Arc::new(View::of(st));
        *self.published.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
        Some(Published(&self.published))
    }

    /// A reader's answer: from the state when the lock is free, else from the view a change
    /// in progress published; a brief holder (another reader, a route change) is waited for
    /// by trying again, not in the lock's queue, where a change could pass ahead of it.
    fn read<T>(&self, live: impl FnOnce(&State) -> T, published: impl FnOnce(&View) -> T) -> T {
        loop {
            match self.state.try_lock() {
                Ok(st) => return live(&st),
                Err(TryLockError::Poisoned(p)) => return live(&p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
            let view = self
                .published
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(v) = view {
                return published(&v);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    pub fn saver(&self) -> Option<&Saver> {
        self.saver.as_ref()
    }

    /// Appends a change of the local configuration to the journal (called with the state
    /// locked, right after the change: records go in the order of the changes); the sync
    /// happens after the unlock, in [`Daemon::saved`]. `extra`: lines the changes do not say
    /// (waiting routes deleted). `ports`: the change made or removed devices. Err: the record
    /// could not be written (the caller undoes the change).
    fn journal(
        &self,
        st: &State,
        changes: &[Change],
        extra: &str,
        ports: bool,
    ) -> Result<Option<Saving>, String> {
        let Some(saver) = self.saver.as_ref() else {
            return Ok(None);
        };
        let delta = local_delta(changes, &|r| st.derived.has_route(r), &|l| {
            st.derived.has_link(l)
        })
        .map(|mut t| {
            t.push_str(extra);
            t
        });
        let appended = match delta {
            Some(text) if text.is_empty() => None,
            // A change whose lines would not fit a record (a batch replacing 100,000 routes)
            // is saved as the whole configuration, which always fits.
            Some(text) if text.len() < journal::MAX_PAYLOAD => {
                Some(saver.append(Kind::Delta, &text)?)
            }
            _ => Some(saver.append(Kind::Snapshot, &st.local_script())?),
        };
        Ok(Some(Saving {
            appended,
            ports: ports.then(|| Ports::of(st)),
        }))
    }

    /// The change's record on disk (then it may be acknowledged), and its devices recorded.
    fn saved(&self, saving: Option<Saving>) -> Result<(), String> {
        let (Some(saver), Some(s)) = (&self.saver, saving) else {
            return Ok(());
        };
        let synced = s.appended.map_or(Ok(()), |a| saver.sync(a));
        if let Some(p) = s.ports {
            record_ports(saver, p);
        }
        synced
    }

    /// The whole local configuration, the journal cut where it is (called with the state
    /// locked).
    fn whole(&self, st: &State) -> Option<Whole> {
        let saver = self.saver.as_ref()?;
        let script = st.local_script();
        Some(Whole {
            seq: saver.cut(script.len()),
            script,
            ports: Ports::of(st),
        })
    }

    fn save_whole(&self, w: Option<Whole>) -> Result<(), String> {
        let (Some(saver), Some(w)) = (&self.saver, w) else {
            return Ok(());
        };
        let saved = saver.whole(w.seq, &w.script);
        record_ports(saver, w.ports);
        saved
    }

    /// How the state directory's writes go, and who may control the daemon (`pending`: the
    /// routes waiting for their link).
    fn state_status(&self, pending: usize) -> StateStatus {
        let h = self.saver.as_ref().map(Saver::health).unwrap_or_default();
        StateStatus {
            failing: h.failing,
            unsaved: h.unsaved,
            errors: h.errors,
            last_error: h.last_error,
            pending_routes: pending as u64,
            control_without_token: self.control_without_token.load(Relaxed),
        }
    }

    /// The local configuration rendered for a compaction of the journal (the state
    /// directory's writer calls this).
    pub fn render_local(&self) -> Option<(u64, String)> {
        let st = self.lock();
        let saver = self.saver.as_ref()?;
        let script = st.local_script();
        Some((saver.cut(script.len()), script))
    }

    /// Ends the takeover of an earlier vnetd's kernel fast path (after `restore`), and records
    /// what it changed on the devices.
    pub fn commit_takeover(&self) {
        let mut st = self.lock();
        st.engine.commit_kernel_takeover();
        let w = self.whole(&st);
        drop(st);
        if let Err(e) = self.save_whole(w) {
            tracing::warn!("state: {e}");
        }
    }

    fn derived_snapshot(&self, st: &State) -> Option<(u64, String)> {
        self.saver.as_ref()?;
        let g = self.generation.fetch_add(1, Relaxed) + 1;
        let mut text = String::new();
        for c in st.derived.commands() {
            if let Some(l) = vnet_cluster::render_command(&c) {
                text.push_str(&l);
                text.push('\n');
            }
        }
        Some((g, text))
    }

    /// The derived configuration rendered now, for the state directory's writer.
    pub fn render_derived(&self) -> Option<(u64, String)> {
        let st = self.lock();
        self.derived_snapshot(&st)
    }

    fn save_derived(&self, snap: Option<(u64, String)>) {
        if let (Some(saver), Some((g, text))) = (&self.saver, snap) {
            saver.derived(g, text);
        }
    }

    /// Realizes the configuration a starting daemon restored (`restore::plan`): the part the
    /// config file accounts for (`file_part`) must come up whole, as a config file always
    /// had to; the rest (runtime changes of earlier runs) comes up line by line, and a line the
    /// host can no longer realize (a container's namespace gone while no vnetd ran) is left
    /// out and said. Then the derived links and routes of the last run, line by line; then the
    /// routes that waited for a link that is here now (the others wait on, saved). An error is
    /// the config file's part failing.
    pub fn restore(
        &self,
        local: &Config,
        file_part: &Config,
        derived: Option<&str>,
        pending: Pending,
    ) -> Result<Restore, String> {
        let mut notes = Vec::new();
        let mut st = self.lock();
        // Bounded as a configuration, not as a script: what the control port accepted in
        // many batches is longer than one script may be.
        let whole = parse_config(&local.to_script()).map_err(|e| e.to_string())?;
        let published = self.publish_before(&st, true);
        if apply_in(&mut st, &whole).is_err() {
            let file = parse_config(&file_part.to_script()).map_err(|e| e.to_string())?;
            apply_in(&mut st, &file).map_err(|e| format!("config file: {e}"))?;
            let rest = file_part.diff_script(local);
            for line in rest.lines() {
                let Ok(Some(cmd)) = parse_line(line) else {
                    continue;
                };
                if let Err(e) = apply_in(&mut st, &[(0, cmd)]) {
                    notes.push(format!("not restored: {line}: {e}"));
                }
            }
        }
        for line in derived.unwrap_or_default().lines() {
            let Ok(Some(cmd)) = parse_line(line) else {
                continue;
            };
            match apply_in(&mut st, &[(0, cmd.clone())]) {
                Ok(_) => {
                    if let Err(e) = st.derived.apply(&cmd) {
                        tracing::warn!("derived record out of step at {line}: {e}");
                    }
                }
                Err(e) => notes.push(format!("derived link or route not restored: {line}: {e}")),
            }
        }
        st.pending = pending;
        bring_back(&mut st);
        if !st.pending.is_empty() {
            notes.push(format!(
                "{} route(s) wait for their link (saved, shown in show config; in effect once the etcd agent derives it)",
                st.pending.len()
            ));
        }
        let whole = self.whole(&st);
        let derived_snap = self.derived_snapshot(&st);
        drop(published);
        drop(st);
        let saved = self.save_whole(whole);
        self.save_derived(derived_snap);
        Ok(Restore { notes, saved })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one line of the control language; Ok is the output (possibly empty).
    pub fn execute_line(&self, line: &str) -> Result<String, String> {
        // `teardown`: not a change of the configuration but the daemon's end (the control
        // port's own command, like `auth` and `batch`).
        if line.split_whitespace().eq(["teardown"]) {
            return self.request_teardown();
        }
        match parse_line(line) {
            Err(e) => Err(e.to_string()),
            Ok(None) => Ok(String::new()),
            Ok(Some(cmd)) if cmd.is_query() => Ok(self.query(&cmd)),
            Ok(Some(cmd)) => self.apply_commands(vec![(0, cmd)]),
        }
    }

    /// Stops the daemon and removes everything it made (devices, pinned kernel objects, state
    /// files): the main thread does it on its way out, as on SIGTERM.
    fn request_teardown(&self) -> Result<String, String> {
        self.teardown.store(true, Relaxed);
        signal_hook::low_level::raise(signal_hook::consts::SIGTERM)
            .map_err(|e| format!("cannot stop: {e}"))?;
        Ok("tearing down: the daemon stops and removes every device, kernel object and state file it made\n".into())
    }

    /// Validates and applies a whole script; one bad line refuses all of it.
    pub fn execute_script(&self, text: &str) -> Result<String, String> {
        let cmds = parse_script(text).map_err(|e| e.to_string())?;
        if let Some((line, _)) = cmds.iter().find(|(_, c)| c.is_query()) {
            return Err(format!("line {line}: show cannot be part of a script"));
        }
        self.apply_commands(cmds)
    }

    /// A change of the local configuration (config file, control port): acknowledged (Ok)
    /// only once it is on disk.
    fn apply_commands(&self, cmds: Vec<(usize, Command)>) -> Result<String, String> {
        let mut st = self.lock();
        // Deletes of routes that wait for their link: not the model's (it does not hold them).
        let (cmds, unwaited) = st.pending.deletes(cmds, &st.cfg);
        let pending_before = (!unwaited.is_empty()).then(|| st.pending.clone());
        let routes_only = cmds.iter().all(|(_, c)| is_route(c));
        let published = self.publish_before(&st, !routes_only);
        let applied = if cmds.is_empty() {
            Applied::default()
        } else {
            apply_undoable(&mut st, &cmds)?
        };
        let mut extra = String::new();
        for r in &unwaited {
            st.pending.forget(r);
            extra.push_str(&format!("route del {}\n", crate::pending::spec_of(r)));
        }
        let saving = match self.journal(&st, &applied.changes, &extra, !routes_only) {
            Ok(s) => s,
            Err(e) => {
                // Not on disk: taken back, so that what runs is what a restart restores.
                undo(&mut st, applied);
                if let Some(p) = pending_before {
                    st.pending = p;
                }
                return Err(format!(
                    "not applied: the state directory cannot be written ({e}); nothing changed"
                ));
            }
        };
        if applied
            .changes
            .iter()
            .any(|c| matches!(c, Change::AddLink(_)))
        {
            bring_back(&mut st);
        }
        self.local_changes.fetch_add(1, Relaxed);
        drop(published);
        drop(st);
        // On disk before the change is acknowledged.
        self.saved(saving).map_err(|e| {
            format!(
                "applied but NOT SAVED: {e}; the change is in effect and a restart would lose it (vnetd keeps trying to save it: show stats)"
            )
        })?;
        Ok(String::new())
    }

    /// Brings the derived part of the running configuration in line with the cluster's
    /// state: derives from the local configuration, applies the diff from what was applied
    /// before (as one atomic script, or command by command if that fails, so one refused
    /// command does not hold back the others), and records what was applied.
    #[cfg(test)]
    pub fn sync_cluster(&self, host: &vnet_cluster::HostId, state: &ClusterState) -> SyncReport {
        self.cluster_synced(Some(state));
        let derivation = vnet_cluster::derive(host, state, &self.local_config());
        self.apply_derivation(&derivation, None)
    }

    /// Records a synchronisation with the cluster for the HTTP listener's views: its time,
    /// and the state it derived from when the agent hands one over (at most about once a
    /// second: a copy costs the overlay's size).
    pub fn cluster_synced(&self, state: Option<&ClusterState>) {
        let mut seen = self.cluster_seen.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        match (state, seen.as_mut()) {
            (Some(s), _) => *seen = Some((now, s.clone())),
            (None, Some((at, _))) => *at = now,
            (None, None) => {}
        }
    }

    /// Reads the last synchronisation with the cluster (when it was, and the state the agent
    /// last handed over), if there was one.
    pub fn last_sync<T>(
        &self,
        f: impl FnOnce(std::time::Instant, &ClusterState) -> T,
    ) -> Option<T> {
        self.cluster_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(at, s)| f(*at, s))
    }

    /// Brings the derived part of the running configuration to `derivation` (the etcd agent
    /// derives incrementally and hands the result over here). With the agent's `delta` (what
    /// changed since its previous derivation) and a record that followed that derivation
    /// exactly, the delta is applied as it is; otherwise the record is compared with the whole
    /// derivation. The commands go as one script; when one is refused, the ones before it go
    /// as one script, it is reported, and the rest are tried the same way (not one by one).
    pub fn apply_derivation(
        &self,
        derivation: &vnet_cluster::Derivation,
        delta: Option<&[Command]>,
    ) -> SyncReport {
        let mut st = self.lock();
        let mut report = SyncReport {
            conflicts: derivation
                .conflicts
                .iter()
                .map(ToString::to_string)
                .collect(),
            ..Default::default()
        };
        let local_now = self.local_changes.load(Relaxed);
        let cmds: Vec<Command> = match delta {
            Some(d) if st.derived_in_step == Some(local_now) => d.to_vec(),
            _ => {
                let State { cfg, derived, .. } = &mut *st;
                derived.retain_present(cfg);
                vnet_cluster::diff(derived.config(), &derivation.config)
            }
        };
        if cmds.is_empty() {
            st.derived_in_step = Some(local_now);
            return report;
        }
        let published = self.publish_before(&st, !cmds.iter().all(is_route));
        let text =
            |c: &Command| vnet_cluster::render_command(c).unwrap_or_else(|| format!("{c:?}"));
        let mut rest: &[Command] = &cmds;
        let mut links_came = false;
        let mut local_went = 0;
        while !rest.is_empty() {
            let numbered: Vec<(usize, Command)> = rest.iter().cloned().map(|c| (0, c)).collect();
            let (ok, failed) = match apply_in_at(&mut st, &numbered) {
                Ok(a) => {
                    local_went += took_local_routes(&mut st, &a.changes);
                    links_came |= a.changes.iter().any(|c| matches!(c, Change::AddLink(_)));
                    (rest, None)
                }
                Err((i, e)) => {
                    // Everything before the refused command, as one script.
                    let before: Vec<(usize, Command)> = numbered[..i].to_vec();
                    match apply_in_at(&mut st, &before) {
                        Ok(a) => {
                            local_went += took_local_routes(&mut st, &a.changes);
                            links_came |= a.changes.iter().any(|c| matches!(c, Change::AddLink(_)));
                            (&rest[..i], Some((i, e)))
                        }
                        Err((j, e2)) => {
                            // Not expected (they went before it); report the first, go on after.
                            report.failed.push(format!("{}: {e2}", text(&rest[j])));
                            (&rest[..0], Some((j, e)))
                        }
                    }
                }
            };
            for c in ok {
                if let Err(e) = st.derived.apply(c) {
                    tracing::warn!("derived record out of step at {}: {e}", text(c));
                }
                report.applied.push(text(c));
            }
            match failed {
                None => rest = &[],
                Some((i, e)) => {
                    if !report.failed.iter().any(|f| f.starts_with(&text(&rest[i]))) {
                        report.failed.push(format!("{}: {e}", text(&rest[i])));
                    }
                    rest = &rest[i + 1..];
                }
            }
        }
        // Routes that waited for a link the agent brought are in effect again, and local
        // routes whose derived link went wait for it: the local configuration changed (the
        // agent derives from it, so it looks again).
        let came_back = if links_came { bring_back(&mut st) } else { 0 };
        if local_went + came_back > 0 {
            self.local_changes.fetch_add(1, Relaxed);
        }
        // A refused command is not in the record: the next sync compares the whole sets.
        st.derived_in_step = report.failed.is_empty().then_some(local_now);
        drop(published);
        drop(st);
        // Rendered by the writer when it writes (not here, under the lock, on every change).
        if let Some(saver) = &self.saver {
            saver.derived_changed();
        }
        report
    }

    /// The local configuration (what `show config` prints).
    pub fn local_config(&self) -> Config {
        self.lock().local_config()
    }

    /// `show stats json`.
    pub fn stats(&self) -> StatsReport {
        let control_errors = self.control_errors.load(Relaxed);
        let mut s = self.read(
            |st| stats_report(st, control_errors),
            |v| {
                let mut s = v.stats.clone();
                s.daemon.control_errors = control_errors;
                s
            },
        );
        s.state = self.state_status(s.state.pending_routes as usize);
        s
    }

    /// `show links json`.
    pub fn links(&self) -> Vec<LinkStatus> {
        self.read(link_rows, |v| v.links.clone())
    }

    /// The running configuration's interfaces.
    pub fn interfaces(&self) -> Vec<Interface> {
        self.read(|st| st.cfg.interfaces.clone(), |v| v.interfaces.clone())
    }

    /// `show matrix json`.
    pub fn matrix_report(&self) -> MatrixReport {
        self.read(matrix_of, |v| v.matrix.clone())
    }

    /// The traffic matrix of this host.
    pub fn matrix(&self) -> Vec<vnet_core::MatrixEntry> {
        self.read(|st| st.engine.matrix().0, |v| v.matrix.pairs.clone())
    }

    /// Sends frames into the overlay as if the guest behind interface `name` had sent them.
    pub fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        self.lock().engine.inject_from_interface(name, frames)
    }

    /// `show cluster`: the agent's status and what it applied.
    pub fn cluster_report(&self) -> ClusterReport {
        let agent = self
            .cluster_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ClusterReport {
            agent,
            derived: self.read(derived_lines, |v| v.derived.clone()),
        }
    }

    /// `show interfaces`: the configuration of each interface, and which data path serves it.
    pub fn interface_table(&self) -> InterfaceTable {
        self.read(interface_rows, |v| v.interface_table.clone())
    }

    /// `show routes`.
    pub fn routes(&self) -> Vec<RouteStatus> {
        self.read(route_rows, |v| v.routes.clone())
    }

    /// `show routes to MAC`: the routes whose destination matches `mac`, in table order.
    pub fn routes_to(&self, mac: MacAddr) -> Vec<RouteStatus> {
        self.read(|st| route_rows_to(st, mac), |v| rows_to(&v.routes, mac))
    }

    /// `show listeners`.
    pub fn listeners(&self) -> ListenerTable {
        self.read(
            |st| ListenerTable(st.cfg.listeners.clone()),
            |v| v.listeners.clone(),
        )
    }
}

fn record_ports(saver: &Saver, p: Ports) {
    saver.update_resources(|r| {
        r.made = p.made.into_iter().map(|d| (d.netns, d.ifname)).collect();
        r.set_forwarding(&p.forwarding);
    });
}

fn interface_rows(st: &State) -> InterfaceTable {
    InterfaceTable(
        st.cfg
            .interfaces
            .iter()
            .map(|i| InterfaceStatus {
                interface: i.clone(),
                path: st
                    .engine
                    .port_status(DestKind::Interface, &i.name)
                    .map(|p| p.path),
            })
            .collect(),
    )
}

/// The rows of the routes whose destination matches `mac` (few: each looks its VNI up).
fn route_rows_to(st: &State, mac: MacAddr) -> Vec<RouteStatus> {
    let c = &st.cfg;
    c.routes
        .iter()
        .filter(|r| r.dst.matches(mac))
        .map(|r| RouteStatus::new(r, c))
        .collect()
}

/// The rows of a published view whose destination matches `mac`.
fn rows_to(rows: &[RouteStatus], mac: MacAddr) -> Vec<RouteStatus> {
    rows.iter()
        .filter(|r| row_dst_matches(&r.dst, mac))
        .cloned()
        .collect()
}

/// Whether a route row's destination (as `MacMatch` renders it) matches `mac`; tested
/// against `MacMatch::matches` for every form `MacMatch` renders.
fn row_dst_matches(dst: &str, mac: MacAddr) -> bool {
    let one = |s: &str| match s {
        "broadcast" => Some(MacAddr::BROADCAST),
        s => s.parse::<MacAddr>().ok(),
    };
    if dst == "any" {
        return true;
    }
    match dst.strip_prefix("not ") {
        Some(m) => one(m).is_some_and(|m| m != mac),
        None => one(dst) == Some(mac),
    }
}

/// Every route's row; the destinations' VNIs are looked up once (`show routes` is what a
/// poller asks every daemon for: scanning the ports for each route made it quadratic).
fn route_rows(st: &State) -> Vec<RouteStatus> {
    let c = &st.cfg;
    let vnis: std::collections::HashMap<(DestKind, &str), u32> = c
        .interfaces
        .iter()
        .map(|i| ((DestKind::Interface, i.name.as_str()), i.vni))
        .chain(
            c.links
                .iter()
                .map(|l| ((DestKind::Link, l.name.as_str()), l.vni)),
        )
        .collect();
    c.routes
        .iter()
        .map(|r| {
            let vni = vnis.get(&(r.to.kind, r.to.name.as_str())).copied();
            RouteStatus::at(r, vni.unwrap_or(0))
        })
        .collect()
}

fn derived_lines(st: &State) -> Vec<String> {
    st.derived
        .commands()
        .iter()
        .filter_map(vnet_cluster::render_command)
        .collect()
}

fn matrix_of(st: &State) -> MatrixReport {
    let (pairs, overflow) = st.engine.matrix();
    MatrixReport { pairs, overflow }
}

fn to_json_line<T: serde::Serialize>(v: &T) -> String {
    let mut out = serde_json::to_string(v).unwrap_or_default();
    out.push('\n');
    out
}

fn stats_report(st: &State, control_errors: u64) -> StatsReport {
    let mut ports = Vec::new();
    for i in &st.cfg.interfaces {
        ports.extend(st.engine.port_status(DestKind::Interface, &i.name));
    }
    for l in &st.cfg.links {
        ports.extend(st.engine.port_status(DestKind::Link, &l.name));
    }
    let daemon = st.engine.daemon_counters();
    StatsReport {
        ports,
        daemon: DaemonCounters {
            rx_datagrams: daemon.rx_frames,
            rx_bytes: daemon.rx_bytes,
            drops: daemon.drops,
            control_errors,
        },
        state: StateStatus {
            pending_routes: st.pending.len() as u64,
            ..StateStatus::default()
        },
        dispatch: st.engine.dispatch_status(),
        kernel: st.engine.kernel_status(),
    }
}

fn link_rows(st: &State) -> Vec<LinkStatus> {
    st.cfg
        .links
        .iter()
        .map(|l| {
            LinkStatus::new(
                l,
                st.engine.link_state(&l.name),
                st.cfg.link_rates.get(&l.name).copied(),
                st.engine.link_crypto(&l.name),
            )
        })
        .collect()
}

/// An error at a script's line; 0 means a single command (no line number).
fn at(line: usize, msg: String) -> String {
    if line == 0 {
        msg
    } else {
        format!("line {line}: {msg}")
    }
}

/// Applies commands to the running configuration and the engine atomically: all or none;
/// returns what changed. `line` 0 means a single command (no line number in errors).
fn apply_in(st: &mut State, cmds: &[(usize, Command)]) -> Result<Vec<Change>, String> {
    apply_in_at(st, cmds).map(|a| a.changes).map_err(|(_, e)| e)
}

/// [`apply_in`], with what it takes to undo it.
fn apply_undoable(st: &mut State, cmds: &[(usize, Command)]) -> Result<Applied, String> {
    apply_in_at(st, cmds).map_err(|(_, e)| e)
}

/// Takes back what [`apply_undoable`] did (a change that could not be saved).
fn undo(st: &mut State, a: Applied) {
    for c in a.changes.iter().rev() {
        if let Err(e) = st.engine.apply(&c.inverse()) {
            tracing::error!("could not undo {c:?}: {e}");
        }
    }
    match a.before {
        Some(cfg) => {
            st.cfg = cfg;
            let State { cfg, engine, .. } = &mut *st;
            engine.rebuild(cfg);
        }
        None => {
            let routes: Vec<RouteChange> = a
                .changes
                .into_iter()
                .filter_map(|c| match c {
                    Change::Route(rc) => Some(rc),
                    _ => None,
                })
                .collect();
            st.cfg.undo_routes(&routes);
            st.engine.publish_routes();
        }
    }
}

/// Routes that wait for a link the configuration has now go back into effect (one it
/// refuses waits on). Returns how many.
fn bring_back(st: &mut State) -> usize {
    let ready = st.pending.ready(&st.cfg);
    let mut n = 0;
    for cmd in ready {
        match apply_in(st, &[(0, cmd.clone())]) {
            Ok(_) => n += 1,
            Err(_) => st.pending.put_back(&cmd),
        }
    }
    n
}

/// A link of the agent's that went took local routes along (a route of the local
/// configuration to a derived link): they wait for it to come back, saved as before.
/// Called before the record takes the agent's commands in. Returns how many.
fn took_local_routes(st: &mut State, changes: &[Change]) -> usize {
    let mut n = 0;
    for c in changes {
        if let Change::Route(RouteChange::Removed { route, .. }) = c {
            if !st.derived.has_route(route) {
                st.pending.push(route.clone());
                n += 1;
            }
        }
    }
    n
}

/// [`apply_in`], saying which command (its index in `cmds`) was refused.
fn apply_in_at(st: &mut State, cmds: &[(usize, Command)]) -> Result<Applied, (usize, String)> {
    if cmds.iter().all(|(_, c)| is_route(c)) {
        return apply_routes_in(st, cmds);
    }
    let mut cfg = st.cfg.clone();
    let mut changes: Vec<(usize, usize, Change)> = Vec::new();
    let mut gen = MacAddr::random;
    for (i, (line, cmd)) in cmds.iter().enumerate() {
        match cfg.apply(cmd, &mut gen) {
            Ok(ch) => changes.extend(ch.into_iter().map(|c| (i, *line, c))),
            Err(e) => return Err((i, at(*line, e.to_string()))),
        }
    }
    #[cfg(test)]
    if let Some(hook) = st.before_engine.as_mut() {
        hook();
    }
    for (k, (i, line, ch)) in changes.iter().enumerate() {
        if let Err(e) = st.engine.apply(ch) {
            // Undo what this script already did in the OS, newest first.
            for (_, _, prev) in changes[..k].iter().rev() {
                if let Err(undo) = st.engine.apply(&prev.inverse()) {
                    tracing::error!("could not undo {prev:?}: {undo}");
                }
            }
            let old = st.cfg.clone();
            st.engine.rebuild(&old);
            return Err((*i, at(*line, e.to_string())));
        }
    }
    let before = std::mem::replace(&mut st.cfg, cfg);
    let State { cfg, engine, .. } = &mut *st;
    engine.rebuild(cfg);
    Ok(Applied {
        changes: changes.into_iter().map(|(_, _, c)| c).collect(),
        before: Some(before),
    })
}

fn is_route(c: &Command) -> bool {
    matches!(c, Command::Route(..))
}

/// Route commands alone, the common case (the etcd agent's moves, joins and leaves): the
/// configuration changes in place and a refused line takes back the lines before it (no copy
/// of the configuration), and the engine applies the typed changes to the destinations they
/// touch (no rebuild). Route changes cannot fail in the engine.
fn apply_routes_in(st: &mut State, cmds: &[(usize, Command)]) -> Result<Applied, (usize, String)> {
    let mut done: Vec<vnet_control::RouteChange> = Vec::new();
    let mut gen = MacAddr::random;
    for (i, (line, cmd)) in cmds.iter().enumerate() {
        match st.cfg.apply(cmd, &mut gen) {
            Ok(ch) => done.extend(ch.into_iter().filter_map(|c| match c {
                Change::Route(rc) => Some(rc),
                _ => None,
            })),
            Err(e) => {
                st.cfg.undo_routes(&done);
                return Err((i, at(*line, e.to_string())));
            }
        }
    }
    let changes: Vec<Change> = done.into_iter().map(Change::Route).collect();
    for c in &changes {
        if let Err(e) = st.engine.apply(c) {
            tracing::error!("a route change failed in the engine: {e}");
        }
    }
    st.engine.publish_routes();
    Ok(Applied {
        changes,
        before: None,
    })
}

impl Daemon {
    /// Answers a `show`: the typed status, as text (its `Display`) or as one line of JSON.
    fn query(&self, cmd: &Command) -> String {
        let Command::Show(what, json) = cmd else {
            return String::new();
        };
        fn shown<T: serde::Serialize + std::fmt::Display>(v: &T, json: bool) -> String {
            if json {
                to_json_line(v)
            } else {
                v.to_string()
            }
        }
        let json = *json;
        let mut out = match what {
            // The local configuration only; derived objects are in `show cluster`.
            ShowWhat::Config => {
                let (cfg, pending) = self.read(
                    |st| (st.local_config(), st.pending.shown()),
                    |v| (v.local_config.clone(), v.pending_shown.clone()),
                );
                cfg.to_script() + &pending
            }
            ShowWhat::Interfaces => shown(&self.interface_table(), json),
            ShowWhat::Links => shown(&LinkTable(self.links()), json),
            ShowWhat::Routes(None) => shown(&RouteTable(self.routes()), json),
            ShowWhat::Routes(Some(mac)) => shown(&RouteTable(self.routes_to(*mac)), json),
            ShowWhat::Listeners => shown(&self.listeners(), json),
            ShowWhat::Stats => shown(&self.stats(), json),
            ShowWhat::Cluster => shown(&self.cluster_report(), json),
            ShowWhat::Reach => shown(
                &self.reach.get().map(|r| r.report()).unwrap_or_default(),
                json,
            ),
            ShowWhat::Matrix => shown(&self.matrix_report(), json),
        };
        if json && !out.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    /// Stops the data path: with [`Leave::Keep`] what vnetd made stays for the next vnetd,
    /// with [`Leave::Remove`] it goes.
    pub fn shutdown(&self, leave: Leave) {
        self.lock().engine.shutdown(leave);
    }
}

#[cfg(test)]
mod tests;
