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

mod harness;
mod moves;
mod recorder;
mod scenario;
mod stats;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use vnet_cluster::OverlayName;
use vnet_etcd::{Client, ClientConfig};

use harness::Harness;

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
        steps: Vec::new(),
    };
    let result = h.run();
    h.shutdown();
    let v = match result {
        Ok(v) => v,
        Err(e) => {
            // What was measured before the failure is still worth reading (the steps that
            // led to it); the exit status says the run failed.
            let partial = serde_json::json!({
                "hosts": h.args.hosts,
                "proxies": h.args.proxies.len(),
                "error": format!("{e:#}"),
                "steps": std::mem::take(&mut h.steps),
            });
            println!("{}", serde_json::to_string_pretty(&partial)?);
            return Err(e);
        }
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
