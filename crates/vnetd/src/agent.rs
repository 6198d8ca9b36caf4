//! The daemon's side of the etcd agent's seam (`vnet_agent::DataPlane`): the agent itself
//! lives in `vnet-agent`, so that the scale harness runs the same code.

use vnet_agent::{DataPlane, SyncReport};
use vnet_cluster::{ClusterState, Derivation};
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config};
use vnet_core::LockRecover;

use crate::daemon::Daemon;

impl DataPlane for Daemon {
    fn local_config(&self) -> Config {
        Daemon::local_config(self)
    }

    fn local_changes(&self) -> u64 {
        Daemon::local_changes(self)
    }

    /// The delta applies as it is while the daemon's record of what it applied followed the
    /// agent's derivations exactly; after a refused command (it stays out of the record and
    /// is retried) or a local change the daemon compares the whole sets once.
    fn apply_derived(&self, derivation: &Derivation, delta: Option<&[Command]>) -> SyncReport {
        Daemon::apply_derivation(self, derivation, delta)
    }

    fn matrix(&self) -> Vec<vnet_core::MatrixEntry> {
        Daemon::matrix(self)
    }

    fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        Daemon::inject_from_interface(self, name, frames)
    }

    fn synced(&self, state: Option<&ClusterState>) {
        Daemon::cluster_synced(self, state)
    }

    /// Called on every pass of the agent's loop (ten times a second when idle), so the host
    /// record is touched only when the lease changed.
    fn set_cluster_status(&self, status: ClusterStatus) {
        let mut current = self.cluster_status.lock_or_recover();
        let lease_changed = current.as_ref().is_none_or(|c| c.lease != status.lease);
        if let (true, Some(saver)) = (lease_changed, self.saver()) {
            // The lease outlives a restart: the next vnetd renews it.
            let lease = status.lease.clone();
            saver.update_resources(|r| r.etcd_lease = lease);
        }
        *current = Some(status);
    }
}

/// The agent's seam with reach: the daemon for everything, plus the reach thread for the host
/// records it takes and the reach part of this host's record it gives.
pub struct WithReach {
    pub daemon: std::sync::Arc<Daemon>,
    pub reach: std::sync::Arc<crate::reach_handle::Handle>,
}

impl DataPlane for WithReach {
    fn local_config(&self) -> Config {
        self.daemon.local_config()
    }

    fn local_changes(&self) -> u64 {
        DataPlane::local_changes(&*self.daemon)
    }

    fn apply_derived(&self, derivation: &Derivation, delta: Option<&[Command]>) -> SyncReport {
        self.daemon.apply_derived(derivation, delta)
    }

    fn matrix(&self) -> Vec<vnet_core::MatrixEntry> {
        DataPlane::matrix(&*self.daemon)
    }

    fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool {
        DataPlane::inject_from_interface(&*self.daemon, name, frames)
    }

    fn synced(&self, state: Option<&ClusterState>) {
        self.daemon.synced(state)
    }

    fn set_cluster_status(&self, status: ClusterStatus) {
        self.daemon.set_cluster_status(status)
    }

    fn hosts(
        &self,
        hosts: &std::collections::BTreeMap<vnet_cluster::HostId, vnet_cluster::HostRecord>,
    ) {
        self.reach.hosts_changed(hosts);
    }

    fn host_reach(&self) -> Option<vnet_cluster::HostReach> {
        Some(self.reach.to_publish())
    }
}
