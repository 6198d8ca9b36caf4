//! `vnetd`: the vnet daemon.

#![forbid(unsafe_code)]

mod agent;
mod autodetect;
mod control;
mod daemon;
mod delta;
mod derived;
mod journal;
mod leftovers;
mod observe;
mod pending;
mod persist;
mod reach;
mod reach_handle;
mod reach_tunnel;
mod restore;
mod state;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info, warn};
use vnet_dataplane::{Engine, Leave};

use crate::daemon::Daemon;
use crate::persist::Saver;
use crate::state::StateDir;

/// Where vnetd keeps what must outlive it (`--state-dir`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/vnet";

/// Joins local VM interfaces and links to other hosts into one Ethernet LAN (VNET).
#[derive(Parser, Debug)]
#[command(version, about)]
// --etcd needs --host-id too.
#[command(group(clap::ArgGroup::new("with_etcd").arg("etcd").requires("host_id")))]
struct Args {
    /// A script of control-language commands to apply at the first start (refused whole on any
    /// bad line); later starts restore the state and apply only what changed in it since.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where vnetd keeps its configuration (the config file plus every runtime change), what
    /// it made on the host, and its lock (one vnetd per state directory).
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    state_dir: PathBuf,
    /// Remove everything vnetd made for this state directory (devices, pinned kernel objects,
    /// state files) and exit; refused while a vnetd runs (`vnetctl teardown` stops it and
    /// does the same).
    #[arg(long, conflicts_with_all = ["config", "gen_key"])]
    teardown: bool,
    /// Address of the control port.
    #[arg(long, default_value = "127.0.0.1:7600")]
    control: SocketAddr,
    /// A file holding the shared token the control port requires.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// UDP port for VXLAN.
    #[arg(long, default_value_t = vnet_wire::VXLAN_PORT)]
    udp_port: u16,
    /// Underlay address to bind the VXLAN socket to (`::` for IPv6 and IPv4). Default:
    /// 0.0.0.0, or `::` when the advertised address is IPv6.
    #[arg(long)]
    bind: Option<IpAddr>,
    /// Serve Prometheus metrics (`/metrics`) and the live view (`/`) over HTTP on ADDR
    /// (`IP:PORT`, or a bare PORT for 127.0.0.1:PORT). Off by default. With --token-file, the
    /// data needs `Authorization: Bearer TOKEN`.
    #[arg(long, value_name = "ADDR", value_parser = parse_http_addr)]
    http: Option<SocketAddr>,
    /// This host's static X25519 private key (base64, mode 0600), for encrypted links.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Write a new private key to PATH (mode 0600, never overwriting), print its public key
    /// and exit.
    #[arg(long, value_name = "PATH")]
    gen_key: Option<PathBuf>,
    // --etcd, --overlay and how to reach etcd.
    #[command(flatten)]
    overlay: vnet_etcd::OverlayArgs,
    /// This host's id in the overlay (at most 20 of `A-Z a-z 0-9 _ - .`).
    #[arg(long, requires = "etcd")]
    host_id: Option<String>,
    /// The underlay address other hosts send to (default: --bind if it is not a wildcard, else
    /// the source address of this host's route to the first etcd endpoint it can reach).
    #[arg(long, requires = "etcd")]
    advertise_addr: Option<IpAddr>,
    /// Seconds the host's records outlive the daemon (its lease's TTL).
    #[arg(long, default_value_t = 5, requires = "etcd", value_parser = clap::value_parser!(i64).range(2..=3600))]
    etcd_lease_ttl: i64,
    /// Seconds between two publications of the traffic matrix (0: never).
    #[arg(long, default_value_t = 5, requires = "etcd", value_parser = clap::value_parser!(u64).range(0..=86400))]
    etcd_matrix_interval: u64,
    /// Never load the kernel fast path (eBPF): everything runs in user space, veth interfaces
    /// become TAPs. Without this flag vnetd loads it where the kernel allows, and says why not
    /// where it does not.
    #[arg(long)]
    no_kernel_fastpath: bool,
    /// Entries of the kernel's forwarding map (destinations beyond it go through vnetd).
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    fastpath_table_size: u32,
    /// (VNI, source, destination) pairs the kernel's traffic matrix holds (allocated as they
    /// appear; once it is full, the frames of further pairs are counted as its overflow).
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    fastpath_matrix_size: u32,
    /// Interfaces the kernel fast path can serve.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    fastpath_ports: u32,
    /// Plain udp links the kernel fast path can serve.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=65536))]
    fastpath_links: u32,
    /// Relay datagrams between hosts of the overlay that cannot reach each other (behind
    /// symmetric NATs, or where UDP between them is filtered). Give it to hosts the others can
    /// reach (docs/design/reach.md).
    #[arg(long, requires = "etcd")]
    relay: bool,
    /// What a relay lets each pair of hosts send through it, in Mbit/s.
    #[arg(long, default_value_t = 1000, requires = "relay", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    relay_rate: u64,
    /// A STUN server (HOST:PORT) to learn this host's public endpoint from, besides the other
    /// hosts of the overlay (repeatable).
    #[arg(long, value_name = "HOST:PORT", requires = "etcd")]
    stun: Vec<String>,
    /// Do not look for paths to other hosts (reach): links go to the addresses hosts
    /// advertise, as before reach existed.
    #[arg(long, requires = "etcd")]
    no_reach: bool,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(Args::parse()) {
        error!("{e:#}");
        eprintln!("vnetd: {e:#}");
        std::process::exit(1);
    }
}

/// `--stun HOST:PORT` servers, resolved once at the start.
fn resolve_stun(servers: &[String]) -> Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    servers
        .iter()
        .map(|s| {
            s.to_socket_addrs()
                .with_context(|| format!("--stun {s}"))?
                .next()
                .with_context(|| format!("--stun {s}: no address"))
        })
        .collect()
}

/// `--http`: `IP:PORT`, `[IPv6]:PORT`, or a bare port on loopback.
fn parse_http_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not IP:PORT or a port number"))
}

fn read_token(path: &PathBuf) -> Result<String> {
    let t =
        std::fs::read_to_string(path).with_context(|| format!("token file {}", path.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() || t.contains(char::is_whitespace) {
        bail!("token file {} must hold one word", path.display());
    }
    Ok(t)
}

/// What `--etcd` sets up: the agent's settings and client, and the client configuration
/// (the HTTP listener reads the published matrices with a client of its own).
struct EtcdSetup {
    agent: vnet_agent::AgentConfig,
    client: vnet_etcd::Client,
    client_config: vnet_etcd::ClientConfig,
}

/// The etcd agent's settings and client, checked before anything is set up.
fn etcd_setup(
    args: &Args,
    public_key: Option<vnet_crypto::PublicKey>,
) -> Result<Option<EtcdSetup>> {
    let Some((overlay, cc)) = args.overlay.client_config().context("etcd access")? else {
        return Ok(None);
    };
    let host: vnet_cluster::HostId = args
        .host_id
        .as_deref()
        .unwrap_or_default()
        .parse()
        .context("--host-id")?;
    let addr = match (args.advertise_addr, args.bind) {
        (Some(a), _) => a,
        (None, Some(b)) if !b.is_unspecified() => {
            info!(addr = %b, "advertising the --bind address");
            b
        }
        (None, _) => {
            let d = autodetect::from_etcd_endpoints(&cc.endpoints, Duration::from_secs(1))?;
            info!(addr = %d.addr, "advertising the {}; --advertise-addr chooses another", d.how);
            d.addr
        }
    };
    if addr.is_unspecified() || addr.is_multicast() {
        bail!("--advertise-addr {addr} is not a unicast address");
    }
    if let Some(b) = args.bind {
        if b.is_ipv4() && addr.is_ipv6() {
            bail!("the advertised address {addr} is IPv6 but --bind {b} is IPv4: use --bind ::");
        }
    }
    let record = vnet_cluster::HostRecord {
        host_id: host.clone(),
        addr,
        udp_port: args.udp_port,
        tcp_port: None,
        // With a host key, the host links only encrypted: capability noise and its public key
        // (vnet-cluster derives `encrypt KEY` on the links between two such hosts).
        capabilities: std::iter::once(vnet_cluster::CAP_VXLAN)
            .chain(public_key.map(|_| vnet_cluster::CAP_NOISE))
            .chain(args.relay.then_some(vnet_cluster::CAP_RELAY))
            .map(str::to_string)
            .collect(),
        public_key: public_key.map(|k| k.to_string()),
        version: vnet_cluster::SCHEMA_VERSION,
        reach: Default::default(),
    };
    record.validate().context("host record")?;
    let client = vnet_etcd::Client::new(&cc).context("etcd client")?;
    Ok(Some(EtcdSetup {
        agent: vnet_agent::AgentConfig {
            overlay,
            host,
            record,
            lease_ttl: args.etcd_lease_ttl,
            matrix_interval: std::time::Duration::from_secs(args.etcd_matrix_interval),
            read_page: vnet_agent::READ_PAGE,
            lease: None,
            crash: Default::default(),
        },
        client,
        client_config: cc,
    }))
}

/// The VXLAN socket's address: --bind, or the wildcard of the advertised address's family
/// (an IPv6 underlay needs `::`).
fn bind_addr(args: &Args, etcd: Option<&EtcdSetup>) -> IpAddr {
    match (args.bind, etcd) {
        (Some(b), _) => b,
        (None, Some(e)) if e.agent.record.addr.is_ipv6() => {
            info!("binding the VXLAN socket to :: (the advertised address is IPv6)");
            IpAddr::from([0u16; 8])
        }
        (None, _) => IpAddr::from([0u8; 4]),
    }
}

/// Starts the HTTP listener (`--http`).
fn start_http(
    addr: SocketAddr,
    daemon: &Arc<Daemon>,
    token: Option<String>,
    etcd: Option<&EtcdSetup>,
) -> Result<()> {
    let listener = TcpListener::bind(addr).with_context(|| format!("--http {addr}"))?;
    let matrices = match etcd {
        Some(e) => {
            // Its own client, with a short timeout: a page waiting on etcd must not hang.
            let mut cc = e.client_config.clone();
            cc.timeout = Duration::from_secs(2);
            let client = vnet_etcd::Client::new(&cc).context("etcd client for --http")?;
            Some(observe::MatrixReader::new(
                client,
                e.agent.overlay.clone(),
                e.agent.host.clone(),
            ))
        }
        None => None,
    };
    if !addr.ip().is_loopback() && token.is_none() {
        tracing::warn!(http = %addr, "HTTP listener is not on loopback and has no token");
    }
    let source = Arc::new(observe::DaemonSource {
        daemon: daemon.clone(),
        matrices,
        scrapes: observe::ScrapeBudget::default(),
    });
    let counters = Arc::new(vnet_http::HttpCounters::default());
    let start_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let app = vnet_http::App::new(
        source,
        token,
        addr.ip().is_loopback(),
        counters.clone(),
        vnet_http::BuildInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            start_time,
        },
    );
    vnet_http::spawn(
        listener,
        Arc::new(app),
        vnet_http::Limits::default(),
        counters,
    )
    .context("http thread")?;
    info!(http = %addr, "HTTP listener ready (/metrics, live view at /)");
    Ok(())
}

fn run(args: Args) -> Result<()> {
    if let Some(path) = &args.gen_key {
        let public = vnet_crypto::keys::file::generate(path)
            .with_context(|| format!("key file {}", path.display()))?;
        println!("{public}");
        return Ok(());
    }
    if args.teardown {
        return leftovers::teardown_offline(&args.state_dir);
    }
    let token = args.token_file.as_ref().map(read_token).transpose()?;
    let key = args
        .key_file
        .as_ref()
        .map(|p| {
            vnet_crypto::keys::file::read(p).with_context(|| format!("key file {}", p.display()))
        })
        .transpose()?;
    let mut etcd = etcd_setup(&args, key.as_ref().map(|k| k.public()))?;
    // The lock first: a second vnetd stops here, before it touches anything.
    let state = StateDir::open(&args.state_dir)?;
    let (mut resources, instance) = leftovers::identify(&state)?;
    let netns = state::netns_inode();
    let here = resources.netns.is_none() || resources.netns == netns;
    info!(%instance, "this vnetd's instance (in its devices' alias and its pin directory)");
    if !here {
        warn!(state_dir = %args.state_dir.display(), "the state directory was last used in another network namespace: none of its devices are here; restoring its configuration only");
        resources.made.clear();
        resources.etcd_lease = None;
    }
    let earlier = resources.clone();
    resources.netns = netns;
    // Reach's probe key: published in the host record, so it must be there before the agent.
    let probe = match etcd.as_mut() {
        Some(e) if !args.no_reach => {
            let k = reach::probe_key(&args.state_dir, key.as_ref())?;
            e.agent.record.reach.probe_key = Some(k.public().to_string());
            Some(k)
        }
        _ => None,
    };
    // Consumed only once the configuration without them is saved (below).
    let cni_deleted = state.cni_deletions()?;
    let file_text = args
        .config
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("config {}", p.display())))
        .transpose()?;
    let saved_local = state.read(state::LOCAL)?;
    let journal = journal::replay(
        journal::base(saved_local.as_deref()),
        &mut state.read_segments()?,
    );
    let saved = match (&saved_local, journal.records.is_empty()) {
        (None, true) => None,
        (text, _) => Some(restore::Saved {
            text: text.as_deref().unwrap_or_default(),
            journal: &journal.records,
        }),
    };
    let plan = restore::plan(
        saved,
        state.read(state::FILE)?.as_deref(),
        file_text.as_deref(),
        &cni_deleted,
        &mut vnet_wire::MacAddr::random,
    )
    .map_err(|e| match &args.config {
        Some(p) => anyhow::anyhow!("config {}: {e}", p.display()),
        None => anyhow::anyhow!("{e}"),
    })?;
    let saved_derived = if etcd.is_some() {
        state.read(state::DERIVED)?
    } else {
        None
    };
    if let (Some(e), Some(lease)) = (etcd.as_mut(), &earlier.etcd_lease) {
        e.agent.lease = i64::from_str_radix(lease, 16).ok();
    }
    let bind = bind_addr(&args, etcd.as_ref());
    // Handle signals from the start, so a TERM during set-up still cleans up.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("signal handlers")?;
    let mut engine = Engine::new(SocketAddr::new(bind, args.udp_port)).context("data path")?;
    // The control port before anything is realized: a daemon that cannot serve it stops
    // without having touched a device.
    let listener = TcpListener::bind(args.control)
        .with_context(|| format!("control port {}", args.control))?;
    engine.set_nic_factory(Box::new(vnet_vhost::VhostFactory));
    if let Some(k) = key {
        info!(public_key = %k.public(), "host key loaded");
        engine.set_static_key(k);
    }
    if args.no_kernel_fastpath {
        info!("kernel fast path off (--no-kernel-fastpath): everything runs in user space");
    } else {
        let pin_dir = state::pin_dir(instance, state::netns_id());
        leftovers::adopt_legacy_pins(&earlier, here, &args.state_dir, instance, &pin_dir);
        let cfg = vnet_fastpath::FastPathConfig {
            max_ports: args.fastpath_ports,
            max_links: args.fastpath_links,
            max_table: args.fastpath_table_size,
            max_matrix: args.fastpath_matrix_size,
            pin_dir: Some(pin_dir.clone()),
            ..Default::default()
        };
        // Recorded before the attempt: a teardown removes whatever it leaves in the directory.
        resources.bpf_dir = Some(pin_dir);
        match engine.enable_kernel_path(cfg) {
            Ok(()) => {
                info!(pinned = engine.kernel_pinned(), "kernel fast path loaded (eBPF at tcx): veth and netdev interfaces and plain udp links are forwarded in the kernel where the table decides");
                engine.set_kernel_forwarding_originals(resources.forwarding_originals());
            }
            Err(why) => tracing::warn!("the kernel fast path is not available, so everything runs in user space (veth interfaces become TAPs): {why}"),
        }
    }
    let saver = Saver::new(state, resources, journal.highest).context("state writer")?;
    let daemon = Arc::new(Daemon::new(engine, Some(saver)));
    if let Some(saver) = daemon.saver() {
        let weak = Arc::downgrade(&daemon);
        saver.set_derived_source(Box::new(move || weak.upgrade()?.render_derived()));
        let weak = Arc::downgrade(&daemon);
        saver.set_local_source(Box::new(move || weak.upgrade()?.render_local()));
    }
    if !journal.records.is_empty() {
        info!(
            records = journal.records.len(),
            "restore: the journal's changes since config.vnet was last written replayed"
        );
    }
    for n in journal.notes.iter().chain(&plan.notes) {
        info!("restore: {n}");
    }
    for w in &journal.warnings {
        warn!("restore: {w}");
    }
    let restored = match daemon.restore(
        &plan.local,
        &plan.file_part,
        saved_derived.as_deref(),
        plan.pending,
    ) {
        Ok(r) => {
            for n in &r.notes {
                warn!("restore: {n}");
            }
            r
        }
        Err(e) => {
            daemon.shutdown(Leave::Keep);
            if let Some(s) = daemon.saver() {
                s.flush();
            }
            match &args.config {
                Some(p) => bail!("config {}: {e}", p.display()),
                None => bail!("{e}"),
            }
        }
    };
    daemon.commit_takeover();
    if let Some(s) = daemon.saver() {
        match &restored.saved {
            Ok(()) => {
                // The saved configuration has the config file's changes and is without the
                // queued deletions: only now are they done.
                if let Some(f) = &plan.file_applied {
                    if let Err(e) = s.dir().write(state::FILE, f) {
                        warn!("state: writing the config file as applied: {e:#} (its changes are applied again at the next start)");
                    }
                }
                s.dir().remove_cni_deletions(&cni_deleted);
            }
            Err(e) => warn!("state: the configuration as restored is not saved ({e}): vnetd runs, refuses changes until the state directory can be written, and keeps trying"),
        }
        if saved.is_some() {
            info!(state_dir = %args.state_dir.display(), "state restored");
        } else if args.config.is_some() {
            info!("configuration applied");
        }
    }
    // What an earlier vnetd made for ports this configuration no longer has.
    let made_now = daemon.made_devices();
    leftovers::remove_made(&earlier, &made_now)?;
    if token.is_none() {
        daemon
            .control_without_token
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if args.control.ip().is_loopback() {
            warn!(control = %args.control, "the control port has no token: every local user can control this daemon, which runs as root (give --token-file)");
        } else {
            warn!(control = %args.control, "the control port is not on loopback and has no token: anyone who reaches it controls this daemon (give --token-file)");
        }
    }
    if let Some(addr) = args.http {
        if let Err(e) = start_http(addr, &daemon, token.clone(), etcd.as_ref()) {
            daemon.shutdown(Leave::Keep);
            return Err(e);
        }
    }
    info!(control = %args.control, "vnetd ready");
    let d = daemon.clone();
    std::thread::Builder::new()
        .name("control-accept".into())
        .spawn(move || control::serve(listener, d, token))
        .context("control thread")?;
    let agent_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let agent_keep_lease = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut reach_thread = None;
    let agent = match etcd {
        Some(EtcdSetup {
            agent: mut cfg,
            client,
            ..
        }) => {
            info!(overlay = %cfg.overlay, host = %cfg.host, "etcd agent starting");
            cfg.crash = agent_keep_lease.clone();
            let plane: Arc<dyn vnet_agent::DataPlane> = match probe {
                Some(k) => {
                    let settings = reach::Settings {
                        host: cfg.host.clone(),
                        port: args.udp_port,
                        advertised: args.advertise_addr,
                        stun: resolve_stun(&args.stun)?,
                        relay: args.relay,
                        relay_rate_mbit: args.relay_rate,
                    };
                    let (handle, join) = reach::start(daemon.clone(), k, settings)?;
                    let _ = daemon.reach.set(handle.clone());
                    reach_thread = Some((handle.clone(), join));
                    Arc::new(agent::WithReach {
                        daemon: daemon.clone(),
                        reach: handle,
                    })
                }
                None => daemon.clone(),
            };
            Some(
                vnet_agent::spawn(plane, cfg, client, agent_stop.clone())
                    .context("etcd agent thread")?,
            )
        }
        None => None,
    };
    if let Some(sig) = signals.forever().next() {
        info!(signal = sig, "shutting down");
    }
    let teardown = daemon.teardown.load(std::sync::atomic::Ordering::Relaxed);
    // A plain stop keeps the lease (the next vnetd renews it: the other hosts never see this
    // one leave); a teardown revokes it.
    agent_keep_lease.store(!teardown, std::sync::atomic::Ordering::Relaxed);
    agent_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(a) = agent {
        // The agent revokes the lease (bounded by the client's timeout).
        let _ = a.join();
    }
    if let Some((handle, join)) = reach_thread {
        handle.stop();
        let _ = join.join();
    }
    if teardown {
        daemon.shutdown(Leave::Remove);
        leftovers::remove_pin_dir(
            &state::pin_dir(instance, state::netns_id()),
            instance,
            &state::legacy_pin_dir(&args.state_dir),
        );
        if let Some(s) = daemon.saver() {
            s.flush();
            let left = s.resources();
            leftovers::remove_made(&left, &[])?;
            s.dir().clear()?;
        }
        reach::remove_key(&args.state_dir).context("removing the probe key")?;
        info!("torn down: every device, kernel object and state file vnet made is gone");
    } else {
        daemon.shutdown(Leave::Keep);
        if let Some(s) = daemon.saver() {
            s.flush();
        }
        info!("stopped (the devices and the kernel fast path stay for the next vnetd)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The overlay's own options are vnet-etcd's (tested with vnetctl's); vnetd adds that
    /// `--etcd` needs `--host-id`.
    #[test]
    fn etcd_needs_a_host_id() {
        Args::command().debug_assert();
        let ok = [
            "vnetd",
            "--etcd",
            "e:2379",
            "--overlay",
            "o1",
            "--host-id",
            "h",
        ];
        assert!(Args::try_parse_from(ok).is_ok());
        assert!(Args::try_parse_from(&ok[..5]).is_err());
        assert!(Args::try_parse_from(["vnetd", "--host-id", "h"]).is_err());
    }
}
