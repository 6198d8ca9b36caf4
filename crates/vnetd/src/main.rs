//! `vnetd`: the vnet daemon.

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
    if let Some(sig) = signals.forever().next() {
        info!(signal = sig, "shutting down");
    }
    daemon.shutdown();
    info!("stopped");
    Ok(())
}
