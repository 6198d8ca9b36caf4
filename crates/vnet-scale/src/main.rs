//! `vnet-scale`: N of vnet's real etcd agents (the code `vnetd --etcd` runs, `vnet-agent`) in
//! one process against one real etcd (directly, or spread over etcd's gRPC proxies with
//! `--proxies`), each with a recording data plane, and the time it takes a change to reach
//! all of them.
//!
//! Steps, in order: bring-up (every host registers), a host joining, a guest moving, a storm
//! of moves, a host dying. For each: the time until every affected agent has applied the
//! change (from its recorder's probe), this process's CPU (the agents' work) and memory, etcd's
//! CPU, memory and bytes sent (from `/proc/PID` and its `/metrics`), and a correctness check:
//! every agent's derived links and routes equal a fresh derivation from what the store holds.
//! Results go to stdout as one JSON document; progress to stderr.

#![forbid(unsafe_code)]

mod recorder;
mod stats;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use vnet_cluster::{
    derived_link_name, key_for_host, matrix_prefix, overlay_prefix, plan_move, ClusterState,
    HostId, HostRecord, OverlayName, SCHEMA_VERSION,
};
use vnet_control::{Command, Config, DestKind, DestRef, Route};
use vnet_core::MacMatch;
use vnet_etcd::{Client, ClientConfig, Compare, CompareTarget, TxnOp};
use vnet_wire::MacAddr;

use recorder::{Probe, Recorder};
use vnet_agent::DataPlane as _;

#[derive(Parser, Debug)]
#[command(about = "Scale harness: N real vnet etcd agents with recording data planes")]
struct Args {
    /// etcd endpoint(s) for the agents and the controller.
    #[arg(long)]
    etcd: String,
    /// etcd's PID, for its CPU and memory (from /proc).
    #[arg(long)]
    etcd_pid: Option<u32>,
    /// Hosts (agents) at the start; one more joins in the join step.
    #[arg(long, default_value_t = 10)]
    hosts: usize,
    /// Guests (interfaces) per host.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(2..=200))]
    guests: u16,
    /// VNIs: host i's guests are all in VNI 1 + i % VNIS (1: one job over every host, the
    /// worst case: a full mesh).
    #[arg(long, default_value_t = 1)]
    vnis: usize,
    /// Lease TTL of every agent, seconds.
    #[arg(long, default_value_t = 10)]
    lease_ttl: i64,
    /// Moves in the storm step.
    #[arg(long, default_value_t = 100)]
    storm: usize,
    /// The longest wait for one step to converge, seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// The longest wait for bring-up, seconds (0: 1.5 s per host, at least 180).
    #[arg(long, default_value_t = 0)]
    bringup_timeout: u64,
    /// Keys per page of each agent's first read (and of the harness's own reads).
    #[arg(long, default_value_t = vnet_agent::READ_PAGE, value_parser = clap::value_parser!(i64).range(1..))]
    read_page: i64,
    /// Spread the agents' starts evenly over this many seconds (0: in waves of --wave, 200 ms
    /// apart), as hosts booting over a while rather than all at once.
    #[arg(long, default_value_t = 0.0)]
    ramp: f64,
    /// Agents started at once during bring-up (then the next wave).
    #[arg(long, default_value_t = 100)]
    wave: usize,
    /// A simultaneous cold start: every agent started at once (no waves; --ramp ignored), as
    /// after a power cut or an etcd restore; the bring-up reports its time and the leases lost.
    #[arg(long)]
    cold_start: bool,
    /// etcd gRPC proxies (`etcd grpc-proxy start`; comma-separated endpoints) the agents
    /// reach etcd through instead of --etcd: agent i uses proxy i % P. The harness's own
    /// client and the measurements of etcd stay on --etcd.
    #[arg(long, value_delimiter = ',')]
    proxies: Vec<String>,
    /// The proxies' PIDs, for their CPU (from /proc).
    #[arg(long, value_delimiter = ',')]
    proxy_pids: Vec<u32>,
}

/// One simulated host: its agent's thread and its recorder.
struct Host {
    id: HostId,
    vni: u32,
    recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    crash: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    alive: bool,
}

fn host_id(i: usize) -> HostId {
    format!("h{i:05}").parse().expect("valid host id")
}

fn guest_mac(i: usize, g: u16) -> MacAddr {
    let [_, _, hi, lo] = (i as u32).to_be_bytes();
    let [ghi, glo] = g.to_be_bytes();
    MacAddr([0x52, 0x54, hi, lo, ghi, glo])
}

fn host_addr(i: usize) -> IpAddr {
    // Documentation only: nothing is ever sent to these (the recorders apply nothing).
    IpAddr::V4(Ipv4Addr::new(10, 200, (i / 250) as u8, (i % 250 + 1) as u8))
}

fn route_to(mac: MacAddr, kind: DestKind, name: String) -> Route {
    Route {
        src: MacMatch::Any,
        dst: MacMatch::Exact(mac),
        to: DestRef { kind, name },
    }
}

fn via_link(mac: MacAddr, host: &HostId, vni: u32) -> Route {
    route_to(mac, DestKind::Link, derived_link_name(host, vni))
}

fn interface_add(name: &str, mac: MacAddr, vni: u32) -> Result<Command> {
    vnet_control::parse_line(&format!("interface add {name} tap mac {mac} vni {vni}"))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("empty command")
}

/// Agents that hold every link and route of a complete bring-up.
fn ready_at_end(hosts: &[Host], per_vni: usize, routes: usize) -> usize {
    hosts
        .iter()
        .filter(|h| h.recorder.counts() == (per_vni - 1, routes))
        .count()
}

/// Per probed agent, the move each of its probe's `want` and `gone` routes belongs to.
type MoveTags = BTreeMap<usize, (Vec<usize>, Vec<usize>)>;

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

struct Harness {
    args: Args,
    overlay: OverlayName,
    client: Client,
    hosts: Vec<Host>,
    t_start: Instant,
    /// The probes of the last step, taken from the recorders.
    probes: Vec<(usize, Probe)>,
}

/// Resource counters at one moment.
struct Sample {
    at: Instant,
    own_cpu: f64,
    etcd_cpu: f64,
    etcd_rss: u64,
    etcd_sent: f64,
    /// The proxies' CPU seconds, all together.
    proxies_cpu: f64,
}

impl Harness {
    fn progress(&self, msg: &str) {
        eprintln!(
            "[{:7.1}s] N={} {msg}",
            self.t_start.elapsed().as_secs_f64(),
            self.args.hosts
        );
    }

    fn sample(&self) -> Sample {
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
        }
    }

    /// The leases the agents lost so far, all together.
    fn leases_lost(&self) -> u64 {
        self.hosts.iter().map(|h| h.recorder.leases_lost()).sum()
    }

    fn start_host(&mut self, i: usize) -> Result<()> {
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
    fn peers(&self, vni: u32) -> impl Iterator<Item = (usize, &Host)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.alive && h.vni == vni)
    }

    /// Every alive agent's derived links and routes against a fresh derivation from the
    /// store; retried for up to 10 s while agents may still be applying. Returns the number
    /// of agents that differ at the end.
    fn check(&self) -> Result<usize> {
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

    fn read_state(&self) -> Result<ClusterState> {
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
    fn wait_probes(&mut self, probed: &[usize]) -> Vec<Option<f64>> {
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
    fn per_move_times(&self, tags: &MoveTags, issued: &[Option<Duration>]) -> Vec<Option<f64>> {
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
    fn step(
        &mut self,
        name: &str,
        probed: &[usize],
        before: Sample,
        events: usize,
        baseline_cpu_rate: f64,
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
        let agent_cpu = (own_cpu - baseline_cpu_rate * wall).max(0.0);
        let receivers = self.hosts.iter().filter(|h| h.alive).count().max(1);
        let wrong = self.check()?;
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
            "agent_cpu_us_per_event": agent_cpu * 1e6 / (receivers * events.max(1)) as f64,
            "etcd_cpu_s": after.etcd_cpu - before.etcd_cpu,
            "etcd_cores": (after.etcd_cpu - before.etcd_cpu) / wall,
            "etcd_rss_bytes": after.etcd_rss,
            "etcd_sent_bytes": after.etcd_sent - before.etcd_sent,
            "etcd_sent_bytes_per_event": (after.etcd_sent - before.etcd_sent) / events.max(1) as f64,
            "proxies_cpu_s": after.proxies_cpu - before.proxies_cpu,
            "agents_wrong_after": wrong,
        });
        self.progress(&format!(
            "{name}: p50 {} p99 {} max {} s, {missing} not converged, {wrong} agents wrong",
            secs(stats::percentile(&done, 50.0)),
            secs(stats::percentile(&done, 99.0)),
            secs(done.last().copied())
        ));
        Ok(v)
    }

    /// Adds an interface for `mac` on host `to` (the VM arriving there) without moving it yet.
    fn arrive(&self, to: usize, name: &str, mac: MacAddr, vni: u32) -> Result<()> {
        self.hosts[to]
            .recorder
            .change_local(&interface_add(name, mac, vni)?)
    }

    /// The move transaction, as `vnetctl --etcd move` makes it. Refused because the store
    /// changed meanwhile (the destination re-registered under a new lease, say), it is planned
    /// again from a fresh read, as an orchestrator would, up to three times. Returns when the
    /// transaction that succeeded was sent.
    fn move_txn(
        &self,
        state: &ClusterState,
        mac: MacAddr,
        vni: u32,
        to: usize,
        name: &str,
    ) -> Result<Instant> {
        let mut current = state
            .placement(vni, mac)
            .with_context(|| format!("no placement of {mac}"))?
            .clone();
        let to_id = &self.hosts[to].id;
        let host_key = key_for_host(&self.overlay, to_id);
        for _attempt in 0..3 {
            let host_kv = self.client.range(host_key.as_bytes(), None)?;
            let host_kv = host_kv.kvs.first().context("destination not registered")?;
            let plan = plan_move(&self.overlay, &current, to_id, name)?;
            let sent = Instant::now();
            let ok = self.client.txn(
                &[
                    Compare {
                        key: plan.key.clone().into_bytes(),
                        target: CompareTarget::Value(plan.expected_value.clone()),
                    },
                    Compare {
                        key: host_key.clone().into_bytes(),
                        target: CompareTarget::ModRevision(host_kv.mod_revision),
                    },
                ],
                &[TxnOp::Put {
                    key: plan.key.clone().into_bytes(),
                    value: plan.new_value,
                    lease: host_kv.lease,
                }],
                &[],
            )?;
            if ok {
                return Ok(sent);
            }
            let now = self.client.range(plan.key.as_bytes(), None)?;
            let kv = now.kvs.first().with_context(|| format!("{mac} is gone"))?;
            match vnet_cluster::parse_entry(&self.overlay, &plan.key, &kv.value) {
                Ok(vnet_cluster::ClusterEntry::Interface(rec)) => current = rec,
                _ => bail!("{mac}: bad placement in the store"),
            }
        }
        bail!("move of {mac} refused three times (store changed)")
    }

    /// The probes of a set of moves (mac, vni, from, to, name) for every alive agent of the VNI.
    fn move_probes(
        &self,
        moves: &[(MacAddr, u32, usize, usize, String)],
        t0: Instant,
        tags: &mut MoveTags,
    ) -> Vec<usize> {
        let mut probed = Vec::new();
        for (i, h) in self.hosts.iter().enumerate().filter(|(_, h)| h.alive) {
            let mut want = Vec::new();
            let mut gone = Vec::new();
            let (mut want_tags, mut gone_tags) = (Vec::new(), Vec::new());
            for (m, (mac, vni, from, to, name)) in moves.iter().enumerate() {
                if h.vni != *vni {
                    continue;
                }
                let old = &self.hosts[*from].id;
                let new = &self.hosts[*to].id;
                if i == *to {
                    want.push(route_to(*mac, DestKind::Interface, name.clone()));
                } else {
                    want.push(via_link(*mac, new, *vni));
                }
                want_tags.push(m);
                if i == *from {
                    let g = u16::from_be_bytes([mac.0[4], mac.0[5]]);
                    gone.push(route_to(*mac, DestKind::Interface, format!("g{g}")));
                    gone_tags.push(m);
                } else if i != *to {
                    gone.push(via_link(*mac, old, *vni));
                    gone_tags.push(m);
                }
            }
            if !want.is_empty() {
                h.recorder.set_probe(Probe::new(t0, want, gone));
                tags.insert(i, (want_tags, gone_tags));
                probed.push(i);
            }
        }
        probed
    }

    fn run(&mut self) -> Result<Value> {
        let n = self.args.hosts;
        let g = self.args.guests;
        if self.args.vnis == 0 || n < 2 * self.args.vnis || !n.is_multiple_of(self.args.vnis) {
            bail!("--hosts must be a multiple of --vnis, with at least two hosts per VNI");
        }
        let mut steps = Vec::new();

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
        let rss = stats::proc_usage(std::process::id()).map_or(0, |u| u.1);
        let threads = stats::threads(std::process::id()).unwrap_or(0);
        steps.push(json!({
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
            "agents_wrong_after": wrong,
        }));

        // The idle cost of the agents (ticks, lease keep-alives), subtracted from the steps.
        let idle0 = self.sample();
        std::thread::sleep(Duration::from_secs(3));
        let idle1 = self.sample();
        let idle_rate =
            (idle1.own_cpu - idle0.own_cpu) / idle1.at.duration_since(idle0.at).as_secs_f64();
        let etcd_idle =
            (idle1.etcd_cpu - idle0.etcd_cpu) / idle1.at.duration_since(idle0.at).as_secs_f64();
        self.progress(&format!(
            "idle: agents {idle_rate:.3} cores, etcd {etcd_idle:.3} cores"
        ));

        // Join: host n registers with its guests; every host of its VNI must route to them.
        let j = n;
        let vni_j = 1 + (j % self.args.vnis) as u32;
        let t0 = Instant::now();
        let mut probed = Vec::new();
        for (i, h) in self.peers(vni_j) {
            let want = (0..g)
                .map(|k| via_link(guest_mac(j, k), &host_id(j), vni_j))
                .collect();
            h.recorder.set_probe(Probe::new(t0, want, vec![]));
            probed.push(i);
        }
        let before = self.sample();
        self.start_host(j)?;
        steps.push(self.step("join", &probed, before, 1 + g as usize, idle_rate)?);

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
        steps.push(self.step("move", &probed, before, 1, idle_rate)?);

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
        let mut storm = self.step("storm", &probed, before, moves.len(), idle_rate)?;
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
        steps.push(storm);

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
        let mut probed = Vec::new();
        for (i, h) in self.peers(vni_j) {
            let gone = (0..g)
                .map(|k| via_link(guest_mac(victim, k), &host_id(victim), vni_j))
                .collect();
            h.recorder.set_probe(Probe::new(t0, vec![], gone));
            probed.push(i);
        }
        let before = self.sample();
        self.client.lease_revoke(lease)?;
        steps.push(self.step("death", &probed, before, 1 + g as usize, idle_rate)?);

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
            "idle_agents_cores": idle_rate,
            "idle_etcd_cores": etcd_idle,
            "steps": steps,
        }))
    }

    fn shutdown(&mut self) {
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

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // The harness's own client (the controller: reads, moves, revokes) waits long: it is the
    // measuring tool, and a call of its own timing out on a loaded etcd would end the run.
    let mut cc = ClientConfig::new(&args.etcd);
    cc.timeout = Duration::from_secs(30);
    let client = Client::new(&cc).context("etcd client")?;
    client.range(b"/", None).context("etcd not reachable")?;
    let overlay: OverlayName = format!("scale{}", std::process::id()).parse()?;
    let mut h = Harness {
        args,
        overlay,
        client,
        hosts: Vec::new(),
        t_start: Instant::now(),
        probes: Vec::new(),
    };
    let result = h.run();
    h.shutdown();
    let v = result?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
