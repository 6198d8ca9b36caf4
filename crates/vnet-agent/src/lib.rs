//! The etcd agent of one vnet host: what `vnetd --etcd` runs, as a library so that the scale
//! harness (`vnet-scale`) runs the very same code for many hosts at once.
//!
//! The agent does the talking to etcd (lease, publishing, watching) and the deriving; what it
//! derives is applied through the [`DataPlane`] seam. vnetd's `Daemon` implements it by
//! changing its running configuration and engine; the harness implements it with a recorder
//! that applies nothing to the OS.
//!
//! Inside, the decisions are a state machine without I/O (`machine`: what to publish, claim,
//! derive, announce, and what etcd's answers and events mean; `backoff`: the timing between
//! sessions; `settle`: the wait for registrations to settle before a first read), driven by
//! the I/O loop (`agent`: sessions, the watch thread) and the lease's keep-alive thread
//! (`keepalive`).

#![forbid(unsafe_code)]

mod agent;
mod backoff;
mod keepalive;
mod machine;
mod settle;
mod splice;
mod watches;

pub use agent::{spawn, AgentConfig, READ_PAGE};

use std::time::Duration;

use vnet_cluster::Derivation;
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config};

/// What one synchronisation with the cluster's state did.
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    /// Commands applied (links and routes added or removed).
    pub applied: Vec<String>,
    /// Commands the running configuration refused (retried by the next synchronisation).
    pub failed: Vec<String>,
    /// What the derivation skipped (vnet_cluster::Conflict), as text.
    pub conflicts: Vec<String>,
}

/// What a session's first read of the overlay took (issue #19: what a starting host reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartRead {
    /// Polls of the host count (one before registering, the others while waiting for the
    /// registrations to settle).
    pub polls: u32,
    /// How long the agent waited before reading (the wait for the registrations to settle
    /// and its part of the spread).
    pub settle: Duration,
    /// Its part of the spread of the reads of the agents that started with it.
    pub spread: Duration,
    /// Keys in the snapshot read.
    pub keys: u64,
    /// Bytes of every answer of the read, polls and pages, as etcd (or its proxy) sent them.
    pub bytes: u64,
    /// The snapshot's revision.
    pub revision: i64,
}

/// Where the agent's decisions land: the host's data plane and its local configuration.
pub trait DataPlane: Send + Sync {
    /// The local configuration alone (config file and control port, no derived objects).
    fn local_config(&self) -> Config;
    /// A counter bumped by every change of the local configuration.
    fn local_changes(&self) -> u64;
    /// Brings the derived part of the running configuration to `derivation`. `delta`, when
    /// given, is what changed since the previous derivation passed here (the agent's
    /// incremental derivation), in an order in which every command is valid; an implementation
    /// may apply it instead of comparing the whole sets, as long as its record of what it
    /// applied followed the previous derivation exactly.
    fn apply_derived(&self, derivation: &Derivation, delta: Option<&[Command]>) -> SyncReport;
    /// This host's traffic matrix (published for `vnetctl suggest`).
    fn matrix(&self) -> Vec<vnet_core::MatrixEntry>;
    /// Sends frames into the overlay as if the guest behind interface `name` had sent them.
    fn inject_from_interface(&self, name: &str, frames: &[Vec<u8>]) -> bool;
    /// Called after every synchronisation, for views of the overlay (vnetd's HTTP listener):
    /// `state` is the cluster state derived from, handed over at most about once a second
    /// and after the last change of a burst (a copy costs the overlay's size, which an event
    /// must not); None when only the time of the synchronisation is new.
    fn synced(&self, _state: Option<&vnet_cluster::ClusterState>) {}
    /// The agent's status, for `show cluster`.
    fn set_cluster_status(&self, status: ClusterStatus);
    /// A session read the overlay whole (the first one, or after its revision was compacted
    /// away): what the read took. For measurements; the agent logs it too.
    fn read_at_start(&self, _read: &StartRead) {}
    /// Every host record, after a synchronisation in which one of them changed (vnetd's reach
    /// takes its peers' keys and candidates from them).
    fn hosts(
        &self,
        _hosts: &std::collections::BTreeMap<vnet_cluster::HostId, vnet_cluster::HostRecord>,
    ) {
    }
    /// This host's reach record to publish (candidates, NAT, relays); None leaves the record's
    /// reach part as it was given.
    fn host_reach(&self) -> Option<vnet_cluster::HostReach> {
        None
    }
}
