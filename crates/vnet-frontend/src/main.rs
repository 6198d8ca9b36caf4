//! `vhost-frontend`: a vhost-user-net frontend for benchmarks and robustness tests.
//! See the library documentation (`vnet_frontend`) and the crate README for usage.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use vnet_frontend::bench::{self, BenchOpts, Role, Stats};
use vnet_frontend::conn::ConnError;
use vnet_frontend::device::{Device, Endpoint, SetupOpts};
use vnet_frontend::frame::{parse_mac, FrameSpec};
use vnet_frontend::hostile::{self, HostileOpts};
use vnet_frontend::isolation::{self, IsolationOpts};
use vnet_frontend::refill::{self, RefillOpts};

#[derive(Parser, Debug)]
#[command(
    name = "vhost-frontend",
    about = "A vhost-user-net frontend that plays the VMM: probe, benchmark, or attack a backend"
)]
struct Cli {
    /// The backend's vhost-user unix socket.
    #[arg(
        long,
        short = 's',
        global = true,
        default_value = "/tmp/vhost-user-net.sock"
    )]
    socket: PathBuf,
    /// Bind the socket and accept a backend in client mode (instead of connecting).
    #[arg(long, global = true)]
    listen: bool,
    /// Guest memory size in MiB (one memfd region).
    #[arg(long, global = true, default_value_t = 64)]
    mem_mb: usize,
    /// Guest physical address of the memory region (page aligned; hex with 0x).
    #[arg(long, global = true, default_value = "0", value_parser = parse_u64)]
    gpa_base: u64,
    /// Queue pairs: ring 2k receives, ring 2k+1 transmits.
    #[arg(long, global = true, default_value_t = 1)]
    queue_pairs: u16,
    /// Entries per ring (power of two).
    #[arg(long, global = true, default_value_t = 256)]
    ring_size: u32,
    /// Do not negotiate VIRTIO_RING_F_EVENT_IDX.
    #[arg(long, global = true)]
    no_event_idx: bool,
    /// Do not negotiate VIRTIO_NET_F_MRG_RXBUF.
    #[arg(long, global = true)]
    no_mrg_rxbuf: bool,
    /// Negotiate CSUM, GUEST_CSUM, HOST_TSO4, GUEST_TSO4 (when offered).
    #[arg(long, global = true)]
    offload: bool,
    /// Seconds to wait for the backend (connect/accept, each reply, data path progress).
    #[arg(long, global = true, default_value_t = 10.0)]
    timeout: f64,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Negotiate, set up the rings, print what was negotiated (JSON).
    Probe,
    /// Move frames and measure.
    Bench(BenchArgs),
    /// Misbehave and report what the backend did (JSON).
    Hostile(HostileArgs),
    /// Post receive buffers and report whether bytes of foreign frames (carrying a marker)
    /// ever appeared in them (JSON).
    Isolation(IsolationArgs),
    /// Offer too few receive buffers, add more later kicking only when EVENT_IDX asks for it,
    /// and report whether the frames that waited arrived (JSON).
    Refill(RefillArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum RoleArg {
    Tx,
    Rx,
    Both,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    #[arg(long, value_enum, default_value = "tx")]
    role: RoleArg,
    /// Ethernet frame size including the 14-byte header (above MTU+14 needs --offload: TSO).
    #[arg(long, default_value_t = 1514)]
    size: usize,
    #[arg(long, default_value = "ff:ff:ff:ff:ff:ff")]
    dst_mac: String,
    #[arg(long, default_value = "02:00:00:00:00:01")]
    src_mac: String,
    #[arg(long, default_value = "10.99.0.1")]
    src_ip: Ipv4Addr,
    #[arg(long, default_value = "10.99.0.2")]
    dst_ip: Ipv4Addr,
    /// IP MTU of the link.
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Seconds to run (tx from the first frame sent; rx from the first frame received).
    #[arg(long)]
    duration: Option<f64>,
    /// Frames to send / receive (in total over all queues).
    #[arg(long)]
    count: Option<u64>,
    /// Frames per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Frames published per kick decision.
    #[arg(long, default_value_t = 32)]
    batch: u16,
    /// rx: stop after this many seconds without a frame (once frames have arrived).
    #[arg(long, default_value_t = 2.0)]
    idle: f64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct HostileArgs {
    /// Case name, "case/variant", or "all".
    #[arg(long, default_value = "all")]
    case: String,
    /// List the cases and variants and exit.
    #[arg(long)]
    list: bool,
    /// Milliseconds the backend gets to react to each misbehaviour.
    #[arg(long, default_value_t = 300)]
    settle_ms: u64,
    /// Seconds hostile rx buffers stay posted (send traffic to the port meanwhile).
    #[arg(long, default_value_t = 1.0)]
    rx_wait: f64,
    /// Seconds to wait for the answer to the GET_FEATURES probe.
    #[arg(long, default_value_t = 2.0)]
    probe_timeout: f64,
    /// Skip the normal frame round after each case.
    #[arg(long)]
    no_round: bool,
}

#[derive(clap::Args, Debug)]
struct IsolationArgs {
    /// The bytes only frames that are not for this guest carry (at least 8).
    #[arg(long)]
    marker: String,
    /// Keep rewriting the start of every receive buffer while frames arrive.
    #[arg(long)]
    scribble: bool,
    /// Longest run, seconds.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Stop after this many seconds without a frame (once frames have arrived).
    #[arg(long, default_value_t = 2.0)]
    idle: f64,
}

#[derive(clap::Args, Debug)]
struct RefillArgs {
    /// Receive buffers offered first.
    #[arg(long, default_value_t = 1)]
    first: u16,
    /// Receive buffers added after --wait.
    #[arg(long, default_value_t = 15)]
    then: u16,
    /// Bytes per receive buffer.
    #[arg(long, default_value_t = 256)]
    buffer_len: u32,
    /// Seconds the first buffers stay alone (send the frames meanwhile).
    #[arg(long, default_value_t = 2.0)]
    wait: f64,
    /// Seconds to wait for frames after the refill.
    #[arg(long, default_value_t = 3.0)]
    timeout: f64,
}

/// println! that does not panic when stdout is gone (e.g. piped into `head`).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

fn secs(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("bad {what} {v}"))
}

fn setup_opts(cli: &Cli) -> Result<SetupOpts> {
    if cli.queue_pairs == 0 || cli.queue_pairs > 127 {
        bail!("--queue-pairs must be 1..=127");
    }
    if cli.mem_mb == 0 || cli.mem_mb > 1 << 20 {
        bail!("--mem-mb out of range");
    }
    Ok(SetupOpts {
        timeout: secs(cli.timeout, "--timeout")?,
        mem_mb: cli.mem_mb,
        gpa_base: cli.gpa_base,
        queue_pairs: cli.queue_pairs,
        ring_size: cli.ring_size,
        event_idx: !cli.no_event_idx,
        mrg_rxbuf: !cli.no_mrg_rxbuf,
        offload: cli.offload,
    })
}

/// Exit status 2: the backend went away (or a hostile case found a problem).
const EXIT_BACKEND: u8 = 2;

fn is_disconnect(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ConnError>(),
            Some(ConnError::Closed) | Some(ConnError::Timeout)
        )
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("vhost-frontend: {e:#}");
            if is_disconnect(&e) {
                ExitCode::from(EXIT_BACKEND)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn run(cli: &Cli) -> Result<u8> {
    if let Mode::Hostile(h) = &cli.mode {
        if h.list {
            for n in hostile::variant_names() {
                say!("{n}");
            }
            return Ok(0);
        }
    }
    let opts = setup_opts(cli)?;
    let ep = Endpoint::new(cli.socket.clone(), cli.listen)?;
    match &cli.mode {
        Mode::Probe => {
            let dev = Device::open(&ep, &opts, 1)?;
            let mut v = dev.neg.to_json(opts.queue_pairs);
            v["mode"] = json!("probe");
            v["rings"] = json!(dev.queues.len());
            v["ring_size"] = json!(opts.ring_size);
            say!("{}", serde_json::to_string_pretty(&v)?);
            let _ = dev.stop();
            Ok(0)
        }
        Mode::Bench(b) => run_bench(&ep, &opts, b),
        Mode::Isolation(a) => {
            let io = IsolationOpts {
                marker: a.marker.as_bytes().to_vec(),
                scribble: a.scribble,
                duration: secs(a.duration, "--duration")?,
                idle: secs(a.idle, "--idle")?,
            };
            run_mode(&ep, &opts, "isolation", |dev| isolation::run(dev, &io))
        }
        Mode::Refill(a) => {
            let ro = RefillOpts {
                first: a.first,
                then: a.then,
                buffer_len: a.buffer_len,
                wait: secs(a.wait, "--wait")?,
                timeout: secs(a.timeout, "--timeout")?,
            };
            run_mode(&ep, &opts, "refill", |dev| refill::run(dev, &ro))
        }
        Mode::Hostile(h) => {
            let mut o = opts.clone();
            o.queue_pairs = 1;
            let ho = HostileOpts {
                setup: o,
                settle: Duration::from_millis(h.settle_ms),
                rx_wait: secs(h.rx_wait, "--rx-wait")?,
                probe_timeout: secs(h.probe_timeout, "--probe-timeout")?,
                round: !h.no_round,
                frame: FrameSpec::default(),
            };
            let reports = hostile::run(&ep, &ho, &h.case, |r| {
                eprintln!(
                    "[hostile] {}/{}: {}{}",
                    r.case,
                    r.variant,
                    r.verdict,
                    if r.canary_intact {
                        ""
                    } else {
                        " (CANARY DAMAGED)"
                    }
                );
            })?;
            let failures = reports.iter().filter(|r| r.is_failure()).count();
            let out = json!({
                "mode": "hostile",
                "variants": reports.len(),
                "failures": failures,
                "results": reports,
            });
            say!("{}", serde_json::to_string_pretty(&out)?);
            Ok(if failures > 0 { EXIT_BACKEND } else { 0 })
        }
    }
}

/// Opens the device, runs a mode that reports once on it, stops the device and prints the
/// report (JSON, with "mode").
fn run_mode<R: serde::Serialize>(
    ep: &Endpoint,
    opts: &SetupOpts,
    mode: &str,
    run: impl FnOnce(&Device) -> Result<R>,
) -> Result<u8> {
    let dev = Device::open(ep, opts, 1)?;
    let rep = run(&dev)?;
    let _ = dev.stop();
    let mut v = serde_json::to_value(&rep)?;
    v["mode"] = json!(mode);
    say!("{}", serde_json::to_string_pretty(&v)?);
    Ok(0)
}

fn run_bench(ep: &Endpoint, opts: &SetupOpts, b: &BenchArgs) -> Result<u8> {
    let role = match b.role {
        RoleArg::Tx => Role::Tx,
        RoleArg::Rx => Role::Rx,
        RoleArg::Both => Role::Both,
    };
    if b.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let frame = FrameSpec {
        size: b.size,
        dst_mac: parse_mac(&b.dst_mac)?,
        src_mac: parse_mac(&b.src_mac)?,
        src_ip: b.src_ip,
        dst_ip: b.dst_ip,
        mtu: b.mtu,
        tso: opts.offload,
        ..Default::default()
    };
    // Check the frame before connecting (TSO is re-checked against the negotiated features).
    if role != Role::Rx {
        vnet_frontend::frame::build_frame(&frame)?;
    }
    let bo = BenchOpts {
        role,
        frame,
        duration: b.duration.map(|d| secs(d, "--duration")).transpose()?,
        count: b.count,
        rate: b.rate,
        batch: b.batch,
        idle: secs(b.idle, "--idle")?,
        timeout: opts.timeout,
    };
    if bo.duration.is_none() && bo.count.is_none() && role != Role::Rx {
        bail!("give --duration or --count");
    }
    let dev = Device::open(ep, opts, 1)?;
    if role != Role::Rx && b.size > b.mtu + 14 && !dev.neg.host_tso4 {
        bail!(
            "frame size {} needs TSO but the backend did not negotiate HOST_TSO4+CSUM",
            b.size
        );
    }
    let report = bench::run(&dev, &bo)?;
    let disconnected = dev.conn.peer_closed() || report.error.is_some() && is_closed_msg(&report);
    if !disconnected {
        let _ = dev.stop();
    }
    let mut out = json!({
        "mode": "bench",
        "role": format!("{:?}", role).to_lowercase(),
        "size": b.size,
        "queue_pairs": opts.queue_pairs,
        "ring_size": opts.ring_size,
        "event_idx": dev.neg.event_idx,
        "mrg_rxbuf": dev.neg.mrg_rxbuf,
        "tso": dev.neg.host_tso4 && b.size > b.mtu + 14,
        "error": report.error,
    });
    let stats_json = |s: &Option<Stats>| {
        s.as_ref()
            .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
    };
    match role {
        Role::Both => {
            out["tx"] = stats_json(&report.tx).unwrap_or(Value::Null);
            out["rx"] = stats_json(&report.rx).unwrap_or(Value::Null);
        }
        _ => {
            let s = if role == Role::Tx {
                &report.tx
            } else {
                &report.rx
            };
            if let Some(Value::Object(m)) = stats_json(s) {
                for (k, v) in m {
                    if k != "role" {
                        out[k] = v;
                    }
                }
            }
        }
    }
    if b.json {
        say!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for s in [&report.tx, &report.rx].into_iter().flatten() {
            say!(
                "{}: {} frames, {} bytes in {:.3} s: {:.0} pps, {:.3} Gbit/s; kicks {}, calls {} ({} wake-ups), {:.1} frames/call, {:.2} calls/MB",
                s.role, s.frames, s.bytes, s.seconds, s.pps, s.gbit_per_s, s.kicks, s.calls,
                s.call_wakeups, s.frames_per_call, s.calls_per_mb
            );
        }
        if let Some(e) = &report.error {
            say!("error: {e}");
        }
    }
    if let Some(e) = &report.error {
        eprintln!("vhost-frontend: {e}");
        return Ok(if disconnected { EXIT_BACKEND } else { 1 });
    }
    Ok(0)
}

fn is_closed_msg(r: &bench::Report) -> bool {
    r.error.as_deref().is_some_and(|e| e.contains("closed"))
}
