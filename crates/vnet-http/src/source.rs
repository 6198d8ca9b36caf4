//! What the listener reads from the daemon: typed snapshots (the status structs of
//! `vnet_control::status`), behind a trait so that the listener, the metrics and the views
//! are tested without a data path.

use std::time::Duration;

use serde::Serialize;
use vnet_cluster::{ClusterState, HostId, MatrixRecord};
use vnet_control::status::{ClusterStatus, LinkStatus, MatrixReport, StatsReport};
use vnet_control::Interface;

/// The etcd agent's state, as the metrics and the view show it.
#[derive(Debug, Clone, Serialize)]
pub struct AgentSnapshot {
    #[serde(flatten)]
    pub status: ClusterStatus,
    /// Since the agent last brought the derived configuration in line with the overlay's
    /// state (None before the first time).
    #[serde(serialize_with = "ser_secs")]
    pub last_sync_age: Option<Duration>,
}

fn ser_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

impl AgentSnapshot {
    /// Connected to etcd, and everything derived is applied.
    pub fn synced(&self) -> bool {
        self.status.connected && self.status.failed.is_empty() && self.last_sync_age.is_some()
    }
}

/// One host's state at one moment.
#[derive(Debug, Clone)]
pub struct HostSnapshot {
    pub stats: StatsReport,
    pub links: Vec<LinkStatus>,
    pub interfaces: Vec<Interface>,
    /// None without `--etcd`.
    pub agent: Option<AgentSnapshot>,
}

/// The overlay as this host's agent knows it, and the traffic matrices the hosts published.
#[derive(Debug, Clone)]
pub struct OverlaySnapshot {
    pub local_host: HostId,
    /// None until the agent's first synchronisation.
    pub state: Option<ClusterState>,
    /// The published matrices, or why they could not be read.
    pub matrices: Result<Vec<MatrixRecord>, String>,
}

/// The daemon, seen from the listener.
pub trait Source: Send + Sync + 'static {
    fn host(&self) -> HostSnapshot;
    /// This host's traffic matrix.
    fn matrix(&self) -> MatrixReport;
    /// None without `--etcd`.
    fn overlay(&self) -> Option<OverlaySnapshot>;
    /// Runs `work`, pure rendering of a snapshot already taken, where it takes no core from the
    /// daemon's own threads for a while (vnetd: under `SCHED_IDLE`, for at most 50 ms for one
    /// scrape each half second, 10 s for the rest). By default, as it is.
    fn background(&self, work: &mut dyn FnMut()) {
        work()
    }
}
