//! The harness: the simulated hosts (each an agent's thread with a recorder), the resource
//! samples, and the measuring of one step (probes set, change made, convergence, check).
//! What the steps are is in `scenario`; the move transactions in `moves`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use vnet_cluster::{
    derived_link_name, matrix_prefix, overlay_prefix, ClusterState, HostId, HostRecord,
    OverlayName, SCHEMA_VERSION,
};
use vnet_control::{Command, Config, DestKind, DestRef, Route};
use vnet_core::MacMatch;
use vnet_etcd::{Client, ClientConfig};
use vnet_wire::MacAddr;

use crate::recorder::{Probe, Recorder};
use crate::{stats, Args};
use vnet_agent::DataPlane as _;

/// One simulated host: its agent's thread and its recorder.
pub(crate) struct Host {
    pub(crate) id: HostId,
    pub(crate) vni: u32,
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) crash: Arc<AtomicBool>,
    pub(crate) thread: Option<JoinHandle<()>>,
    pub(crate) alive: bool,
}

pub(crate) fn host_id(i: usize) -> HostId {
    format!("h{i:05}").parse().expect("valid host id")
}

pub(crate) fn guest_mac(i: usize, g: u16) -> MacAddr {
    let [_, _, hi, lo] = (i as u32).to_be_bytes();
    let [ghi, glo] = g.to_be_bytes();
    MacAddr([0x52, 0x54, hi, lo, ghi, glo])
}

pub(crate) fn host_addr(i: usize) -> IpAddr {
    // Documentation only: nothing is ever sent to these (the recorders apply nothing).
    IpAddr::V4(Ipv4Addr::new(10, 200, (i / 250) as u8, (i % 250 + 1) as u8))
}

pub(crate) fn route_to(mac: MacAddr, kind: DestKind, name: String) -> Route {
    Route {
        src: MacMatch::Any,
        dst: MacMatch::Exact(mac),
        to: DestRef { kind, name },
    }
}

pub(crate) fn via_link(mac: MacAddr, host: &HostId, vni: u32) -> Route {
    route_to(mac, DestKind::Link, derived_link_name(host, vni))
}

pub(crate) fn interface_add(name: &str, mac: MacAddr, vni: u32) -> Result<Command> {
    vnet_control::parse_line(&format!("interface add {name} tap mac {mac} vni {vni}"))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("empty command")
}

/// Per probed agent, the move each of its probe's `want` and `gone` routes belongs to.
pub(crate) type MoveTags = BTreeMap<usize, (Vec<usize>, Vec<usize>)>;

/// Seconds with three decimals, or "-" for none (progress lines).
pub(crate) fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

pub(crate) struct Harness {
    pub(crate) args: Args,
    pub(crate) overlay: OverlayName,
    pub(crate) client: Client,
    pub(crate) hosts: Vec<Host>,
    pub(crate) t_start: Instant,
    /// The probes of the last step, taken from the recorders.
    pub(crate) probes: Vec<(usize, Probe)>,
    /// The steps measured so far (written out even when a later step fails).
    pub(crate) steps: Vec<Value>,
}

/// Resource counters at one moment.
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) own_cpu: f64,
    pub(crate) etcd_cpu: f64,
    pub(crate) etcd_rss: u64,
    pub(crate) etcd_sent: f64,
    /// The proxies' CPU seconds, all together.
    pub(crate) proxies_cpu: f64,
    /// The watchers etcd holds (each agent's two ranges straight to it, or each proxy's
    /// broadcasts: a proxy coalesces the watchers of one range into one only when they start
    /// from the same revision or later).
    pub(crate) etcd_watchers: f64,
    /// The range calls etcd answered (with proxies: those their cache did not answer).
    pub(crate) etcd_ranges: f64,
}

/// What the agents and etcd spend while nothing changes (ticks; the lease keep-alives, which
/// etcd answers per host, through proxies or not), per second: a step's cost per event is
/// what it spends above this, so that the per-host cost of holding leases does not pass for
/// a cost of the events.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct IdleRates {
    /// The agents' CPU, cores.
    pub(crate) agents_cpu: f64,
    /// etcd's CPU, cores.
    pub(crate) etcd_cpu: f64,
    /// What etcd's gRPC server sends, bytes per second.
    pub(crate) etcd_sent: f64,
}

impl IdleRates {
    /// The rates between two samples taken while nothing changed.
    pub(crate) fn between(a: &Sample, b: &Sample) -> IdleRates {
        let secs = b.at.duration_since(a.at).as_secs_f64();
        if secs <= 0.0 {
            return IdleRates::default();
        }
        IdleRates {
            agents_cpu: (b.own_cpu - a.own_cpu).max(0.0) / secs,
            etcd_cpu: (b.etcd_cpu - a.etcd_cpu).max(0.0) / secs,
            etcd_sent: (b.etcd_sent - a.etcd_sent).max(0.0) / secs,
        }
    }

    /// `spent` over `wall` seconds, less what idling would have spent (never below 0).
    pub(crate) fn above(rate: f64, spent: f64, wall: f64) -> f64 {
        (spent - rate * wall).max(0.0)
    }
}

impl Harness {
    pub(crate) fn progress(&self, msg: &str) {
        eprintln!(
            "[{:7.1}s] N={} {msg}",
            self.t_start.elapsed().as_secs_f64(),
            self.args.hosts
        );
    }

    pub(crate) fn sample(&self) -> Sample {
        let own = stats::proc_usage(std::process::id()).unwrap_or_default();
        let etcd = self
            .args
            .etcd_pid
            .and_then(stats::proc_usage)
            .unwrap_or_default();
        let page = stats::etcd_metrics(self.client.endpoints()[0].as_str());
        Sample {
            at: Instant::now(),
            own_cpu: own.0,
            etcd_cpu: etcd.0,
            etcd_rss: etcd.1,
            etcd_sent: stats::metric_sum(&page, "etcd_network_client_grpc_sent_bytes_total"),
            proxies_cpu: self
                .args
                .proxy_pids
                .iter()
                .filter_map(|&p| stats::proc_usage(p))
                .map(|u| u.0)
                .sum(),
            etcd_watchers: stats::metric_sum(&page, "etcd_debugging_mvcc_watcher_total"),
            etcd_ranges: stats::metric_sum_with(
                &page,
                "grpc_server_handled_total",
                "grpc_method=\"Range\"",
            ),
        }
    }

    /// The leases lost so far, all together: those etcd let expire (the harness revokes the
    /// lease of a host it kills), or, if more, those the agents' status showed replaced.
    /// etcd's count is the one to trust: an agent whose lease expires during its first read
    /// registers again under a new one before it ever reports the first (stop 28: about one
    /// run in two of 1,000 agents in waves lost one or two leases that way, and the agents'
    /// count showed none).
    pub(crate) fn leases_lost(&self) -> u64 {
        let replaced: u64 = self.hosts.iter().map(|h| h.recorder.leases_lost()).sum();
        let page = stats::etcd_metrics(self.client.endpoints()[0].as_str());
        let expired = stats::metric_sum(&page, "etcd_debugging_server_lease_expired_total");
        replaced.max(expired as u64)
    }

    pub(crate) fn start_host(&mut self, i: usize) -> Result<()> {
        let id = host_id(i);
        let vni = 1 + (i % self.args.vnis) as u32;
        let mut local = Config::default();
        for g in 0..self.args.guests {
            local
                .apply(
                    &interface_add(&format!("g{g}"), guest_mac(i, g), vni)?,
                    &mut || MacAddr::ZERO,
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let recorder = Arc::new(Recorder::new(local));
        let record = HostRecord {
            host_id: id.clone(),
            addr: host_addr(i),
            udp_port: 4789,
            tcp_port: None,
            capabilities: vec![vnet_cluster::CAP_VXLAN.to_string()],
            public_key: None,
            version: SCHEMA_VERSION,
            reach: Default::default(),
        };
        let (stop, crash) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let cfg = vnet_agent::AgentConfig {
            overlay: self.overlay.clone(),
            host: id.clone(),
            record,
            lease_ttl: self.args.lease_ttl,
            matrix_interval: Duration::ZERO,
            read_page: self.args.read_page,
            lease: None,
            crash: crash.clone(),
        };
        let endpoint = match self.args.proxies.len() {
            0 => &self.args.etcd,
            p => &self.args.proxies[i % p],
        };
        let client = Client::new(&ClientConfig::new(endpoint))?;
        let thread = vnet_agent::spawn(recorder.clone(), cfg, client, stop.clone())?;
        self.hosts.push(Host {
            id,
            vni,
            recorder,
            stop,
            crash,
            thread: Some(thread),
            alive: true,
        });
        Ok(())
    }

    /// Hosts (alive) that serve `vni`.
    pub(crate) fn peers(&self, vni: u32) -> impl Iterator<Item = (usize, &Host)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.alive && h.vni == vni)
    }

    /// Every alive agent's derived links and routes against a fresh derivation from the
    /// store; retried for up to 10 s while agents may still be applying. Returns the number
    /// of agents that differ at the end.
    pub(crate) fn check(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = self.read_state()?;
            let wrong = self
                .hosts
                .iter()
                .filter(|h| h.alive)
                .filter(|h| {
                    let want =
                        vnet_cluster::derive(&h.id, &state, &h.recorder.local_config()).config;
                    want != h.recorder.derived()
                })
                .count();
            if wrong == 0 || Instant::now() > deadline {
                return Ok(wrong);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub(crate) fn read_state(&self) -> Result<ClusterState> {
        let r = self.client.get_prefix_paged(
            overlay_prefix(&self.overlay).as_bytes(),
            self.args.read_page,
        )?;
        let matrices = matrix_prefix(&self.overlay);
        let entries = r.kvs.iter().filter_map(|kv| {
            let k = std::str::from_utf8(&kv.key).ok()?;
            (!k.starts_with(&matrices)).then_some((k, kv.value.as_slice()))
        });
        Ok(ClusterState::from_entries(self.overlay.clone(), entries).0)
    }

    /// Waits until every probe is done (or the timeout), then returns each probed agent's
    /// time in seconds (None: not converged).
    /// The probes are kept in `self.probes` (agent index, probe) for per-change figures.
    pub(crate) fn wait_probes(&mut self, probed: &[usize]) -> Vec<Option<f64>> {
        let deadline = Instant::now() + Duration::from_secs(self.args.timeout);
        while Instant::now() < deadline
            && !probed.iter().all(|&i| self.hosts[i].recorder.probe_done())
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.probes = probed
            .iter()
            .filter_map(|&i| Some((i, self.hosts[i].recorder.take_probe()?)))
            .collect();
        probed
            .iter()
            .map(|&i| {
                self.probes
                    .iter()
                    .find(|(k, _)| *k == i)
                    .and_then(|(_, p)| p.done)
                    .map(|d| d.as_secs_f64())
            })
            .collect()
    }

    /// Per move and agent, the time from the move's transaction being sent to the agent having
    /// applied all of it (its new route present, its old one gone), from the last step's
    /// probes; `tags` says which move each probed route belongs to, `issued` when each move
    /// was sent (both since the probes' start). None: not applied.
    pub(crate) fn per_move_times(
        &self,
        tags: &MoveTags,
        issued: &[Option<Duration>],
    ) -> Vec<Option<f64>> {
        let mut out = Vec::new();
        for (i, probe) in &self.probes {
            let Some((want_tags, gone_tags)) = tags.get(i) else {
                continue;
            };
            let mut applied: BTreeMap<usize, Option<Duration>> = BTreeMap::new();
            let routes = want_tags
                .iter()
                .zip(&probe.want_at)
                .chain(gone_tags.iter().zip(&probe.gone_at));
            for (m, at) in routes {
                let e = applied.entry(*m).or_insert(Some(Duration::ZERO));
                *e = match (*e, at) {
                    (Some(a), Some(b)) => Some(a.max(*b)),
                    _ => None,
                };
            }
            for (m, at) in applied {
                out.push(match (at, issued.get(m).copied().flatten()) {
                    (Some(a), Some(s)) => Some(a.saturating_sub(s).as_secs_f64()),
                    _ => None,
                });
            }
        }
        out
    }

    /// Measures one step: `act` makes the change and returns the number of store events it
    /// made; the probes must be set before (with the time `t0`).
    pub(crate) fn step(
        &mut self,
        name: &str,
        probed: &[usize],
        before: Sample,
        events: usize,
        idle: &IdleRates,
    ) -> Result<Value> {
        let times = self.wait_probes(probed);
        // Let the tail of the work (and etcd's) finish inside the measured interval.
        std::thread::sleep(Duration::from_millis(500));
        let after = self.sample();
        let wall = after.at.duration_since(before.at).as_secs_f64();
        let mut done: Vec<f64> = times.iter().flatten().copied().collect();
        done.sort_by(f64::total_cmp);
        let missing = times.len() - done.len();
        let own_cpu = after.own_cpu - before.own_cpu;
        let agent_cpu = IdleRates::above(idle.agents_cpu, own_cpu, wall);
        let etcd_cpu = after.etcd_cpu - before.etcd_cpu;
        let etcd_sent = after.etcd_sent - before.etcd_sent;
        let etcd_cpu_above = IdleRates::above(idle.etcd_cpu, etcd_cpu, wall);
        let etcd_sent_above = IdleRates::above(idle.etcd_sent, etcd_sent, wall);
        let receivers = self.hosts.iter().filter(|h| h.alive).count().max(1);
        let wrong = self.check()?;
        let lost = self.leases_lost();
        let per_event = events.max(1) as f64;
        let v = json!({
            "step": name,
            "agents_probed": probed.len(),
            "not_converged": missing,
            "events": events,
            "p50_s": stats::percentile(&done, 50.0),
            "p99_s": stats::percentile(&done, 99.0),
            "max_s": done.last(),
            "wall_s": wall,
            "agents_cpu_s": own_cpu,
            "agents_cpu_s_above_idle": agent_cpu,
            "agent_cpu_us_per_event": agent_cpu * 1e6 / (receivers as f64 * per_event),
            "etcd_cpu_s": etcd_cpu,
            "etcd_cores": etcd_cpu / wall,
            "etcd_cpu_s_above_idle": etcd_cpu_above,
            "etcd_cpu_ms_per_event_above_idle": etcd_cpu_above * 1e3 / per_event,
            "etcd_rss_bytes": after.etcd_rss,
            "etcd_sent_bytes": etcd_sent,
            "etcd_sent_bytes_per_event": etcd_sent / per_event,
            "etcd_sent_bytes_per_event_above_idle": etcd_sent_above / per_event,
            "proxies_cpu_s": after.proxies_cpu - before.proxies_cpu,
            "etcd_watchers": after.etcd_watchers,
            "leases_lost": lost,
            "agents_wrong_after": wrong,
        });
        self.progress(&format!(
            "{name}: p50 {} p99 {} max {} s, {missing} not converged, {wrong} agents wrong, \
             {lost} leases lost so far, etcd holds {} watchers",
            secs(stats::percentile(&done, 50.0)),
            secs(stats::percentile(&done, 99.0)),
            secs(done.last().copied()),
            after.etcd_watchers
        ));
        Ok(v)
    }

    pub(crate) fn shutdown(&mut self) {
        for h in &self.hosts {
            h.stop.store(true, Relaxed);
        }
        for h in &mut self.hosts {
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
        // Whatever the agents left (a crashed host's keys) goes with the overlay's prefix.
        let prefix = overlay_prefix(&self.overlay);
        let _ = self.client.delete(
            prefix.as_bytes(),
            Some(&vnet_etcd::prefix_end(prefix.as_bytes())),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, own_cpu: f64, etcd_cpu: f64, etcd_sent: f64) -> Sample {
        Sample {
            at,
            own_cpu,
            etcd_cpu,
            etcd_rss: 0,
            etcd_sent,
            proxies_cpu: 0.0,
            etcd_watchers: 0.0,
            etcd_ranges: 0.0,
        }
    }

    #[test]
    fn a_step_costs_what_it_spends_above_idling() {
        let t0 = Instant::now();
        let a = sample(t0, 10.0, 4.0, 1000.0);
        let b = sample(t0 + Duration::from_secs(4), 12.0, 4.4, 9000.0);
        let idle = IdleRates::between(&a, &b);
        assert!((idle.agents_cpu - 0.5).abs() < 1e-9);
        assert!((idle.etcd_cpu - 0.1).abs() < 1e-9);
        assert!((idle.etcd_sent - 2000.0).abs() < 1e-9);
        // 10 s of a step that spent 1.5 CPU-s of etcd's: 0.5 above its idle rate.
        assert!((IdleRates::above(idle.etcd_cpu, 1.5, 10.0) - 0.5).abs() < 1e-9);
        // Less than idling (noise) is no cost, never a negative one.
        assert_eq!(IdleRates::above(idle.etcd_cpu, 0.2, 10.0), 0.0);
        // Samples at the same instant (or counters that went back) give no rate.
        assert_eq!(IdleRates::between(&b, &b), IdleRates::default());
        assert_eq!(IdleRates::between(&b, &a), IdleRates::default());
    }
}
