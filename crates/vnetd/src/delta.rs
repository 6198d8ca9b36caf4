//! What a change of the local configuration appends to the journal (pure): the typed changes
//! the model made, said as control-language lines that take the local configuration (the
//! running one without what the etcd agent derived) from before the change to after it, when
//! replayed on it the way a start reads saved text (line by line, a line that does not apply
//! left out: `restore.rs`).
//!
//! Why from the typed changes and not the commands as typed: a change's effect is what the
//! model did (an interface given a random MAC, the routes an `interface del` took along, a
//! replace that took out a derived route), and the objects the agent derived are not part of
//! the local configuration, so their lines are left out, as `State::local_script` leaves them.
//! Settings are the one change said as a whole snapshot instead (`None`): putting one back to
//! its default has no line of its own.

use std::fmt::Write as _;

use vnet_control::{Change, Config, DestKind, Link, PortPolicy, Route, RouteSpec};

/// The lines of `changes`, or None when they must be saved as a whole snapshot.
/// `derived_route` and `derived_link` say whether an object is the agent's.
pub fn local_delta(
    changes: &[Change],
    derived_route: &dyn Fn(&Route) -> bool,
    derived_link: &dyn Fn(&Link) -> bool,
) -> Option<String> {
    let mut s = String::new();
    for c in changes {
        match c {
            Change::AddInterface(i) => {
                let mut one = Config::default();
                one.interfaces.push(i.clone());
                s.push_str(&one.to_script());
            }
            Change::DelInterface(i) => {
                let _ = writeln!(s, "interface del {}", i.name);
            }
            Change::AddLink(l) if !derived_link(l) => {
                let mut one = Config::default();
                one.links.push(l.clone());
                s.push_str(&one.to_script());
            }
            Change::DelLink(l) if !derived_link(l) => {
                let _ = writeln!(s, "link del {}", l.name);
            }
            Change::AddLink(_) | Change::DelLink(_) => {}
            Change::AddListener(a) => {
                let _ = writeln!(s, "listen tcp {a}");
            }
            Change::DelListener(a) => {
                let _ = writeln!(s, "listen del tcp {a}");
            }
            Change::Route(rc) => {
                let (out, put) = rc.parts();
                if let Some(r) = out.filter(|r| !derived_route(r)) {
                    let _ = writeln!(s, "route del {}", spec(r));
                }
                if let Some(r) = put.filter(|r| !derived_route(r)) {
                    let _ = writeln!(s, "route add {}", spec(r));
                }
            }
            Change::Policy {
                kind, name, new, ..
            } => s.push_str(&policy_line(*kind, name, new)),
            Change::Learn(on) => {
                let _ = writeln!(s, "set learn {}", if *on { "on" } else { "off" });
            }
            Change::Settings { .. } => return None,
        }
    }
    Some(s)
}

fn spec(r: &Route) -> RouteSpec {
    RouteSpec {
        src: r.src,
        dst: r.dst,
        to: r.to.clone(),
    }
}

/// `interface set` / `link set` with every part of the policy as it is now.
fn policy_line(kind: DestKind, name: &str, p: &PortPolicy) -> String {
    let rate = match &p.rate {
        Some(r) => r.to_string(),
        None => "rate off".into(),
    };
    match kind {
        DestKind::Interface => format!(
            "interface set {name} any-source {} {rate}\n",
            if p.any_source { "on" } else { "off" }
        ),
        DestKind::Link => format!("link set {name} {rate}\n"),
    }
}

#[cfg(test)]
mod tests;
