//! The etcd agent (`vnetd --etcd`): registers this host and its interfaces under a lease,
//! watches the overlay's keys and keeps the derived links and routes of the running
//! configuration in line with them (vnet_cluster does the deriving; this is the I/O).
//!
//! One thread runs sessions. A session authenticates, renews or grants the lease, reads the
//! whole overlay prefix (in pages, the first time), publishes what is missing, applies the
//! derived diff, then watches from the read's revision (a second thread reads the stream)
//! while re-publishing after local changes and publishing the traffic matrix; a third thread
//! renews the lease. Any etcd error ends the session; the running configuration stays as it
//! is (forwarding goes on with the last derived configuration, nothing is deleted) and the
//! next session, after a jittered backoff, resumes the watch after the last revision it
//! applied, so etcd replays only what it missed. Only the first session, or one whose revision
//! was compacted away, reads everything again (issue #13: at a few hundred hosts, sessions
//! that failed under load and re-read the whole overlay kept etcd saturated for minutes).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tracing::{debug, info, warn};
use vnet_cluster::{
    announce_frame, encode, key_for_host, key_for_interface, key_for_matrix, matrix_prefix,
    overlay_prefix, parse_key, ClusterKey, ClusterState, Deriver, HostId, HostRecord,
    InterfaceRecord, MatrixRecord, OverlayName,
};
use vnet_etcd::{prefix_end, Client, Compare, CompareTarget, EventKind, TxnOp, WatchMessage};
use vnet_wire::MacAddr;

use crate::DataPlane;
use vnet_control::status::ClusterStatus;

/// Who this host is in which overlay, and the agent's timing.
pub struct AgentConfig {
    pub overlay: OverlayName,
    pub host: HostId,
    /// What this host publishes about itself.
    pub record: HostRecord,
    pub lease_ttl: i64,
    pub matrix_interval: Duration,
    /// Set together with `stop`: leave without revoking the lease, as a crashed host would
    /// (the scale harness plays host deaths with it; vnetd sets it on a plain stop, so the
    /// next vnetd renews the lease and the other hosts never see this one leave).
    pub crash: Arc<AtomicBool>,
    /// A lease an earlier run of this daemon held: renewed if etcd still has it (the host's
    /// records then never went away), else a new one is granted.
    pub lease: Option<i64>,
    /// Keys per page of the first read ([`READ_PAGE`]; the harness's quick run makes it small
    /// so that reads of many pages are exercised).
    pub read_page: i64,
}

/// The longest wait between two attempts to reach etcd (each wait is jittered down to half
/// of it, so that agents failing together do not retry together).
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest whole-call timeout an agent lets its calls grow to under load.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys per page of the first read (about 300 KB of the gateway's JSON).
pub const READ_PAGE: i64 = 1000;

type Placement = (u32, MacAddr);

struct Agent {
    daemon: Arc<dyn DataPlane>,
    cfg: AgentConfig,
    client: Arc<Client>,
    stop: Arc<AtomicBool>,
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
    status: Status,
    /// The incremental derivation (None until the session's first synchronisation).
    deriver: Option<Deriver>,
    /// Keys changed since the last synchronisation.
    pending: Vec<ClusterKey>,
    keepalive: Arc<KeepAlive>,
    /// The revision up to which every event has been applied to `state` (None: read it all).
    resume: Option<i64>,
    /// State of the backoff's jitter (xorshift; no need for good randomness).
    jitter: u64,
    /// When the state was last handed to the data plane's views, and whether it changed since.
    state_shown: Option<Instant>,
    state_changed: bool,
}

/// What the agent and its keep-alive thread share.
struct KeepAlive {
    /// The lease to renew (0: none).
    lease: AtomicI64,
    /// Renewal interval, milliseconds.
    every_ms: AtomicI64,
    /// The endpoint serving the session's watch (usize::MAX: none); keep-alives go there.
    watch_endpoint: AtomicUsize,
    /// The store said the lease is gone.
    expired: AtomicBool,
    /// The watch's member did not answer a keep-alive in time.
    member_silent: AtomicBool,
}

#[derive(Default)]
struct Status {
    connected: bool,
    revision: i64,
    sessions: u64,
    events: u64,
    bad_entries: u64,
    announcements: u64,
    syncs: u64,
    last_error: String,
    conflicts: Vec<String>,
    failed: Vec<String>,
    /// Another daemon's lease holds this host id's record.
    host_id_in_use: bool,
}

pub fn spawn(
    daemon: Arc<dyn DataPlane>,
    cfg: AgentConfig,
    client: Client,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let state = ClusterState::new(cfg.overlay.clone());
    let lease = cfg.lease.filter(|l| *l > 0);
    let keepalive = Arc::new(KeepAlive {
        lease: AtomicI64::new(0),
        every_ms: AtomicI64::new(1000),
        watch_endpoint: AtomicUsize::new(usize::MAX),
        expired: AtomicBool::new(false),
        member_silent: AtomicBool::new(false),
    });
    let client = Arc::new(client);
    {
        let (client, stop, ka) = (client.clone(), stop.clone(), keepalive.clone());
        std::thread::Builder::new()
            .name("etcd-lease".into())
            .spawn(move || keep_alive(&client, &stop, &ka))?;
    }
    let mut agent = Agent {
        daemon,
        cfg,
        client,
        stop,
        state,
        lease,
        published_under: None,
        published: BTreeSet::new(),
        announced: BTreeMap::new(),
        announce: Vec::new(),
        local_seen: 0,
        last_matrix: Vec::new(),
        status: Status::default(),
        deriver: None,
        pending: Vec::new(),
        keepalive,
        resume: None,
        jitter: 0,
        state_shown: None,
        state_changed: false,
    };
    agent.jitter = seed(agent.cfg.host.as_str());
    std::thread::Builder::new()
        .name("etcd-agent".into())
        .spawn(move || agent.run())
}

impl Agent {
    fn run(&mut self) {
        let mut backoff = Duration::from_millis(100);
        self.report();
        while !self.stop.load(Relaxed) {
            let result = self.session();
            if self.stop.load(Relaxed) {
                break;
            }
            if let Err(e) = result {
                // A call that timed out waits twice as long next time (up to
                // MAX_CALL_TIMEOUT): on an overloaded etcd, giving up and asking again only
                // adds load (at 1,000 hosts, sessions whose first calls timed out at 3 s kept
                // etcd saturated). Back to the configured timeout once a session is up.
                let timed_out = e
                    .downcast_ref::<vnet_etcd::Error>()
                    .is_some_and(vnet_etcd::Error::is_unreachable);
                if timed_out {
                    let t = (self.client.call_timeout() * 2).min(MAX_CALL_TIMEOUT);
                    self.client
                        .set_call_timeout(t.max(self.client.base_timeout()));
                }
                let msg = format!("{e:#}");
                if self.status.connected {
                    warn!("etcd: {msg}; keeping the last derived configuration");
                    backoff = Duration::from_millis(100);
                } else if msg != self.status.last_error {
                    // Once per distinct error, not once per retry.
                    warn!("etcd: {msg}; retrying");
                } else {
                    debug!("etcd: {msg}");
                }
                self.status.connected = false;
                self.status.last_error = msg;
                self.report();
                let wait = self.jittered(backoff);
                self.sleep(wait);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        self.keepalive.lease.store(0, Relaxed);
        // A clean stop takes this host out of the overlay at once, rather than after the TTL.
        if let Some(id) = self.lease.filter(|_| !self.cfg.crash.load(Relaxed)) {
            if let Err(e) = self.client.lease_revoke(id) {
                debug!("etcd: revoking the lease at stop: {e}");
            }
        }
    }

    /// `d` scaled by a random factor in [0.5, 1).
    fn jittered(&mut self, d: Duration) -> Duration {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        d.mul_f64(0.5 + (self.jitter % 1000) as f64 / 2000.0)
    }

    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stop.load(Relaxed) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
        }
    }

    fn report(&self) {
        let s = &self.status;
        let v = ClusterStatus {
            overlay: self.cfg.overlay.as_str().to_string(),
            host_id: self.cfg.host.as_str().to_string(),
            connected: s.connected,
            endpoints: self.client.endpoints().join(","),
            lease: self.lease.map(|l| format!("{l:x}")),
            revision: s.revision,
            policy: serde_json::to_value(self.state.policy()).unwrap_or_default(),
            hosts: self.state.hosts().len(),
            interfaces: self.state.interfaces().len(),
            operator_routes: self.state.routes().len(),
            sessions: s.sessions,
            syncs: s.syncs,
            events: s.events,
            bad_entries: s.bad_entries,
            announcements: s.announcements,
            last_error: s.last_error.clone(),
            conflicts: s.conflicts.clone(),
            failed: s.failed.clone(),
            host_id_in_use: s.host_id_in_use,
        };
        self.daemon.set_cluster_status(v);
    }

    fn is_matrix_key(&self, key: &str) -> bool {
        key.starts_with(&matrix_prefix(&self.cfg.overlay))
    }

    fn session(&mut self) -> Result<()> {
        let client = self.client.clone();
        client.authenticate()?;
        if let Some(id) = self.lease {
            if client.lease_keepalive(id)? <= 0 {
                info!(
                    lease = format!("{id:x}"),
                    "etcd: lease expired; registering again"
                );
                self.lease = None;
            }
        }
        let lease = match self.lease {
            Some(l) => l,
            None => {
                let (id, ttl) = client.lease_grant(self.cfg.lease_ttl)?;
                info!(lease = format!("{id:x}"), ttl, "etcd: lease granted");
                self.lease = Some(id);
                // Everything is put again under the new lease.
                self.last_matrix.clear();
                id
            }
        };
        let ttl = self.cfg.lease_ttl.max(1);
        let ka = &self.keepalive;
        ka.every_ms.store((ttl * 1000 / 3).max(300), Relaxed);
        ka.watch_endpoint.store(usize::MAX, Relaxed);
        ka.expired.store(false, Relaxed);
        ka.member_silent.store(false, Relaxed);
        ka.lease.store(lease, Relaxed);

        let prefix = overlay_prefix(&self.cfg.overlay);
        let from = match self.resume {
            // What this agent applied is a consistent state at that revision: watch on from
            // there (etcd replays the rest), unless it has been compacted away.
            Some(revision) => revision + 1,
            None => {
                // A host new to the store registers before it reads the overlay, so the others
                // see it join without waiting for that read (a second at 1,000 hosts). Safe
                // without the state: the transaction's comparisons are etcd's, and it changes
                // nothing if any of its keys exists (publish() then claims them after the read).
                if self.published_under != Some(lease) && self.state.hosts().is_empty() {
                    self.register_at_once(lease)?;
                }
                self.read_all(&prefix)? + 1
            }
        };
        self.local_seen = self.daemon.local_changes();
        self.publish(lease)?;
        self.sync();

        // The watch: a thread reads the stream and hands the messages over. Everything of the
        // overlay but the traffic matrices (which every host re-puts while traffic flows:
        // N hosts would each receive N hosts' matrices), as two ranges on one stream.
        let (tx, rx) = mpsc::channel();
        let watch_stop = Arc::new(AtomicBool::new(false));
        {
            let (client, stop) = (client.clone(), watch_stop.clone());
            let matrices = matrix_prefix(&self.cfg.overlay).into_bytes();
            let ranges = vec![
                (prefix.clone().into_bytes(), Some(matrices.clone())),
                (prefix_end(&matrices), Some(prefix_end(prefix.as_bytes()))),
            ];
            let endpoint = self.keepalive.clone();
            std::thread::Builder::new()
                .name("etcd-watch".into())
                .spawn(move || {
                    let mut w = match client.watch_ranges(&ranges, from) {
                        Ok(w) => w,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    endpoint.watch_endpoint.store(w.endpoint(), Relaxed);
                    loop {
                        let m = w.next_message();
                        let ended = m.is_err();
                        if stop.load(Relaxed) || tx.send(m).is_err() || ended {
                            return;
                        }
                    }
                })?;
        }
        let result = self.watch_loop(lease, &rx);
        watch_stop.store(true, Relaxed);
        self.keepalive.watch_endpoint.store(usize::MAX, Relaxed);
        result
    }

    fn watch_loop(
        &mut self,
        lease: i64,
        rx: &mpsc::Receiver<Result<WatchMessage, vnet_etcd::Error>>,
    ) -> Result<()> {
        let mut created = false;
        let mut next_matrix = Instant::now();
        loop {
            if self.stop.load(Relaxed) {
                return Ok(());
            }
            let mut dirty = false;
            let mut first = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => bail!("watch ended"),
            };
            // Take everything already queued, so a burst of events costs one derivation.
            while let Some(m) = first.take().or_else(|| rx.try_recv().ok()) {
                match m? {
                    WatchMessage::Created { .. } => {
                        if !created {
                            created = true;
                            self.client.set_call_timeout(self.client.base_timeout());
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
                        self.resume = self.resume.max(Some(revision));
                    }
                    WatchMessage::Canceled {
                        reason,
                        compact_revision,
                    } => {
                        if compact_revision > 0 {
                            // The events since `resume` are gone: read everything again.
                            self.resume = None;
                        }
                        bail!("watch canceled: {reason}")
                    }
                    WatchMessage::Events { revision, events } => {
                        self.status.revision = revision;
                        for ev in events {
                            self.status.events += 1;
                            // Not the message's revision: etcd may send the events of a
                            // long catch-up in several messages, each with the store's
                            // current revision.
                            self.resume = self.resume.max(Some(ev.kv.mod_revision));
                            let Ok(key) = std::str::from_utf8(&ev.kv.key) else {
                                self.status.bad_entries += 1;
                                continue;
                            };
                            if self.is_matrix_key(key) {
                                continue;
                            }
                            let r = match ev.kind {
                                EventKind::Put => self.state.apply_put(key, &ev.kv.value),
                                EventKind::Delete => self.state.apply_delete(key),
                            };
                            match r {
                                Ok(true) => {
                                    dirty = true;
                                    if let Ok(k) = parse_key(&self.cfg.overlay, key) {
                                        self.pending.push(k);
                                    }
                                }
                                Ok(false) => {}
                                Err(e) => {
                                    self.status.bad_entries += 1;
                                    warn!(key, "etcd: bad entry ignored: {e}");
                                }
                            }
                        }
                    }
                }
            }
            let local = self.daemon.local_changes();
            if local != self.local_seen {
                self.local_seen = local;
                dirty = true;
            }
            if dirty {
                // Our own records may have been changed or deleted by someone else.
                self.publish(lease)?;
                self.sync();
            }
            self.send_announcements();
            if self.state_changed {
                self.show_state(false);
            }
            let now = Instant::now();
            if self.keepalive.expired.load(Relaxed) {
                self.lease = None;
                bail!("lease expired");
            }
            if self.keepalive.member_silent.load(Relaxed) {
                bail!("the etcd member serving the watch did not answer a lease keep-alive; watching through another");
            }
            if !self.cfg.matrix_interval.is_zero() && now >= next_matrix {
                self.publish_matrix(lease)?;
                next_matrix = now + self.cfg.matrix_interval;
            }
            self.report();
        }
    }

    /// Reads the whole overlay (but the traffic matrices) as one snapshot, in pages, into a
    /// new state; the derivation starts over. Returns the snapshot's revision.
    fn read_all(&mut self, prefix: &str) -> Result<i64> {
        let read = self
            .client
            .get_prefix_paged(prefix.as_bytes(), self.cfg.read_page)?;
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
        let (state, bad) = ClusterState::from_entries(self.cfg.overlay.clone(), entries);
        for (k, e) in &bad {
            warn!(key = %k, "etcd: bad entry ignored: {e}");
        }
        for (&(vni, mac), rec) in state.interfaces() {
            let key = key_for_interface(&self.cfg.overlay, vni, mac);
            if rec.host_id == self.cfg.host && ours.contains(key.as_bytes()) {
                self.published.insert((vni, mac));
            }
        }
        self.status.bad_entries += bad.len() as u64;
        self.state = state;
        self.deriver = None;
        self.pending.clear();
        self.status.revision = read.revision;
        self.resume = Some(read.revision);
        Ok(read.revision)
    }

    /// Puts this host's record and its interfaces' placements where the store lacks them or
    /// holds something else; removes the placements of interfaces this daemon no longer has.
    fn publish(&mut self, lease: i64) -> Result<()> {
        let client = self.client.clone();
        let force = self.published_under != Some(lease);
        if force && self.register_at_once(lease)? {
            return Ok(());
        }
        let overlay = &self.cfg.overlay;
        let host = &self.cfg.host;
        if force || self.state.host(host) != Some(&self.cfg.record) {
            // Claim the host id: put the record only where none exists or ours (under our
            // lease) is. Another live daemon with the same --host-id keeps it, and this one
            // stops instead of overwriting it back and forth (which would make every host's
            // links to this id flap and etcd's history grow without end).
            let key = key_for_host(overlay, host).into_bytes();
            let value = encode(&self.cfg.record);
            let claimed = client.put_if(&key, CompareTarget::Version(0), &value, lease)?
                || client.put_if(&key, CompareTarget::Lease(lease), &value, lease)?;
            if !claimed {
                self.status.host_id_in_use = true;
                bail!(
                    "host id {host} is held by another daemon's lease (a second daemon with the \
                     same --host-id, or this one's previous run, until its lease expires)"
                );
            }
            self.status.host_id_in_use = false;
            // Derive from our own record now, not when the watch brings it back: until then
            // the state would lack this host's key, and a host with a key must never derive a
            // plaintext link.
            if self
                .state
                .insert(vnet_cluster::ClusterEntry::Host(self.cfg.record.clone()))
            {
                self.pending.push(ClusterKey::Host(host.clone()));
            }
        }
        let local = self.daemon.local_config();
        let mut now_local = BTreeSet::new();
        for i in &local.interfaces {
            let at: Placement = (i.vni, i.mac);
            now_local.insert(at);
            let key = key_for_interface(overlay, i.vni, i.mac);
            match self.state.placement(i.vni, i.mac) {
                None => {
                    let rec = InterfaceRecord {
                        mac: i.mac,
                        vni: i.vni,
                        host_id: host.clone(),
                        name: i.name.clone(),
                        epoch: 0,
                    };
                    if rec.validate().is_err() {
                        continue;
                    }
                    // Only if nobody placed it meanwhile: another host may serve it.
                    let put = client.put_if(
                        key.as_bytes(),
                        CompareTarget::Version(0),
                        &encode(&rec),
                        lease,
                    )?;
                    if put {
                        self.published.insert(at);
                    }
                }
                Some(cur) if &cur.host_id == host => {
                    if force || cur.name != i.name {
                        let mut rec = cur.clone();
                        rec.name = i.name.clone();
                        // Keep the epoch; attach to the current lease.
                        client.put_if(
                            key.as_bytes(),
                            CompareTarget::Value(encode(cur)),
                            &encode(&rec),
                            lease,
                        )?;
                    }
                    self.published.insert(at);
                }
                // Placed on another host (moved away, or served there): its routes say so.
                Some(_) => {}
            }
        }
        let gone: Vec<Placement> = self
            .published
            .iter()
            .filter(|p| !now_local.contains(p))
            .copied()
            .collect();
        for (vni, mac) in gone {
            if let Some(cur) = self.state.placement(vni, mac) {
                if &cur.host_id == host {
                    client.delete_if(
                        key_for_interface(overlay, vni, mac).as_bytes(),
                        CompareTarget::Value(encode(cur)),
                    )?;
                }
            }
            self.published.remove(&(vni, mac));
        }
        self.published_under = Some(lease);
        Ok(())
    }

    /// A host registering afresh (none of its keys in the store) puts its record and every
    /// placement in one transaction, so the other agents get one watch message (one revision)
    /// for the whole host instead of one per key: at 1,000 hosts x 8 guests that is 9 times
    /// fewer messages through etcd's gateway during bring-up, and a join reaches every agent
    /// at once. Returns false (nothing written) when any key exists; [`Agent::publish`] then
    /// goes key by key.
    fn register_at_once(&mut self, lease: i64) -> Result<bool> {
        let overlay = &self.cfg.overlay;
        let host = &self.cfg.host;
        if self.state.host(host).is_some() {
            return Ok(false);
        }
        let local = self.daemon.local_config();
        let mut records = Vec::new();
        for i in &local.interfaces {
            if self.state.placement(i.vni, i.mac).is_some() {
                return Ok(false);
            }
            let rec = InterfaceRecord {
                mac: i.mac,
                vni: i.vni,
                host_id: host.clone(),
                name: i.name.clone(),
                epoch: 0,
            };
            if rec.validate().is_ok() {
                records.push(rec);
            }
        }
        // etcd refuses transactions of more than 128 operations (its --max-txn-ops).
        if records.len() + 1 > 128 {
            return Ok(false);
        }
        let host_key = key_for_host(overlay, host).into_bytes();
        let mut compare = vec![Compare {
            key: host_key.clone(),
            target: CompareTarget::Version(0),
        }];
        let mut puts = vec![TxnOp::Put {
            key: host_key,
            value: encode(&self.cfg.record),
            lease,
        }];
        for rec in &records {
            let key = key_for_interface(overlay, rec.vni, rec.mac).into_bytes();
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
        if !self.client.txn(&compare, &puts, &[])? {
            return Ok(false);
        }
        self.status.host_id_in_use = false;
        if self
            .state
            .insert(vnet_cluster::ClusterEntry::Host(self.cfg.record.clone()))
        {
            self.pending.push(ClusterKey::Host(host.clone()));
        }
        self.published
            .extend(records.iter().map(|r| (r.vni, r.mac)));
        self.published_under = Some(lease);
        Ok(true)
    }

    /// Applies the derived diff, and queues announcements for interfaces that just moved here.
    fn sync(&mut self) {
        let local = self.daemon.local_config();
        let keys = std::mem::take(&mut self.pending);
        let report = match &mut self.deriver {
            Some(d) => {
                let delta = d.update(&self.state, &keys, &local);
                self.daemon.apply_derived(d.derivation(), Some(&delta))
            }
            None => {
                let d = Deriver::new(self.cfg.host.clone(), &self.state, &local);
                let r = self.daemon.apply_derived(d.derivation(), None);
                self.deriver = Some(d);
                r
            }
        };
        self.status.syncs += 1;
        self.state_changed = true;
        self.show_state(true);
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
            let (vni, mac) = (&i.vni, &i.mac);
            let Some(rec) = self.state.placement(*vni, *mac) else {
                continue;
            };
            if rec.host_id != self.cfg.host || rec.epoch == 0 {
                continue;
            }
            if self.announced.get(&(*vni, *mac)) != Some(&rec.epoch) {
                info!(interface = %i.name, mac = %mac, epoch = rec.epoch, "etcd: interface moved here; announcing");
                // Twice: now and at the next turn of the loop, in case the first is lost.
                self.announce.push((i.name.clone(), *mac, 2));
            }
            announced.insert((*vni, *mac), rec.epoch);
        }
        self.announced = announced;
    }

    /// Hands the state to the data plane's views when it changed, at most once a second
    /// (see [`crate::DataPlane::synced`]); called after each synchronisation and each turn of
    /// the watch loop, so the last change of a burst is shown within a second.
    fn show_state(&mut self, synced: bool) {
        let due = self
            .state_shown
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if self.state_changed && due {
            self.daemon.synced(Some(&self.state));
            self.state_shown = Some(Instant::now());
            self.state_changed = false;
        } else if synced {
            self.daemon.synced(None);
        }
    }

    fn send_announcements(&mut self) {
        for (name, mac, left) in &mut self.announce {
            // The guest's IP address is not known to vnet: a gratuitous RARP carries the MAC.
            let frame = announce_frame(*mac, None::<Ipv4Addr>).to_vec();
            if self.daemon.inject_from_interface(name, &[frame]) {
                self.status.announcements += 1;
            }
            *left -= 1;
        }
        self.announce.retain(|(_, _, left)| *left > 0);
    }

    fn publish_matrix(&mut self, lease: i64) -> Result<()> {
        let value = MatrixRecord::heaviest(self.cfg.host.clone(), self.daemon.matrix()).encode();
        if value != self.last_matrix || self.published_under != Some(lease) {
            self.client.put(
                key_for_matrix(&self.cfg.overlay, &self.cfg.host).as_bytes(),
                &value,
                lease,
            )?;
            self.last_matrix = value;
        }
        Ok(())
    }
}

/// The lease keep-alive thread: renews the session's lease every TTL/3, on a thread of its own
/// so that a slow etcd call of the agent cannot make it late. Each renewal goes to the member
/// that serves the watch, with a deadline of the interval: a member that does not answer
/// (frozen, partitioned) while another one does is reported so the agent watches through
/// that one; the renewal is retried at once through any member that answers.
fn keep_alive(client: &Client, stop: &AtomicBool, ka: &KeepAlive) {
    let mut next = Instant::now();
    while !stop.load(Relaxed) {
        // Short enough to notice a new lease or a stop soon, long enough that a thousand
        // idle agents in one harness process cost little.
        let wait = next.saturating_duration_since(Instant::now());
        std::thread::sleep(wait.clamp(Duration::from_millis(10), Duration::from_millis(100)));
        let lease = ka.lease.load(Relaxed);
        let every = Duration::from_millis(ka.every_ms.load(Relaxed).max(100) as u64);
        if lease == 0 || Instant::now() < next {
            continue;
        }
        next = Instant::now() + every;
        // How long a renewal may take before it is given up: half the TTL. An overloaded etcd
        // answers late, and a renewal that waits in its queue is better than one that times
        // out and is sent again (at 1,000 hosts on one etcd, 3 s call timeouts let leases
        // expire, and each expiry's deletions and re-registration added to the load).
        let patience = every * 3 / 2;
        let endpoint = ka.watch_endpoint.load(Relaxed);
        let first = if endpoint == usize::MAX || client.endpoints().len() == 1 {
            client.lease_keepalive_within(lease, patience)
        } else {
            match client.lease_keepalive_via(lease, endpoint, every) {
                Err(e) if e.is_unreachable() => {
                    client.avoid_endpoint(endpoint);
                    let r = client.lease_keepalive_within(lease, patience);
                    // Silent only if another member answered in its place: when none does,
                    // the store is down or overloaded, and moving the watch would only add
                    // a full catch-up to its load (at 300 hosts on one loaded etcd, every
                    // late keep-alive restarted a session).
                    if r.is_ok() && client.current_endpoint() != endpoint {
                        warn!(
                            endpoint = client.endpoints().get(endpoint).map(String::as_str),
                            "etcd: the watch's member did not answer a keep-alive: {e}"
                        );
                        ka.member_silent.store(true, Relaxed);
                    }
                    r
                }
                r => r,
            }
        };
        match first {
            Ok(ttl) if ttl <= 0 => ka.expired.store(true, Relaxed),
            Ok(_) => {}
            // Tried every member: the next attempt comes sooner than a full interval.
            Err(e) => {
                debug!("etcd: lease keep-alive failed: {e}");
                next = Instant::now() + every / 4;
            }
        }
    }
}

/// A seed for the backoff's jitter that differs between hosts and runs.
fn seed(host: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(host.as_bytes());
    h.finish() | 1
}
