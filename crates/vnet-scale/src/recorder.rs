//! The harness's data plane: implements the agent's seam (`vnet_agent::DataPlane`) by
//! recording what the agent derives, applying nothing to the OS. Each recorder can hold a
//! probe, a set of routes that must be present or absent; the time at which the recorded
//! configuration first satisfies it is that agent's convergence time for the step.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vnet_agent::{DataPlane, SyncReport};
use vnet_cluster::{ClusterState, DerivedConfig, HostId};
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config, Route};

/// Routes that must be present (`want`) or absent (`gone`) in the recorded configuration.
/// Kept up to date from the commands applied (so a probe costs the size of the change, not
/// of the configuration, and does not weigh on the agent CPU measured).
pub struct Probe {
    pub since: Instant,
    pub want: Vec<Route>,
    pub gone: Vec<Route>,
    /// Of `want`, those not present yet; of `gone`, those still present.
    missing: Vec<Route>,
    present: Vec<Route>,
    pub done: Option<Duration>,
}

impl Probe {
    pub fn new(since: Instant, want: Vec<Route>, gone: Vec<Route>) -> Probe {
        Probe {
            since,
            want,
            gone,
            missing: Vec::new(),
            present: Vec::new(),
            done: None,
        }
    }

    fn start(&mut self, derived: &DerivedConfig) {
        self.missing = self
            .want
            .iter()
            .filter(|r| !derived.routes.contains(r))
            .cloned()
            .collect();
        self.present = self
            .gone
            .iter()
            .filter(|r| derived.routes.contains(r))
            .cloned()
            .collect();
        self.check();
    }

    fn observe(&mut self, cmd: &Command) {
        let Command::Route(op, spec) = cmd else {
            return;
        };
        let r = Route {
            src: spec.src,
            dst: spec.dst,
            to: spec.to.clone(),
        };
        match op {
            vnet_control::RouteOp::Add => {
                self.missing.retain(|m| *m != r);
                if self.gone.contains(&r) && !self.present.contains(&r) {
                    self.present.push(r);
                }
            }
            vnet_control::RouteOp::Del => {
                self.present.retain(|m| *m != r);
                if self.want.contains(&r) && !self.missing.contains(&r) {
                    self.missing.push(r);
                }
            }
            vnet_control::RouteOp::Replace => {}
        }
    }

    fn check(&mut self) {
        if self.done.is_none() && self.missing.is_empty() && self.present.is_empty() {
            self.done = Some(self.since.elapsed());
        }
    }
}

pub struct Recorder {
    local: Mutex<Config>,
    local_changes: AtomicU64,
    derived: Mutex<DerivedConfig>,
    probe: Mutex<Option<Probe>>,
    pub syncs: AtomicU64,
    pub commands: AtomicU64,
    pub connected: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub fn new(local: Config) -> Recorder {
        Recorder {
            local: Mutex::new(local),
            local_changes: AtomicU64::new(0),
            derived: Mutex::new(DerivedConfig::default()),
            probe: Mutex::new(None),
            syncs: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            connected: Default::default(),
        }
    }

    /// Changes the local configuration (a VM arriving), as the control port would.
    pub fn change_local(&self, cmd: &Command) -> anyhow::Result<()> {
        let mut local = lock(&self.local);
        local
            .apply(cmd, &mut || vnet_wire::MacAddr::ZERO)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.local_changes.fetch_add(1, Relaxed);
        Ok(())
    }

    pub fn derived(&self) -> DerivedConfig {
        lock(&self.derived).clone()
    }

    /// Sets a probe, checked now and after every synchronisation.
    pub fn set_probe(&self, mut probe: Probe) {
        let derived = lock(&self.derived);
        probe.start(&derived);
        *lock(&self.probe) = Some(probe);
    }

    pub fn take_probe(&self) -> Option<Probe> {
        lock(&self.probe).take()
    }

    pub fn probe_done(&self) -> bool {
        lock(&self.probe).as_ref().is_none_or(|p| p.done.is_some())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DataPlane for Recorder {
    fn local_config(&self) -> Config {
        lock(&self.local).clone()
    }

    fn local_changes(&self) -> u64 {
        self.local_changes.load(Relaxed)
    }

    fn sync_cluster(&self, host: &HostId, state: &ClusterState) -> SyncReport {
        let local = self.local_config();
        let derivation = vnet_cluster::derive(host, state, &local);
        let mut derived = lock(&self.derived);
        let cmds = vnet_cluster::diff(&derived, &derivation.config);
        let mut report = SyncReport {
            conflicts: derivation.conflicts.iter().map(ToString::to_string).collect(),
            ..SyncReport::default()
        };
        let mut probe = lock(&self.probe);
        for c in &cmds {
            if let Some(p) = probe.as_mut() {
                p.observe(c);
            }
            match derived.apply(c) {
                Ok(()) => report
                    .applied
                    .push(vnet_cluster::render_command(c).unwrap_or_default()),
                Err(e) => report.failed.push(e.to_string()),
            }
        }
        self.syncs.fetch_add(1, Relaxed);
        self.commands.fetch_add(cmds.len() as u64, Relaxed);
        if let Some(p) = probe.as_mut() {
            p.check();
        }
        report
    }

    fn matrix(&self) -> Vec<vnet_core::MatrixEntry> {
        Vec::new()
    }

    fn inject_from_interface(&self, _name: &str, _frames: &[Vec<u8>]) -> bool {
        true
    }

    fn set_cluster_status(&self, status: ClusterStatus) {
        self.connected.store(status.connected, Relaxed);
    }
}
