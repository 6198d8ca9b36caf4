//! The daemon's record of what the etcd agent applied to the running configuration (links
//! and routes to other hosts), with an index that tells an object of the agent's from a local
//! one in constant time.
//!
//! Why an index: the local configuration is the running one without these objects, and it
//! is asked for on every local change (the journal's record leaves the agent's objects out)
//! and on every synchronisation (the agent derives from the local configuration). Scanning
//! the record's lists for each object made those quadratic in the overlay's size. The index
//! is made of persistent maps (`imbl`), so that every view the daemon publishes holds a copy
//! of it for nothing.

use vnet_cluster::{DerivedApplyError, DerivedConfig};
use vnet_control::{Command, Config, DestRef, Link, Route, RouteOp};
use vnet_core::MacMatch;

type RouteKey = (MacMatch, MacMatch, DestRef);

fn key(r: &Route) -> RouteKey {
    (r.src, r.dst, r.to.clone())
}

/// Which links and routes are the agent's (cheap to copy: shared until changed).
#[derive(Debug, Clone, Default)]
pub struct DerivedIndex {
    routes: imbl::HashSet<RouteKey>,
    links: imbl::OrdMap<String, Link>,
}

impl DerivedIndex {
    pub fn has_route(&self, r: &Route) -> bool {
        !self.routes.is_empty() && self.routes.contains(&key(r))
    }

    pub fn has_link(&self, l: &Link) -> bool {
        self.links.get(&l.name) == Some(l)
    }

    /// The agent's links, by name.
    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }
}

/// What the agent applied and has not taken back.
#[derive(Debug, Default)]
pub struct DerivedRecord {
    config: DerivedConfig,
    index: DerivedIndex,
}

impl DerivedRecord {
    pub fn config(&self) -> &DerivedConfig {
        &self.config
    }

    pub fn index(&self) -> &DerivedIndex {
        &self.index
    }

    pub fn has_route(&self, r: &Route) -> bool {
        self.index.has_route(r)
    }

    pub fn has_link(&self, l: &Link) -> bool {
        self.index.has_link(l)
    }

    /// The commands that create the record from nothing.
    pub fn commands(&self) -> Vec<Command> {
        self.config.commands()
    }

    /// Applies one command of the agent's (see [`DerivedConfig::apply`]).
    pub fn apply(&mut self, cmd: &Command) -> Result<(), DerivedApplyError> {
        self.config.apply(cmd)?;
        match cmd {
            Command::Route(op, s) => {
                let k = (s.src, s.dst, s.to.clone());
                // `DerivedConfig::apply` refuses a replace, so an add or a delete got here.
                if *op == RouteOp::Del {
                    self.index.routes.remove(&k);
                } else {
                    self.index.routes.insert(k);
                }
            }
            // A link's coming or going (its routes go with it): rarer than routes; reindexed.
            _ => self.reindex(),
        }
        Ok(())
    }

    /// Keeps only what `running` really holds (see [`DerivedConfig::retain_present`]).
    pub fn retain_present(&mut self, running: &Config) {
        self.config.retain_present(running);
        self.reindex();
    }

    /// The local configuration: `running` without this record's objects.
    #[cfg(test)]
    pub fn local_config(&self, running: &Config) -> Config {
        let mut local = running.clone();
        local.links.retain(|l| !self.has_link(l));
        local.routes.retain(|r| !self.has_route(r));
        local
    }

    /// [`DerivedRecord::local_config`]'s script, rendered from the running configuration
    /// (no copy of it).
    pub fn local_script(&self, running: &Config) -> String {
        running.script_where(|l| !self.has_link(l), |r| !self.has_route(r))
    }

    fn reindex(&mut self) {
        self.index.routes = self.config.routes.iter().map(key).collect();
        self.index.links = self
            .config
            .links
            .iter()
            .map(|l| (l.name.clone(), l.clone()))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_control::parse_line;

    fn cmd(line: &str) -> Command {
        parse_line(line).unwrap().unwrap()
    }

    fn route(line: &str) -> Route {
        let Command::Route(_, s) = cmd(line) else {
            panic!("not a route: {line}")
        };
        Route {
            src: s.src,
            dst: s.dst,
            to: s.to,
        }
    }

    /// The index answers as the lists do, after every kind of change.
    #[test]
    fn the_index_follows_the_record() {
        let mut d = DerivedRecord::default();
        let r1 = route("route add any 02:00:00:00:00:01 link up");
        let r2 = route("route add any 02:00:00:00:00:02 link up");
        assert!(!d.has_route(&r1));
        d.apply(&cmd("link add up udp 10.0.0.2 vni 1")).unwrap();
        d.apply(&cmd("route add any 02:00:00:00:00:01 link up"))
            .unwrap();
        d.apply(&cmd("route add any 02:00:00:00:00:02 link up"))
            .unwrap();
        assert!(d.has_route(&r1) && d.has_route(&r2));
        let up = d.config().links[0].clone();
        assert!(d.has_link(&up));
        let mut other = up.clone();
        other.vni = 2;
        assert!(!d.has_link(&other), "same name, another link");
        d.apply(&cmd("route del any 02:00:00:00:00:01 link up"))
            .unwrap();
        assert!(!d.has_route(&r1) && d.has_route(&r2));
        assert!(d
            .apply(&cmd("route del any 02:00:00:00:00:01 link up"))
            .is_err());
        // A link going takes its routes along, in the index too.
        d.apply(&cmd("link del up")).unwrap();
        assert!(!d.has_route(&r2) && !d.has_link(&up));
        // What the running configuration no longer holds goes.
        d.apply(&cmd("link add up udp 10.0.0.2 vni 1")).unwrap();
        d.apply(&cmd("route add any 02:00:00:00:00:01 link up"))
            .unwrap();
        d.retain_present(&Config::default());
        assert!(!d.has_route(&r1) && !d.has_link(&up));
        assert!(d.commands().is_empty());
    }
}
