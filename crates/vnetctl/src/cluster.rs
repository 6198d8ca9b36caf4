//! `vnetctl --etcd ENDPOINTS --overlay NAME ...`: the whole overlay, through etcd
//! (docs/control-language.md, "Many hosts from etcd").

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use vnet_cluster::{
    encode, key_for_host, key_for_interface, key_for_policy, key_for_route, matrix_prefix,
    overlay_prefix, plan_move, suggest, ClusterState, HostId, MatrixRecord, OperatorRoute,
    OverlayName, Policy, RouteId, RouteRecord,
};
use vnet_control::status::Col::{Left as L, Rest, Right as R};
use vnet_control::status::Columns;
use vnet_etcd::{Client, Compare, CompareTarget, TxnOp};
use vnet_wire::MacAddr;

pub const USAGE: &str = "commands with --etcd: hosts [json] | interfaces [json] | routes [json] | \
route add ID ROUTE-SPEC [host H] | route del ID | move VNI MAC HOST [NAME] | \
policy [mesh | star PROXY | explicit] | suggest [threshold BYTES] [json]";

/// Reads the overlay (without the traffic matrices).
fn read_state(client: &Client, overlay: &OverlayName) -> Result<(ClusterState, Vec<String>)> {
    let prefix = overlay_prefix(overlay);
    let r = client.get_prefix(prefix.as_bytes())?;
    let matrices = matrix_prefix(overlay);
    let mut entries = Vec::new();
    for kv in &r.kvs {
        if let Ok(k) = std::str::from_utf8(&kv.key) {
            if !k.starts_with(&matrices) {
                entries.push((k, kv.value.as_slice()));
            }
        }
    }
    let (state, bad) = ClusterState::from_entries(overlay.clone(), entries);
    Ok((
        state,
        bad.iter().map(|(k, e)| format!("{k}: {e}")).collect(),
    ))
}

fn warn_bad(bad: &[String]) {
    for b in bad {
        eprintln!("vnetctl: ignored a bad entry: {b}");
    }
}

/// The overlay's state for a listing (its bad entries warned of), and whether `rest` asks for
/// JSON.
fn listing(client: &Client, overlay: &OverlayName, rest: &[&str]) -> Result<(ClusterState, bool)> {
    let json = json_flag(rest)?;
    let (state, bad) = read_state(client, overlay)?;
    warn_bad(&bad);
    Ok((state, json))
}

/// A listing in JSON: one array, one line.
fn json_array<T: serde::Serialize>(items: impl Iterator<Item = T>) -> String {
    let v: Vec<Value> = items
        .map(|x| serde_json::to_value(x).unwrap_or_default())
        .collect();
    Value::Array(v).to_string() + "\n"
}

pub fn run(client: &Client, overlay: &OverlayName, words: &[String]) -> Result<String> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let mut out = String::new();
    match w.as_slice() {
        ["hosts", rest @ ..] => {
            let (state, json) = listing(client, overlay, rest)?;
            if json {
                out = json_array(state.hosts().values());
            } else {
                const T: Columns = Columns(&[L(20), L(39), R(6), R(6), Rest]);
                let _ = T.row(
                    &mut out,
                    &[&"HOST", &"ADDRESS", &"UDP", &"TCP", &"CAPABILITIES"],
                );
                for h in state.hosts().values() {
                    let _ = T.row(
                        &mut out,
                        &[
                            &h.host_id.as_str(),
                            &h.addr.to_string(),
                            &h.udp_port,
                            &h.tcp_port.map_or("-".to_string(), |p| p.to_string()),
                            &h.capabilities.join(","),
                        ],
                    );
                }
            }
        }
        ["interfaces", rest @ ..] => {
            let (state, json) = listing(client, overlay, rest)?;
            if json {
                out = json_array(state.interfaces().values());
            } else {
                const T: Columns = Columns(&[R(8), L(17), L(20), L(16), R(6)]);
                let _ = T.row(&mut out, &[&"VNI", &"MAC", &"HOST", &"NAME", &"EPOCH"]);
                for i in state.interfaces().values() {
                    let _ = T.row(
                        &mut out,
                        &[
                            &i.vni,
                            &i.mac.to_string(),
                            &i.host_id.as_str(),
                            &i.name,
                            &i.epoch,
                        ],
                    );
                }
            }
        }
        ["routes", rest @ ..] => {
            let (state, json) = listing(client, overlay, rest)?;
            if json {
                out = json_array(state.routes().values().map(|r| {
                    let rec = r.to_record();
                    json!({"id": r.id.as_str(), "line": rec.line, "host_id": rec.host_id.as_ref().map(|h| h.as_str())})
                }));
            } else {
                const T: Columns = Columns(&[L(24), L(20), Rest]);
                let _ = T.row(&mut out, &[&"ID", &"HOST", &"LINE"]);
                for r in state.routes().values() {
                    let rec = r.to_record();
                    let _ = T.row(
                        &mut out,
                        &[
                            &r.id.as_str(),
                            &rec.host_id.as_ref().map_or("(all)", |h| h.as_str()),
                            &rec.line,
                        ],
                    );
                }
            }
        }
        ["route", "add", id, spec @ ..] => {
            let id: RouteId = id.parse().context("route id")?;
            let (spec, host) = match spec {
                [s @ .., "host", h] => (s, Some(h.parse::<HostId>().context("host")?)),
                s => (s, None),
            };
            if spec.is_empty() {
                bail!("route add ID needs a route, e.g. `any 52:54:00:00:00:01 link c-b-v1`");
            }
            let spec = spec.join(" ");
            let line = if spec.starts_with("route ") {
                spec
            } else {
                format!("route add {spec}")
            };
            let rec = RouteRecord {
                line,
                host_id: host,
            };
            // Refuse what the daemons would refuse, before writing it.
            let route = OperatorRoute::from_record(id.clone(), rec)?;
            let rec = route.to_record();
            client.put(key_for_route(overlay, &id).as_bytes(), &encode(&rec), 0)?;
        }
        ["route", "del", id] => {
            let id: RouteId = id.parse().context("route id")?;
            let key = key_for_route(overlay, &id);
            if client.range(key.as_bytes(), None)?.kvs.is_empty() {
                bail!("no route {id}");
            }
            client.delete(key.as_bytes(), None)?;
        }
        ["move", vni, mac, host, name @ ..] => {
            let vni: u32 = vni.parse().map_err(|_| anyhow!("bad VNI {vni:?}"))?;
            let mac: MacAddr = mac
                .to_lowercase()
                .parse()
                .map_err(|e| anyhow!("bad MAC: {e:?}"))?;
            let to: HostId = host.parse().context("host")?;
            out = move_interface(client, overlay, vni, mac, &to, name.first().copied())?;
        }
        ["policy"] => {
            let (state, _) = read_state(client, overlay)?;
            let p = state.policy();
            out = serde_json::to_string(&p)? + "\n";
        }
        ["policy", rest @ ..] => {
            let p = match rest {
                ["mesh"] => Policy::Mesh,
                ["explicit"] => Policy::Explicit,
                ["star", proxy] => Policy::Star {
                    proxy: proxy.parse().context("proxy host")?,
                },
                _ => bail!("policy mesh | star PROXY | explicit"),
            };
            client.put(key_for_policy(overlay).as_bytes(), &encode(&p), 0)?;
        }
        ["suggest", rest @ ..] => {
            let (threshold, json) = match rest {
                [] => (0, false),
                ["json"] => (0, true),
                ["threshold", t] => (parse_bytes(t)?, false),
                ["threshold", t, "json"] => (parse_bytes(t)?, true),
                _ => bail!("suggest [threshold BYTES] [json]"),
            };
            out = run_suggest(client, overlay, threshold, json)?;
        }
        _ => bail!("{USAGE}"),
    }
    Ok(out)
}

fn json_flag(rest: &[&str]) -> Result<bool> {
    match rest {
        [] => Ok(false),
        ["json"] => Ok(true),
        _ => bail!("unexpected {:?}", rest.join(" ")),
    }
}

fn parse_bytes(s: &str) -> Result<u64> {
    s.parse().map_err(|_| anyhow!("bad byte count {s:?}"))
}

/// Moves a placement in one transaction, conditioned on what was read (the previous host and
/// epoch, exactly as stored) and on the new host being registered; the new placement is put
/// under the new host's lease, so it goes when that host dies.
fn move_interface(
    client: &Client,
    overlay: &OverlayName,
    vni: u32,
    mac: MacAddr,
    to: &HostId,
    name: Option<&str>,
) -> Result<String> {
    let (state, _) = read_state(client, overlay)?;
    let current = state
        .placement(vni, mac)
        .ok_or_else(|| anyhow!("no interface {mac} in VNI {vni}"))?;
    if &current.host_id == to {
        return Ok(format!("{mac} in VNI {vni} is already on {to}\n"));
    }
    let host_key = key_for_host(overlay, to);
    let host_kv = client.range(host_key.as_bytes(), None)?;
    let Some(host_kv) = host_kv.kvs.first() else {
        bail!("host {to} is not registered (no {host_key})");
    };
    let name = name.unwrap_or(&current.name);
    let plan = plan_move(overlay, current, to, name)?;
    debug_assert_eq!(plan.key, key_for_interface(overlay, vni, mac));
    let ok = client.txn(
        &[
            Compare {
                key: plan.key.clone().into_bytes(),
                target: CompareTarget::Value(plan.expected_value.clone()),
            },
            Compare {
                key: host_key.into_bytes(),
                target: CompareTarget::ModRevision(host_kv.mod_revision),
            },
        ],
        &[TxnOp::Put {
            key: plan.key.into_bytes(),
            value: plan.new_value,
            lease: host_kv.lease,
        }],
        &[],
    )?;
    if !ok {
        bail!("the placement or host {to} changed meanwhile; nothing moved (try again)");
    }
    Ok(format!(
        "moved {mac} in VNI {vni} from {} to {to} (epoch {})\n",
        plan.expected_host, plan.new_record.epoch
    ))
}

fn run_suggest(
    client: &Client,
    overlay: &OverlayName,
    threshold: u64,
    json: bool,
) -> Result<String> {
    let (state, bad) = read_state(client, overlay)?;
    warn_bad(&bad);
    let prefix = matrix_prefix(overlay);
    let r = client.get_prefix(prefix.as_bytes())?;
    let mut entries = Vec::new();
    for kv in &r.kvs {
        // A value that is not a matrix record adds nothing; bad pairs are skipped.
        if let Ok(m) = MatrixRecord::decode(&kv.value) {
            entries.extend(m.pairs);
        }
    }
    let links = suggest(&entries, &state, threshold);
    let mut out = String::new();
    if json {
        let v: Vec<Value> = links
            .iter()
            .map(|l| {
                json!({"hosts": [l.hosts.0.as_str(), l.hosts.1.as_str()], "vnis": l.vnis,
                       "bytes": l.bytes, "frames": l.frames,
                       "script": l.script(&state).into_iter().map(|(h, lines)| json!({"host": h.as_str(), "lines": lines})).collect::<Vec<_>>()})
            })
            .collect();
        out = Value::Array(v).to_string() + "\n";
    } else if links.is_empty() {
        out.push_str("no direct links to suggest\n");
    } else {
        for l in &links {
            let _ = writeln!(out, "suggest {l}");
            for (h, lines) in l.script(&state) {
                for line in lines {
                    let _ = writeln!(out, "  on {h}: {line}");
                }
            }
        }
    }
    Ok(out)
}
