//! `vnetctl`: sends control-language commands to a running vnetd and prints the answer; with
//! `--etcd`, manages a whole overlay through etcd instead.

#![forbid(unsafe_code)]

mod cluster;

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use vnet_client::{token, Control, Request, Token};

/// Send a command to vnetd, e.g. `vnetctl show stats` or `vnetctl --file topology.vnet`.
#[derive(Parser, Debug)]
#[command(version, about, trailing_var_arg = true)]
struct Args {
    /// Address of vnetd's control port.
    #[arg(long, default_value = "127.0.0.1:7600")]
    control: SocketAddr,
    /// A file holding the control port's shared token [default: $VNET_TOKEN_FILE, else
    /// /etc/vnet/token when it exists].
    #[arg(long, conflicts_with = "etcd")]
    token_file: Option<PathBuf>,
    /// Apply this script atomically (`-` reads standard input).
    #[arg(long, short = 'f', conflicts_with_all = ["command", "etcd"])]
    file: Option<PathBuf>,
    /// Seconds to wait for vnetd.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    // With --etcd: manage the overlay in etcd instead of one vnetd.
    #[command(flatten)]
    overlay: vnet_etcd::OverlayArgs,
    /// The command, e.g. `show stats json` (with --etcd: `hosts`, `routes`, `move ...`).
    #[arg(allow_hyphen_values = true)]
    command: Vec<String>,
}

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

fn run_etcd(
    args: &Args,
    overlay: vnet_cluster::OverlayName,
    mut cc: vnet_etcd::ClientConfig,
) -> Result<String> {
    cc.timeout = Duration::from_secs(args.timeout.clamp(1, 30));
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
    if let Some((overlay, cc)) = args.overlay.client_config()? {
        return run_etcd(&args, overlay, cc);
    }
    // The request is checked before vnetd is asked anything.
    let request = match (&args.file, args.command.is_empty()) {
        (Some(path), _) => {
            let text = if path.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?
            };
            Request::batch(&text.lines().collect::<Vec<_>>())?
        }
        (None, false) => Request::command(&args.command.join(" "))?,
        (None, true) => bail!("no command given (try `vnetctl show stats`, or --help)"),
    };
    let token = token::load(token::choose_here(args.token_file.as_deref()))?;
    let timeout = Duration::from_secs(args.timeout.max(1));
    let out = Control::connect(args.control, timeout, token.word())
        .and_then(|mut c| c.call(&request))
        .map_err(|e| explain(&token, e))?;
    Ok(out.iter().map(|l| format!("{l}\n")).collect())
}

/// vnetd's refusal as the message; when it asked for a token that the default file could
/// not give, why.
fn explain(token: &Token, e: vnet_client::Error) -> anyhow::Error {
    match (token, e) {
        (Token::Unreadable(path, why), vnet_client::Error::Refused(m))
            if m == "authentication failed" =>
        {
            anyhow!(
                "vnetd asks for a token: {} exists but cannot be read ({why}); \
                 run vnetctl as root or give --token-file",
                path.display()
            )
        }
        (_, vnet_client::Error::Refused(m)) => anyhow!(m),
        (_, e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_default_token_is_explained_only_when_vnetd_asks_for_one() {
        let path = PathBuf::from("/etc/vnet/token");
        let unreadable = || Token::Unreadable(path.clone(), std::io::Error::other("denied"));
        let refused = |m: &str| vnet_client::Error::Refused(m.into());
        let msg = explain(&unreadable(), refused("authentication failed")).to_string();
        assert!(
            msg.contains("/etc/vnet/token") && msg.contains("--token-file"),
            "{msg}"
        );
        // Other refusals are vnetd's message as it is.
        let msg = explain(&unreadable(), refused("unknown command")).to_string();
        assert_eq!(msg, "unknown command");
        let msg = explain(&Token::None, refused("authentication failed")).to_string();
        assert_eq!(msg, "authentication failed");
    }
}

#[cfg(test)]
mod args {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> std::result::Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vnetctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_overlay_options_are_checked_as_they_are_parsed() {
        Args::command().debug_assert();
        let a = parse(&["--etcd", "e:2379", "--overlay", "o1", "hosts"]).expect("ok");
        let (overlay, _) = a.overlay.client_config().expect("config").expect("etcd");
        assert_eq!(overlay.to_string(), "o1");
        assert!(parse(&["show", "stats"]).is_ok());
        for bad in [
            &["--etcd", "e:2379", "hosts"][..],
            &["--overlay", "o1", "hosts"],
            &["--etcd", "e:2379", "--overlay", "two words", "hosts"],
            &["--etcd", "e:2379", "--overlay", "o1", "--file", "x.vnet"],
            &[
                "--etcd",
                "e:2379",
                "--overlay",
                "o1",
                "--token-file",
                "t",
                "hosts",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
