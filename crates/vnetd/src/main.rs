//! `vnetd`: the vnet daemon.

#![forbid(unsafe_code)]

mod agent;
mod control;
mod daemon;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{error, info};
use vnet_dataplane::Engine;

use crate::daemon::Daemon;

/// Joins local VM interfaces and links to other hosts into one Ethernet LAN (VNET).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// A script of control-language commands to apply at start (refused whole on any bad line).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address of the control port.
    #[arg(long, default_value = "127.0.0.1:7600")]
    control: SocketAddr,
    /// A file holding the shared token the control port requires.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// UDP port for VXLAN.
    #[arg(long, default_value_t = vnet_wire::VXLAN_PORT)]
    udp_port: u16,
    /// Underlay address to bind the VXLAN socket to (`::` for IPv6 and IPv4).
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// This host's static X25519 private key (base64, mode 0600), for encrypted links.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Write a new private key to PATH (mode 0600, never overwriting), print its public key
    /// and exit.
    #[arg(long, value_name = "PATH")]
    gen_key: Option<PathBuf>,
    /// etcd endpoints (comma-separated `host:port` or URLs): take links and routes to the
    /// other hosts of the overlay from etcd (docs/control-language.md, "Many hosts from etcd").
    #[arg(long, requires_all = ["overlay", "host_id"])]
    etcd: Option<String>,
    /// The overlay's name in etcd (keys under `/vnet/NAME/`).
    #[arg(long, requires = "etcd")]
    overlay: Option<String>,
    /// This host's id in the overlay (at most 20 of `A-Z a-z 0-9 _ - .`).
    #[arg(long, requires = "etcd")]
    host_id: Option<String>,
    /// The underlay address other hosts send to (default: --bind, if it is not a wildcard).
    #[arg(long, requires = "etcd")]
    advertise_addr: Option<IpAddr>,
    /// Seconds the host's records outlive the daemon (its lease's TTL).
    #[arg(long, default_value_t = 5, requires = "etcd", value_parser = clap::value_parser!(i64).range(2..=3600))]
    etcd_lease_ttl: i64,
    /// Seconds between two publications of the traffic matrix (0: never).
    #[arg(long, default_value_t = 5, requires = "etcd", value_parser = clap::value_parser!(u64).range(0..=86400))]
    etcd_matrix_interval: u64,
    #[command(flatten)]
    etcd_access: vnet_etcd::EtcdAccess,
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

fn read_token(path: &PathBuf) -> Result<String> {
    let t =
        std::fs::read_to_string(path).with_context(|| format!("token file {}", path.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() || t.contains(char::is_whitespace) {
        bail!("token file {} must hold one word", path.display());
    }
    Ok(t)
}

/// The etcd agent's settings and client, checked before anything is set up.
fn etcd_setup(
    args: &Args,
    public_key: Option<vnet_crypto::PublicKey>,
) -> Result<Option<(vnet_agent::AgentConfig, vnet_etcd::Client)>> {
    let Some(endpoints) = &args.etcd else {
        return Ok(None);
    };
    let overlay: vnet_cluster::OverlayName = args
        .overlay
        .as_deref()
        .unwrap_or_default()
        .parse()
        .context("--overlay")?;
    let host: vnet_cluster::HostId = args
        .host_id
        .as_deref()
        .unwrap_or_default()
        .parse()
        .context("--host-id")?;
    let addr = match args.advertise_addr {
        Some(a) => a,
        None if !args.bind.is_unspecified() => args.bind,
        None => bail!("--etcd needs --advertise-addr (the underlay address of this host) when --bind is a wildcard"),
    };
    if addr.is_unspecified() || addr.is_multicast() {
        bail!("--advertise-addr {addr} is not a unicast address");
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
            .map(str::to_string)
            .collect(),
        public_key: public_key.map(|k| k.to_string()),
        version: vnet_cluster::SCHEMA_VERSION,
    };
    record.validate().context("host record")?;
    let mut cc = vnet_etcd::ClientConfig::new(endpoints);
    args.etcd_access.apply_to(&mut cc).context("etcd access")?;
    let client = vnet_etcd::Client::new(&cc).context("etcd client")?;
    Ok(Some((
        vnet_agent::AgentConfig {
            overlay,
            host,
            record,
            lease_ttl: args.etcd_lease_ttl,
            matrix_interval: std::time::Duration::from_secs(args.etcd_matrix_interval),
            crash: Default::default(),
        },
        client,
    )))
}

fn run(args: Args) -> Result<()> {
    if let Some(path) = &args.gen_key {
        let public = vnet_crypto::keys::file::generate(path)
            .with_context(|| format!("key file {}", path.display()))?;
        println!("{public}");
        return Ok(());
    }
    let token = args.token_file.as_ref().map(read_token).transpose()?;
    let key = args
        .key_file
        .as_ref()
        .map(|p| {
            vnet_crypto::keys::file::read(p).with_context(|| format!("key file {}", p.display()))
        })
        .transpose()?;
    let etcd = etcd_setup(&args, key.as_ref().map(|k| k.public()))?;
    // Handle signals from the start, so a TERM during set-up still cleans up.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("signal handlers")?;
    let mut engine = Engine::new(SocketAddr::new(args.bind, args.udp_port)).context("data path")?;
    engine.set_nic_factory(Box::new(vnet_vhost::VhostFactory));
    if let Some(k) = key {
        info!(public_key = %k.public(), "host key loaded");
        engine.set_static_key(k);
    }
    let daemon = Arc::new(Daemon::new(engine));
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("config {}", path.display()))?;
        if let Err(e) = daemon.execute_script(&text) {
            daemon.shutdown();
            bail!("config {}: {e}", path.display());
        }
        info!(config = %path.display(), "configuration applied");
    }
    let listener = match TcpListener::bind(args.control) {
        Ok(l) => l,
        Err(e) => {
            daemon.shutdown();
            bail!("control port {}: {e}", args.control);
        }
    };
    if !args.control.ip().is_loopback() && token.is_none() {
        tracing::warn!(control = %args.control, "control port is not on loopback and has no token");
    }
    info!(control = %args.control, "vnetd ready");
    let d = daemon.clone();
    std::thread::Builder::new()
        .name("control-accept".into())
        .spawn(move || control::serve(listener, d, token))
        .context("control thread")?;
    let agent_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let agent = match etcd {
        Some((cfg, client)) => {
            info!(overlay = %cfg.overlay, host = %cfg.host, "etcd agent starting");
            Some(
                vnet_agent::spawn(daemon.clone(), cfg, client, agent_stop.clone())
                    .context("etcd agent thread")?,
            )
        }
        None => None,
    };
    if let Some(sig) = signals.forever().next() {
        info!(signal = sig, "shutting down");
    }
    agent_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(a) = agent {
        // The agent revokes the lease (bounded by the client's timeout).
        let _ = a.join();
    }
    daemon.shutdown();
    info!("stopped");
    Ok(())
}
