//! `vnet-pathem`: forwards frames between two interfaces with delay, jitter, loss and a rate
//! per direction; prints its counters as one JSON line on SIGUSR1 and when it ends (SIGTERM,
//! SIGINT). See the crate's lib.rs for the parts.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use vnet_pathem::forward::Direction;
use vnet_pathem::packet::PacketSocket;
use vnet_pathem::schedule::Schedule;
use vnet_pathem::spec::{self, Impairment};
use vnet_pathem::stats::Counters;

#[derive(Parser, Debug)]
#[command(
    name = "vnet-pathem",
    about = "Forward frames between two interfaces with delay, jitter, loss and a rate (the lab's netem)",
    long_about = "Forward frames between two interfaces with delay, jitter, loss and a rate (the \
lab's netem). SPEC is KEY=VALUE,...: delay=10ms jitter=1ms loss=0.5% rate=100mbit limit=FRAMES \
limit-bytes=BYTES reorder=on. --both applies to each direction, then --ab (frames from A to B) \
and --ba override it. Counters: one JSON line on stdout on SIGUSR1 and at exit (SIGTERM, SIGINT)."
)]
struct Args {
    /// One interface (frames read here go out of B).
    #[arg(long)]
    a: String,
    /// The other interface.
    #[arg(long)]
    b: String,
    /// Impairment of both directions.
    #[arg(long, value_name = "SPEC", default_value = "")]
    both: String,
    /// Impairment of A to B (over --both).
    #[arg(long, value_name = "SPEC", default_value = "")]
    ab: String,
    /// Impairment of B to A (over --both).
    #[arg(long, value_name = "SPEC", default_value = "")]
    ba: String,
    /// Largest frame forwarded, bytes (bigger ones are counted `drop_oversize`). Offload
    /// super-frames up to 64 KiB pass whole (counted `gso_frames`); for loss per packet turn
    /// segmentation offloads off on the devices sending into the forwarder.
    #[arg(long, default_value_t = 65535)]
    max_frame: usize,
    /// Socket receive buffer per interface, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    rcvbuf: usize,
    /// Run the forwarding threads under SCHED_FIFO at this priority (1-99): exact delays on a
    /// busy machine.
    #[arg(long, value_name = "PRIORITY", value_parser = clap::value_parser!(i32).range(1..=99))]
    realtime: Option<i32>,
    /// Seed of the loss and jitter draws (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

fn counters_json(
    started: Instant,
    dirs: &[(&str, &Impairment, &Arc<Counters>)],
    last: bool,
) -> String {
    let mut doc = serde_json::Map::new();
    doc.insert("elapsed_s".into(), started.elapsed().as_secs_f64().into());
    doc.insert("final".into(), last.into());
    for (name, imp, c) in dirs {
        doc.insert(
            (*name).into(),
            serde_json::json!({"impairment": imp, "counters": c.snapshot()}),
        );
    }
    serde_json::Value::Object(doc).to_string()
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.a == args.b {
        bail!("--a and --b must be two interfaces");
    }
    if !(64..=65535).contains(&args.max_frame) {
        bail!("--max-frame must be 64..65535");
    }
    let both = spec::parse(&args.both, &Impairment::default()).context("--both")?;
    let ab = spec::parse(&args.ab, &both).context("--ab")?;
    let ba = spec::parse(&args.ba, &both).context("--ba")?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let sa = Arc::new(PacketSocket::open(&args.a, args.rcvbuf).with_context(|| args.a.clone())?);
    let sb = Arc::new(PacketSocket::open(&args.b, args.rcvbuf).with_context(|| args.b.clone())?);
    // signals before the threads, so none of them takes a default action meanwhile
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR1])?;
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let (cab, cba) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
    tracing::info!(a = %args.a, b = %args.b, "a->b: {ab}; b->a: {ba}; seed {seed}");
    let spawn = |name: &'static str,
                 from: &Arc<PacketSocket>,
                 to: &Arc<PacketSocket>,
                 imp: &Impairment,
                 c: &Arc<Counters>,
                 seed: u64| {
        let d = Direction {
            name,
            from: from.clone(),
            to: to.clone(),
            schedule: Schedule::new(imp.clone(), seed),
            counters: c.clone(),
            max_frame: args.max_frame,
            realtime: args.realtime,
        };
        let stop = stop.clone();
        thread::Builder::new()
            .name(name.into())
            .spawn(move || d.run(epoch, stop))
    };
    let threads = vec![
        spawn("a_to_b", &sa, &sb, &ab, &cab, seed)?,
        spawn("b_to_a", &sb, &sa, &ba, &cba, seed ^ 0x5851_f42d_4c95_7f2d)?,
    ];
    let dirs = [("a_to_b", &ab, &cab), ("b_to_a", &ba, &cba)];
    let out = std::io::stdout();
    let mut failed = None;
    'main: loop {
        for s in signals.pending() {
            match s {
                SIGUSR1 => {
                    let mut o = out.lock();
                    writeln!(o, "{}", counters_json(epoch, &dirs, false))?;
                    o.flush()?;
                }
                _ => break 'main,
            }
        }
        if let Some(t) = threads.iter().find(|t| t.is_finished()) {
            failed = Some(t.thread().name().unwrap_or("?").to_string());
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Relaxed);
    let mut errors = vec![];
    for t in threads {
        let name = t.thread().name().unwrap_or("?").to_string();
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(format!("{name}: {e}")),
            Err(_) => errors.push(format!("{name}: panicked")),
        }
    }
    {
        let mut o = out.lock();
        writeln!(o, "{}", counters_json(epoch, &dirs, true))?;
        o.flush()?;
    }
    if !errors.is_empty() || failed.is_some() {
        bail!("forwarding stopped: {}", errors.join("; "));
    }
    Ok(())
}
