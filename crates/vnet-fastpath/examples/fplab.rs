//! A stand-alone driver of the fast path for the benchmark (`bench/fastpath_variants.py`) and
//! the system test (`tests/system/test_fastpath.py`): it plays vnetd's control-plane part
//! (open, attach the underlay and ports, set links, apply a table) in one host namespace,
//! prints `ready`, writes its counters as JSON to `--stats` on SIGUSR1 and at exit, and detaches
//! everything on SIGTERM/SIGINT (or, killed, leaves it to the kernel to clean up).
//!
//! ```text
//! fplab --underlay eth0 \
//!   --port 1:fpa:fpt:52:54:00:00:00:01:10:1450:peer \
//!   --link 2:10.77.0.2:10.77.0.1:4789:10 \
//!   --route 52:54:00:00:00:01=1 --route 52:54:00:00:00:02=2 --stats /tmp/s.json
//! ```

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use vnet_core::{MacMatch, PortId, RouteRule};
use vnet_fastpath::*;
use vnet_wire::MacAddr;

#[derive(Parser, Debug)]
struct Args {
    /// Underlay netdev (by name) to decapsulate on; repeatable.
    #[arg(long)]
    underlay: Vec<String>,
    /// ID:IFNAME:PUNT_IFNAME:MAC:VNI:MTU:peer|egress[:any]
    #[arg(long)]
    port: Vec<String>,
    /// ID:REMOTE:LOCAL:UDP_PORT:VNI[:via=DEV] (via: variant (a), a collect-metadata VXLAN device)
    #[arg(long)]
    link: Vec<String>,
    /// DST_MAC=ID: a route `any DST_MAC` to port or link ID (in the target's VNI).
    #[arg(long)]
    route: Vec<String>,
    /// Rate limit ID:MBIT:BURST_KB on a port or link.
    #[arg(long)]
    rate: Vec<String>,
    /// A collect-metadata VXLAN device to attach tunnel_ingress to (variant (a)).
    #[arg(long)]
    tunnel_dev: Vec<String>,
    /// Outer next-hop cache per CPU, ms; 0 = bpf_fib_lookup for every packet.
    #[arg(long, default_value_t = 1000)]
    outer_cache_ms: u64,
    #[arg(long, default_value_t = 4789)]
    vxlan_port: u16,
    #[arg(long)]
    stats: Option<PathBuf>,
}

fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        bail!("no device {name}");
    }
    Ok(i)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let cfg = FastPathConfig {
        vxlan_port: a.vxlan_port,
        outer_cache: (a.outer_cache_ms > 0).then(|| Duration::from_millis(a.outer_cache_ms)),
        ..FastPathConfig::default()
    };
    let mut fp = FastPath::open(&cfg).map_err(|e| anyhow!("{e}"))?;
    let mut rates = std::collections::BTreeMap::new();
    for r in &a.rate {
        let f: Vec<&str> = r.split(':').collect();
        if f.len() != 3 {
            bail!("--rate {r}");
        }
        rates.insert(
            f[0].parse::<u32>()?,
            Rate {
                bits_per_sec: f[1].parse::<u64>()? * 1_000_000,
                burst_bytes: f[2].parse::<u64>()? * 1024,
            },
        );
    }
    for u in &a.underlay {
        fp.attach_underlay(ifindex(u)?)?;
    }
    for t in &a.tunnel_dev {
        fp.attach_tunnel_device(ifindex(t)?)?;
    }
    let mut cports = Vec::new();
    let mut names = Vec::new();
    for p in &a.port {
        let f: Vec<&str> = p.split(':').collect();
        if f.len() < 12 {
            bail!("--port {p}: ID:IFNAME:PUNT:MAC(6 parts):VNI:MTU:peer|egress[:any]");
        }
        let id = PortId(f[0].parse()?);
        let mac: MacAddr = f[3..9].join(":").parse().map_err(|e| anyhow!("{e:?}"))?;
        let vni: u32 = f[9].parse()?;
        let spec = PortSpec {
            id,
            ifindex: ifindex(f[1])?,
            punt_ifindex: ifindex(f[2])?,
            mac,
            vni,
            mtu: f[10].parse()?,
            delivery: if f[11] == "peer" {
                Delivery::Peer
            } else {
                Delivery::Egress
            },
            policy: PortPolicy {
                any_source: f.get(12) == Some(&"any"),
                rate: rates.get(&id.0).copied(),
            },
        };
        fp.attach_port(&spec).with_context(|| format!("port {p}"))?;
        cports.push(CompilePort {
            id,
            vni,
            egress: Egress::FastPort,
        });
        names.push(("port", id));
    }
    for l in &a.link {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 5 {
            bail!("--link {l}");
        }
        let id = PortId(f[0].parse()?);
        let vni: u32 = f[4].parse()?;
        let via = match f.get(5).and_then(|v| v.strip_prefix("via=")) {
            Some(dev) => Some(ifindex(dev)?),
            None => None,
        };
        fp.set_link(&LinkSpec {
            id,
            vni,
            remote: f[1].parse::<Ipv4Addr>()?,
            local: f[2].parse::<Ipv4Addr>()?,
            udp_port: f[3].parse()?,
            rate: rates.get(&id.0).copied(),
            via_device: via,
            src_port: None,
            punt: false,
            path_mtu: None,
            relay_tag: None,
        })?;
        cports.push(CompilePort {
            id,
            vni,
            egress: Egress::UdpLink,
        });
        names.push(("link", id));
    }
    let mut rules = Vec::new();
    for r in &a.route {
        let (mac, id) = r.split_once('=').ok_or_else(|| anyhow!("--route {r}"))?;
        let dest = PortId(id.parse()?);
        let vni = cports
            .iter()
            .find(|p| p.id == dest)
            .map(|p| p.vni)
            .ok_or_else(|| anyhow!("--route {r}: no port or link {id}"))?;
        let mac: MacAddr = mac.parse().map_err(|e| anyhow!("{e:?}"))?;
        rules.push(RouteRule {
            vni,
            src: MacMatch::Any,
            dst: MacMatch::Exact(mac),
            dest,
        });
    }
    fp.apply_table(&compile(&cports, &rules, false))?;
    println!("ready");
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGUSR1])?;
    for sig in signals.forever() {
        if let Some(path) = &a.stats {
            write_stats(&fp, &names, path)?;
        }
        if sig != SIGUSR1 {
            break;
        }
    }
    drop(fp);
    Ok(())
}

fn write_stats(fp: &FastPath, names: &[(&str, PortId)], path: &PathBuf) -> Result<()> {
    let mut ports = serde_json::Map::new();
    for (kind, id) in names {
        let c = if *kind == "port" {
            fp.port_counters(*id)?
        } else {
            fp.link_counters(*id)?
        };
        ports.insert(
            format!("{kind}{}", id.0),
            serde_json::json!({
                "rx_frames": c.rx_frames, "rx_bytes": c.rx_bytes,
                "tx_frames": c.tx_frames, "tx_bytes": c.tx_bytes,
                "punted_frames": c.punted_frames, "punted_bytes": c.punted_bytes,
                "slow_tx_frames": c.slow_tx_frames, "drops": c.drops,
                "neigh_miss": c.neigh_miss, "encap_fail": c.encap_fail, "gro_passed": c.gro_passed,
            }),
        );
    }
    let g = fp.global_counters()?;
    let doc = serde_json::json!({
        "ports": ports,
        "global": {"unknown_port": g.unknown_port, "not_vxlan": g.not_vxlan,
                   "unknown_link": g.unknown_link, "fib_fail": g.fib_fail, "table_full": g.table_full, "matrix_full": g.matrix_full},
        "matrix": fp.matrix()?.iter().map(|e| serde_json::json!({
            "vni": e.vni, "src": e.src.to_string(), "dst": e.dst.to_string(),
            "frames": e.frames, "bytes": e.bytes})).collect::<Vec<_>>(),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
