//! A line and a script of the control language: the first words pick the command family, whose
//! parser (`ports`, `settings`, or the small ones here: listen, route, show) reads the rest.

use vnet_core::MacMatch;
use vnet_wire::MacAddr;

use super::ports::{parse_interface, parse_link, parse_policy_update};
use super::settings::parse_setting;
use super::words::{err, keyword, mac, name, quote, socket_addr, unknown, Words};
use crate::command::{
    Command, DestKind, DestRef, ParseError, RouteOp, RouteSpec, ScriptError, ShowWhat,
    MAX_LINE_LEN, MAX_SCRIPT_LINES,
};

/// Parses one line. Blank lines and comments give `Ok(None)`.
pub fn parse_line(line: &str) -> Result<Option<Command>, ParseError> {
    if line.len() > MAX_LINE_LEN {
        return err(format!("line longer than {MAX_LINE_LEN} bytes"));
    }
    let code = match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    };
    let words: Vec<&str> = code.split_whitespace().collect();
    if words.is_empty() {
        return Ok(None);
    }
    let mut w = Words { words, pos: 0 };
    let cmd = match w.next("command")? {
        "interface" => match w.next("interface action (add, del, set)")? {
            "add" => Command::InterfaceAdd(parse_interface(&mut w)?),
            "del" => Command::InterfaceDel(name(w.next("interface name")?)?),
            "set" => {
                let n = name(w.next("interface name")?)?;
                Command::InterfaceSet(n, parse_policy_update(&mut w, true)?)
            }
            o => return unknown("interface action", o, "add, del, set"),
        },
        "link" => match w.next("link action (add, del, set)")? {
            "add" => Command::LinkAdd(parse_link(&mut w)?),
            "del" => Command::LinkDel(name(w.next("link name")?)?),
            "set" => {
                let n = name(w.next("link name")?)?;
                Command::LinkSet(n, parse_policy_update(&mut w, false)?)
            }
            o => return unknown("link action", o, "add, del, set"),
        },
        "listen" => {
            let mut del = false;
            match w.peek() {
                Some("add") => w.pos += 1,
                Some("del") => {
                    w.pos += 1;
                    del = true;
                }
                _ => {}
            }
            match w.next("listener protocol (tcp)")? {
                "tcp" => {}
                o => return unknown("listener protocol", o, "tcp"),
            }
            let addr = socket_addr(w.next("IP:PORT")?, None)?;
            if del {
                Command::ListenDel(addr)
            } else {
                Command::ListenAdd(addr)
            }
        }
        "route" => {
            let op: RouteOp = keyword(w.next("route action (add, replace, del)")?, "route action")?;
            Command::Route(op, parse_route(&mut w)?)
        }
        "set" => Command::Set(parse_setting(&mut w)?),
        "show" => {
            let what = match w.next("what to show")? {
                "interfaces" => ShowWhat::Interfaces,
                "links" => ShowWhat::Links,
                "routes" => match w.peek() {
                    // Only the routes a frame for MAC can take (`ip route get` in spirit):
                    // cheap to ask of a daemon with thousands of routes, as a poller does.
                    Some("to") => {
                        w.pos += 1;
                        ShowWhat::Routes(Some(mac_or_broadcast(
                            w.next("destination MAC after to")?,
                        )?))
                    }
                    _ => ShowWhat::Routes(None),
                },
                "listeners" => ShowWhat::Listeners,
                "stats" => ShowWhat::Stats,
                "matrix" => ShowWhat::Matrix,
                "config" => ShowWhat::Config,
                "cluster" => ShowWhat::Cluster,
                "reach" => ShowWhat::Reach,
                o => {
                    return err(format!(
                    "cannot show {} (interfaces, links, routes, listeners, stats, matrix, config, cluster, reach)",
                    quote(o)
                ))
                }
            };
            let json = match w.peek() {
                Some("json") if what != ShowWhat::Config => {
                    w.pos += 1;
                    true
                }
                _ => false,
            };
            Command::Show(what, json)
        }
        o => return unknown("command", o, "interface, link, listen, route, set, show"),
    };
    w.end()?;
    Ok(Some(cmd))
}

/// Parses a whole script. Refuses it at the first bad line (1-based) or when it is too long.
pub fn parse_script(text: &str) -> Result<Vec<(usize, Command)>, ScriptError> {
    parse_bounded(text, MAX_SCRIPT_LINES, "script")
}

/// Parses a configuration as [`crate::Config::to_script`] renders it (the state directory's
/// saved configuration): as [`parse_script`], but within [`crate::MAX_CONFIG_LINES`], the most
/// lines any configuration the model accepts renders to, rather than a script's
/// [`MAX_SCRIPT_LINES`] (a configuration built in many batches is longer than one may be).
pub fn parse_config(text: &str) -> Result<Vec<(usize, Command)>, ScriptError> {
    parse_bounded(text, crate::model::MAX_CONFIG_LINES, "configuration")
}

fn parse_bounded(
    text: &str,
    max_lines: usize,
    what: &str,
) -> Result<Vec<(usize, Command)>, ScriptError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i >= max_lines {
            return Err(ScriptError {
                line: i + 1,
                message: format!("{what} longer than {max_lines} lines"),
            });
        }
        match parse_line(line) {
            Ok(Some(c)) => out.push((i + 1, c)),
            Ok(None) => {}
            Err(e) => {
                return Err(ScriptError {
                    line: i + 1,
                    message: e.0,
                })
            }
        }
    }
    Ok(out)
}

fn parse_route(w: &mut Words) -> Result<RouteSpec, ParseError> {
    let src = mac_match(w, "source", false)?;
    // No frame has a broadcast source; refused in every spelling, so that what a route renders
    // as (`broadcast` names only a destination) always parses again.
    if matches!(src, MacMatch::Exact(a) | MacMatch::Not(a) if a.is_broadcast()) {
        return Err(ParseError(
            "a source MAC cannot be broadcast (ff:ff:ff:ff:ff:ff)".into(),
        ));
    }
    let dst = mac_match(w, "destination", true)?;
    let kind = match w.next("destination kind (interface, link)")? {
        "interface" => DestKind::Interface,
        "link" => DestKind::Link,
        o => {
            return err(format!(
                "route destination must be interface or link, not {}",
                quote(o)
            ))
        }
    };
    let to = DestRef {
        kind,
        name: name(w.next("destination name")?)?,
    };
    Ok(RouteSpec { src, dst, to })
}

/// A MAC, or the word `broadcast` for ff:ff:ff:ff:ff:ff.
fn mac_or_broadcast(s: &str) -> Result<MacAddr, ParseError> {
    match s {
        "broadcast" => Ok(MacAddr::BROADCAST),
        s => mac(s),
    }
}

fn mac_match(w: &mut Words, what: &str, allow_broadcast: bool) -> Result<MacMatch, ParseError> {
    let one = |s: &str| -> Result<MacAddr, ParseError> {
        if allow_broadcast {
            mac_or_broadcast(s)
        } else {
            mac(s)
        }
    };
    match w.next(&format!("{what} (MAC, any, not MAC)"))? {
        "any" => Ok(MacMatch::Any),
        "not" => Ok(MacMatch::Not(one(
            w.next(&format!("{what} MAC after not"))?
        )?)),
        s => Ok(MacMatch::Exact(one(s)?)),
    }
}
