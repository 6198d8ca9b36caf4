//! The etcd agent (`vnetd --etcd`): registers this host and its interfaces under a lease,
//! watches the overlay's keys and keeps the derived links and routes of the running
//! configuration in line with them. This is the I/O: the calls to etcd and to the data plane,
//! the threads, the sleeps. Every decision is the [`Machine`]'s; this file carries its plans
//! out and hands the answers back.
//!
//! One thread runs sessions. A session authenticates, renews or grants the lease, reads the whole
//! overlay (the first time: after registering, and after the registrations have settled, as one
//! snapshot in pages that etcd's gRPC proxy can answer from its cache; see
//! [`settle`](crate::settle)), publishes what is missing, applies the derived diff, then watches
//! (from etcd's head, with a short catch-up watch from the state's revision when that is older:
//! [`splice`](crate::splice); threads read the streams, [`watches`](crate::watches)) while
//! re-publishing after local changes and publishing the traffic matrix; a third thread renews the
//! lease ([`keepalive`](crate::keepalive)) on a connection of its own. Any etcd error ends the
//! session; the running configuration stays as it is (forwarding goes on with the last derived
//! configuration, nothing is deleted) and the next session, after a jittered backoff, catches up
//! from the last revision it applied, so etcd replays only what it missed. Only the first session,
//! or one whose revision was compacted away, reads everything again (issue #13: at a few hundred
//! hosts, sessions that failed under load and re-read the whole overlay kept etcd saturated for
//! minutes).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tracing::{debug, info};
use vnet_cluster::{
    hosts_prefix, key_for_host, key_for_matrix, matrix_prefix, overlay_prefix, HostId, HostRecord,
    OverlayName,
};
use vnet_etcd::{prefix_end, Client, CompareTarget};

use crate::backoff::{grown_timeout, Backoff, Jitter};
use crate::keepalive::{self, KeepAlive};
use crate::machine::{Machine, Show, Start};
use crate::settle::{Next, Settle};
use crate::watches::{self, Heard};
use crate::{DataPlane, StartRead};

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

/// Keys per page of the first read (about 1.5 MB over gRPC). etcd 3.4 walks its index over the
/// rest of the range for every page, so small pages cost it: a 9,000-key overlay read in pages
/// of 1,000 took etcd 16 ms of CPU, in one page 10.5 ms.
pub const READ_PAGE: i64 = 10_000;

struct Agent {
    daemon: Arc<dyn DataPlane>,
    cfg: AgentConfig,
    client: Arc<Client>,
    stop: Arc<AtomicBool>,
    m: Machine,
    keepalive: Arc<KeepAlive>,
    /// The jitter of the waits for registrations to settle.
    jitter: Jitter,
}

pub fn spawn(
    daemon: Arc<dyn DataPlane>,
    cfg: AgentConfig,
    client: Client,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let m = Machine::new(
        cfg.overlay.clone(),
        cfg.host.clone(),
        cfg.record.clone(),
        cfg.lease_ttl,
        cfg.matrix_interval,
        cfg.lease,
        Instant::now(),
    );
    let keepalive = Arc::new(KeepAlive::default());
    // The renewals on a connection of their own: on the agent's, they queued behind the first
    // read's megabytes and waited for the thread decoding them (see
    // `Client::with_own_connection`).
    let lease_client = client
        .with_own_connection()
        .map_err(|e| std::io::Error::other(format!("etcd client for the lease: {e}")))?;
    let client = Arc::new(client);
    {
        let (stop, crash, ka) = (stop.clone(), cfg.crash.clone(), keepalive.clone());
        std::thread::Builder::new()
            .name("etcd-lease".into())
            .spawn(move || keepalive::run(&lease_client, &stop, &crash, &ka))?;
    }
    let jitter = Jitter::new(seed(cfg.host.as_str()));
    let mut agent = Agent {
        daemon,
        cfg,
        client,
        stop,
        m,
        keepalive,
        jitter,
    };
    std::thread::Builder::new()
        .name("etcd-agent".into())
        .spawn(move || agent.run())
}

/// However the agent's thread ends (a panic too), the lease thread is told the lease is
/// released, so it ends as well.
impl Drop for Agent {
    fn drop(&mut self) {
        self.keepalive.released.store(true, Relaxed);
    }
}

impl Agent {
    fn run(&mut self) {
        let mut backoff = Backoff::new(seed(self.cfg.host.as_str()));
        self.report();
        while !self.stop.load(Relaxed) {
            let result = self.session();
            if self.stop.load(Relaxed) {
                break;
            }
            if let Err(e) = result {
                let timed_out = e
                    .downcast_ref::<vnet_etcd::Error>()
                    .is_some_and(vnet_etcd::Error::is_unreachable);
                if timed_out {
                    let c = &self.client;
                    c.set_call_timeout(grown_timeout(c.call_timeout(), c.base_timeout()));
                }
                if self.m.session_failed(format!("{e:#}")) {
                    backoff.reset();
                }
                self.report();
                let wait = backoff.wait();
                self.sleep(wait);
            }
        }
        // A clean stop takes this host out of the overlay at once, rather than after the TTL;
        // the lease thread renews until then (see `keepalive::thread_done`).
        if let Some(id) = self.m.lease().filter(|_| !self.cfg.crash.load(Relaxed)) {
            if let Err(e) = self.client.lease_revoke(id) {
                debug!("etcd: revoking the lease at stop: {e}");
            }
        }
        self.keepalive.lease.store(0, Relaxed);
    }

    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stop.load(Relaxed) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
        }
    }

    fn report(&self) {
        let status = self.m.cluster_status(self.client.endpoints().join(","));
        self.daemon.set_cluster_status(status);
    }

    fn session(&mut self) -> Result<()> {
        let client = self.client.clone();
        client.authenticate()?;
        if let Some(id) = self.m.lease() {
            let ttl = client.lease_keepalive(id)?;
            self.m.lease_renewed(ttl);
        }
        let lease = match self.m.lease() {
            Some(l) => l,
            None => {
                let (id, ttl) = client.lease_grant(self.cfg.lease_ttl)?;
                self.m.lease_granted(id, ttl);
                id
            }
        };
        self.keepalive.start(lease, self.m.keepalive_every_ms());

        let from = match self.m.start(lease) {
            Start::Resume { from } => from,
            Start::ReadAll { register_first } => {
                self.read_all(register_first.then_some(lease))? + 1
            }
        };
        self.m.local_seen(self.daemon.local_changes());
        self.publish(lease)?;
        self.sync();

        // The watches: threads read the streams and hand the messages over (see `watches`).
        let (tx, rx) = mpsc::channel();
        let watch_stop = Arc::new(AtomicBool::new(false));
        let catch_up_stop = Arc::new(AtomicBool::new(false));
        watches::spawn(watches::Watches {
            client: client.clone(),
            probe: key_for_host(&self.cfg.overlay, &self.cfg.host).into_bytes(),
            lasting: overlay_ranges(&self.cfg.overlay),
            catch_up: catch_up_range(&self.cfg.overlay),
            from,
            tx,
            stop: watch_stop.clone(),
            catch_up_stop: catch_up_stop.clone(),
            keepalive: self.keepalive.clone(),
        })?;
        let result = self.watch_loop(lease, &rx, &catch_up_stop);
        catch_up_stop.store(true, Relaxed);
        watch_stop.store(true, Relaxed);
        self.keepalive.watch_endpoint.store(usize::MAX, Relaxed);
        result
    }

    fn watch_loop(
        &mut self,
        lease: i64,
        rx: &mpsc::Receiver<Heard>,
        catch_up_stop: &AtomicBool,
    ) -> Result<()> {
        self.m.begin_watch(Instant::now());
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
                match m {
                    Heard::Lasting(m) => {
                        let heard = self.m.heard(m?)?;
                        if heard.watching {
                            self.client.set_call_timeout(self.client.base_timeout());
                        }
                        dirty |= heard.changed;
                    }
                    Heard::Joined { through, catch_up } => {
                        if self.m.splice(through) != catch_up {
                            bail!("the watch thread and the agent disagree on a catch-up");
                        }
                    }
                    Heard::CatchUp(m) => {
                        let caught = self.m.heard_catch_up(m?)?;
                        if caught.done {
                            debug!(through = ?self.m.start(lease), "etcd: caught up");
                            catch_up_stop.store(true, Relaxed);
                        }
                        dirty |= caught.changed;
                    }
                }
            }
            if self.m.local_changed(self.daemon.local_changes()) {
                dirty = true;
            }
            if let Some(reach) = self.daemon.host_reach() {
                dirty |= self.m.set_host_reach(reach);
            }
            if dirty {
                // Our own records may have been changed or deleted by someone else.
                self.publish(lease)?;
                self.sync();
            }
            for (name, frame) in self.m.announcements() {
                if self.daemon.inject_from_interface(&name, &[frame]) {
                    self.m.announcement_sent();
                }
            }
            self.show(false);
            let now = Instant::now();
            let ka = &self.keepalive;
            self.m.check_lease(ka.findings())?;
            if self.m.matrix_due(now) {
                self.publish_matrix(lease)?;
                self.m.matrix_done(now);
            }
            self.report();
        }
    }

    /// Puts this host's record and its interfaces' placements where the store lacks them or
    /// holds something else; removes the placements of interfaces this daemon no longer has.
    fn publish(&mut self, lease: i64) -> Result<()> {
        let client = self.client.clone();
        let force = self.m.must_republish(lease);
        if force && self.register_at_once(lease)? {
            return Ok(());
        }
        if let Some(claim) = self.m.host_claim(force) {
            let (key, value) = (&claim.key, &claim.value);
            let claimed = client.put_if(key, CompareTarget::Version(0), value, lease)?
                || client.put_if(key, CompareTarget::Lease(lease), value, lease)?;
            self.m.host_claimed(claimed)?;
        }
        let local = self.daemon.local_config();
        for step in self.m.placements(&local, lease, force) {
            let written = match &step.write {
                Some(w) => client.txn(
                    std::slice::from_ref(&w.compare),
                    std::slice::from_ref(&w.op),
                    &[],
                )?,
                None => false,
            };
            self.m.placement_done(&step, written);
        }
        self.m.published(lease);
        Ok(())
    }

    /// A host registering afresh (none of its keys in the store) puts its record and every
    /// placement in one transaction, so the other agents get one watch message (one revision)
    /// for the whole host instead of one per key: at 1,000 hosts x 8 guests that is 9 times
    /// fewer messages through etcd's gateway during bring-up, and a join reaches every agent
    /// at once. Returns false (nothing written) when any key exists; [`Agent::publish`] then
    /// goes key by key.
    fn register_at_once(&mut self, lease: i64) -> Result<bool> {
        let local = self.daemon.local_config();
        let Some(reg) = self.m.registration(&local, lease) else {
            return Ok(false);
        };
        if !self.client.txn(&reg.compare, &reg.puts, &[])? {
            return Ok(false);
        }
        self.m.registered(reg, lease);
        Ok(true)
    }

    /// Registers this host under `register` (a host new to the store), then reads the whole
    /// overlay once the registrations have settled (see [`settle`](crate::settle)), as one
    /// snapshot; returns its revision. The hosts are counted before the registration too, so
    /// that every agent of a mass start knows how many start with it.
    fn read_all(&mut self, register: Option<i64>) -> Result<i64> {
        let started = Instant::now();
        let hosts = hosts_prefix(&self.cfg.overlay).into_bytes();
        let hosts_end = prefix_end(&hosts);
        let mut bytes = 0;
        let mut before = None;
        if let Some(lease) = register {
            let answer = self.client.count(&hosts, Some(&hosts_end))?;
            bytes += answer.bytes;
            before = Some(answer.count);
            self.register_at_once(lease)?;
        }
        let mut settle = Settle::new(started, before);
        let (floor, spread) = loop {
            let answer = self.client.count(&hosts, Some(&hosts_end))?;
            bytes += answer.bytes;
            match settle.polled(
                answer.count,
                answer.revision,
                Instant::now(),
                &mut self.jitter,
            ) {
                Next::Poll(wait) => self.sleep(wait),
                Next::Read { floor, after } => break (floor, after),
            }
            if self.stop.load(Relaxed) {
                bail!("stopping");
            }
        };
        self.sleep(spread);
        if self.stop.load(Relaxed) {
            bail!("stopping");
        }
        let settled = started.elapsed();
        let read = self.client.snapshot_paged(
            &overlay_ranges(&self.cfg.overlay),
            self.cfg.read_page,
            floor,
        )?;
        let start = StartRead {
            polls: settle.polls() + u32::from(register.is_some()),
            settle: settled,
            spread,
            keys: read.kvs.len() as u64,
            bytes: bytes + read.bytes,
            revision: read.revision,
        };
        info!(
            keys = start.keys,
            bytes = start.bytes,
            revision = start.revision,
            polls = start.polls,
            waited = ?start.settle,
            spread = ?start.spread,
            "etcd: read the overlay"
        );
        self.daemon.read_at_start(&start);
        Ok(self.m.absorb_read(&read))
    }

    /// Applies the derived diff, and queues announcements for interfaces that just moved here.
    fn sync(&mut self) {
        let local = self.daemon.local_config();
        let (derivation, delta) = self.m.derive(&local);
        let report = self.daemon.apply_derived(derivation, delta.as_deref());
        self.m.synced(report, &local);
        if self.m.take_hosts_changed() {
            self.daemon.hosts(self.m.state().hosts());
        }
        self.show(true);
    }

    /// Hands the state to the data plane's views as the machine says (see
    /// [`crate::DataPlane::synced`]).
    fn show(&mut self, synced: bool) {
        match self.m.show(Instant::now(), synced) {
            Show::State => self.daemon.synced(Some(self.m.state())),
            Show::Time => self.daemon.synced(None),
            Show::Nothing => {}
        }
    }

    fn publish_matrix(&mut self, lease: i64) -> Result<()> {
        if let Some(value) = self.m.matrix_update(self.daemon.matrix(), lease) {
            self.client.put(
                key_for_matrix(&self.cfg.overlay, &self.cfg.host).as_bytes(),
                &value,
                lease,
            )?;
            self.m.matrix_put(value);
        }
        Ok(())
    }
}

/// What a session reads and watches: everything of the overlay but the traffic matrices (which
/// every host re-puts while traffic flows: N hosts would each receive N hosts' matrices, and a
/// put through etcd's gRPC proxy would drop its cached snapshot), as two ranges (one watch
/// stream; one snapshot).
fn overlay_ranges(overlay: &OverlayName) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let prefix = overlay_prefix(overlay);
    let matrices = matrix_prefix(overlay).into_bytes();
    vec![
        (prefix.clone().into_bytes(), Some(matrices.clone())),
        (prefix_end(&matrices), Some(prefix_end(prefix.as_bytes()))),
    ]
}

/// What the catch-up watch covers: the whole overlay, a key range other than the lasting
/// watch's (so that etcd's gRPC proxy never shares a watch between the two kinds; see
/// [`splice`](crate::splice)); the matrices in it are ignored.
fn catch_up_range(overlay: &OverlayName) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let prefix = overlay_prefix(overlay).into_bytes();
    let end = prefix_end(&prefix);
    vec![(prefix, Some(end))]
}

/// A seed for the backoff's jitter that differs between hosts and runs.
fn seed(host: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(host.as_bytes());
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_covers_the_overlay_but_the_matrices() {
        let overlay: OverlayName = "lab".parse().unwrap();
        let ranges = overlay_ranges(&overlay);
        let watched = |key: &str| {
            let k = key.as_bytes();
            ranges.iter().any(|(from, to)| {
                k >= from.as_slice() && to.as_ref().is_none_or(|t| k < t.as_slice())
            })
        };
        for key in [
            "/vnet/lab/hosts/a",
            "/vnet/lab/interfaces/1/52:54:00:00:00:01",
            "/vnet/lab/routes/r",
            "/vnet/lab/policy",
            "/vnet/lab/zzz",
        ] {
            assert!(watched(key), "{key}");
        }
        for key in [
            "/vnet/lab/matrix/a",
            "/vnet/lab/matrix/",
            "/vnet/lab2/hosts/a",
            "/vnet/la",
            "/vnet/other/hosts/a",
        ] {
            assert!(!watched(key), "{key}");
        }
    }
}
