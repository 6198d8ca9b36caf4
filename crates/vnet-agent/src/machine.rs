//! The agent's decisions, without I/O: a state machine whose inputs are etcd's answers and
//! events, the time and the local configuration, and whose outputs are what to write to etcd
//! (plans the driver carries out, reporting each result back), what to apply to the data plane
//! and what to tell it. `agent.rs` drives it: it makes the calls, in the order given, and
//! hands every answer back; an etcd error ends the session there, with the state as far as
//! the answers went. So what the agent decides is unit-tested without etcd, root or threads.
//!
//! What it keeps across sessions: the cluster state (events applied up to `resume`), the
//! lease, what this host published and under which lease, the derivation, the announcements
//! owed, the traffic matrix last put, and the status `show cluster` reports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tracing::{info, warn};
use vnet_cluster::{
    announce_frame, encode, key_for_host, key_for_interface, matrix_prefix, parse_key,
    ClusterEntry, ClusterKey, ClusterState, Derivation, Deriver, HostId, HostRecord,
    InterfaceRecord, MatrixRecord, OverlayName,
};
use vnet_control::status::ClusterStatus;
use vnet_control::{Command, Config, Interface};
use vnet_etcd::{Compare, CompareTarget, EventKind, RangeResponse, TxnOp, WatchMessage};
use vnet_wire::MacAddr;

use crate::splice::Splice;
use crate::SyncReport;

/// A guest NIC's placement: (VNI, MAC).
pub type Placement = (u32, MacAddr);

/// etcd refuses transactions of more than 128 operations (its `--max-txn-ops`).
const MAX_TXN_OPS: usize = 128;
/// The state is handed to the data plane's views at most this often.
const SHOW_EVERY: Duration = Duration::from_secs(1);

/// What the lease keep-alive thread found since the session started (see
/// [`Machine::check_lease`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseFindings {
    /// A renewal was answered with no TTL left: the lease is gone.
    pub expired: bool,
    /// No renewal was answered for the lease's whole TTL: it may be gone.
    pub lapsed: bool,
    /// The member serving the watch did not answer a renewal that another member answered.
    pub member_silent: bool,
}

/// Where a session's watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// What was applied is a consistent state at a revision: watch on from the next one
    /// (etcd replays the rest).
    Resume { from: i64 },
    /// Read the whole overlay first (the first session, or the events since were compacted
    /// away); a host new to the store registers before that read (`register_first`), so the
    /// others see it join without waiting for it.
    ReadAll { register_first: bool },
}

/// A host new to the store, registered in one transaction: its record and every placement,
/// each put only where no key exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub compare: Vec<Compare>,
    pub puts: Vec<TxnOp>,
    pub records: Vec<InterfaceRecord>,
}

/// The host record to claim: put where no record exists, else where ours (under our lease) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostClaim {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// One conditional write: `op` if `compare` holds (a transaction of one of each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub compare: Compare,
    pub op: TxnOp,
}

/// What a placement's write means for what this host published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Ours if the write happened (nobody placed it meanwhile).
    OursIfWritten,
    /// Ours (the write only renames it or moves it to the current lease).
    Ours,
    /// No longer ours: the interface is gone from this host.
    Forget,
}

/// A step of the publication of this host's placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementStep {
    pub at: Placement,
    pub write: Option<Write>,
    pub then: Then,
}

/// What one watch message changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heard {
    /// The cluster state changed: publish and derive again.
    pub changed: bool,
    /// The session's watch was just created: the session is up.
    pub watching: bool,
}

/// What one message of the catch-up watch did (see [`crate::splice`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// The cluster state changed: publish and derive again.
    pub changed: bool,
    /// The catch-up is complete: close its watch.
    pub done: bool,
}

/// What to hand the data plane's views after a synchronisation or a turn of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    /// The state changed and a second passed since it was last handed over: a copy of it.
    State,
    /// Only the time of a synchronisation.
    Time,
    Nothing,
}

pub struct Machine {
    overlay: OverlayName,
    host: HostId,
    /// What this host publishes about itself.
    record: HostRecord,
    lease_ttl: i64,
    matrix_interval: Duration,
    matrix_prefix: String,
    state: ClusterState,
    lease: Option<i64>,
    /// The lease the host record and placements were last put under.
    published_under: Option<i64>,
    /// Placements this daemon wrote itself (removed again when the interface goes).
    published: BTreeSet<Placement>,
    /// The epoch of each placement last announced from here (a placement that moved has an
    /// epoch above 0; each epoch of it on this host is announced once).
    announced: BTreeMap<Placement, u64>,
    /// Interfaces to announce (name, MAC) and how many more times.
    announce: Vec<(String, MacAddr, u8)>,
    local_seen: u64,
    last_matrix: Vec<u8>,
    next_matrix: Instant,
    /// The agent's counters and last words; the rest of what `show cluster` reports is
    /// derived when asked ([`Machine::cluster_status`]).
    status: ClusterStatus,
    /// The incremental derivation (None until the first synchronisation after a read).
    deriver: Option<Deriver>,
    /// Keys changed since the last synchronisation.
    pending: Vec<ClusterKey>,
    /// A host record changed since the data plane last had them ([`Machine::take_hosts_changed`]).
    hosts_changed: bool,
    /// The revision up to which every event has been applied to `state` (None: read it all).
    resume: Option<i64>,
    /// When the state was last handed to the data plane's views, and whether it changed since.
    state_shown: Option<Instant>,
    state_changed: bool,
    /// The session's watch has been created.
    watching: bool,
    /// The session's catch-up watch runs (see [`crate::splice`]).
    splice: Option<Splice>,
}

impl Machine {
    /// The agent of `host` in `overlay` before its first session; `lease` is one an earlier
    /// run held (renewed if etcd still has it).
    pub fn new(
        overlay: OverlayName,
        host: HostId,
        record: HostRecord,
        lease_ttl: i64,
        matrix_interval: Duration,
        lease: Option<i64>,
        now: Instant,
    ) -> Machine {
        Machine {
            matrix_prefix: matrix_prefix(&overlay),
            state: ClusterState::new(overlay.clone()),
            overlay,
            host,
            record,
            lease_ttl,
            matrix_interval,
            lease: lease.filter(|l| *l > 0),
            published_under: None,
            published: BTreeSet::new(),
            announced: BTreeMap::new(),
            announce: Vec::new(),
            local_seen: 0,
            last_matrix: Vec::new(),
            next_matrix: now,
            status: ClusterStatus::default(),
            deriver: None,
            pending: Vec::new(),
            hosts_changed: true,
            resume: None,
            state_shown: None,
            state_changed: false,
            watching: false,
            splice: None,
        }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn lease(&self) -> Option<i64> {
        self.lease
    }

    /// What `show cluster` reports (`endpoints`: the client's, comma-separated).
    pub fn cluster_status(&self, endpoints: String) -> ClusterStatus {
        ClusterStatus {
            overlay: self.overlay.as_str().to_string(),
            host_id: self.host.as_str().to_string(),
            endpoints,
            lease: self.lease.map(|l| format!("{l:x}")),
            policy: serde_json::to_value(self.state.policy()).unwrap_or_default(),
            hosts: self.state.hosts().len(),
            interfaces: self.state.interfaces().len(),
            operator_routes: self.state.routes().len(),
            ..self.status.clone()
        }
    }

    fn is_matrix_key(&self, key: &str) -> bool {
        key.starts_with(&self.matrix_prefix)
    }

    // The session's start.

    /// The lease held before was renewed with `ttl` seconds left (0 or less: it expired, and
    /// this host registers again under a new one).
    pub fn lease_renewed(&mut self, ttl: i64) {
        if ttl <= 0 {
            if let Some(id) = self.lease.take() {
                info!(
                    lease = format!("{id:x}"),
                    "etcd: lease expired; registering again"
                );
            }
        }
    }

    /// A new lease was granted: everything is put again under it.
    pub fn lease_granted(&mut self, id: i64, ttl: i64) {
        info!(lease = format!("{id:x}"), ttl, "etcd: lease granted");
        self.lease = Some(id);
        self.last_matrix.clear();
    }

    /// How often the keep-alive thread renews the lease: a third of its TTL.
    pub fn keepalive_every_ms(&self) -> i64 {
        (self.lease_ttl.max(1) * 1000 / 3).max(300)
    }

    /// Where this session's watch starts, under `lease`.
    pub fn start(&self, lease: i64) -> Start {
        match self.resume {
            Some(revision) => Start::Resume { from: revision + 1 },
            // Safe without the state: the registration's comparisons are etcd's, and it
            // changes nothing if any of its keys exists (the publication then claims them
            // after the read).
            None => Start::ReadAll {
                register_first: self.published_under != Some(lease)
                    && self.state.hosts().is_empty(),
            },
        }
    }

    /// The whole overlay as read (in pages) at one revision: a new state, the derivation
    /// starts over. Returns the read's revision.
    pub fn absorb_read(&mut self, read: &RangeResponse) -> i64 {
        let mut entries = Vec::new();
        for kv in &read.kvs {
            match std::str::from_utf8(&kv.key) {
                Ok(k) if self.is_matrix_key(k) => {}
                Ok(k) => entries.push((k, kv.value.as_slice())),
                Err(_) => self.status.bad_entries += 1,
            }
        }
        // Keys under this daemon's lease: an earlier run of it (the lease outlives a restart)
        // put them, so they are this daemon's to take back when their interface is gone.
        let ours: BTreeSet<&[u8]> = match self.lease {
            Some(l) => read
                .kvs
                .iter()
                .filter(|kv| kv.lease == l)
                .map(|kv| kv.key.as_slice())
                .collect(),
            None => BTreeSet::new(),
        };
        let (state, bad) = ClusterState::from_entries(self.overlay.clone(), entries);
        for (k, e) in &bad {
            warn!(key = %k, "etcd: bad entry ignored: {e}");
        }
        for (&(vni, mac), rec) in state.interfaces() {
            let key = key_for_interface(&self.overlay, vni, mac);
            if rec.host_id == self.host && ours.contains(key.as_bytes()) {
                self.published.insert((vni, mac));
            }
        }
        self.status.bad_entries += bad.len() as u64;
        self.state = state;
        self.deriver = None;
        self.pending.clear();
        self.status.revision = read.revision;
        self.resume = Some(read.revision);
        read.revision
    }

    /// The local configuration's change counter as the session starts.
    pub fn local_seen(&mut self, counter: u64) {
        self.local_seen = counter;
    }

    // Publishing this host.

    /// Whether nothing was published under `lease` yet: everything is put again.
    pub fn must_republish(&self, lease: i64) -> bool {
        self.published_under != Some(lease)
    }

    /// The registration of a host new to the store, with `local`'s interfaces; None when any
    /// of its keys is known to exist, or it would be too large a transaction (the
    /// publication then goes key by key).
    pub fn registration(&self, local: &Config, lease: i64) -> Option<Registration> {
        if self.state.host(&self.host).is_some() {
            return None;
        }
        let mut records = Vec::new();
        for i in &local.interfaces {
            if self.state.placement(i.vni, i.mac).is_some() {
                return None;
            }
            let rec = self.new_placement(i);
            if rec.validate().is_ok() {
                records.push(rec);
            }
        }
        if records.len() + 1 > MAX_TXN_OPS {
            return None;
        }
        let host_key = key_for_host(&self.overlay, &self.host).into_bytes();
        let mut compare = vec![Compare {
            key: host_key.clone(),
            target: CompareTarget::Version(0),
        }];
        let mut puts = vec![TxnOp::Put {
            key: host_key,
            value: encode(&self.record),
            lease,
        }];
        for rec in &records {
            let key = key_for_interface(&self.overlay, rec.vni, rec.mac).into_bytes();
            compare.push(Compare {
                key: key.clone(),
                target: CompareTarget::Version(0),
            });
            puts.push(TxnOp::Put {
                key,
                value: encode(rec),
                lease,
            });
        }
        Some(Registration {
            compare,
            puts,
            records,
        })
    }

    /// The placement of local interface `i` on this host, never moved.
    fn new_placement(&self, i: &Interface) -> InterfaceRecord {
        InterfaceRecord {
            mac: i.mac,
            vni: i.vni,
            host_id: self.host.clone(),
            name: i.name.clone(),
            epoch: 0,
        }
    }

    /// The registration's transaction went through: the host and its placements are ours.
    pub fn registered(&mut self, reg: Registration, lease: i64) {
        self.status.host_id_in_use = false;
        self.own_record_known();
        self.published
            .extend(reg.records.iter().map(|r| (r.vni, r.mac)));
        self.published_under = Some(lease);
    }

    /// Derive from our own record now, not when the watch brings it back: until then the
    /// state would lack this host's key, and a host with a key must never derive a plaintext
    /// link.
    fn own_record_known(&mut self) {
        if self.state.insert(ClusterEntry::Host(self.record.clone())) {
            self.pending.push(ClusterKey::Host(self.host.clone()));
        }
    }

    /// The host record to put, when it is not in the store as published (`force`: everything
    /// is put again, see [`Machine::must_republish`]).
    pub fn host_claim(&self, force: bool) -> Option<HostClaim> {
        (force || self.state.host(&self.host) != Some(&self.record)).then(|| HostClaim {
            key: key_for_host(&self.overlay, &self.host).into_bytes(),
            value: encode(&self.record),
        })
    }

    /// Whether the claim took. Another live daemon with the same host id keeps it, and this
    /// one stops instead of overwriting it back and forth (which would make every host's
    /// links to this id flap and etcd's history grow without end).
    pub fn host_claimed(&mut self, claimed: bool) -> Result<()> {
        if !claimed {
            self.status.host_id_in_use = true;
            bail!(
                "host id {} is held by another daemon's lease (a second daemon with the same \
                 --host-id, or this one's previous run, until its lease expires)",
                self.host
            );
        }
        self.status.host_id_in_use = false;
        self.own_record_known();
        Ok(())
    }

    /// The placements of `local`'s interfaces where the store lacks them or holds something
    /// else, and the removal of those this daemon no longer has, in order.
    pub fn placements(&self, local: &Config, lease: i64, force: bool) -> Vec<PlacementStep> {
        let mut steps = Vec::new();
        let mut now_local = BTreeSet::new();
        let put_if = |key: &str, target: CompareTarget, value: Vec<u8>| Write {
            compare: Compare {
                key: key.as_bytes().to_vec(),
                target,
            },
            op: TxnOp::Put {
                key: key.as_bytes().to_vec(),
                value,
                lease,
            },
        };
        for i in &local.interfaces {
            let at: Placement = (i.vni, i.mac);
            now_local.insert(at);
            let key = key_for_interface(&self.overlay, i.vni, i.mac);
            match self.state.placement(i.vni, i.mac) {
                None => {
                    let rec = self.new_placement(i);
                    if rec.validate().is_err() {
                        continue;
                    }
                    // Only if nobody placed it meanwhile: another host may serve it.
                    steps.push(PlacementStep {
                        at,
                        write: Some(put_if(&key, CompareTarget::Version(0), encode(&rec))),
                        then: Then::OursIfWritten,
                    });
                }
                Some(cur) if cur.host_id == self.host => {
                    let write = (force || cur.name != i.name).then(|| {
                        let mut rec = cur.clone();
                        rec.name = i.name.clone();
                        // Keep the epoch; attach to the current lease.
                        put_if(&key, CompareTarget::Value(encode(cur)), encode(&rec))
                    });
                    steps.push(PlacementStep {
                        at,
                        write,
                        then: Then::Ours,
                    });
                }
                // Placed on another host (moved away, or served there): its routes say so.
                Some(_) => {}
            }
        }
        for &(vni, mac) in self.published.iter().filter(|p| !now_local.contains(p)) {
            let write = self
                .state
                .placement(vni, mac)
                .filter(|cur| cur.host_id == self.host)
                .map(|cur| {
                    let key = key_for_interface(&self.overlay, vni, mac).into_bytes();
                    Write {
                        compare: Compare {
                            key: key.clone(),
                            target: CompareTarget::Value(encode(cur)),
                        },
                        op: TxnOp::Delete {
                            key,
                            range_end: None,
                        },
                    }
                });
            steps.push(PlacementStep {
                at: (vni, mac),
                write,
                then: Then::Forget,
            });
        }
        steps
    }

    /// A step of [`Machine::placements`] was carried out (`written`: its write happened).
    pub fn placement_done(&mut self, step: &PlacementStep, written: bool) {
        match step.then {
            Then::OursIfWritten if written => {
                self.published.insert(step.at);
            }
            Then::OursIfWritten => {}
            Then::Ours => {
                self.published.insert(step.at);
            }
            Then::Forget => {
                self.published.remove(&step.at);
            }
        }
    }

    /// The whole publication went through under `lease`.
    pub fn published(&mut self, lease: i64) {
        self.published_under = Some(lease);
    }

    // Deriving.

    /// The derivation from the state and `local`, and (when derived incrementally) the
    /// commands that changed it since the previous synchronisation.
    pub fn derive(&mut self, local: &Config) -> (&Derivation, Option<Vec<Command>>) {
        let keys = std::mem::take(&mut self.pending);
        self.hosts_changed |=
            self.deriver.is_none() || keys.iter().any(|k| matches!(k, ClusterKey::Host(_)));
        let (deriver, delta) = match self.deriver.take() {
            Some(mut d) => {
                let delta = d.update(&self.state, &keys, local);
                (d, Some(delta))
            }
            None => (Deriver::new(self.host.clone(), &self.state, local), None),
        };
        (self.deriver.insert(deriver).derivation(), delta)
    }

    /// The data plane applied the derivation (`report`); `local` is the configuration it was
    /// derived with. Queues announcements for interfaces that just moved here.
    pub fn synced(&mut self, report: SyncReport, local: &Config) {
        self.status.syncs += 1;
        self.state_changed = true;
        for c in &report.applied {
            info!("etcd: {c}");
        }
        for c in &report.failed {
            warn!("etcd: not applied (retried at the next change): {c}");
        }
        for c in &report.conflicts {
            if !self.status.conflicts.contains(c) {
                info!("etcd: {c}");
            }
        }
        self.status.conflicts = report.conflicts;
        self.status.failed = report.failed;

        // A placement that moved here (epoch above 0) is announced once per epoch, when this
        // host has the interface: whether the interface came before the move or after it.
        // From the local interfaces (a few), not the whole overlay's placements.
        let mut announced = BTreeMap::new();
        for i in &local.interfaces {
            let (vni, mac) = (i.vni, i.mac);
            let Some(rec) = self.state.placement(vni, mac) else {
                continue;
            };
            if rec.host_id != self.host || rec.epoch == 0 {
                continue;
            }
            if self.announced.get(&(vni, mac)) != Some(&rec.epoch) {
                info!(interface = %i.name, mac = %mac, epoch = rec.epoch, "etcd: interface moved here; announcing");
                // Twice: now and at the next turn of the loop, in case the first is lost.
                self.announce.push((i.name.clone(), mac, 2));
            }
            announced.insert((vni, mac), rec.epoch);
        }
        self.announced = announced;
    }

    /// What to hand the data plane's views now (`synced`: a synchronisation just happened):
    /// a changed state at most once a second, so the last change of a burst is shown within
    /// a second of it.
    pub fn show(&mut self, now: Instant, synced: bool) -> Show {
        let due = self
            .state_shown
            .is_none_or(|t| now.saturating_duration_since(t) >= SHOW_EVERY);
        if self.state_changed && due {
            self.state_shown = Some(now);
            self.state_changed = false;
            Show::State
        } else if synced {
            Show::Time
        } else {
            Show::Nothing
        }
    }

    /// The announcements due this turn: (interface, frame to send as if from its guest).
    /// The guest's IP address is not known to vnet: a gratuitous RARP carries the MAC.
    pub fn announcements(&mut self) -> Vec<(String, Vec<u8>)> {
        let due = self
            .announce
            .iter()
            .map(|(name, mac, _)| {
                (
                    name.clone(),
                    announce_frame(*mac, None::<Ipv4Addr>).to_vec(),
                )
            })
            .collect();
        for (_, _, left) in &mut self.announce {
            *left -= 1;
        }
        self.announce.retain(|(_, _, left)| *left > 0);
        due
    }

    /// An announcement reached the data plane.
    pub fn announcement_sent(&mut self) {
        self.status.announcements += 1;
    }

    // The watch.

    /// The session's watch is being set up; the matrix is due at once.
    pub fn begin_watch(&mut self, now: Instant) {
        self.watching = false;
        self.splice = None;
        self.next_matrix = now;
    }

    /// The session's lasting watch starts after revision `through`: a catch-up watch brings
    /// what happened since `resume` (see [`crate::splice`]). Whether one is needed (the
    /// agent's state is older).
    pub fn splice(&mut self, through: i64) -> bool {
        let needed = self.resume.is_some_and(|r| r < through);
        self.splice = needed.then(|| Splice::new(through));
        needed
    }

    /// One message of the watch. An error ends the session (the watch was canceled).
    pub fn heard(&mut self, msg: WatchMessage) -> Result<Heard> {
        let mut heard = Heard::default();
        match msg {
            WatchMessage::Created { .. } => {
                if !self.watching {
                    self.watching = true;
                    heard.watching = true;
                    self.status.connected = true;
                    self.status.last_error.clear();
                    self.status.sessions += 1;
                    info!(
                        revision = self.status.revision,
                        "etcd: watching the overlay"
                    );
                }
            }
            WatchMessage::Progress { revision } => {
                self.status.revision = revision;
                if self.splice.is_none() {
                    self.resume = self.resume.max(Some(revision));
                }
            }
            WatchMessage::Canceled {
                reason,
                compact_revision,
            } => return Err(self.canceled("watch", &reason, compact_revision)),
            WatchMessage::Events { revision, events } => {
                self.status.revision = revision;
                for ev in events {
                    self.status.events += 1;
                    if let Some(s) = self.splice.as_mut() {
                        // The catch-up's progress is where a next session resumes.
                        s.lasting(&ev.kv.key);
                    } else {
                        // Not the message's revision: etcd may send the events of a long
                        // catch-up in several messages, each with the store's current revision.
                        self.resume = self.resume.max(Some(ev.kv.mod_revision));
                    }
                    heard.changed |= self.apply_event(&ev);
                }
            }
        }
        Ok(heard)
    }

    /// One message of the session's catch-up watch (see [`crate::splice`]); messages after
    /// it completed are ignored. An error ends the session.
    pub fn heard_catch_up(&mut self, msg: WatchMessage) -> Result<CaughtUp> {
        let mut caught = CaughtUp::default();
        let Some(splice) = self.splice.take() else {
            return Ok(caught);
        };
        match msg {
            WatchMessage::Created { .. } | WatchMessage::Progress { .. } => {}
            WatchMessage::Canceled {
                reason,
                compact_revision,
            } => return Err(self.canceled("catch-up watch", &reason, compact_revision)),
            WatchMessage::Events { events, .. } => {
                let mut last = None;
                for ev in events {
                    last = Some(ev.kv.mod_revision);
                    if !splice.catch_up(&ev.kv.key, ev.kv.mod_revision) {
                        continue;
                    }
                    self.status.events += 1;
                    self.resume = self.resume.max(Some(ev.kv.mod_revision));
                    caught.changed |= self.apply_event(&ev);
                }
                if last.is_some_and(|r| splice.completed_by(r)) {
                    self.resume = self.resume.max(Some(splice.through()));
                    caught.done = true;
                    return Ok(caught);
                }
            }
        }
        self.splice = Some(splice);
        Ok(caught)
    }

    /// etcd ended a watch: the session ends, and if the events since `resume` were compacted
    /// away, the next one reads everything again.
    fn canceled(&mut self, which: &str, reason: &str, compact_revision: i64) -> anyhow::Error {
        if compact_revision > 0 {
            self.resume = None;
        }
        anyhow::anyhow!("{which} canceled: {reason}")
    }

    /// Applies one event to the state; whether it changed it.
    fn apply_event(&mut self, ev: &vnet_etcd::WatchEvent) -> bool {
        let Ok(key) = std::str::from_utf8(&ev.kv.key) else {
            self.status.bad_entries += 1;
            return false;
        };
        if self.is_matrix_key(key) {
            return false;
        }
        let r = match ev.kind {
            EventKind::Put => self.state.apply_put(key, &ev.kv.value),
            EventKind::Delete => self.state.apply_delete(key),
        };
        match r {
            Ok(true) => {
                if let Ok(k) = parse_key(&self.overlay, key) {
                    self.pending.push(k);
                }
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.status.bad_entries += 1;
                warn!(key, "etcd: bad entry ignored: {e}");
                false
            }
        }
    }

    /// Whether a host record changed since this was last asked (the data plane's reach needs
    /// every host's candidates and keys, not only the derived links).
    pub fn take_hosts_changed(&mut self) -> bool {
        std::mem::take(&mut self.hosts_changed)
    }

    /// This host's reach record (candidates, NAT, relays) is now `reach`: whether that changed
    /// the record to publish.
    pub fn set_host_reach(&mut self, reach: vnet_cluster::HostReach) -> bool {
        if self.record.reach == reach {
            return false;
        }
        // Not put into the state here: the state says what the store holds, and the record
        // differing from it is what makes the next publication put it.
        self.record.reach = reach;
        true
    }

    /// Whether the local configuration changed (its change counter is now `counter`).
    pub fn local_changed(&mut self, counter: u64) -> bool {
        let changed = counter != self.local_seen;
        self.local_seen = counter;
        changed
    }

    /// The keep-alive thread's findings end the session: the store said the lease is gone
    /// (`expired`: this host registers again under a new one), no renewal was answered for its
    /// whole TTL (`lapsed`), or the member serving the watch did not answer while another did
    /// (`member_silent`). A lapse keeps the lease: unanswered renewals may still have reached
    /// etcd (through a busy gRPC proxy they arrive late rather than never), and the next
    /// session asks the store first. Dropping it here made each host whose answers were late
    /// register again under a second lease while the first still held its keys: "host id
    /// held by another daemon's lease" until it expired, and every other host saw it leave
    /// and come back.
    pub fn check_lease(&mut self, findings: LeaseFindings) -> Result<()> {
        if findings.expired {
            self.lease = None;
            bail!("lease expired");
        }
        if findings.lapsed {
            bail!("no lease keep-alive answered for the lease's whole TTL; asking the store whether it lives");
        }
        if findings.member_silent {
            bail!("the etcd member serving the watch did not answer a lease keep-alive; watching through another");
        }
        Ok(())
    }

    // The traffic matrix.

    /// Whether the traffic matrix is due for publication now.
    pub fn matrix_due(&self, now: Instant) -> bool {
        !self.matrix_interval.is_zero() && now >= self.next_matrix
    }

    /// The matrix record of `pairs` to put under `lease`, when it differs from the one last
    /// put (or that one was under another lease).
    pub fn matrix_update(&self, pairs: Vec<vnet_core::MatrixEntry>, lease: i64) -> Option<Vec<u8>> {
        let value = MatrixRecord::heaviest(self.host.clone(), pairs).encode();
        (value != self.last_matrix || self.published_under != Some(lease)).then_some(value)
    }

    /// The matrix `value` was put.
    pub fn matrix_put(&mut self, value: Vec<u8>) {
        self.last_matrix = value;
    }

    /// The matrix was published (or found unchanged) at `now`: next time after the interval.
    pub fn matrix_done(&mut self, now: Instant) {
        self.next_matrix = now + self.matrix_interval;
    }

    // A session's end.

    /// The session ended with `error`: the agent is no longer connected. Returns whether it
    /// was (the backoff starts over then).
    pub fn session_failed(&mut self, error: String) -> bool {
        let was = self.status.connected;
        if was {
            warn!("etcd: {error}; keeping the last derived configuration");
        } else if error != self.status.last_error {
            // Once per distinct error, not once per retry.
            warn!("etcd: {error}; retrying");
        } else {
            tracing::debug!("etcd: {error}");
        }
        self.status.connected = false;
        self.status.last_error = error;
        was
    }
}

#[cfg(test)]
mod tests;
