//! The change transactions, run on the owner thread: commands validated against the running
//! configuration and applied to it in place, the engine following change by change, all or
//! none; a command of the control port journaled; the etcd agent's derivations in scripts;
//! the start's restore; routes that wait for their link brought back. The journal's record
//! and its acknowledgement are `saving.rs`'s.
//!
//! All or none without a copy of the configuration: a script changes the configuration in
//! place, and a refused line puts back the configuration without its routes as it was before
//! the script (a copy of the ports and settings, small) and takes back the script's route
//! changes newest first (`Config::undo_routes`). A change the OS refuses (a TAP name taken) is
//! undone in the engine with the inverses of the changes before it, newest first, and the
//! engine's table is made anew from the configuration as it was.

use std::sync::atomic::Ordering::Relaxed;

use vnet_agent::SyncReport;
use vnet_control::{parse_config, parse_line, Change, Command, Config, RouteChange};
use vnet_wire::MacAddr;

use super::owner::{Owner, State};
use super::saving::{Saving, Whole};
use crate::pending::Pending;

/// What a successful apply did, enough to take it back.
#[derive(Default)]
pub struct Applied {
    pub changes: Vec<Change>,
    /// The configuration without its routes before (None: a change of routes only, taken
    /// back by its changes).
    before: Option<Config>,
}

/// The configuration without its routes (what a script may change besides them).
fn without_routes(cfg: &mut Config) -> Config {
    let routes = std::mem::take(&mut cfg.routes);
    let rest = cfg.clone();
    cfg.routes = routes;
    rest
}

/// Puts back `before` (from [`without_routes`]) and takes back the route changes of `done`.
fn put_back(cfg: &mut Config, mut before: Config, done: &[Change]) {
    cfg.undo_routes(&route_changes(done));
    before.routes = std::mem::take(&mut cfg.routes);
    *cfg = before;
}

fn route_changes(changes: &[Change]) -> Vec<RouteChange> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::Route(rc) => Some(rc.clone()),
            _ => None,
        })
        .collect()
}

/// An error at a script's line; 0 means a single command (no line number).
pub fn at(line: usize, msg: String) -> String {
    if line == 0 {
        msg
    } else {
        format!("line {line}: {msg}")
    }
}

fn is_route(c: &Command) -> bool {
    matches!(c, Command::Route(..))
}

/// Whether a batch of commands is routes alone (brief changes).
pub fn routes_only<'a>(cmds: impl IntoIterator<Item = &'a Command>) -> bool {
    cmds.into_iter().all(is_route)
}

impl Owner {
    /// Applies commands to the running configuration and the engine atomically: all or none;
    /// returns what changed. `line` 0 means a single command (no line number in errors).
    pub fn apply_in(&mut self, cmds: &[(usize, Command)]) -> Result<Vec<Change>, String> {
        self.apply_in_at(cmds)
            .map(|a| a.changes)
            .map_err(|(_, e)| e)
    }

    /// [`Owner::apply_in`], with what it takes to undo it.
    pub fn apply_undoable(&mut self, cmds: &[(usize, Command)]) -> Result<Applied, String> {
        self.apply_in_at(cmds).map_err(|(_, e)| e)
    }

    /// [`Owner::apply_in`], saying which command (its index in `cmds`) was refused.
    pub fn apply_in_at(&mut self, cmds: &[(usize, Command)]) -> Result<Applied, (usize, String)> {
        let r = if routes_only(cmds.iter().map(|(_, c)| c)) {
            apply_routes_in(&mut self.st, cmds)
        } else {
            let r = apply_script_in(&mut self.st, cmds);
            if r.is_err() {
                self.renew();
            }
            r
        };
        if let Ok(a) = &r {
            self.note(&a.changes);
        }
        r
    }

    /// Takes back what [`Owner::apply_undoable`] did (a change that could not be saved).
    pub fn undo(&mut self, a: Applied) {
        let st = &mut self.st;
        for c in a.changes.iter().rev() {
            if let Err(e) = st.engine.apply(&c.inverse()) {
                tracing::error!("could not undo {c:?}: {e}");
            }
        }
        match a.before {
            Some(before) => {
                put_back(&mut st.cfg, before, &a.changes);
                let State { cfg, engine, .. } = st;
                engine.rebuild(cfg);
            }
            None => {
                st.cfg.undo_routes(&route_changes(&a.changes));
                st.engine.publish();
            }
        }
        self.renew();
    }

    /// Routes that wait for a link the configuration has now go back into effect (one it
    /// refuses waits on). Returns how many.
    pub fn bring_back(&mut self) -> usize {
        let ready = self.st.pending.ready(&self.st.cfg);
        let mut n = 0;
        for cmd in ready {
            match self.apply_in(&[(0, cmd.clone())]) {
                Ok(_) => n += 1,
                Err(_) => self.st.pending.put_back(&cmd),
            }
        }
        n
    }

    /// A link of the agent's that went took local routes along (a route of the local
    /// configuration to a derived link): they wait for it to come back, saved as before.
    /// Called before the record takes the agent's commands in. Returns how many.
    pub fn took_local_routes(&mut self, changes: &[Change]) -> usize {
        let st = &mut self.st;
        let mut n = 0;
        for c in changes {
            if let Change::Route(RouteChange::Removed { route, .. }) = c {
                if !st.derived.has_route(route) {
                    st.pending.push(route.clone());
                    n += 1;
                }
            }
        }
        n
    }
}

/// A script with more than routes: the configuration changes in place (see the module
/// header), then the engine realizes the changes one by one and publishes once.
fn apply_script_in(st: &mut State, cmds: &[(usize, Command)]) -> Result<Applied, (usize, String)> {
    #[cfg(all(test, debug_assertions))]
    let was = st.cfg.clone();
    let before = without_routes(&mut st.cfg);
    let mut changes: Vec<(usize, usize, Change)> = Vec::new();
    let mut gen = MacAddr::random;
    for (i, (line, cmd)) in cmds.iter().enumerate() {
        match st.cfg.apply(cmd, &mut gen) {
            Ok(ch) => changes.extend(ch.into_iter().map(|c| (i, *line, c))),
            Err(e) => {
                let done: Vec<Change> = changes.into_iter().map(|(_, _, c)| c).collect();
                put_back(&mut st.cfg, before, &done);
                #[cfg(all(test, debug_assertions))]
                assert!(
                    st.cfg == was,
                    "a refused script leaves the configuration as it was"
                );
                return Err((i, at(*line, e.to_string())));
            }
        }
    }
    #[cfg(test)]
    if let Some(hook) = st.before_engine.as_mut() {
        hook();
    }
    for (k, (i, line, ch)) in changes.iter().enumerate() {
        if let Err(e) = st.engine.apply(ch) {
            // Undo what this script already did in the OS, newest first.
            for (_, _, prev) in changes[..k].iter().rev() {
                if let Err(undo) = st.engine.apply(&prev.inverse()) {
                    tracing::error!("could not undo {prev:?}: {undo}");
                }
            }
            let err = (*i, at(*line, e.to_string()));
            let done: Vec<Change> = changes.into_iter().map(|(_, _, c)| c).collect();
            put_back(&mut st.cfg, before, &done);
            let State { cfg, engine, .. } = st;
            engine.rebuild(cfg);
            return Err(err);
        }
    }
    st.engine.publish();
    Ok(Applied {
        changes: changes.into_iter().map(|(_, _, c)| c).collect(),
        before: Some(before),
    })
}

/// Route commands alone, the common case (the etcd agent's moves, joins and leaves): the
/// configuration changes in place and a refused line takes back the lines before it, and the
/// engine applies the typed changes to the destinations they touch. Route changes cannot fail
/// in the engine.
fn apply_routes_in(st: &mut State, cmds: &[(usize, Command)]) -> Result<Applied, (usize, String)> {
    let mut done: Vec<RouteChange> = Vec::new();
    let mut gen = MacAddr::random;
    for (i, (line, cmd)) in cmds.iter().enumerate() {
        match st.cfg.apply(cmd, &mut gen) {
            Ok(ch) => done.extend(ch.into_iter().filter_map(|c| match c {
                Change::Route(rc) => Some(rc),
                _ => None,
            })),
            Err(e) => {
                st.cfg.undo_routes(&done);
                return Err((i, at(*line, e.to_string())));
            }
        }
    }
    let changes: Vec<Change> = done.into_iter().map(Change::Route).collect();
    for c in &changes {
        if let Err(e) = st.engine.apply(c) {
            tracing::error!("a route change failed in the engine: {e}");
        }
    }
    st.engine.publish();
    Ok(Applied {
        changes,
        before: None,
    })
}

/// `Daemon::apply_commands` on the owner: applied, then journaled (undone when the record
/// cannot be written); the record's sync is left to the caller.
pub fn apply_commands_in(
    o: &mut Owner,
    cmds: Vec<(usize, Command)>,
) -> Result<Option<Saving>, String> {
    // Deletes of routes that wait for their link: not the model's (it does not hold them).
    let (cmds, unwaited) = o.st.pending.deletes(cmds, &o.st.cfg);
    let pending_before = (!unwaited.is_empty()).then(|| o.st.pending.clone());
    let routes_only = routes_only(cmds.iter().map(|(_, c)| c));
    let applied = if cmds.is_empty() {
        Applied::default()
    } else {
        o.apply_undoable(&cmds)?
    };
    let mut extra = String::new();
    for r in &unwaited {
        o.st.pending.forget(r);
        extra.push_str(&format!("route del {}\n", crate::pending::spec_of(r)));
    }
    let saving = match o.journal(&applied.changes, &extra, !routes_only) {
        Ok(s) => s,
        Err(e) => {
            // Not on disk: taken back, so that what runs is what a restart restores.
            o.undo(applied);
            if let Some(p) = pending_before {
                o.st.pending = p;
            }
            return Err(format!(
                "not applied: the state directory cannot be written ({e}); nothing changed"
            ));
        }
    };
    if applied
        .changes
        .iter()
        .any(|c| matches!(c, Change::AddLink(_)))
    {
        o.bring_back();
    }
    o.common.local_changes.fetch_add(1, Relaxed);
    Ok(saving)
}

/// `Daemon::apply_derivation` on the owner.
pub fn derivation_in(
    o: &mut Owner,
    derived: &vnet_cluster::DerivedConfig,
    delta: Option<&[Command]>,
) -> SyncReport {
    let mut report = SyncReport::default();
    let local_now = o.common.local_changes.load(Relaxed);
    let cmds: Vec<Command> = match delta {
        Some(d) if o.st.derived_in_step == Some(local_now) => d.to_vec(),
        _ => {
            let State {
                cfg, derived: rec, ..
            } = &mut o.st;
            rec.retain_present(cfg);
            vnet_cluster::diff(rec.config(), derived)
        }
    };
    if cmds.is_empty() {
        o.st.derived_in_step = Some(local_now);
        return report;
    }
    let text = |c: &Command| vnet_cluster::render_command(c).unwrap_or_else(|| format!("{c:?}"));
    let mut rest: &[Command] = &cmds;
    let mut links_came = false;
    let mut local_went = 0;
    while !rest.is_empty() {
        let numbered: Vec<(usize, Command)> = rest.iter().cloned().map(|c| (0, c)).collect();
        let (ok, failed) = match o.apply_in_at(&numbered) {
            Ok(a) => {
                local_went += o.took_local_routes(&a.changes);
                links_came |= a.changes.iter().any(|c| matches!(c, Change::AddLink(_)));
                (rest, None)
            }
            Err((i, e)) => {
                // Everything before the refused command, as one script.
                let before: Vec<(usize, Command)> = numbered[..i].to_vec();
                match o.apply_in_at(&before) {
                    Ok(a) => {
                        local_went += o.took_local_routes(&a.changes);
                        links_came |= a.changes.iter().any(|c| matches!(c, Change::AddLink(_)));
                        (&rest[..i], Some((i, e)))
                    }
                    Err((j, e2)) => {
                        // Not expected (they went before it); report the first, go on after.
                        report.failed.push(format!("{}: {e2}", text(&rest[j])));
                        (&rest[..0], Some((j, e)))
                    }
                }
            }
        };
        for c in ok {
            if let Err(e) = o.st.derived.apply(c) {
                tracing::warn!("derived record out of step at {}: {e}", text(c));
            }
            report.applied.push(text(c));
        }
        match failed {
            None => rest = &[],
            Some((i, e)) => {
                if !report.failed.iter().any(|f| f.starts_with(&text(&rest[i]))) {
                    report.failed.push(format!("{}: {e}", text(&rest[i])));
                }
                rest = &rest[i + 1..];
            }
        }
    }
    // Routes that waited for a link the agent brought are in effect again, and local
    // routes whose derived link went wait for it: the local configuration changed (the
    // agent derives from it, so it looks again).
    let came_back = if links_came { o.bring_back() } else { 0 };
    if local_went + came_back > 0 {
        o.common.local_changes.fetch_add(1, Relaxed);
    }
    // A refused command is not in the record: the next sync compares the whole sets.
    o.st.derived_in_step = report.failed.is_empty().then_some(local_now);
    report
}

/// What a restore leaves to save: its notes, the whole configuration, the derived one.
type Restored = (Vec<String>, Option<Whole>, Option<(u64, String)>);

/// `Daemon::restore` on the owner.
pub fn restore_in(
    o: &mut Owner,
    whole: &[(usize, Command)],
    file: &str,
    rest: &str,
    derived: &str,
    pending: Pending,
) -> Result<Restored, String> {
    let mut notes = Vec::new();
    if o.apply_in(whole).is_err() {
        let file = parse_config(file).map_err(|e| e.to_string())?;
        o.apply_in(&file).map_err(|e| format!("config file: {e}"))?;
        for line in rest.lines() {
            let Ok(Some(cmd)) = parse_line(line) else {
                continue;
            };
            if let Err(e) = o.apply_in(&[(0, cmd)]) {
                notes.push(format!("not restored: {line}: {e}"));
            }
        }
    }
    for line in derived.lines() {
        let Ok(Some(cmd)) = parse_line(line) else {
            continue;
        };
        match o.apply_in(&[(0, cmd.clone())]) {
            Ok(_) => {
                if let Err(e) = o.st.derived.apply(&cmd) {
                    tracing::warn!("derived record out of step at {line}: {e}");
                }
            }
            Err(e) => notes.push(format!("derived link or route not restored: {line}: {e}")),
        }
    }
    o.st.pending = pending;
    o.bring_back();
    if !o.st.pending.is_empty() {
        notes.push(format!(
            "{} route(s) wait for their link (saved, shown in show config; in effect once the etcd agent derives it)",
            o.st.pending.len()
        ));
    }
    Ok((notes, o.whole(), o.derived_snapshot()))
}
