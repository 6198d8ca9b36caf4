//! What the daemon, the etcd agent and the reach thread share (`Handle`): the host records
//! the agent hands over, the reach part of this host's record for the agent to publish,
//! `show reach`'s report, the stop flag. A module of its own, below both the daemon (which
//! keeps the handle for `show reach`) and the reach thread (which runs on the daemon), so that
//! neither imports the other's module in a ring.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use vnet_cluster::{HostId, HostReach, HostRecord};
use vnet_control::status::ReachReport;
use vnet_core::LockRecover;
use vnet_crypto::PublicKey;

/// What the daemon and the agent share with the reach thread.
pub struct Handle {
    pub(crate) hosts: Mutex<Option<BTreeMap<HostId, HostRecord>>>,
    pub(crate) publish: Mutex<Option<HostReach>>,
    pub(crate) report: Mutex<ReachReport>,
    pub(crate) stop: AtomicBool,
    pub(crate) probe_key: PublicKey,
}

impl Handle {
    pub fn new(relay: bool, probe_key: PublicKey) -> Handle {
        Handle {
            hosts: Mutex::new(None),
            publish: Mutex::new(None),
            report: Mutex::new(ReachReport {
                enabled: true,
                relay,
                ..Default::default()
            }),
            stop: AtomicBool::new(false),
            probe_key,
        }
    }

    /// The host records changed (the agent's hook).
    pub fn hosts_changed(&self, hosts: &BTreeMap<HostId, HostRecord>) {
        *self.hosts.lock_or_recover() = Some(hosts.clone());
    }

    /// The reach part of this host's record to publish: the probe key from the start, the
    /// rest once the machine has said it.
    pub fn to_publish(&self) -> HostReach {
        self.publish
            .lock_or_recover()
            .clone()
            .unwrap_or_else(|| HostReach {
                probe_key: Some(self.probe_key.to_string()),
                ..Default::default()
            })
    }

    pub fn report(&self) -> ReachReport {
        self.report.lock_or_recover().clone()
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }
}
