//! The daemon's state: the configuration model and the engine that realizes it, and the
//! answers to control-language commands.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde_json::json;
use vnet_control::{
    parse_line, parse_script, Change, Command, Config, DestKind, LinkKind, ShowWhat,
};
use vnet_dataplane::Engine;
use vnet_wire::MacAddr;

pub struct State {
    pub cfg: Config,
    pub engine: Engine,
}

pub struct Daemon {
    pub state: Mutex<State>,
    /// Refused control connections, bad control lines and failed authentications.
    pub control_errors: AtomicU64,
}

fn random_mac() -> MacAddr {
    let mut b = [0u8; 6];
    // SAFETY: getrandom writes at most b.len() bytes into the live buffer b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // Extremely unlikely; fall back to time-derived bytes, still locally administered.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    MacAddr::local_from_random(b)
}

impl Daemon {
    pub fn new(engine: Engine) -> Daemon {
        Daemon {
            state: Mutex::new(State {
                cfg: Config::default(),
                engine,
            }),
            control_errors: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one line of the control language; Ok is the output (possibly empty).
    pub fn execute_line(&self, line: &str) -> Result<String, String> {
        match parse_line(line) {
            Err(e) => Err(e.to_string()),
            Ok(None) => Ok(String::new()),
            Ok(Some(cmd)) if cmd.is_query() => Ok(self.query(&cmd)),
            Ok(Some(cmd)) => self.apply_commands(vec![(0, cmd)]),
        }
    }

    /// Validates and applies a whole script; one bad line refuses all of it.
    pub fn execute_script(&self, text: &str) -> Result<String, String> {
        let cmds = parse_script(text).map_err(|e| e.to_string())?;
        if let Some((line, _)) = cmds.iter().find(|(_, c)| c.is_query()) {
            return Err(format!("line {line}: show cannot be part of a script"));
        }
        self.apply_commands(cmds)
    }

    /// `line` 0 means a single command (no line number in errors).
    fn apply_commands(&self, cmds: Vec<(usize, Command)>) -> Result<String, String> {
        let at = |line: usize, msg: String| {
            if line == 0 {
                msg
            } else {
                format!("line {line}: {msg}")
            }
        };
        let mut st = self.lock();
        let mut cfg = st.cfg.clone();
        let mut changes: Vec<(usize, Change)> = Vec::new();
        let mut gen = random_mac;
        for (line, cmd) in &cmds {
            match cfg.apply(cmd, &mut gen) {
                Ok(ch) => changes.extend(ch.into_iter().map(|c| (*line, c))),
                Err(e) => return Err(at(*line, e.to_string())),
            }
        }
        for (k, (line, ch)) in changes.iter().enumerate() {
            if let Err(e) = st.engine.apply(ch) {
                // Undo what this script already did in the OS, newest first.
                for (_, prev) in changes[..k].iter().rev() {
                    if let Err(undo) = st.engine.apply(&prev.inverse()) {
                        tracing::error!("could not undo {prev:?}: {undo}");
                    }
                }
                let old = st.cfg.clone();
                st.engine.rebuild(&old);
                return Err(at(*line, e.to_string()));
            }
        }
        st.cfg = cfg;
        let State { cfg, engine } = &mut *st;
        engine.rebuild(cfg);
        Ok(String::new())
    }

    fn query(&self, cmd: &Command) -> String {
        let Command::Show(what, json) = cmd else {
            return String::new();
        };
        let st = self.lock();
        let cfg = &st.cfg;
        let mut out = String::new();
        match what {
            ShowWhat::Config => out = cfg.to_script(),
            ShowWhat::Interfaces => {
                if *json {
                    out = serde_json::to_string(&cfg.interfaces).unwrap_or_default();
                } else {
                    let _ = writeln!(
                        out,
                        "{:<16} {:<5} {:<15} {:<17} {:>5} {:<16} {:>8} POLICY",
                        "NAME", "TYPE", "IFNAME", "MAC", "MTU", "NETNS", "VNI"
                    );
                    for i in &cfg.interfaces {
                        let _ = writeln!(
                            out,
                            "{:<16} {:<5} {:<15} {:<17} {:>5} {:<16} {:>8} {}",
                            i.name,
                            i.kind,
                            i.ifname,
                            i.mac.to_string(),
                            i.mtu,
                            i.netns.as_deref().unwrap_or("-"),
                            i.vni,
                            policy_text(i.any_source, i.rate.as_ref())
                        );
                    }
                }
            }
            ShowWhat::Links => {
                let rows: Vec<serde_json::Value> = cfg
                    .links
                    .iter()
                    .map(|l| {
                        let (remote, dev) = match &l.kind {
                            LinkKind::Udp(a) | LinkKind::TcpDial(a) => (Some(a.to_string()), None),
                            LinkKind::TcpAccept(ip) => (Some(ip.to_string()), None),
                            LinkKind::Direct(d) => (None, Some(d.clone())),
                        };
                        let mut row = json!({"name": l.name, "kind": l.kind.keyword(), "remote": remote, "dev": dev,
                               "vni": l.vni, "state": st.engine.link_state(&l.name),
                               "rate": cfg.link_rates.get(&l.name)});
                        if let Some(c) = st.engine.link_crypto(&l.name) {
                            row["encrypted"] = c;
                        }
                        row
                    })
                    .collect();
                if *json {
                    out = serde_json::Value::Array(rows).to_string();
                } else {
                    let _ = writeln!(
                        out,
                        "{:<16} {:<10} {:<28} {:>8} {:<10} POLICY",
                        "NAME", "TYPE", "REMOTE/DEVICE", "VNI", "STATE"
                    );
                    for r in rows {
                        let peer = r["remote"]
                            .as_str()
                            .or(r["dev"].as_str())
                            .unwrap_or("-")
                            .to_string();
                        let name = r["name"].as_str().unwrap_or("");
                        // An encrypted link says so beside its state ("up+enc").
                        let state = format!(
                            "{}{}",
                            r["state"].as_str().unwrap_or(""),
                            if r["encrypted"].is_object() {
                                "+enc"
                            } else {
                                ""
                            }
                        );
                        let _ = writeln!(
                            out,
                            "{:<16} {:<10} {:<28} {:>8} {:<10} {}",
                            name,
                            r["kind"].as_str().unwrap_or(""),
                            peer,
                            r["vni"],
                            state,
                            policy_text(false, cfg.link_rates.get(name))
                        );
                    }
                }
            }
            ShowWhat::Routes => {
                let rows: Vec<serde_json::Value> = cfg
                    .routes
                    .iter()
                    .map(|r| {
                        json!({"src": r.src.to_string(), "dst": r.dst.to_string(), "to": r.to.kind.to_string(),
                               "name": r.to.name, "vni": cfg.dest_vni(&r.to).unwrap_or(0)})
                    })
                    .collect();
                if *json {
                    out = serde_json::Value::Array(rows).to_string();
                } else {
                    let _ = writeln!(
                        out,
                        "{:<24} {:<24} {:<28} {:>8}",
                        "SOURCE", "DESTINATION", "TO", "VNI"
                    );
                    for r in &cfg.routes {
                        let _ = writeln!(
                            out,
                            "{:<24} {:<24} {:<28} {:>8}",
                            r.src.to_string(),
                            r.dst.to_string(),
                            format!("{} {}", r.to.kind, r.to.name),
                            cfg.dest_vni(&r.to).unwrap_or(0)
                        );
                    }
                }
            }
            ShowWhat::Listeners => {
                if *json {
                    let v: Vec<String> = cfg.listeners.iter().map(|a| format!("tcp {a}")).collect();
                    out = serde_json::to_string(&v).unwrap_or_default();
                } else {
                    for a in &cfg.listeners {
                        let _ = writeln!(out, "tcp {a}");
                    }
                }
            }
            ShowWhat::Stats => {
                let mut ports = Vec::new();
                for i in &cfg.interfaces {
                    ports.extend(st.engine.port_status(DestKind::Interface, &i.name));
                }
                for l in &cfg.links {
                    ports.extend(st.engine.port_status(DestKind::Link, &l.name));
                }
                let daemon = st.engine.daemon_counters();
                let control_errors = self.control_errors.load(Relaxed);
                let dispatch = st.engine.dispatch_status();
                if *json {
                    out = json!({"ports": ports, "daemon": {"rx_datagrams": daemon.rx_frames, "rx_bytes": daemon.rx_bytes, "drops": daemon.drops, "control_errors": control_errors}, "dispatch": dispatch}).to_string();
                } else {
                    let _ = writeln!(
                        out,
                        "{:<9} {:<16} {:>8} {:>12} {:>14} {:>12} {:>14}  DROPS",
                        "KIND", "NAME", "VNI", "RX FRAMES", "RX BYTES", "TX FRAMES", "TX BYTES"
                    );
                    for p in &ports {
                        let drops: Vec<String> = p
                            .counters
                            .drops
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect();
                        let _ = writeln!(
                            out,
                            "{:<9} {:<16} {:>8} {:>12} {:>14} {:>12} {:>14}  {}",
                            p.kind,
                            p.name,
                            p.vni,
                            p.counters.rx_frames,
                            p.counters.rx_bytes,
                            p.counters.tx_frames,
                            p.counters.tx_bytes,
                            if drops.is_empty() {
                                "-".to_string()
                            } else {
                                drops.join(" ")
                            }
                        );
                    }
                    let drops: Vec<String> = daemon
                        .drops
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let _ = writeln!(
                        out,
                        "daemon: {} datagrams received; drops: {}; control errors: {}",
                        daemon.rx_frames,
                        if drops.is_empty() {
                            "-".to_string()
                        } else {
                            drops.join(" ")
                        },
                        control_errors
                    );
                    render_dispatch(&mut out, &dispatch);
                }
            }
            ShowWhat::Matrix => {
                let (pairs, overflow) = st.engine.matrix();
                if *json {
                    out = json!({"pairs": pairs, "overflow": overflow}).to_string();
                } else {
                    let _ = writeln!(
                        out,
                        "{:>8} {:<17} {:<17} {:>12} {:>14}",
                        "VNI", "SOURCE", "DESTINATION", "FRAMES", "BYTES"
                    );
                    for p in &pairs {
                        let _ = writeln!(
                            out,
                            "{:>8} {:<17} {:<17} {:>12} {:>14}",
                            p.vni,
                            p.src.to_string(),
                            p.dst.to_string(),
                            p.frames,
                            p.bytes
                        );
                    }
                    if overflow > 0 {
                        let _ = writeln!(
                            out,
                            "({overflow} frames of pairs beyond the table's capacity)"
                        );
                    }
                }
            }
        }
        if *json && !out.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    pub fn shutdown(&self) {
        self.lock().engine.shutdown();
    }
}

/// A port's policy in the text tables: `any-source`, `rate M burst K`, or `-`.
fn policy_text(any_source: bool, rate: Option<&vnet_control::RateLimit>) -> String {
    let mut parts = Vec::new();
    if any_source {
        parts.push("any-source".to_string());
    }
    if let Some(r) = rate {
        parts.push(r.to_string());
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(" ")
    }
}

/// The text form of the data path's state in `show stats`.
fn render_dispatch(out: &mut String, d: &serde_json::Value) {
    let s = &d["settings"];
    let onoff = |v: &serde_json::Value| {
        if v.as_bool() == Some(true) {
            "on"
        } else {
            "off"
        }
    };
    let _ = writeln!(
        out,
        "data path: mode {} ({} dispatchers, yield {}, T_sleep {} us, T_nowork {} us, adaptive {}..{} pkt/s over {} ms); UDP GSO {}, GRO {}",
        s["mode"].as_str().unwrap_or("?"),
        s["dispatchers"],
        s["yield"].as_str().unwrap_or("?"),
        s["yield_sleep_us"],
        s["yield_nowork_us"],
        s["adaptive_low"],
        s["adaptive_high"],
        s["adaptive_window_ms"],
        onoff(&d["udp_gso"]),
        onoff(&d["udp_gro"]),
    );
    for x in d["dispatchers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  dispatcher {}: now {}, {} switches, {} wake-ups, {} frames, {} frames per wake-up, {} descriptors",
            x["index"],
            x["mode"].as_str().unwrap_or("?"),
            x["switches"],
            x["wakeups"],
            x["frames"],
            x["frames_per_wakeup"],
            x["sources"]
        );
    }
    let o = &d["offload"];
    let _ = writeln!(
        out,
        "  offload: {} guest frames cut into {} segments ({} UDP_SEGMENT sends, {} sendmmsg calls); {} segments merged into {} frames for guests; {} checksums completed, {} partial ones passed on",
        o["gso_frames"],
        o["gso_segments"],
        o["udp_gso_sends"],
        o["udp_batch_sends"],
        o["gro_merged"],
        o["gro_frames"],
        o["csum_completed"],
        o["partial_csum"]
    );
}
