//! `vnetctl`: sends control-language commands to a running vnetd and prints the answer; with
//! `--etcd`, manages a whole overlay through etcd instead.

#![forbid(unsafe_code)]

mod cluster;
mod token;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;

/// Send a command to vnetd, e.g. `vnetctl show stats` or `vnetctl --file topology.vnet`.
#[derive(Parser, Debug)]
#[command(version, about, trailing_var_arg = true)]
struct Args {
    /// Address of vnetd's control port.
    #[arg(long, default_value = "127.0.0.1:7600")]
    control: SocketAddr,
    /// A file holding the control port's shared token [default: $VNET_TOKEN_FILE, else
    /// /etc/vnet/token when it exists].
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Apply this script atomically (`-` reads standard input).
    #[arg(long, short = 'f', conflicts_with = "command")]
    file: Option<PathBuf>,
    /// Seconds to wait for vnetd.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Manage the overlay in etcd at these endpoints (comma-separated) instead of one vnetd.
    #[arg(long, requires = "overlay", conflicts_with_all = ["file", "token_file"])]
    etcd: Option<String>,
    /// The overlay's name in etcd.
    #[arg(long, requires = "etcd")]
    overlay: Option<String>,
    #[command(flatten)]
    etcd_access: vnet_etcd::EtcdAccess,
    /// The command, e.g. `show stats json` (with --etcd: `hosts`, `routes`, `move ...`).
    #[arg(allow_hyphen_values = true)]
    command: Vec<String>,
}

/// The largest batch vnetd takes, in bytes of its lines (docs/control-language.md).
const MAX_BATCH_BYTES: usize = 1 << 20;

fn main() {
    match run(Args::parse()) {
        Ok(out) => print!("{out}"),
        Err(e) => {
            eprintln!("vnetctl: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Commands that run here, without vnetd: `keygen PATH` writes a new private key (mode 0600)
/// and prints its public key; `pubkey PATH` prints a key file's public key.
fn local_command(words: &[String]) -> Option<Result<String>> {
    let path = |w: &[String]| -> Result<PathBuf> {
        match w {
            [_, p] => Ok(PathBuf::from(p)),
            _ => bail!("usage: vnetctl {} PATH", w[0]),
        }
    };
    match words.first().map(String::as_str) {
        Some("keygen") => Some(path(words).and_then(|p| {
            let public = vnet_crypto::keys::file::generate(&p)
                .with_context(|| format!("key file {}", p.display()))?;
            Ok(format!("{public}\n"))
        })),
        Some("pubkey") => Some(path(words).and_then(|p| {
            let key = vnet_crypto::keys::file::read(&p)
                .with_context(|| format!("key file {}", p.display()))?;
            Ok(format!("{}\n", key.public()))
        })),
        _ => None,
    }
}

fn run_etcd(args: &Args, endpoints: &str) -> Result<String> {
    let overlay: vnet_cluster::OverlayName = args
        .overlay
        .as_deref()
        .unwrap_or_default()
        .parse()
        .context("--overlay")?;
    let mut cc = vnet_etcd::ClientConfig::new(endpoints);
    cc.timeout = Duration::from_secs(args.timeout.clamp(1, 30));
    args.etcd_access.apply_to(&mut cc)?;
    let client = vnet_etcd::Client::new(&cc)?;
    if args.command.is_empty() {
        bail!("{}", cluster::USAGE);
    }
    cluster::run(&client, &overlay, &args.command)
}

fn run(args: Args) -> Result<String> {
    if let Some(r) = local_command(&args.command) {
        return r;
    }
    if let Some(endpoints) = &args.etcd {
        return run_etcd(&args, endpoints);
    }
    let request = match (&args.file, args.command.is_empty()) {
        (Some(path), _) => {
            let text = if path.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?
            };
            let lines: Vec<&str> = text.lines().collect();
            let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
            if bytes > MAX_BATCH_BYTES {
                bail!("the script is {bytes} bytes; vnetd takes at most {MAX_BATCH_BYTES} (1 MiB) at once: split it");
            }
            let mut req = format!("batch {}\n", lines.len());
            for l in lines {
                req.push_str(l);
                req.push('\n');
            }
            req
        }
        (None, false) => {
            let cmd = args.command.join(" ");
            if cmd.contains('\n') {
                bail!("a command is one line");
            }
            format!("{cmd}\n")
        }
        (None, true) => bail!("no command given (try `vnetctl show stats`, or --help)"),
    };
    let token = token::load(token::choose(
        args.token_file.as_deref(),
        std::env::var_os(token::TOKEN_FILE_ENV).as_deref(),
        Path::new(token::DEFAULT_TOKEN_FILE),
    ))?;
    let timeout = Duration::from_secs(args.timeout.max(1));
    let stream = TcpStream::connect_timeout(&args.control, timeout)
        .with_context(|| format!("cannot reach vnetd at {}", args.control))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    if let token::Token::Use(t) = &token {
        w.write_all(format!("auth {t}\n").as_bytes())?;
        read_reply(&mut r)?;
    }
    w.write_all(request.as_bytes())?;
    read_reply(&mut r).map_err(|e| match token::why_refused(&token, &e.to_string()) {
        Some(why) => anyhow!(why),
        None => e,
    })
}

fn read_reply(r: &mut impl BufRead) -> Result<String> {
    let mut status = String::new();
    if r.read_line(&mut status)? == 0 {
        bail!("vnetd closed the connection");
    }
    let status = status.trim_end();
    if let Some(msg) = status.strip_prefix("error ") {
        return Err(anyhow!("{msg}"));
    }
    let n: usize = status
        .strip_prefix("ok ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("unexpected reply from vnetd: {status:?}"))?;
    let mut out = String::new();
    for _ in 0..n {
        if r.read_line(&mut out)? == 0 {
            bail!("vnetd closed the connection mid-reply");
        }
    }
    Ok(out)
}
