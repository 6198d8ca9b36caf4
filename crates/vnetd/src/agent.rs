//! The daemon's side of the etcd agent's seam (`vnet_agent::DataPlane`): the agent itself
//! lives in `vnet-agent`, so that the scale harness runs the same code.

use std::sync::atomic::Ordering::Relaxed;

use vnet_agent::{DataPlane, SyncReport};
use vnet_cluster::{ClusterState, Derivation};
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config};

use crate::daemon::Daemon;

impl DataPlane for Daemon {
    fn local_config(&self) -> Config {
        Daemon::local_config(self)
    }

    fn local_changes(&self) -> u64 {
        self.local_changes.load(Relaxed)
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

    fn set_cluster_status(&self, status: ClusterStatus) {
        // The lease outlives a restart: the next vnetd renews it.
        if let Some(saver) = self.saver() {
            let lease = status.lease.clone();
            saver.update_resources(|r| r.etcd_lease = lease);
        }
        *self
            .cluster_status
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(status);
    }
}
