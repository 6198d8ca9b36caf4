//! The scenario, in order: bring-up, the idle cost, a host joining, a guest moving, a storm
//! of moves, a host dying; each measured by the harness, all in one JSON document.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use vnet_cluster::key_for_host;

use crate::harness::*;
use crate::recorder::Probe;
use crate::stats;
use vnet_agent::StartRead;

/// Agents that hold every link and route of a complete bring-up.
pub(crate) fn ready_at_end(hosts: &[Host], per_vni: usize, routes: usize) -> usize {
    hosts
        .iter()
        .filter(|h| h.recorder.counts() == (per_vni - 1, routes))
        .count()
}

/// What the agents read to start, from each agent's reads of the whole overlay: per host, its
/// first read (keys, bytes as sent, polls of the host count and the wait for registrations to
/// settle: median, mean, max), and every read together (more reads than hosts: some read
/// again, their revision compacted away).
pub(crate) fn start_reads(reads: &[Vec<StartRead>]) -> Value {
    let firsts: Vec<&StartRead> = reads.iter().filter_map(|r| r.first()).collect();
    let spread = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let mean = (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        json!({
            "p50": stats::percentile(&v, 50.0),
            "mean": mean,
            "max": v.last(),
        })
    };
    let all = reads.iter().flatten();
    json!({
        "hosts": firsts.len(),
        "keys_per_host": spread(firsts.iter().map(|r| r.keys as f64).collect()),
        "bytes_per_host": spread(firsts.iter().map(|r| r.bytes as f64).collect()),
        "polls_per_host": spread(firsts.iter().map(|r| f64::from(r.polls)).collect()),
        "settle_s": spread(firsts.iter().map(|r| r.settle.as_secs_f64()).collect()),
        "read_spread_s": spread(firsts.iter().map(|r| r.spread.as_secs_f64()).collect()),
        "reads": all.clone().count(),
        "keys": all.clone().map(|r| r.keys).sum::<u64>(),
        "bytes": all.map(|r| r.bytes).sum::<u64>(),
    })
}

impl Harness {
    /// Sets on every alive agent of `vni` a probe for the routes to `host`'s guests over its
    /// link: all present (`present`: a join) or all gone (a death). Returns the probed agents.
    fn probe_host_routes(&self, vni: u32, host: usize, t0: Instant, present: bool) -> Vec<usize> {
        let mut probed = Vec::new();
        for (i, h) in self.peers(vni) {
            let routes = (0..self.args.guests)
                .map(|k| via_link(guest_mac(host, k), &host_id(host), vni))
                .collect();
            let (want, gone) = if present {
                (routes, vec![])
            } else {
                (vec![], routes)
            };
            h.recorder.set_probe(Probe::new(t0, want, gone));
            probed.push(i);
        }
        probed
    }

    pub(crate) fn run(&mut self) -> Result<Value> {
        let n = self.args.hosts;
        let g = self.args.guests;
        if self.args.vnis == 0 || n < 2 * self.args.vnis || !n.is_multiple_of(self.args.vnis) {
            bail!("--hosts must be a multiple of --vnis, with at least two hosts per VNI");
        }
        self.steps.clear();

        // Bring-up, in waves.
        let t0 = Instant::now();
        let before = self.sample();
        for i in 0..n {
            self.start_host(i)?;
            if self.args.cold_start {
                continue;
            }
            if self.args.ramp > 0.0 {
                let due = t0 + Duration::from_secs_f64(self.args.ramp * (i + 1) as f64 / n as f64);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                if (i + 1) % 100 == 0 {
                    self.progress(&format!("started {} agents", i + 1));
                }
            } else if (i + 1) % self.args.wave == 0 {
                self.progress(&format!("started {} agents", i + 1));
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let per_vni = n / self.args.vnis;
        let expect_routes = g as usize * per_vni;
        let bringup_limit = match self.args.bringup_timeout {
            0 => (n as u64 * 3 / 2).max(180),
            t => t,
        };
        let deadline = Instant::now() + Duration::from_secs(bringup_limit);
        let mut last_report = Instant::now();
        let mut timeline = Vec::new();
        loop {
            let ready = self
                .hosts
                .iter()
                .filter(|h| h.recorder.counts() == (per_vni - 1, expect_routes))
                .count();
            if ready == n {
                break;
            }
            if Instant::now() > deadline {
                self.progress(&format!("bring-up: only {ready} of {n} agents complete"));
                break;
            }
            if last_report.elapsed() > Duration::from_secs(5) {
                // How much of the overlay the agents know, on average: the routes they hold
                // (one per guest, their own included) against all of them.
                let known: usize = self.hosts.iter().map(|h| h.recorder.counts().1).sum();
                let frac = known as f64 / (n * expect_routes) as f64;
                let etcd = self.sample();
                let lost = self.leases_lost();
                self.progress(&format!(
                    "bring-up: {ready} of {n} agents complete, {:.1} % of the routes known, etcd {:.0} CPU-s, {lost} leases lost",
                    frac * 100.0,
                    etcd.etcd_cpu - before.etcd_cpu
                ));
                timeline.push(json!([t0.elapsed().as_secs_f64(), ready, frac, lost]));
                last_report = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let bringup = t0.elapsed().as_secs_f64();
        let complete = ready_at_end(&self.hosts, per_vni, expect_routes);
        let after = self.sample();
        let wrong = self.check()?;
        self.progress(&format!("bring-up {bringup:.1} s, {wrong} agents wrong"));
        let reads: Vec<Vec<StartRead>> = self.hosts.iter().map(|h| h.recorder.reads()).collect();
        let rss = stats::proc_usage(std::process::id()).map_or(0, |u| u.1);
        let threads = stats::threads(std::process::id()).unwrap_or(0);
        self.steps.push(json!({
            "step": "bring-up",
            "wall_s": bringup,
            "agents_complete": complete,
            "cold_start": self.args.cold_start,
            "leases_lost": self.leases_lost(),
            "timeline": timeline,
            "agents_cpu_s": after.own_cpu - before.own_cpu,
            "etcd_cpu_s": after.etcd_cpu - before.etcd_cpu,
            "etcd_sent_bytes": after.etcd_sent - before.etcd_sent,
            "etcd_rss_bytes": after.etcd_rss,
            "proxies_cpu_s": after.proxies_cpu - before.proxies_cpu,
            "etcd_ranges": after.etcd_ranges - before.etcd_ranges,
            "etcd_watchers": after.etcd_watchers,
            "start_reads": start_reads(&reads),
            "agents_wrong_after": wrong,
        }));

        // The idle cost of the agents (ticks, lease keep-alives), subtracted from the steps.
        let idle0 = self.sample();
        std::thread::sleep(Duration::from_secs(5));
        let idle1 = self.sample();
        let idle = IdleRates::between(&idle0, &idle1);
        self.progress(&format!(
            "idle: agents {:.3} cores, etcd {:.3} cores, etcd sends {:.0} B/s",
            idle.agents_cpu, idle.etcd_cpu, idle.etcd_sent
        ));

        // Join: host n registers with its guests; every host of its VNI must route to them.
        let j = n;
        let vni_j = 1 + (j % self.args.vnis) as u32;
        let t0 = Instant::now();
        let probed = self.probe_host_routes(vni_j, j, t0, true);
        let before = self.sample();
        self.start_host(j)?;
        // The joiner's own first read comes after its settle polls: wait for it, so that the
        // step's measurement of etcd holds the read that is taken out of it below.
        let read_by = Instant::now() + Duration::from_secs(self.args.timeout);
        while self.hosts[j].recorder.reads().is_empty() && Instant::now() < read_by {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut join = self.step("join", &probed, before, 1 + g as usize, &idle)?;
        // The joiner's own first read of the overlay is O(N) by nature (it needs every host's
        // records) and etcd serves it even through a proxy: the joiner's registration through
        // that proxy clears its cached overlay. What the join costs etcd for everyone else is
        // the rest.
        let joiner_read: u64 = self.hosts[j].recorder.reads().iter().map(|r| r.bytes).sum();
        let above = join["etcd_sent_bytes_per_event_above_idle"]
            .as_f64()
            .unwrap_or(0.0);
        let events = (1 + g as usize) as f64;
        join["joiner_read_bytes"] = json!(joiner_read);
        join["etcd_sent_bytes_per_event_above_idle_less_joiner_read"] =
            json!((above * events - joiner_read as f64).max(0.0) / events);
        self.steps.push(join);

        // Move: guest 0 of host 0 to the next host of its VNI.
        let (from, to) = (0usize, self.args.vnis);
        let (mac, vni) = (guest_mac(from, 0), self.hosts[from].vni);
        let name = format!("m{from}g0");
        self.arrive(to, &name, mac, vni)?;
        std::thread::sleep(Duration::from_millis(500));
        let state = self.read_state()?;
        let before = self.sample();
        let t0 = Instant::now();
        let moves = vec![(mac, vni, from, to, name.clone())];
        let probed = self.move_probes(&moves, t0, &mut MoveTags::new());
        self.move_txn(&state, mac, vni, to, &name)?;
        let moved = self.step("move", &probed, before, 1, &idle)?;
        self.steps.push(moved);

        // Storm: many guests (guest 1.. of hosts 1..) each to the next host of its VNI.
        let mut moves = Vec::new();
        'pick: for k in 1..g {
            for from in 1..n {
                if moves.len() == self.args.storm {
                    break 'pick;
                }
                let to = (from + self.args.vnis) % n;
                let mac = guest_mac(from, k);
                moves.push((mac, self.hosts[from].vni, from, to, format!("m{from}g{k}")));
            }
        }
        for (mac, vni, _, to, name) in &moves {
            self.arrive(*to, name, *mac, *vni)?;
        }
        std::thread::sleep(Duration::from_millis(1000));
        let state = self.read_state()?;
        let before = self.sample();
        let t0 = Instant::now();
        let mut tags = MoveTags::new();
        let probed = self.move_probes(&moves, t0, &mut tags);
        // Issued from 8 threads at once, as operators or an orchestrator moving a job would.
        let this = &*self;
        let chunk_len = moves.len().div_ceil(8).max(1);
        let sent: Vec<Option<Duration>> = std::thread::scope(|s| -> Result<_> {
            let workers: Vec<_> = moves
                .chunks(chunk_len)
                .map(|chunk| {
                    let state = &state;
                    s.spawn(move || -> Result<Vec<Option<Duration>>> {
                        let mut sent = Vec::new();
                        for (mac, vni, _, to, name) in chunk {
                            let at = this.move_txn(state, *mac, *vni, *to, name)?;
                            sent.push(Some(at.duration_since(t0)));
                        }
                        Ok(sent)
                    })
                })
                .collect();
            let mut sent = Vec::new();
            for w in workers {
                sent.extend(
                    w.join()
                        .map_err(|_| anyhow::anyhow!("move thread panicked"))??,
                );
            }
            Ok(sent)
        })?;
        let issued = t0.elapsed().as_secs_f64();
        let mut storm = self.step("storm", &probed, before, moves.len(), &idle)?;
        let mut per_move: Vec<f64> = Vec::new();
        let mut per_move_missing = 0;
        for t in self.per_move_times(&tags, &sent) {
            match t {
                Some(t) => per_move.push(t),
                None => per_move_missing += 1,
            }
        }
        per_move.sort_by(f64::total_cmp);
        storm["moves"] = json!(moves.len());
        storm["issue_s"] = json!(issued);
        // Each move from its own transaction to each agent: what "a move reaches every agent"
        // means while 99 others are under way.
        storm["per_move_p50_s"] = json!(stats::percentile(&per_move, 50.0));
        storm["per_move_p99_s"] = json!(stats::percentile(&per_move, 99.0));
        storm["per_move_max_s"] = json!(per_move.last());
        storm["per_move_not_applied"] = json!(per_move_missing);
        self.progress(&format!(
            "storm: moves issued in {issued:.2} s; each move to each agent p50 {} p99 {} s",
            secs(stats::percentile(&per_move, 50.0)),
            secs(stats::percentile(&per_move, 99.0))
        ));
        self.steps.push(storm);

        // Death: the joined host stops without a word; its lease is revoked at t0 (what the
        // lease's expiry does TTL seconds later).
        let victim = j;
        let lease = {
            let key = key_for_host(&self.overlay, &self.hosts[victim].id);
            let r = self.client.range(key.as_bytes(), None)?;
            r.kvs
                .first()
                .map(|kv| kv.lease)
                .context("victim not registered")?
        };
        {
            let h = &mut self.hosts[victim];
            h.crash.store(true, Relaxed);
            h.stop.store(true, Relaxed);
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
            h.alive = false;
        }
        let t0 = Instant::now();
        let probed = self.probe_host_routes(vni_j, victim, t0, false);
        let before = self.sample();
        self.client.lease_revoke(lease)?;
        let death = self.step("death", &probed, before, 1 + g as usize, &idle)?;
        self.steps.push(death);

        let rss_end = stats::proc_usage(std::process::id()).map_or(0, |u| u.1);
        Ok(json!({
            "hosts": n,
            "guests": g,
            "vnis": self.args.vnis,
            "lease_ttl": self.args.lease_ttl,
            "proxies": self.args.proxies.len(),
            "threads": threads,
            "agents_rss_bytes": rss,
            "agents_rss_bytes_end": rss_end,
            "rss_bytes_per_agent": rss as f64 / n as f64,
            "idle_agents_cores": idle.agents_cpu,
            "idle_etcd_cores": idle.etcd_cpu,
            "idle_etcd_sent_bytes_per_s": idle.etcd_sent,
            "steps": std::mem::take(&mut self.steps),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(keys: u64, bytes: u64, polls: u32) -> StartRead {
        StartRead {
            polls,
            settle: Duration::from_millis(u64::from(polls) * 500),
            spread: Duration::ZERO,
            keys,
            bytes,
            revision: 1,
        }
    }

    #[test]
    fn start_reads_per_host_count_the_first_read_and_all_reads_together() {
        let reads = vec![
            vec![read(10, 1000, 2)],
            // Read again (compacted): the second read counts in the totals only.
            vec![read(30, 3000, 4), read(90, 9000, 2)],
            vec![],
        ];
        let v = start_reads(&reads);
        assert_eq!(v["hosts"], 2);
        assert_eq!(v["keys_per_host"]["max"], 30.0);
        assert_eq!(v["keys_per_host"]["mean"], 20.0);
        assert_eq!(v["bytes_per_host"]["p50"], 1000.0);
        assert_eq!(v["polls_per_host"]["max"], 4.0);
        assert_eq!(v["settle_s"]["max"], 2.0);
        assert_eq!(
            (v["reads"].as_u64(), v["keys"].as_u64()),
            (Some(3), Some(130))
        );
        assert_eq!(v["bytes"], 13000);
        let none = start_reads(&[]);
        assert!(none["keys_per_host"]["mean"].is_null());
    }
}
