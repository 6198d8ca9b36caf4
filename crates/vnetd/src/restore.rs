//! The configuration a starting vnetd realizes (pure; `state.rs` reads the files): the saved
//! local configuration when there is one (the config file plus every runtime change of the
//! runs before: `config.vnet` with the journal's records after it replayed), with an edited config file applied as the difference between the file as it
//! was last applied and as it is now, and the interfaces the CNI plugin deleted while no
//! vnetd ran taken out. On a first start (no saved state) the config file alone.
//!
//! The config file stays strict (a bad line refuses the start, as it always did); what was
//! saved is carried over line by line, and a line that no longer fits is left out and said,
//! but for a route to a link that is not there: it waits for its link (`pending.rs`; the
//! etcd agent derives links only after the start), saved and shown, not left out.

use vnet_control::{parse_line, parse_script, Change, Command, Config};
use vnet_wire::MacAddr;

use crate::journal::{Kind, Record};
use crate::pending::Pending;

/// The saved local configuration: `config.vnet`'s text and the journal's records after it
/// (`journal::replay`).
#[derive(Debug, Clone, Copy)]
pub struct Saved<'a> {
    pub text: &'a str,
    pub journal: &'a [Record],
}

#[cfg(test)]
impl<'a> Saved<'a> {
    /// A saved configuration with no journal after it.
    pub fn whole(text: &'a str) -> Saved<'a> {
        Saved { text, journal: &[] }
    }
}

/// The saved local configuration as a configuration: the file, then each record replayed on
/// it line by line (a snapshot record replaces what came before), as the daemon's journal
/// says its changes (`delta.rs`); with the routes that wait for their link.
pub fn saved_config(
    saved: &Saved<'_>,
    gen: &mut dyn FnMut() -> MacAddr,
    notes: &mut Vec<String>,
) -> (Config, Pending) {
    let mut pending = Pending::default();
    let mut cfg = lenient(saved.text, "saved configuration", &mut pending, gen, notes);
    for r in saved.journal {
        let what = format!("journal record {}", r.seq);
        match r.kind {
            Kind::Delta => apply_lenient(&mut cfg, &mut pending, &r.text, &what, gen, notes),
            Kind::Snapshot => {
                pending = Pending::default();
                cfg = lenient(&r.text, &what, &mut pending, gen, notes);
            }
        }
    }
    (cfg, pending)
}

/// What to realize at start.
#[derive(Debug, Default)]
pub struct Restored {
    /// The local configuration.
    pub local: Config,
    /// Routes of the local configuration waiting for their link (not in `local`).
    pub pending: Pending,
    /// The config file as applied now (to save), when `--config` was given.
    pub file_applied: Option<String>,
    /// The part of `local` the config file accounts for (it must come up whole; the rest,
    /// runtime changes of earlier runs, may come up line by line).
    pub file_part: Config,
    /// What was left out or changed, in words (the daemon logs them).
    pub notes: Vec<String>,
}

/// A configuration from saved text, line by line (a line that does not apply is noted, a
/// route whose link is not there waits in `pending`).
fn lenient(
    text: &str,
    what: &str,
    pending: &mut Pending,
    gen: &mut dyn FnMut() -> MacAddr,
    notes: &mut Vec<String>,
) -> Config {
    let mut cfg = Config::default();
    apply_lenient(&mut cfg, pending, text, what, gen, notes);
    cfg
}

fn apply_lenient(
    cfg: &mut Config,
    pending: &mut Pending,
    text: &str,
    what: &str,
    gen: &mut dyn FnMut() -> MacAddr,
    notes: &mut Vec<String>,
) {
    for (n, line) in text.lines().enumerate() {
        match parse_line(line) {
            Ok(None) => {}
            Ok(Some(cmd)) if cmd.is_query() => {}
            Ok(Some(cmd)) => match cfg.apply(&cmd, gen) {
                Ok(changes) => {
                    if changes.iter().any(|c| matches!(c, Change::AddLink(_))) {
                        bring_back(cfg, pending, gen);
                    }
                }
                Err(_) if pending.wait_if_linkless(&cmd, cfg) || pending.delete(&cmd, cfg) => {}
                Err(e) => notes.push(format!("{what} line {}: {line:?} left out: {e}", n + 1)),
            },
            Err(e) => notes.push(format!("{what} line {}: {line:?} left out: {e}", n + 1)),
        }
    }
}

/// The waiting routes whose link is there now go into `cfg` (one that `cfg` refuses waits on).
pub(crate) fn bring_back(
    cfg: &mut Config,
    pending: &mut Pending,
    gen: &mut dyn FnMut() -> MacAddr,
) {
    for cmd in pending.ready(cfg) {
        if cfg.apply(&cmd, gen).is_err() {
            pending.put_back(&cmd);
        }
    }
}

/// The config file as a configuration, strictly; an interface it names without a MAC keeps
/// the one it got when the file was last applied (`before`).
fn file_config(
    text: &str,
    before: &Config,
    gen: &mut dyn FnMut() -> MacAddr,
) -> Result<Config, String> {
    let cmds = parse_script(text).map_err(|e| e.to_string())?;
    let mut cfg = Config::default();
    for (line, mut cmd) in cmds {
        if cmd.is_query() {
            return Err(format!("line {line}: show cannot be part of a script"));
        }
        if let Command::InterfaceAdd(spec) = &mut cmd {
            if spec.mac.is_none() {
                spec.mac = before.interface(&spec.name).map(|i| i.mac);
            }
        }
        cfg.apply(&cmd, gen)
            .map_err(|e| format!("line {line}: {e}"))?;
    }
    Ok(cfg)
}

/// The `items` that `keep` keeps.
fn kept<T: Clone>(items: &[T], keep: impl Fn(&T) -> bool) -> Vec<T> {
    items.iter().filter(|x| keep(x)).cloned().collect()
}

/// What of the config file's configuration the local one still has (an object deleted at run
/// time is not the file's to bring up any more); settings are the local ones.
fn common(file: &Config, local: &Config) -> Config {
    let mut c = Config::default();
    c.learn = local.learn;
    c.settings = local.settings.clone();
    c.interfaces = kept(&file.interfaces, |i| local.interface(&i.name) == Some(i));
    c.links = kept(&file.links, |l| local.link(&l.name) == Some(l));
    for l in &c.links {
        if let Some(r) = local.link_rates.get(&l.name) {
            c.link_rates.insert(l.name.clone(), *r);
        }
    }
    c.listeners = kept(&file.listeners, |a| local.listeners.contains(a));
    c.routes = file
        .routes
        .iter()
        .filter(|r| local.routes.contains(r) && c.dest_vni(&r.to).is_some())
        .cloned()
        .collect();
    c
}

/// Plans the start: `saved_local` / `saved_file` from the state directory, `file` the config
/// file's text now, `cni_deleted` the CNI deletion queue. An error is a bad config file.
pub fn plan(
    saved_local: Option<Saved<'_>>,
    saved_file: Option<&str>,
    file: Option<&str>,
    cni_deleted: &[String],
    gen: &mut dyn FnMut() -> MacAddr,
) -> Result<Restored, String> {
    let mut r = Restored::default();
    match (saved_local, file) {
        (None, None) => {}
        (None, Some(text)) => {
            r.local = file_config(text, &Config::default(), gen)?;
            r.file_applied = Some(r.local.to_script());
            r.file_part = r.local.clone();
        }
        (Some(saved), None) => {
            (r.local, r.pending) = saved_config(&saved, gen, &mut r.notes);
            if let Some(t) = saved_file {
                let mut none = Pending::default();
                r.file_part = lenient(t, "saved config file", &mut none, gen, &mut r.notes);
            }
        }
        (Some(saved), Some(text)) => {
            (r.local, r.pending) = saved_config(&saved, gen, &mut r.notes);
            let mut none = Pending::default();
            let before = saved_file
                .map(|t| lenient(t, "saved config file", &mut none, gen, &mut r.notes))
                .unwrap_or_default();
            let now = file_config(text, &before, gen)?;
            let diff = before.diff_script(&now);
            if !diff.is_empty() {
                r.notes.push(format!(
                    "the config file changed since it was last applied: applying {} line(s) of difference",
                    diff.lines().count()
                ));
                apply_lenient(
                    &mut r.local,
                    &mut r.pending,
                    &diff,
                    "config file change",
                    gen,
                    &mut r.notes,
                );
            }
            r.file_applied = Some(now.to_script());
            r.file_part = now;
        }
    }
    for name in cni_deleted {
        let cmd = Command::InterfaceDel(name.clone());
        if r.local.apply(&cmd, gen).is_ok() {
            r.notes.push(format!(
                "interface {name} removed: the CNI plugin deleted it while vnetd was not running"
            ));
        }
    }
    r.file_part = common(&r.file_part, &r.local);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen() -> impl FnMut() -> MacAddr {
        gen_from(0)
    }

    /// Random MACs do not repeat across runs; a later run's generator starts elsewhere.
    fn gen_from(start: u8) -> impl FnMut() -> MacAddr {
        let mut n = start;
        move || {
            n = n.wrapping_add(1);
            MacAddr([2, 0, 0, 0, 0x77, n])
        }
    }

    fn names(c: &Config) -> Vec<&str> {
        c.interfaces.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn a_first_start_is_the_config_file() {
        let r = plan(None, None, Some("interface add a tap\n"), &[], &mut gen()).unwrap();
        assert_eq!(names(&r.local), ["a"]);
        let saved = r.file_applied.unwrap();
        assert!(
            saved.contains("interface add a tap") && saved.contains("mac 02:00:00:00:77:01"),
            "{saved}"
        );
        assert!(plan(None, None, Some("interface add\n"), &[], &mut gen()).is_err());
    }

    #[test]
    fn runtime_changes_survive_and_the_file_is_not_applied_twice() {
        // Run 1: the file gave `a`; at run time `c` (a CNI container) was added.
        let file = "interface add a tap\nroute add any 02:00:00:00:00:0a interface a\n";
        let r1 = plan(None, None, Some(file), &[], &mut gen()).unwrap();
        let mut local = r1.local.clone();
        let cmd = parse_line("interface add c veth mac 02:00:00:00:00:0c netns ctr")
            .unwrap()
            .unwrap();
        local.apply(&cmd, &mut gen()).unwrap();
        let saved = local.to_script();
        // Run 2, the file unchanged: the state as it was, a MAC never drawn again.
        let r2 = plan(
            Some(Saved::whole(&saved)),
            r1.file_applied.as_deref(),
            Some(file),
            &[],
            &mut || MacAddr([2, 9, 9, 9, 9, 9]),
        )
        .unwrap();
        assert_eq!(r2.local, local);
        assert!(r2.notes.is_empty(), "{:?}", r2.notes);
    }

    #[test]
    fn an_edited_file_is_applied_as_a_difference() {
        let file1 = "interface add a tap\ninterface add b tap\n";
        let r1 = plan(None, None, Some(file1), &[], &mut gen()).unwrap();
        let mut local = r1.local.clone();
        local
            .apply(
                &parse_line("interface add c tap mac 02:00:00:00:00:0c")
                    .unwrap()
                    .unwrap(),
                &mut gen(),
            )
            .unwrap();
        let a_mac = local.interface("a").unwrap().mac;
        // The operator removes b and adds d; c was a runtime change and stays; a keeps its MAC.
        let file2 = "interface add a tap\ninterface add d tap mtu 9000\n";
        let r2 = plan(
            Some(Saved::whole(&local.to_script())),
            r1.file_applied.as_deref(),
            Some(file2),
            &[],
            &mut gen_from(0x50),
        )
        .unwrap();
        let mut n = names(&r2.local);
        n.sort();
        assert_eq!(n, ["a", "c", "d"]);
        assert_eq!(r2.local.interface("a").unwrap().mac, a_mac);
        assert_eq!(r2.local.interface("d").unwrap().mtu, 9000);
        // The file's part: a and d, not the runtime c.
        let mut f = names(&r2.file_part);
        f.sort();
        assert_eq!(f, ["a", "d"]);
        // A bad edit refuses the start.
        assert!(plan(
            Some(Saved::whole(&local.to_script())),
            r1.file_applied.as_deref(),
            Some("route add\n"),
            &[],
            &mut gen()
        )
        .is_err());
    }

    #[test]
    fn what_no_longer_fits_is_left_out_and_said() {
        let saved = "interface add a tap mac 02:00:00:00:00:01\nno such command\n";
        let r = plan(Some(Saved::whole(saved)), None, None, &[], &mut gen()).unwrap();
        assert_eq!(names(&r.local), ["a"]);
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    }

    /// Issue 32: a saved route to a link the agent derives (not there at a start) was left
    /// out, and the start's rewritten file lost it. It waits for its link instead; a later
    /// delete of it takes it out, a local link of its name brings it back.
    #[test]
    fn a_route_whose_link_is_not_there_waits_instead_of_being_left_out() {
        let saved = "link add l0 udp 10.0.0.2\nroute add any 02:00:00:00:00:01 link d0\nroute add any 02:00:00:00:00:02 link l0\n";
        let r = plan(Some(Saved::whole(saved)), None, None, &[], &mut gen()).unwrap();
        assert_eq!(r.local.routes.len(), 1);
        assert_eq!(
            r.pending.script(),
            "route add any 02:00:00:00:00:01 link d0\n"
        );
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        let record = |text: &str| Record {
            seq: 1,
            kind: Kind::Delta,
            text: text.into(),
        };
        let del = [record("route del any 02:00:00:00:00:01 link d0\n")];
        let r = plan(
            Some(Saved {
                text: saved,
                journal: &del,
            }),
            None,
            None,
            &[],
            &mut gen(),
        )
        .unwrap();
        assert!(r.pending.is_empty() && r.notes.is_empty(), "{r:?}");
        let link = [record("link add d0 udp 10.0.0.3\n")];
        let r = plan(
            Some(Saved {
                text: saved,
                journal: &link,
            }),
            None,
            None,
            &[],
            &mut gen(),
        )
        .unwrap();
        assert!(r.pending.is_empty(), "{r:?}");
        assert_eq!(r.local.routes.len(), 2);
    }

    #[test]
    fn the_cni_deletion_queue_is_honoured() {
        let saved = "interface add cni-x veth mac 02:00:00:00:00:01\nroute add any 02:00:00:00:00:01 interface cni-x\ninterface add b tap mac 02:00:00:00:00:02\n";
        let r = plan(
            Some(Saved::whole(saved)),
            None,
            None,
            &["cni-x".into(), "cni-gone".into()],
            &mut gen(),
        )
        .unwrap();
        assert_eq!(names(&r.local), ["b"]);
        assert!(r.local.routes.is_empty());
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    }
}
