//! `vnet-cni`: a CNI plugin (specification 1.0 and 1.1) that attaches a container to a vnet
//! overlay. The container's NIC is an interface of the local vnetd: a veth pair when vnetd
//! has the kernel fast path's `veth` kind, a TAP otherwise; addresses come from the IPAM
//! plugin the configuration names (`host-local`, ...); with `vnetd --etcd` the interface is
//! published to the overlay like any other, so every host routes to it.
//!
//! ADD: IPAM ADD; `interface add cni-… veth|tap ifname vc… mac MAC vni V [mtu M] [netns NS]`
//! (and, without etcd, `route add any MAC interface cni-…`, in the same atomic batch); the
//! device is put into the container's namespace (by vnetd when the namespace is a named one,
//! by the plugin otherwise), renamed to CNI_IFNAME, given the addresses and routes, and
//! brought up; the result names the container's NIC and, for a veth, its host end (no
//! sandbox), which chained plugins such as `bandwidth` look for. Any failure undoes what was
//! done. DEL: `interface del` (a missing interface is not an error: DEL is idempotent; a
//! stopped vnetd finds the deletion queued in its state directory when it starts) and IPAM
//! DEL. CHECK: vnetd has the interface with the previous result's MAC, the container has the
//! device with it, up, with its addresses; IPAM CHECK. STATUS (1.1): vnetd answers. GC (1.1): this network's interfaces
//! that belong to no valid attachment are removed. VERSION: 1.0.0 and 1.1.0.

mod conf;
mod ipam;
mod link;
mod names;

use std::io::Read;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;
use vnet_client::{token, Control, Error as CtlError, Token};
use vnet_wire::MacAddr;

use crate::conf::{
    code, parse_config, requested_mac, AddResult, CniError, Config, Env, InterfaceResult, IpNet,
    IpamResult, SUPPORTED_VERSIONS,
};

/// How long vnetd may take to accept the connection, and each answer.
const VNETD_TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    let env = match Env::from_vars(|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(e) => fail(&e, "1.0.0"),
    };
    if env.command == "VERSION" {
        let v = serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED_VERSIONS});
        println!("{v}");
        return;
    }
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(conf::MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut input)
    {
        fail(
            &CniError::new(code::IO, "reading the network configuration", e.to_string()),
            "1.0.0",
        );
    }
    if input.len() > conf::MAX_CONFIG_BYTES {
        fail(
            &CniError::new(
                code::INVALID_CONFIG,
                "network configuration too large",
                "over 1 MiB",
            ),
            "1.0.0",
        );
    }
    let cfg = match parse_config(&input) {
        Ok(c) => c,
        Err(e) => fail(&e, "1.0.0"),
    };
    let version = cfg.conf.cni_version.clone();
    let result = match env.command.as_str() {
        "ADD" => add(&cfg, &env).map(Some),
        "DEL" => del(&cfg, &env).map(|_| None),
        "CHECK" => check(&cfg, &env).map(|_| None),
        "STATUS" if version != "1.0.0" => status(&cfg, &env).map(|_| None),
        "GC" if version != "1.0.0" => gc(&cfg, &env).map(|_| None),
        other => Err(CniError::new(
            code::INVALID_ENV,
            "unknown CNI_COMMAND",
            format!("{other} (with cniVersion {version})"),
        )),
    };
    match result {
        Ok(Some(out)) => println!("{out}"),
        Ok(None) => {}
        Err(e) => fail(&e, &version),
    }
}

fn fail(e: &CniError, version: &str) -> ! {
    println!("{}", e.to_json(version));
    eprintln!("vnet-cni: {e}");
    std::process::exit(1)
}

fn ctl_error(e: CtlError) -> CniError {
    match e {
        CtlError::Unreachable(..) => {
            CniError::new(code::TRY_AGAIN, "vnetd is not reachable", e.to_string())
        }
        CtlError::Refused(m) => CniError::new(code::VNETD_REFUSED, "vnetd refused", m),
        CtlError::BadAnswer(_) | CtlError::Request(_) => {
            CniError::new(code::VNETD_REFUSED, "vnetd refused", e.to_string())
        }
        CtlError::Token { .. } => CniError::new(
            code::INVALID_CONFIG,
            "invalid network configuration",
            e.to_string(),
        ),
        CtlError::Io(_) => CniError::new(code::IO, "talking to vnetd", e.to_string()),
    }
}

/// Connects to vnetd with the token vnetctl would present (the configuration's `tokenFile`
/// naming the file); the plugin runs as root, so a default file it cannot read is an error.
fn connect(cfg: &Config) -> Result<Control, CtlError> {
    let token = match token::load(token::choose_here(cfg.conf.token_file.as_deref()))? {
        Token::Unreadable(path, e) => {
            return Err(CtlError::Token {
                path,
                reason: e.to_string(),
            })
        }
        t => t,
    };
    Control::connect(cfg.control, VNETD_TIMEOUT, token.word())
}

fn netlink_error(what: &str, e: std::io::Error) -> CniError {
    CniError::new(code::NETLINK, what.to_string(), e.to_string())
}

/// vnetd's interface `name`, if it has one.
fn vnetd_interface(c: &mut Control, name: &str) -> Result<Option<Value>, CtlError> {
    let v = c.show_json("interfaces")?;
    Ok(v.as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == name).cloned()))
}

fn is_unknown_kind(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("unknown interface type")
        || m.contains("unknown interface kind")
        || m.contains("unknown kind")
}

fn add(cfg: &Config, env: &Env) -> Result<String, CniError> {
    let (cid, ifname) = env.require_container()?;
    let netns = env.require_netns()?;
    let ipam_type = cfg
        .conf
        .ipam
        .as_ref()
        .map(|i| i.plugin_type.clone())
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                "invalid network configuration",
                "\"ipam\" is missing",
            )
        })?;
    let mac = requested_mac(&cfg.conf, env)?.unwrap_or_else(MacAddr::random);
    let name = names::interface_name(&cfg.conf.name, cid, ifname);
    let dev = names::device_name(&cfg.conf.name, cid, ifname);

    let mut c = connect(cfg).map_err(ctl_error)?;
    // A leftover of an earlier, interrupted ADD of the same attachment goes first.
    if vnetd_interface(&mut c, &name).map_err(ctl_error)?.is_some() {
        c.command(&format!("interface del {name}"))
            .map_err(ctl_error)?;
    }
    // With etcd, the agent routes to local interfaces from their placements; without, the
    // interface needs its route here.
    let agent = c.show_json("cluster").map_err(ctl_error)?["agent"].is_object();

    let out = ipam::delegate(&ipam_type, "ADD", env, &cfg.raw)?.unwrap_or_default();
    let ipam: IpamResult = serde_json::from_slice(&out)
        .map_err(|e| CniError::new(code::IPAM, "IPAM result", e.to_string()))?;
    let undo_ipam = || {
        if let Err(e) = ipam::delegate(&ipam_type, "DEL", env, &cfg.raw) {
            eprintln!("vnet-cni: undoing IPAM: {e}");
        }
    };
    if ipam.ips.is_empty() {
        undo_ipam();
        return Err(CniError::new(
            code::IPAM,
            "IPAM gave no address",
            String::from_utf8_lossy(&out),
        ));
    }

    // A named namespace: vnetd puts the device there itself (and the kernel fast path then
    // delivers straight into it); any other (/proc/PID/ns/net): the plugin moves it.
    let ns_name = link::netns_name(&netns);
    let script = |kind: &str| {
        let mut s = format!(
            "interface add {name} {kind} ifname {dev} mac {mac} vni {}",
            cfg.vni
        );
        if let Some(m) = cfg.conf.mtu {
            s.push_str(&format!(" mtu {m}"));
        }
        if let Some(n) = &ns_name {
            s.push_str(&format!(" netns {n}"));
        }
        let mut lines = vec![s];
        if !agent {
            lines.push(format!("route add any {mac} interface {name}"));
        }
        lines
    };
    // The kernel fast path's veth when this vnetd has it; a TAP otherwise.
    let added = match c.batch(&script("veth")) {
        Err(CtlError::Refused(m)) if is_unknown_kind(&m) => c.batch(&script("tap")),
        other => other,
    };
    if let Err(e) = added {
        undo_ipam();
        return Err(ctl_error(e));
    }

    let ipam_net = |s: &str, what: &str| {
        s.parse::<IpNet>()
            .map_err(|e| CniError::new(code::IPAM, what, e))
    };
    let setup = || -> Result<AddResult, CniError> {
        if ns_name.is_none() {
            link::move_to_netns(&dev, &netns)
                .map_err(|e| netlink_error("moving the device into the container", e))?;
        }
        let mut addresses = Vec::new();
        for ip in &ipam.ips {
            let n = ipam_net(&ip.address, "IPAM address")?;
            addresses.push((n.addr, n.prefix));
        }
        let mut routes = Vec::new();
        for r in &ipam.routes {
            let n = ipam_net(&r.dst, "IPAM route")?;
            let gw = match &r.gw {
                Some(g) => Some(
                    g.parse::<IpAddr>()
                        .map_err(|_| CniError::new(code::IPAM, "IPAM route gateway", g.clone()))?,
                ),
                // No gateway given: the first address of the family with one.
                None => ipam
                    .ips
                    .iter()
                    .filter_map(|i| i.gateway.as_deref()?.parse::<IpAddr>().ok())
                    .find(|g| g.is_ipv4() == n.addr.is_ipv4()),
            };
            routes.push((n.addr, n.prefix, gw));
        }
        let info = link::configure(
            &netns,
            link::Setup {
                dev: dev.clone(),
                ifname: ifname.to_string(),
                addresses,
                routes,
            },
        )
        .map_err(|e| netlink_error("setting up the container's interface", e))?;
        // The host's end of a veth, for chained plugins (a TAP has none).
        let host = match link::host_end(&info, &name) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("vnet-cni: the host end of {ifname}: {e}");
                None
            }
        };
        let container = InterfaceResult {
            name: ifname.to_string(),
            mac: info
                .address
                .map(|m| MacAddr(m).to_string())
                .unwrap_or_else(|| mac.to_string()),
            mtu: info.mtu,
            sandbox: Some(netns.display().to_string()),
        };
        let host = host.map(|h| InterfaceResult {
            name: h.name,
            mac: h
                .address
                .map(|m| MacAddr(m).to_string())
                .unwrap_or_default(),
            mtu: h.mtu,
            sandbox: None,
        });
        Ok(conf::add_result(
            &cfg.conf.cni_version,
            container,
            host,
            &ipam,
        ))
    };
    match setup() {
        Ok(r) => serde_json::to_string(&r)
            .map_err(|e| CniError::new(code::IO, "encoding the result", e.to_string())),
        Err(e) => {
            // The device goes with the interface, wherever it is by now.
            if let Err(u) = c.command(&format!("interface del {name}")) {
                eprintln!("vnet-cni: undoing the interface: {u}");
            }
            undo_ipam();
            Err(e)
        }
    }
}

fn del(cfg: &Config, env: &Env) -> Result<(), CniError> {
    let (cid, ifname) = env.require_container()?;
    let name = names::interface_name(&cfg.conf.name, cid, ifname);
    match connect(cfg) {
        Ok(mut c) => match c.command(&format!("interface del {name}")) {
            Ok(_) => {}
            // Already gone: DEL is idempotent.
            Err(CtlError::Refused(m)) if m.contains("no interface") => {}
            Err(e) => return Err(ctl_error(e)),
        },
        // A stopped vnetd keeps its interfaces for its next run: leave the deletion in its
        // state directory's queue, which the next vnetd takes out before it restores (as
        // Cilium's CNI queues deletions while its agent is down).
        Err(CtlError::Unreachable(..)) => queue_deletion(cfg, &name)?,
        Err(e) => return Err(ctl_error(e)),
    }
    if let Some(i) = &cfg.conf.ipam {
        ipam::delegate(&i.plugin_type, "DEL", env, &cfg.raw)?;
    }
    Ok(())
}

/// Leaves `interface del NAME` for the next vnetd (`STATE_DIR/cni-deleted/NAME`). Without a
/// state directory no vnetd ever ran here with one, and there is nothing to delete.
fn queue_deletion(cfg: &Config, name: &str) -> Result<(), CniError> {
    let dir = cfg
        .conf
        .state_dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from(DEFAULT_STATE_DIR));
    if !dir.is_dir() {
        return Ok(());
    }
    let queue = dir.join("cni-deleted");
    std::fs::create_dir_all(&queue)
        .and_then(|()| std::fs::write(queue.join(name), b""))
        .map_err(|e| {
            CniError::new(
                code::IO,
                "vnetd is not running and its deletion queue is not writable",
                format!("{}: {e}", queue.display()),
            )
        })
}

/// vnetd's default state directory.
const DEFAULT_STATE_DIR: &str = "/var/lib/vnet";

fn check_failed(details: String) -> CniError {
    CniError::new(
        code::CHECK_FAILED,
        "the attachment is not as ADD left it",
        details,
    )
}

fn check(cfg: &Config, env: &Env) -> Result<(), CniError> {
    let (cid, ifname) = env.require_container()?;
    let netns = env.require_netns()?;
    let prev: AddResult = cfg
        .conf
        .prev_result
        .clone()
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                "invalid network configuration",
                "CHECK needs prevResult",
            )
        })
        .and_then(|v| {
            serde_json::from_value(v)
                .map_err(|e| CniError::new(code::DECODING, "prevResult", e.to_string()))
        })?;
    let want = prev
        .interfaces
        .iter()
        .find(|i| i.name == ifname)
        .ok_or_else(|| check_failed(format!("prevResult has no interface {ifname}")))?;
    let name = names::interface_name(&cfg.conf.name, cid, ifname);
    let mut c = connect(cfg).map_err(ctl_error)?;
    let iface = vnetd_interface(&mut c, &name)
        .map_err(ctl_error)?
        .ok_or_else(|| check_failed(format!("vnetd has no interface {name}")))?;
    if !iface["mac"]
        .as_str()
        .is_some_and(|m| m.eq_ignore_ascii_case(&want.mac))
    {
        return Err(check_failed(format!(
            "vnetd's {name} has MAC {}, not {}",
            iface["mac"], want.mac
        )));
    }
    if iface["vni"].as_u64() != Some(cfg.vni as u64) {
        return Err(check_failed(format!(
            "vnetd's {name} is in VNI {}, not {}",
            iface["vni"], cfg.vni
        )));
    }
    let (info, addrs) = link::inspect(&netns, ifname)
        .map_err(|e| check_failed(format!("{ifname} in {}: {e}", netns.display())))?;
    let mac = info
        .address
        .map(|m| MacAddr(m).to_string())
        .unwrap_or_default();
    if !mac.eq_ignore_ascii_case(&want.mac) {
        return Err(check_failed(format!(
            "{ifname} has MAC {mac}, not {}",
            want.mac
        )));
    }
    if !info.up {
        return Err(check_failed(format!("{ifname} is down")));
    }
    for ip in &prev.ips {
        let n: IpNet = ip
            .address
            .parse()
            .map_err(|e| check_failed(format!("prevResult address: {e}")))?;
        if !addrs.contains(&(n.addr, n.prefix)) {
            return Err(check_failed(format!("{ifname} lacks address {n}")));
        }
    }
    if let Some(i) = &cfg.conf.ipam {
        ipam::delegate(&i.plugin_type, "CHECK", env, &cfg.raw)?;
    }
    Ok(())
}

fn status(cfg: &Config, env: &Env) -> Result<(), CniError> {
    let mut c = connect(cfg)
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, "vnetd is not available", e.to_string()))?;
    c.command("show stats")
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, "vnetd is not available", e.to_string()))?;
    if let Some(i) = &cfg.conf.ipam {
        ipam::delegate(&i.plugin_type, "STATUS", env, &cfg.raw)?;
    }
    Ok(())
}

fn gc(cfg: &Config, env: &Env) -> Result<(), CniError> {
    let valid: std::collections::BTreeSet<String> = cfg
        .conf
        .valid_attachments
        .iter()
        .flatten()
        .map(|a| names::interface_name(&cfg.conf.name, &a.container_id, &a.ifname))
        .collect();
    let prefix = names::network_prefix(&cfg.conf.name);
    let mut c = connect(cfg).map_err(ctl_error)?;
    let ifaces = c.show_json("interfaces").map_err(ctl_error)?;
    for i in ifaces.as_array().into_iter().flatten() {
        let Some(n) = i["name"].as_str() else {
            continue;
        };
        if n.starts_with(&prefix) && !valid.contains(n) {
            match c.command(&format!("interface del {n}")) {
                Ok(_) => {}
                Err(CtlError::Refused(m)) if m.contains("no interface") => {}
                Err(e) => return Err(ctl_error(e)),
            }
        }
    }
    if let Some(i) = &cfg.conf.ipam {
        ipam::delegate(&i.plugin_type, "GC", env, &cfg.raw)?;
    }
    Ok(())
}
