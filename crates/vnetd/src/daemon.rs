//! The daemon: the answers to control-language commands and every other thread's way to the
//! state. The state has one owner (`daemon/owner.rs`, a thread that takes changes over a
//! channel and publishes a view after each); this module is what the control port, the etcd
//! agent, the reach thread, the HTTP listener and `main` call. Its parts:
//!
//! - `owner.rs`: the owner thread, its inbox, the state it holds;
//! - `apply.rs`: the change transactions (all or none, in place, the engine following): a
//!   command of the control port journaled, the etcd agent's derivations, the start's restore;
//! - `saving.rs`: the journal's record of a change and when it may be acknowledged;
//! - `view.rs`: what readers see, and every `show` rendered from it.
//!
//! A change of the local configuration is acknowledged only once it is on disk (issue 32): a
//! journal record that cannot be written undoes the change and refuses the command (nothing
//! changed); a record that cannot be synced is saved by a whole write instead, and when that
//! fails too the command fails saying the change is in effect and not saved (`persist.rs`).
//! Readers (`show`, `/metrics`, the live view, the agent's look at the local configuration)
//! load the last published view and never wait for a change in progress.

mod apply;
mod owner;
mod saving;
mod view;
mod view_routes;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use vnet_agent::SyncReport;
use vnet_cluster::ClusterState;
use vnet_control::status::{
    ClusterReport, ClusterStatus, InterfaceTable, LinkStatus, LinkTable, ListenerTable,
    MatrixReport, RouteStatus, RouteTable, StateStatus, StatsReport,
};
use vnet_control::Interface;
use vnet_control::{parse_config, parse_line, parse_script, Command, Config, ShowWhat};
use vnet_core::LockRecover;
use vnet_dataplane::{Engine, Leave};
use vnet_wire::MacAddr;

use crate::pending::Pending;
use crate::persist::Saver;
use apply::{apply_commands_in, derivation_in, restore_in};
pub use owner::State;
use owner::{Common, Inbox};
use view::View;

pub struct Daemon {
    /// The owner thread's inbox: every change goes there.
    inbox: Inbox,
    /// What the owner and the other threads share: the saver, the view.
    common: Arc<Common>,
    /// Refused control connections, bad control lines and failed authentications.
    pub control_errors: AtomicU64,
    /// The etcd agent's status for `show cluster` (None without `--etcd`).
    pub cluster_status: Mutex<Option<ClusterStatus>>,
    /// The cluster state of the last synchronisation and when it was (for the metrics and the
    /// live view; None before the first).
    pub cluster_seen: Mutex<Option<(std::time::Instant, ClusterState)>>,
    /// `teardown` was asked for on the control port: the daemon removes everything it made
    /// on its way out.
    pub teardown: AtomicBool,
    /// The control port takes no token (every local user controls the daemon): said in
    /// `show stats` and `/metrics`.
    pub control_without_token: AtomicBool,
    /// `show links`' last text (`View::links_text`).
    links_text: view::LinksTextCache,
    /// The reach thread's handle (`--etcd`): `show reach`.
    pub reach: std::sync::OnceLock<Arc<crate::reach_handle::Handle>>,
    /// Called on the caller's thread by a change before it goes to the owner (tests: a
    /// handler that panics).
    #[cfg(test)]
    pub before_change: Mutex<Option<Box<dyn Fn() + Send>>>,
}

/// What a start's restore did.
pub struct Restore {
    /// What was left out, in words.
    pub notes: Vec<String>,
    /// Whether the configuration as restored is on disk (Err: why not).
    pub saved: Result<(), String>,
}

fn to_json_line<T: serde::Serialize>(v: &T) -> String {
    let mut out = serde_json::to_string(v).unwrap_or_default();
    out.push('\n');
    out
}

impl Daemon {
    pub fn new(mut engine: Engine, saver: Option<Saver>) -> Daemon {
        let first = View {
            ports: Arc::new(Config::default()),
            routes: Default::default(),
            derived: Default::default(),
            pending: Arc::new(Pending::default()),
            engine: engine.status(),
        };
        let common = Arc::new(Common {
            saver,
            local_changes: AtomicU64::new(0),
            derived_generation: AtomicU64::new(0),
            views_published: AtomicU64::new(0),
            view: ArcSwap::from_pointee(first),
        });
        Daemon {
            inbox: Inbox::start(engine, common.clone()),
            common,
            control_errors: AtomicU64::new(0),
            cluster_status: Mutex::new(None),
            cluster_seen: Mutex::new(None),
            teardown: AtomicBool::new(false),
            control_without_token: AtomicBool::new(false),
            links_text: Default::default(),
            reach: std::sync::OnceLock::new(),
            #[cfg(test)]
            before_change: Mutex::new(None),
        }
    }

    /// The last published view (a reader's whole answer comes from one).
    fn view(&self) -> Arc<View> {
        self.common.view.load_full()
    }

    /// Runs `f` on the owner thread and waits for it (changes, and the few reads that need
    /// the state itself: a start's bookkeeping, the writer's renderings).
    pub fn with_state<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> T + Send + 'static,
    ) -> Result<T, String> {
        self.inbox.run(move |o| f(&mut o.st))
    }

    pub fn saver(&self) -> Option<&Saver> {
        self.common.saver.as_ref()
    }

    /// Changes of the local configuration so far (the etcd agent re-derives when it moved).
    pub fn local_changes(&self) -> u64 {
        self.common.local_changes.load(Relaxed)
    }

    /// How the state directory's writes go, and who may control the daemon (`pending`: the
    /// routes waiting for their link).
    fn state_status(&self, pending: u64) -> StateStatus {
        let h = self.saver().map(Saver::health).unwrap_or_default();
        StateStatus {
            failing: h.failing,
            unsaved: h.unsaved,
            errors: h.errors,
            last_error: h.last_error,
            pending_routes: pending,
            control_without_token: self.control_without_token.load(Relaxed),
        }
    }

    /// The local configuration rendered for a compaction of the journal (the state
    /// directory's writer calls this; it waits for the owner).
    pub fn render_local(&self) -> Option<(u64, String)> {
        self.inbox.run(|o| o.render_local()).ok().flatten()
    }

    /// The derived configuration rendered now, for the state directory's writer.
    pub fn render_derived(&self) -> Option<(u64, String)> {
        self.inbox.run(|o| o.derived_snapshot()).ok().flatten()
    }

    /// Ends the takeover of an earlier vnetd's kernel fast path (after `restore`), and records
    /// what it changed on the devices.
    pub fn commit_takeover(&self) {
        let w = self.inbox.run(|o| {
            o.st.engine.commit_kernel_takeover();
            o.whole()
        });
        if let Err(e) = w.and_then(|w| self.common.save_whole(w)) {
            tracing::warn!("state: {e}");
        }
    }

    /// The devices vnetd made for the ports it has now.
    pub fn made_devices(&self) -> Vec<vnet_dataplane::made::MadeDevice> {
        self.with_state(|st| st.engine.made_devices())
            .unwrap_or_default()
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
        // Bounded as a configuration, not as a script: what the control port accepted in
        // many batches is longer than one script may be.
        let whole = parse_config(&local.to_script()).map_err(|e| e.to_string())?;
        let file = file_part.to_script();
        let rest = file_part.diff_script(local);
        let derived = derived.unwrap_or_default().to_string();
        let (notes, whole, derived_snap) = self
            .inbox
            .run(move |o| restore_in(o, &whole, &file, &rest, &derived, pending))??;
        let saved = self.common.save_whole(whole);
        self.common.save_derived(derived_snap);
        Ok(Restore { notes, saved })
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

    /// A change of the local configuration (config file, control port): applied and
    /// journaled by the owner, acknowledged (Ok) here only once it is on disk.
    fn apply_commands(&self, cmds: Vec<(usize, Command)>) -> Result<String, String> {
        #[cfg(test)]
        if let Some(hook) = &*self.before_change.lock_or_recover() {
            hook();
        }
        let saving = self.inbox.run(move |o| apply_commands_in(o, cmds))??;
        // On disk before the change is acknowledged.
        self.common.saved(saving).map_err(|e| {
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
        let mut seen = self.cluster_seen.lock_or_recover();
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
            .lock_or_recover()
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
        let conflicts: Vec<String> = derivation
            .conflicts
            .iter()
            .map(ToString::to_string)
            .collect();
        let derived = derivation.config.clone();
        let delta = delta.map(<[Command]>::to_vec);
        let report = self
            .inbox
            .run(move |o| derivation_in(o, &derived, delta.as_deref()));
        let mut report = report.unwrap_or_else(|e| SyncReport {
            failed: vec![e],
            ..Default::default()
        });
        report.conflicts = conflicts;
        // Rendered by the writer when it writes (not here, on every change).
        if let Some(saver) = self.saver() {
            saver.derived_changed();
        }
        report
    }

    /// The local configuration (what `show config` prints, what the agent derives from).
    pub fn local_config(&self) -> Config {
        self.view().local_config()
    }

    /// `show stats json`.
    pub fn stats(&self) -> StatsReport {
        let mut s = self.view().stats(self.control_errors.load(Relaxed));
        s.state = self.state_status(s.state.pending_routes);
        s
    }

    /// `show links json`.
    pub fn links(&self) -> Vec<LinkStatus> {
        self.view().links()
    }

    /// The running configuration's interfaces.
    pub fn interfaces(&self) -> Vec<Interface> {
        self.view().interfaces()
    }

    /// `show matrix json`.
    pub fn matrix_report(&self) -> MatrixReport {
        self.view().matrix()
    }

    /// The traffic matrix of this host.
    pub fn matrix(&self) -> Vec<vnet_core::MatrixEntry> {
        self.view().engine.matrix().0
    }

    /// Sends frames into the overlay as if the guest behind interface `name` had sent them.
    pub fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        self.view().engine.inject_from_interface(name, frames)
    }

    /// `show cluster`: the agent's status and what it applied.
    pub fn cluster_report(&self) -> ClusterReport {
        let agent = self.cluster_status.lock_or_recover().clone();
        ClusterReport {
            agent,
            derived: self.view().derived_lines(),
        }
    }

    /// `show interfaces`: the configuration of each interface, and which data path serves it.
    pub fn interface_table(&self) -> InterfaceTable {
        self.view().interface_table()
    }

    /// `show routes`, or the routes whose destination matches `to`, in table order.
    pub fn routes(&self, to: Option<MacAddr>) -> Vec<RouteStatus> {
        self.view().routes(to)
    }

    /// `show listeners`.
    pub fn listeners(&self) -> ListenerTable {
        self.view().listeners()
    }

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
            ShowWhat::Config => self.view().config_text(),
            ShowWhat::Interfaces => shown(&self.interface_table(), json),
            ShowWhat::Links if json => to_json_line(&LinkTable(self.links())),
            ShowWhat::Links => self.view().links_text(&self.links_text).to_string(),
            ShowWhat::Routes(to) => shown(&RouteTable(self.routes(*to)), json),
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

    /// What the reach thread needs of the data path: its shared state (the inbox, a relay's
    /// table, the clock) and the VXLAN socket.
    pub fn reach_edge(
        &self,
    ) -> Option<(
        Arc<vnet_dataplane::shared::Shared>,
        Arc<vnet_dataplane::vxlan_socket::VxlanSocket>,
    )> {
        self.with_state(|st| (st.engine.shared().clone(), st.engine.udp_socket().clone()))
            .ok()
    }

    /// Points the links to the peer with probe key `key` at `path`, without waiting (the
    /// reach thread must not wait for a change in progress).
    pub fn set_reach_path(&self, key: vnet_crypto::PublicKey, path: vnet_dataplane::ReachPath) {
        self.inbox
            .post(move |o| o.st.engine.set_reach_path(key, path));
    }

    /// A relay's admitted pairs to the kernel, and what the kernel forwarded into the relay's
    /// counts, without waiting (`Engine::sync_relay_pairs`).
    pub fn sync_relay_pairs(&self, now_ms: u64) {
        self.inbox
            .post(move |o| o.st.engine.sync_relay_pairs(now_ms));
    }

    /// Stops the data path: with [`Leave::Keep`] what vnetd made stays for the next vnetd,
    /// with [`Leave::Remove`] it goes.
    pub fn shutdown(&self, leave: Leave) {
        let _ = self.with_state(move |st| st.engine.shutdown(leave));
    }
}

impl Drop for Daemon {
    /// The owner thread ends with the daemon (its state, the engine included, dropped there:
    /// the engine's drop never removes what vnetd made).
    fn drop(&mut self) {
        self.inbox.stop();
    }
}

#[cfg(test)]
mod tests;
