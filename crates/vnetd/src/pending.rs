//! Routes of the local configuration that wait for their link (pure).
//!
//! Why (issue 32): a route to a link the etcd agent derived is a local change, accepted and
//! journaled like any other; but a start restores the local configuration before the derived
//! links exist, and a derived link that goes (its host left the overlay) takes the routes to
//! it along. Refusing such a route then, as a start used to, erased it from the state
//! directory at the next write. Instead it waits here: it is saved with the local
//! configuration (its `route add` line, after the rest), counted and shown as pending, and
//! comes back into effect when a link of its name does.
//!
//! The same rules hold wherever the local configuration is rebuilt (a start replaying saved
//! text in `restore.rs`, the running daemon in `daemon.rs`), so what is saved reads back as it
//! ran: a route add or replace to a link that is not there waits; a route delete of a waiting
//! route takes it out; a link that comes brings its waiting routes back.

use vnet_control::{Command, Config, DestKind, Route, RouteOp, RouteSpec};

/// The routes waiting for their link, in the order they came.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pending {
    routes: Vec<Route>,
}

/// The route a command adds.
fn route_of(s: &RouteSpec) -> Route {
    Route {
        src: s.src,
        dst: s.dst,
        to: s.to.clone(),
    }
}

/// A route as a command says it (its `Display` is the command's words).
pub fn spec_of(r: &Route) -> RouteSpec {
    RouteSpec {
        src: r.src,
        dst: r.dst,
        to: r.to.clone(),
    }
}

impl Pending {
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether a command that `cfg` refused is a route that waits for its link instead (a
    /// route add or replace to a link `cfg` does not have): then it is kept here.
    pub fn wait_if_linkless(&mut self, cmd: &Command, cfg: &Config) -> bool {
        let Command::Route(RouteOp::Add | RouteOp::Replace, s) = cmd else {
            return false;
        };
        if s.to.kind != DestKind::Link || cfg.link(&s.to.name).is_some() {
            return false;
        }
        self.push(route_of(s));
        true
    }

    /// Keeps a route that lost its link (no twice: the same route is one line).
    pub fn push(&mut self, r: Route) {
        if !self.routes.contains(&r) {
            self.routes.push(r);
        }
    }

    /// A route [`Pending::ready`] gave that could not be applied after all: it waits on.
    pub fn put_back(&mut self, cmd: &Command) {
        if let Command::Route(_, s) = cmd {
            self.push(route_of(s));
        }
    }

    /// A `route del` of a waiting route (one `cfg` does not hold): taken out. True if it was
    /// one.
    pub fn delete(&mut self, cmd: &Command, cfg: &Config) -> bool {
        let Command::Route(RouteOp::Del, s) = cmd else {
            return false;
        };
        let r = route_of(s);
        if cfg.routes.contains(&r) {
            return false;
        }
        let before = self.routes.len();
        self.routes.retain(|x| *x != r);
        self.routes.len() != before
    }

    /// Splits a local change's commands into the deletes of waiting routes (routes `cfg` does
    /// not hold: the model would refuse them) and the rest, for the model. The routes are
    /// not taken out here: [`Pending::forget`] each once the change is applied.
    pub fn deletes(
        &self,
        cmds: Vec<(usize, Command)>,
        cfg: &Config,
    ) -> (Vec<(usize, Command)>, Vec<Route>) {
        if self.routes.is_empty() {
            return (cmds, Vec::new());
        }
        let mut rest = Vec::with_capacity(cmds.len());
        let mut gone = Vec::new();
        for (line, cmd) in cmds {
            if let Command::Route(RouteOp::Del, s) = &cmd {
                let r = route_of(s);
                if self.routes.contains(&r) && !cfg.routes.contains(&r) && !gone.contains(&r) {
                    gone.push(r);
                    continue;
                }
            }
            rest.push((line, cmd));
        }
        (rest, gone)
    }

    /// Takes a waiting route out.
    pub fn forget(&mut self, r: &Route) {
        self.routes.retain(|x| x != r);
    }

    /// The waiting routes whose link `cfg` now has, taken out in order, as the commands that
    /// add them.
    pub fn ready(&mut self, cfg: &Config) -> Vec<Command> {
        let mut out = Vec::new();
        self.routes.retain(|r| {
            if cfg.link(&r.to.name).is_some() {
                out.push(Command::Route(RouteOp::Add, spec_of(r)));
                false
            } else {
                true
            }
        });
        out
    }

    /// The lines that save them (after the rest of the local configuration: read back, each
    /// waits again, or applies when its link is there by then).
    pub fn script(&self) -> String {
        let mut s = String::new();
        for r in &self.routes {
            s.push_str(&format!("route add {}\n", spec_of(r)));
        }
        s
    }

    /// The lines `show config` adds: comments, so the text stays a script that applies.
    pub fn shown(&self) -> String {
        if self.routes.is_empty() {
            return String::new();
        }
        let mut s = format!(
            "# {} route(s) waiting for their link (saved; in effect once the link is here):\n",
            self.routes.len()
        );
        for r in &self.routes {
            s.push_str(&format!("# route add {}\n", spec_of(r)));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_control::parse_line;
    use vnet_wire::MacAddr;

    fn cmd(line: &str) -> Command {
        parse_line(line).unwrap().unwrap()
    }

    fn cfg(script: &str) -> Config {
        let mut c = Config::default();
        for l in script.lines() {
            c.apply(&cmd(l), &mut MacAddr::random).unwrap();
        }
        c
    }

    #[test]
    fn routes_to_a_missing_link_wait_and_come_back_with_it() {
        let mut p = Pending::default();
        let c = cfg("link add here udp 10.0.0.2\n");
        // Only a route to a link that is not there waits.
        assert!(!p.wait_if_linkless(&cmd("route add any 02:00:00:00:00:01 link here"), &c));
        assert!(!p.wait_if_linkless(&cmd("route add any 02:00:00:00:00:01 interface vm9"), &c));
        assert!(!p.wait_if_linkless(&cmd("route del any 02:00:00:00:00:01 link gone"), &c));
        assert!(p.wait_if_linkless(&cmd("route add any 02:00:00:00:00:01 link gone"), &c));
        assert!(p.wait_if_linkless(&cmd("route replace any 02:00:00:00:00:02 link gone"), &c));
        assert!(p.wait_if_linkless(&cmd("route add any 02:00:00:00:00:03 link other"), &c));
        assert!(p.wait_if_linkless(&cmd("route add any 02:00:00:00:00:01 link gone"), &c));
        assert_eq!(p.len(), 3, "the same route is one line");
        assert_eq!(
            p.script(),
            "route add any 02:00:00:00:00:01 link gone\nroute add any 02:00:00:00:00:02 link gone\nroute add any 02:00:00:00:00:03 link other\n"
        );
        assert!(p.shown().lines().all(|l| l.starts_with('#')));
        // A delete of a waiting route takes it out.
        assert!(p.delete(&cmd("route del any 02:00:00:00:00:02 link gone"), &c));
        assert!(!p.delete(&cmd("route del any 02:00:00:00:00:02 link gone"), &c));
        // The link comes: its routes are ready, in order; the others wait on.
        let c = cfg("link add here udp 10.0.0.2\nlink add gone udp 10.0.0.3\n");
        let ready = p.ready(&c);
        assert_eq!(ready, [cmd("route add any 02:00:00:00:00:01 link gone")]);
        assert_eq!(p.len(), 1);
        assert!(p.ready(&c).is_empty());
    }
}
