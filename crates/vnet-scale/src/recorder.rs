//! The harness's data plane: implements the agent's seam (`vnet_agent::DataPlane`) by
//! recording what the agent derives, applying nothing to the OS. Each recorder can hold a
//! probe, a set of routes that must be present or absent; the time at which the recorded
//! configuration first satisfies it is that agent's convergence time for the step.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vnet_agent::{DataPlane, StartRead, SyncReport};
use vnet_cluster::{Derivation, DerivedConfig};
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config, Route};
use vnet_core::LockRecover;

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
    /// When each route of `want` was first present, and each of `gone` first absent (since
    /// `since`): per-change times within a step of many changes (the storm).
    pub want_at: Vec<Option<Duration>>,
    pub gone_at: Vec<Option<Duration>>,
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
            want_at: Vec::new(),
            gone_at: Vec::new(),
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
        let now = self.since.elapsed();
        self.want_at = self
            .want
            .iter()
            .map(|r| (!self.missing.contains(r)).then_some(now))
            .collect();
        self.gone_at = self
            .gone
            .iter()
            .map(|r| (!self.present.contains(r)).then_some(now))
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
        let now = self.since.elapsed();
        let first = |routes: &[Route], at: &mut [Option<Duration>]| {
            for (w, t) in routes.iter().zip(at.iter_mut()) {
                if *w == r && t.is_none() {
                    *t = Some(now);
                }
            }
        };
        match op {
            vnet_control::RouteOp::Add => first(&self.want, &mut self.want_at),
            vnet_control::RouteOp::Del => first(&self.gone, &mut self.gone_at),
            vnet_control::RouteOp::Replace => {}
        }
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
    /// The agent's leases: the one it holds and how many it lost (see [`LeaseCount`]).
    leases: Mutex<LeaseCount>,
    /// What each of the agent's whole reads of the overlay took (one per start, unless its
    /// revision was compacted away).
    reads: Mutex<Vec<StartRead>>,
}

/// The leases an agent went through, from the lease its status shows: every lease after the
/// first is one lost (expired or revoked: the agent grants a new one only then), and with it
/// the host left the overlay for a while and registered again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeaseCount {
    held: Option<String>,
    pub lost: u64,
}

impl LeaseCount {
    pub fn saw(&mut self, lease: Option<&str>) {
        let Some(l) = lease else { return };
        if self.held.as_deref() != Some(l) {
            if self.held.is_some() {
                self.lost += 1;
            }
            self.held = Some(l.to_string());
        }
    }
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
            leases: Mutex::new(LeaseCount::default()),
            reads: Mutex::new(Vec::new()),
        }
    }

    /// The agent's whole reads of the overlay so far.
    pub fn reads(&self) -> Vec<StartRead> {
        self.reads.lock_or_recover().clone()
    }

    /// How many leases the agent lost so far.
    pub fn leases_lost(&self) -> u64 {
        self.leases.lock_or_recover().lost
    }

    /// Changes the local configuration (a VM arriving), as the control port would.
    pub fn change_local(&self, cmd: &Command) -> anyhow::Result<()> {
        let mut local = self.local.lock_or_recover();
        local
            .apply(cmd, &mut || vnet_wire::MacAddr::ZERO)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.local_changes.fetch_add(1, Relaxed);
        Ok(())
    }

    pub fn derived(&self) -> DerivedConfig {
        self.derived.lock_or_recover().clone()
    }

    /// The numbers of derived links and routes (without copying them: the bring-up loop asks
    /// every agent every 50 ms, and at 1,000 hosts a copy is 8,000 routes).
    pub fn counts(&self) -> (usize, usize) {
        let d = self.derived.lock_or_recover();
        (d.links.len(), d.routes.len())
    }

    /// Sets a probe, checked now and after every synchronisation.
    pub fn set_probe(&self, mut probe: Probe) {
        let derived = self.derived.lock_or_recover();
        probe.start(&derived);
        *self.probe.lock_or_recover() = Some(probe);
    }

    pub fn take_probe(&self) -> Option<Probe> {
        self.probe.lock_or_recover().take()
    }

    pub fn probe_done(&self) -> bool {
        self.probe
            .lock_or_recover()
            .as_ref()
            .is_none_or(|p| p.done.is_some())
    }
}

impl DataPlane for Recorder {
    fn local_config(&self) -> Config {
        self.local.lock_or_recover().clone()
    }

    fn local_changes(&self) -> u64 {
        self.local_changes.load(Relaxed)
    }

    fn apply_derived(&self, derivation: &Derivation, delta: Option<&[Command]>) -> SyncReport {
        let mut derived = self.derived.lock_or_recover();
        let mut probe = self.probe.lock_or_recover();
        // The agent's delta when given (the cost of the change); the whole diff otherwise, or
        // when the delta does not apply (the record would then differ from the derivation).
        let mut cmds: Vec<Command> = Vec::new();
        let mut whole = delta.is_none();
        for c in delta.unwrap_or_default() {
            if derived.apply(c).is_err() {
                whole = true;
                break;
            }
            cmds.push(c.clone());
        }
        // A cheap sanity check of the delta; the harness's correctness check compares all.
        whole |= derived.links.len() != derivation.config.links.len()
            || derived.routes.len() != derivation.config.routes.len();
        if whole {
            let rest = vnet_cluster::diff(&derived, &derivation.config);
            for c in &rest {
                let _ = derived.apply(c);
            }
            cmds.extend(rest);
        }
        let report = SyncReport {
            applied: cmds
                .iter()
                .filter_map(vnet_cluster::render_command)
                .collect(),
            failed: Vec::new(),
            conflicts: derivation
                .conflicts
                .iter()
                .map(ToString::to_string)
                .collect(),
        };
        if let Some(p) = probe.as_mut() {
            for c in &cmds {
                p.observe(c);
            }
            p.check();
        }
        self.syncs.fetch_add(1, Relaxed);
        self.commands.fetch_add(cmds.len() as u64, Relaxed);
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
        self.leases.lock_or_recover().saw(status.lease.as_deref());
    }

    fn read_at_start(&self, read: &StartRead) {
        self.reads.lock_or_recover().push(read.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseCount;

    #[test]
    fn every_lease_after_the_first_is_one_lost() {
        let mut c = LeaseCount::default();
        c.saw(None);
        c.saw(Some("a"));
        c.saw(Some("a"));
        // Between sessions the status may show no lease: not a loss by itself.
        c.saw(None);
        c.saw(Some("a"));
        assert_eq!(c.lost, 0);
        c.saw(Some("b"));
        c.saw(Some("b"));
        c.saw(Some("c"));
        assert_eq!(c.lost, 2);
    }
}
