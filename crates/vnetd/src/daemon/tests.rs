//! Tests of `daemon.rs`, in a file of their own so that the module reads as what it does.

use super::*;
use crate::journal::Kind;
use vnet_cluster::{ClusterState, HostId};

fn daemon() -> Daemon {
    let engine = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    Daemon::new(engine, None)
}

fn state_with_route(line: &str) -> ClusterState {
    let overlay: vnet_cluster::OverlayName = "t".parse().unwrap();
    let mut s = ClusterState::new(overlay.clone());
    s.apply_put(
        &vnet_cluster::key_for_policy(&overlay),
        br#"{"template":"explicit"}"#,
    )
    .unwrap();
    let id: vnet_cluster::RouteId = "r1".parse().unwrap();
    let rec = vnet_cluster::RouteRecord {
        line: line.into(),
        host_id: None,
    };
    s.apply_put(
        &vnet_cluster::key_for_route(&overlay, &id),
        &vnet_cluster::encode(&rec),
    )
    .unwrap();
    s
}

#[test]
fn derived_objects_stay_out_of_the_local_config() {
    let d = daemon();
    d.execute_script("link add up udp 10.0.0.2\n").unwrap();
    let local_changes = d.local_changes();
    let host: HostId = "a".parse().unwrap();
    let state = state_with_route("route add any 52:54:00:00:00:09 link up");

    let r = d.sync_cluster(&host, &state);
    assert_eq!(r.applied, ["route add any 52:54:00:00:00:09 link up"]);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    // Running: the route is there. Local: it is not. The agent's change is not local.
    assert!(d
        .execute_line("show routes")
        .unwrap()
        .contains("52:54:00:00:00:09"));
    let cfg = d.execute_line("show config").unwrap();
    assert!(
        cfg.contains("link add up") && !cfg.contains("52:54:00:00:00:09"),
        "{cfg}"
    );
    assert!(d
        .execute_line("show cluster")
        .unwrap()
        .contains("52:54:00:00:00:09"));
    assert_eq!(d.local_changes(), local_changes);
    // What the state directory gets: the local script, rendered without a copy.
    let (script, local) = d
        .with_state(|st| (st.local_script(), st.local_config()))
        .unwrap();
    assert_eq!(script, local.to_script());
    assert!(!script.contains("52:54:00:00:00:09"));
    assert_eq!(
        d.local_config(),
        local,
        "the view's local configuration is the state's"
    );

    // The same state again: nothing to do (no flapping).
    assert!(d.sync_cluster(&host, &state).applied.is_empty());

    // The operator route goes: so does the derived route, and only it.
    let empty = state_with_route("route add any 52:54:00:00:00:0a link nowhere");
    let r = d.sync_cluster(&host, &empty);
    assert!(r
        .applied
        .iter()
        .any(|c| c == "route del any 52:54:00:00:00:09 link up"));
    assert!(!d
        .execute_line("show routes")
        .unwrap()
        .contains("52:54:00:00:00:09"));
    assert!(d
        .execute_line("show config")
        .unwrap()
        .contains("link add up"));
    // A local change is counted, for the agent to re-derive.
    d.execute_line("link del up").unwrap();
    assert!(d.local_changes() > local_changes);
    d.shutdown(Leave::Remove);
}

fn route(line: &str) -> Command {
    parse_line(line).unwrap().unwrap()
}

fn generation(d: &Daemon) -> u64 {
    d.with_state(|st| st.engine.snapshot_generation()).unwrap()
}

/// Puts the daemon's record of the agent's objects in step with its local configuration.
fn in_step(d: &Daemon) {
    let local = d.local_changes();
    d.with_state(move |st| st.derived_in_step = Some(local))
        .unwrap();
}

#[test]
fn the_agents_delta_is_applied_while_the_record_is_in_step() {
    let d = daemon();
    d.execute_script("link add up udp 10.0.0.2\n").unwrap();
    let host: HostId = "a".parse().unwrap();
    let state = state_with_route("route add any 52:54:00:00:00:09 link up");
    let first = vnet_cluster::derive(&host, &state, &d.local_config());
    assert!(d.apply_derivation(&first, None).failed.is_empty());
    // In step: the delta is what is applied (the derivation is not compared again).
    let delta = [route("route add any 52:54:00:00:00:0a link up")];
    let r = d.apply_derivation(&first, Some(&delta));
    assert_eq!(r.applied, ["route add any 52:54:00:00:00:0a link up"]);
    assert!(d
        .execute_line("show routes")
        .unwrap()
        .contains("52:54:00:00:00:0a"));
    // A refused command takes the record out of step: the next sync compares the whole
    // sets (and so takes back what the derivation does not have), ignoring the delta.
    let bad = [route("route add any 52:54:00:00:00:0b link nowhere")];
    assert_eq!(d.apply_derivation(&first, Some(&bad)).failed.len(), 1);
    let ignored = [route("route add any 52:54:00:00:00:0c link up")];
    let r = d.apply_derivation(&first, Some(&ignored));
    assert_eq!(r.applied, ["route del any 52:54:00:00:00:0a link up"]);
    assert!(!d
        .execute_line("show routes")
        .unwrap()
        .contains("52:54:00:00:00:0c"));
    d.shutdown(Leave::Remove);
}

#[test]
fn a_refused_command_does_not_make_the_batch_go_line_by_line() {
    let d = daemon();
    d.execute_script("link add up udp 10.0.0.2\n").unwrap();
    let host: HostId = "a".parse().unwrap();
    let state = state_with_route("route add any 52:54:00:00:00:09 link up");
    let first = vnet_cluster::derive(&host, &state, &d.local_config());
    d.apply_derivation(&first, None);
    let mut delta: Vec<Command> = (0..40)
        .map(|i| route(&format!("route add any 52:54:00:00:01:{i:02x} link up")))
        .collect();
    delta.insert(20, route("route add any 52:54:00:00:02:00 link nowhere"));
    let before = generation(&d);
    let r = d.apply_derivation(&first, Some(&delta));
    assert_eq!((r.applied.len(), r.failed.len()), (40, 1), "{:?}", r.failed);
    assert!(r.failed[0].contains("52:54:00:00:02:00"), "{:?}", r.failed);
    // The 20 before it in one publication, the 20 after it in another.
    let publications = generation(&d) - before;
    assert!(
        publications <= 3,
        "{publications} publications for one refused line"
    );
    d.shutdown(Leave::Remove);
}

#[test]
fn the_derived_configuration_is_rendered_by_the_writer() {
    let (d, dir) = daemon_with_state("derived");
    d.execute_script("link add up udp 10.0.0.2\n").unwrap();
    let host: HostId = "a".parse().unwrap();
    let state = state_with_route("route add any 52:54:00:00:00:09 link up");
    let r = d.sync_cluster(&host, &state);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    d.saver().unwrap().flush();
    let text = std::fs::read_to_string(dir.join(crate::state::DERIVED)).expect("derived.vnet");
    assert!(
        text.contains("route add any 52:54:00:00:00:09 link up"),
        "{text}"
    );
    d.shutdown(Leave::Remove);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CPU of one agent route event (a guest moving: the delta `route del`, `route add`)
/// through `apply_derivation`, against the overlay's size. A measurement, not a check:
/// `cargo test --release -p vnetd -- --ignored --nocapture derived_route_event_cost`
/// (docs/results/2026-11-25-issue19-incr).
#[test]
#[ignore]
fn derived_route_event_cost() {
    let mac = |h: usize, g: usize| format!("52:54:{:02x}:{:02x}:00:{g:02x}", h >> 8, h & 0xff);
    let host: HostId = "a".parse().unwrap();
    let first = vnet_cluster::derive(
        &host,
        &state_with_route("route add any any link x"),
        &Config::default(),
    );
    for hosts in [1usize, 100, 1000] {
        let d = daemon();
        let mut cmds = Vec::new();
        for h in 0..hosts {
            cmds.push(route(&format!(
                "link add h{h} udp 10.77.{}.{}",
                (h + 1) >> 8,
                (h + 1) & 0xff
            )));
            for g in 0..8 {
                cmds.push(route(&format!("route add any {} link h{h}", mac(h, g))));
            }
        }
        in_step(&d);
        let r = d.apply_derivation(&first, Some(&cmds));
        assert!(r.failed.is_empty(), "{:?}", &r.failed[..1]);
        in_step(&d);
        let events = 2000;
        // This thread's CPU time in ns (schedstat's first field).
        let cpu = || {
            let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
            s.split_whitespace()
                .next()
                .and_then(|x| x.parse::<f64>().ok())
                .unwrap_or(0.0)
                * 1e-9
        };
        let t0 = cpu();
        for e in 0..events {
            let (h, g) = (e % hosts, (e / hosts) % 8);
            let (from, to) = (
                (h + e / (hosts * 8)) % hosts,
                (h + 1 + e / (hosts * 8)) % hosts,
            );
            let delta = [
                route(&format!("route del any {} link h{from}", mac(h, g))),
                route(&format!("route add any {} link h{to}", mac(h, g))),
            ];
            let r = d.apply_derivation(&first, Some(&delta));
            assert!(r.failed.is_empty(), "{:?}", r.failed);
        }
        let us = (cpu() - t0) * 1e6 / events as f64;
        println!(
            "derived route event, {hosts} hosts ({} routes): {us:.1} us CPU per event",
            hosts * 8
        );
        d.shutdown(Leave::Remove);
    }
}

/// The run time of the process's threads in seconds (schedstat, ns; the owner's work is on
/// a thread of its own).
fn process_cpu() -> f64 {
    let mut total = 0.0;
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        total += s
            .split_whitespace()
            .next()
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    total * 1e-9
}

/// The CPU of one `route replace` and of one `link set X rate` over the control language at
/// 1,000 hosts' worth of links and routes (8,000), the whole process. A measurement, not a
/// check: `cargo test --release -p vnetd -- --ignored --nocapture control_change_cost`.
#[test]
#[ignore]
fn control_change_cost() {
    let mac = |h: usize, g: usize| format!("52:54:{:02x}:{:02x}:00:{g:02x}", h >> 8, h & 0xff);
    let hosts = 1000;
    let d = daemon();
    let mut script = String::new();
    for h in 0..hosts {
        script.push_str(&format!(
            "link add h{h} udp 10.77.{}.{}\n",
            (h + 1) >> 8,
            (h + 1) & 0xff
        ));
        for g in 0..8 {
            script.push_str(&format!("route add any {} link h{h}\n", mac(h, g)));
        }
    }
    d.execute_script(&script).unwrap();
    let events = if std::env::var("ONLY_LINKS").is_ok() {
        0
    } else {
        2000
    };
    let t0 = process_cpu();
    for e in 0..events {
        let (h, g) = (e % hosts, (e / hosts) % 8);
        let to = (h + 1 + e / (hosts * 8)) % hosts;
        d.execute_line(&format!("route replace any {} link h{to}", mac(h, g)))
            .unwrap();
    }
    let route_us = (process_cpu() - t0) * 1e6 / events as f64;
    let t0 = process_cpu();
    for e in 0..2000 {
        d.execute_line(&format!("link set h{} rate {}", e % hosts, 10 + e))
            .unwrap();
    }
    let rate_us = (process_cpu() - t0) * 1e6 / 2000.0;
    println!(
        "{hosts} hosts: route replace {route_us:.1} us, link set rate {rate_us:.1} us CPU each"
    );
    d.shutdown(Leave::Remove);
}

#[test]
fn show_cluster_without_an_agent() {
    let d = daemon();
    assert!(d
        .execute_line("show cluster")
        .unwrap()
        .contains("without --etcd"));
    let j: serde_json::Value =
        serde_json::from_str(&d.execute_line("show cluster json").unwrap()).unwrap();
    assert!(j["agent"].is_null());
    d.shutdown(Leave::Remove);
}

/// `show` and what `/metrics` renders (`stats`, `links`, `interfaces`, `matrix_report`) answer
/// while a change is inside the engine (netlink, BPF writes: seconds at worst), with the state
/// as it was before the change; the change shows once it is done.
#[test]
fn show_and_the_metrics_do_not_wait_for_a_change_in_progress() {
    use std::sync::{mpsc, Arc};
    use std::time::Duration;
    let d = Arc::new(daemon());
    d.execute_script("link add up udp 10.0.0.2\n").unwrap();
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    d.with_state(move |st| {
        st.before_engine = Some(Box::new(move || {
            let _ = entered_tx.send(());
            let _ = release_rx.lock().unwrap().recv();
        }))
    })
    .unwrap();
    let writer = {
        let d = d.clone();
        std::thread::spawn(move || d.execute_script("link add slow udp 10.0.0.3\n"))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the change reached the engine");
    let (tx, rx) = mpsc::channel();
    let reader = {
        let d = d.clone();
        std::thread::spawn(move || {
            let shown: Vec<String> = ["show links", "show stats", "show routes", "show config"]
                .iter()
                .map(|l| d.execute_line(l).unwrap())
                .collect();
            let links = d.links().len();
            let _ = (d.stats(), d.interfaces(), d.matrix_report());
            // What the etcd agent reads, and the rest of the readers' answers.
            let local = d.local_config();
            let _ = (d.cluster_report(), d.interface_table(), d.routes(None));
            let _ = tx.send((shown, links, local));
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(5));
    release_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();
    reader.join().unwrap();
    let (shown, links, local) = answered.expect("show waited for the change in progress");
    assert_eq!(local.links.len(), 1);
    // The state before the change: the link being added is not there yet.
    assert!(
        shown[0].contains("up") && !shown[0].contains("slow"),
        "{}",
        shown[0]
    );
    assert!(!shown[3].contains("slow"), "{}", shown[3]);
    assert_eq!(links, 1);
    // Once the change is done, it shows (no stale answer after it).
    assert!(d.execute_line("show links").unwrap().contains("slow"));
    assert_eq!(d.links().len(), 2);
}

/// A link's rate, learning off and on, a dispatcher setting: only what bears on forwarding
/// decisions publishes a forwarding table (each one makes every thread's route cache look at
/// what changed); a rate and a setting do not, learning does.
#[test]
fn a_rate_or_a_setting_publishes_no_forwarding_table() {
    let d = daemon();
    d.execute_script("link add b udp 10.0.0.2\nroute add any 02:00:00:00:00:01 link b\n")
        .unwrap();
    let gen = generation(&d);
    d.execute_line("link set b rate 10").unwrap();
    d.execute_line("set adaptive-window-ms 7").unwrap();
    assert_eq!(generation(&d), gen, "no table for a rate or a setting");
    assert!(d.execute_line("show links").unwrap().contains("10"));
    d.execute_line("set learn on").unwrap();
    assert_eq!(generation(&d), gen + 1, "learning bears on every decision");
    d.shutdown(Leave::Remove);
}

/// Changes that wait while the owner is busy run one after the other and publish one view;
/// each is answered after it, and each is in it.
#[test]
fn waiting_changes_publish_one_view() {
    let d = Arc::new(daemon_with_links_a_and_b(""));
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let d = d.clone();
        std::thread::spawn(move || {
            d.with_state(move |_| {
                held_tx.send(()).unwrap();
                hold_rx.recv().unwrap();
            })
            .unwrap();
        })
    };
    held_rx.recv().unwrap();
    let before = d.common.views_published.load(Relaxed);
    let senders: Vec<_> = (1..=3)
        .map(|i| {
            let d = d.clone();
            std::thread::spawn(move || {
                d.execute_line(&format!("route add any 02:00:00:00:00:0{i} link a"))
                    .unwrap();
                d.execute_line("show routes").unwrap()
            })
        })
        .collect();
    // The three are in the owner's inbox (or on their way) while it is held.
    std::thread::sleep(std::time::Duration::from_millis(200));
    hold_tx.send(()).unwrap();
    holder.join().unwrap();
    for (i, s) in senders.into_iter().enumerate() {
        let shown = s.join().unwrap();
        assert!(
            shown.contains(&format!("02:00:00:00:00:0{}", i + 1)),
            "{shown}"
        );
    }
    let published = d.common.views_published.load(Relaxed) - before;
    assert_eq!(
        published, 1,
        "the held request and the three waiting behind it: one view"
    );
    d.shutdown(Leave::Remove);
}

/// `show links`' text is what the table renders; a route's change keeps it (the same text,
/// not rendered again), a change of the links or their rates makes it anew.
#[test]
fn show_links_text_is_kept_until_the_links_change() {
    let d = daemon_with_links_a_and_b("route add any 02:00:00:00:00:01 link a\n");
    let table = |d: &Daemon| LinkTable(d.links()).to_string();
    let first = d.view().links_text(&d.links_text);
    assert_eq!(*first, table(&d));
    assert_eq!(d.execute_line("show links").unwrap(), table(&d));
    d.execute_line("route replace any 02:00:00:00:00:01 link b")
        .unwrap();
    let kept = d.view().links_text(&d.links_text);
    assert!(
        Arc::ptr_eq(&first, &kept),
        "a route's change keeps the text"
    );
    d.execute_line("link set b rate 10").unwrap();
    let shown = d.execute_line("show links").unwrap();
    assert_eq!(shown, table(&d));
    assert!(shown.contains("rate 10"), "{shown}");
    d.execute_script("link add c udp 10.0.0.4\n").unwrap();
    let shown = d.execute_line("show links").unwrap();
    assert_eq!(shown, table(&d));
    assert!(shown.lines().any(|l| l.starts_with("c ")), "{shown}");
    d.shutdown(Leave::Remove);
}

/// A daemon with a state directory in a fresh temporary directory (its writer's sources set
/// as `main` sets them), started from nothing.
fn daemon_with_state(tag: &str) -> (std::sync::Arc<Daemon>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "vnetd-{tag}-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    let sd = crate::state::StateDir::open(&dir).expect("state dir");
    let d = started(sd, 0, &crate::restore::Restored::default(), None);
    (d, dir)
}

/// A daemon on state directory `sd` (`highest`: the journal's), its writer's sources set as
/// `main` sets them, restored from `plan` (and `derived`, the derived configuration's text).
fn started(
    sd: crate::state::StateDir,
    highest: u64,
    plan: &crate::restore::Restored,
    derived: Option<&str>,
) -> std::sync::Arc<Daemon> {
    let saver = Saver::new(sd, Default::default(), highest).expect("saver");
    let engine = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    let d = std::sync::Arc::new(Daemon::new(engine, Some(saver)));
    let saver = d.saver().unwrap();
    let weak = std::sync::Arc::downgrade(&d);
    saver.set_derived_source(Box::new(move || weak.upgrade()?.render_derived()));
    let weak = std::sync::Arc::downgrade(&d);
    saver.set_local_source(Box::new(move || weak.upgrade()?.render_local()));
    d.restore(&plan.local, &plan.file_part, derived, plan.pending.clone())
        .expect("restore")
        .saved
        .expect("saved");
    d
}

/// Stops `d` as a SIGTERM does (its journal folded into the file) and starts a daemon on its
/// state directory as `main` does; `with_derived`: with the derived configuration (--etcd),
/// else the local one alone (as before the agent's first synchronisation).
fn restart(
    d: std::sync::Arc<Daemon>,
    dir: &std::path::Path,
    with_derived: bool,
) -> std::sync::Arc<Daemon> {
    d.shutdown(Leave::Keep);
    d.saver().unwrap().flush();
    drop(d);
    let sd = crate::state::StateDir::open(dir).expect("the daemon before is gone");
    let text = sd.read(crate::state::LOCAL).unwrap();
    let replay = crate::journal::replay(
        crate::journal::base(text.as_deref()),
        &mut sd.read_segments().unwrap(),
    );
    assert!(replay.warnings.is_empty(), "{:?}", replay.warnings);
    let saved = crate::restore::Saved {
        text: text.as_deref().unwrap_or_default(),
        journal: &replay.records,
    };
    let plan =
        crate::restore::plan(Some(saved), None, None, &[], &mut MacAddr::random).expect("plan");
    let derived = if with_derived {
        sd.read(crate::state::DERIVED).unwrap()
    } else {
        None
    };
    started(sd, replay.highest, &plan, derived.as_deref())
}

/// What a start would restore from the state directory as it is now (as `main` reads it).
fn restored(d: &Daemon) -> (Config, Vec<String>) {
    let sd = d.saver().unwrap().dir();
    let text = sd.read(crate::state::LOCAL).unwrap();
    let replay = crate::journal::replay(
        crate::journal::base(text.as_deref()),
        &mut sd.read_segments().unwrap(),
    );
    let saved = crate::restore::Saved {
        text: text.as_deref().unwrap_or_default(),
        journal: &replay.records,
    };
    let plan =
        crate::restore::plan(Some(saved), None, None, &[], &mut MacAddr::random).expect("plan");
    let mut notes = replay.notes;
    notes.extend(replay.warnings);
    notes.extend(plan.notes);
    (plan.local, notes)
}

/// `config.vnet` as it is on disk.
fn saved_file(d: &Daemon) -> String {
    let text = d.saver().unwrap().dir().read(crate::state::LOCAL);
    text.unwrap().expect("config.vnet")
}

fn segments(d: &Daemon) -> usize {
    d.saver().unwrap().dir().read_segments().unwrap().len()
}

/// Every acknowledged change is in the journal at once (a crash right after it loses
/// nothing), a torn record at the end is ignored, the journal is folded into the file once it
/// outgrows it, and a stop folds in the rest.
#[test]
fn acknowledged_changes_survive_a_crash_through_the_journal() {
    let (d, dir) = daemon_with_state("journal");
    d.execute_script("link add l0 udp 10.0.0.2\nlink add l1 udp 10.0.0.3 vni 1 rate 10\n")
        .unwrap();
    for g in 0..20 {
        d.execute_line(&format!("route add any 02:00:00:00:01:{g:02x} link l0"))
            .unwrap();
    }
    d.execute_line("route replace any 02:00:00:00:01:03 link l1")
        .unwrap();
    d.execute_line("route del any 02:00:00:00:01:04 link l0")
        .unwrap();
    d.execute_line("set learn on").unwrap();
    d.execute_line("set notify batch").unwrap(); // a setting: a snapshot record
    d.execute_line("link set l1 rate off").unwrap();
    // The file is as the start wrote it; the rest is in the journal.
    let file = saved_file(&d);
    assert!(!file.contains("02:00:00:00:01:00"), "{file}");
    assert!(segments(&d) >= 1);
    // A crash now: everything acknowledged comes back.
    let want = d.local_config();
    let (got, notes) = restored(&d);
    assert_eq!(got, want);
    assert!(notes.is_empty(), "{notes:?}");
    // A record torn by a crash at the end of the last segment is ignored, and said.
    let sd = d.saver().unwrap().dir();
    let mut segs = sd.read_segments().unwrap();
    segs.sort();
    let (first, _) = segs.last().unwrap();
    let path = dir.join(crate::journal::segment_name(*first));
    let torn = crate::journal::encode(u64::MAX, Kind::Delta, "route del any any link l0\n");
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(&torn[..torn.len() - 5]).unwrap();
    }
    let (got, notes) = restored(&d);
    assert_eq!(got, want);
    assert!(notes.iter().any(|n| n.contains("torn")), "{notes:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The journal is folded into the file in the background once it holds more than the file
/// (and 64 KiB), and what a start restores stays the same throughout.
#[test]
fn the_journal_is_compacted_in_the_background() {
    let (d, dir) = daemon_with_state("compact");
    d.execute_line("link add l0 udp 10.0.0.2").unwrap();
    d.execute_line("link add l1 udp 10.0.0.3").unwrap();
    // About 120 bytes a record: 2,000 changes are well past the 64 KiB floor.
    for e in 0..2000u32 {
        let to = if e % 2 == 0 { "l1" } else { "l0" };
        d.execute_line(&format!(
            "route replace any 02:00:00:00:{:02x}:{:02x} link {to}",
            (e / 7) % 256,
            e % 7
        ))
        .unwrap();
    }
    let want = d.local_config();
    // Compacted within a few seconds: the file's header moved on, the older segments gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = saved_file(&d);
        if crate::journal::file_sequence(&text).unwrap_or(0) > 1000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not compacted: {}",
            text.lines().next().unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(segments(&d) <= 2, "{} segments", segments(&d));
    let (got, notes) = restored(&d);
    assert_eq!(got, want);
    assert!(notes.is_empty(), "{notes:?}");
    // A stop folds in the rest: the file alone says everything.
    d.execute_line("route add any 02:00:00:00:ff:01 link l0")
        .unwrap();
    d.saver().unwrap().flush();
    assert_eq!(segments(&d), 0);
    let text = saved_file(&d);
    assert!(
        text.contains("route add any 02:00:00:00:ff:01 link l0"),
        "{text}"
    );
    assert_eq!(restored(&d).0, d.local_config());
    std::fs::remove_dir_all(&dir).ok();
}

/// A daemon with links `a` (VNI 7) and `b` (VNI 9), then `routes` (a script).
fn daemon_with_links_a_and_b(routes: &str) -> Daemon {
    let d = daemon();
    d.execute_script("link add a udp 10.0.0.2 vni 7\nlink add b udp 10.0.0.3 vni 9\n")
        .unwrap();
    d.execute_script(routes).unwrap();
    d
}

/// `show routes` with the VNIs looked up once says what the row of each route says alone.
#[test]
fn route_rows_give_each_route_its_destinations_vni() {
    let d = daemon_with_links_a_and_b(
        "route add any 02:00:00:00:00:01 link a\nroute add any 02:00:00:00:00:02 link b\n\
         route add not 02:00:00:00:00:01 any link b\n",
    );
    let want: Vec<String> = d
        .with_state(|st| {
            st.cfg
                .routes
                .iter()
                .map(|r| serde_json::to_string(&RouteStatus::new(r, &st.cfg)).unwrap())
                .collect()
        })
        .unwrap();
    let got: Vec<String> = d
        .routes(None)
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        d.routes(None).iter().map(|r| r.vni).collect::<Vec<_>>(),
        [7, 9, 9]
    );
}

/// `show routes to MAC` is `show routes` less the rows whose destination does not match MAC.
#[test]
fn routes_to_a_mac_are_the_matching_rows() {
    let d = daemon_with_links_a_and_b(
        "route add any 02:00:00:00:00:01 link a\nroute add any 02:00:00:00:00:02 link b\n\
         route add any not 02:00:00:00:00:01 link b\nroute add 02:00:00:00:00:03 any link a\n\
         route add any broadcast link a\nroute add any not broadcast link b\n",
    );
    let macs: Vec<MacAddr> = [
        "02:00:00:00:00:01",
        "02:00:00:00:00:02",
        "ff:ff:ff:ff:ff:ff",
        "02:00:00:00:00:09",
    ]
    .iter()
    .map(|m| m.parse().unwrap())
    .collect();
    let json = |rows: &[RouteStatus]| serde_json::to_string(rows).unwrap();
    let all = d.routes(None);
    let routes = d.with_state(|st| st.cfg.routes.to_vec()).unwrap();
    for &mac in &macs {
        let want: Vec<RouteStatus> = routes
            .iter()
            .zip(&all)
            .filter(|(r, _)| r.dst.matches(mac))
            .map(|(_, row)| row.clone())
            .collect();
        assert!(
            !want.is_empty() && want.len() < all.len(),
            "{mac}: a useful case"
        );
        assert_eq!(json(&d.routes(Some(mac))), json(&want), "{mac}");
    }
    let shown = d
        .execute_line("show routes to 02:00:00:00:00:02 json")
        .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&shown).unwrap();
    let dsts: Vec<&str> = rows.iter().map(|r| r["dst"].as_str().unwrap()).collect();
    assert_eq!(
        dsts,
        [
            "02:00:00:00:00:02",
            "not 02:00:00:00:00:01",
            "any",
            "not broadcast"
        ]
    );
}

/// The next journal record starts a new segment (the journal is cut as a compaction cuts
/// it); returns the name that segment will have.
fn next_segment(d: &Daemon) -> String {
    let (cut, _) = d.render_local().expect("rendered");
    crate::journal::segment_name(cut + 1)
}

fn routes_text(d: &Daemon) -> String {
    d.execute_line("show routes").unwrap()
}

/// Issue 32: a change whose journal record cannot be written was acknowledged all the same
/// (the failure only logged), and lost at the next crash. Now it is refused and taken back:
/// nothing changed, in the configuration or the data path, and `show stats` says the state
/// is not being saved; once the directory can be written again, changes are taken and saved.
/// The failure is real (a directory where the segment's file must go: the open fails with
/// EISDIR), not injected.
#[test]
fn a_change_that_cannot_be_written_is_refused_and_undone() {
    let (d, dir) = daemon_with_state("unwritable");
    d.execute_line("link add l0 udp 10.0.0.2").unwrap();
    d.execute_line("route add any 02:00:00:00:00:01 link l0")
        .unwrap();
    let want = d.local_config();
    let blocker = dir.join(next_segment(&d));
    std::fs::create_dir(&blocker).unwrap();
    // A route (changed in place) and a link (changed on a copy): both refused, both undone.
    let e = d
        .execute_line("route add any 02:00:00:00:00:02 link l0")
        .unwrap_err();
    assert!(
        e.starts_with("not applied") && e.contains("journal segment"),
        "{e}"
    );
    let e = d.execute_line("link add l1 udp 10.0.0.3").unwrap_err();
    assert!(e.starts_with("not applied"), "{e}");
    let e = d
        .execute_line("route del any 02:00:00:00:00:01 link l0")
        .unwrap_err();
    assert!(e.starts_with("not applied"), "{e}");
    assert_eq!(d.local_config(), want);
    assert!(!routes_text(&d).contains("02:00:00:00:00:02"));
    assert!(routes_text(&d).contains("02:00:00:00:00:01"));
    assert!(d.links().iter().all(|l| l.name != "l1"));
    let st = d.stats().state;
    assert!(st.failing && st.errors >= 3, "{st:?}");
    assert!(st.last_error.is_some_and(|e| e.contains("journal segment")));
    let shown = d.execute_line("show stats").unwrap();
    assert!(shown.contains("state: NOT BEING SAVED"), "{shown}");
    // Writable again: taken, saved, and what a crash now restores is what was acknowledged.
    std::fs::remove_dir(&blocker).unwrap();
    d.execute_line("route add any 02:00:00:00:00:03 link l0")
        .unwrap();
    assert!(!d.stats().state.failing);
    let (got, notes) = restored(&d);
    assert_eq!(got, d.local_config());
    assert!(!got.to_script().contains("02:00:00:00:00:02"));
    assert!(notes.iter().all(|n| !n.contains("missing")), "{notes:?}");
    d.shutdown(Leave::Remove);
    std::fs::remove_dir_all(&dir).ok();
}

/// A failed fsync of a journal segment. An injected fault (`Saver::inject`): a real one needs
/// a disk that fails under a file system (dm-error, dm-flakey), which this machine cannot make
/// for a unit test. After a failed fsync the kernel may have dropped the segment's pages, and
/// a later fsync of it succeeds without them: the segment is never trusted again. The change
/// is saved by a whole write of the configuration instead and acknowledged once that is on
/// disk; when the whole write fails too, the command fails saying the change is in effect and
/// not saved, `show stats` says so, and the writer saves it unasked once the disk works.
#[test]
fn a_failed_sync_is_saved_whole_or_said_never_acknowledged() {
    use crate::persist::Io;
    const EIO: i32 = 5;
    const ENOSPC: i32 = 28;
    let (d, dir) = daemon_with_state("fsync");
    d.execute_line("link add l0 udp 10.0.0.2").unwrap();
    let saver = d.saver().unwrap();
    saver.inject(Io::SegmentSync, Some(EIO));
    d.execute_line("route add any 02:00:00:00:00:01 link l0")
        .unwrap();
    // Acknowledged because the whole file has it.
    assert!(saved_file(&d).contains("route add any 02:00:00:00:00:01 link l0"));
    let st = d.stats().state;
    assert!(!st.failing && !st.unsaved && st.errors == 1, "{st:?}");
    assert!(st
        .last_error
        .is_some_and(|e| e.contains("Input/output error")));
    // Both fail: in effect, not saved, and said.
    saver.inject(Io::WholeWrite, Some(ENOSPC));
    let e = d
        .execute_line("route add any 02:00:00:00:00:02 link l0")
        .unwrap_err();
    assert!(
        e.starts_with("applied but NOT SAVED")
            && e.contains("Input/output error")
            && e.contains("No space left on device"),
        "{e}"
    );
    assert!(routes_text(&d).contains("02:00:00:00:00:02"));
    let st = d.stats().state;
    assert!(st.failing && st.unsaved, "{st:?}");
    assert!(d
        .execute_line("show stats")
        .unwrap()
        .contains("changes a restart would lose"));
    // The disk works again: saved within a few seconds, unasked.
    saver.inject(Io::SegmentSync, None);
    saver.inject(Io::WholeWrite, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while d.stats().state.unsaved {
        assert!(std::time::Instant::now() < deadline, "never saved");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(saved_file(&d).contains("route add any 02:00:00:00:00:02 link l0"));
    d.execute_line("route add any 02:00:00:00:00:03 link l0")
        .unwrap();
    let (got, notes) = restored(&d);
    assert_eq!(got, d.local_config());
    assert!(notes.is_empty(), "{notes:?}");
    d.shutdown(Leave::Remove);
    std::fs::remove_dir_all(&dir).ok();
}

/// What the agent derives: link `d0` (or nothing).
fn derivation(with_d0: bool) -> vnet_cluster::Derivation {
    let mut links = Vec::new();
    if with_d0 {
        let mut c = Config::default();
        c.apply(&route("link add d0 udp 10.1.0.1"), &mut MacAddr::random)
            .unwrap();
        links = c.links;
    }
    vnet_cluster::Derivation {
        config: vnet_cluster::DerivedConfig {
            links,
            routes: Vec::new(),
        },
        conflicts: Vec::new(),
    }
}

/// Issue 32: a route of the local configuration to a link the agent derived was "left out"
/// at the next start (the local configuration is restored before the derived links exist),
/// and the start's rewritten file lost it. Now it waits for its link: saved, counted and shown
/// as pending, in effect again once the link is; and the same when the link goes at run time.
#[test]
fn a_route_to_a_derived_link_waits_for_it_and_is_never_lost() {
    let (d, dir) = daemon_with_state("pending");
    assert!(d
        .apply_derivation(&derivation(true), None)
        .failed
        .is_empty());
    let line = "route add any 02:00:00:00:07:01 link d0";
    d.execute_line(line).unwrap();
    d.execute_line("link add l0 udp 10.0.0.2").unwrap();
    assert!(routes_text(&d).contains("02:00:00:00:07:01"));
    // A restart: the local configuration comes before the agent's first synchronisation.
    let d = restart(d, &dir, false);
    assert_eq!(d.stats().state.pending_routes, 1);
    assert!(!routes_text(&d).contains("02:00:00:00:07:01"));
    let shown = d.execute_line("show config").unwrap();
    assert!(shown.contains(&format!("# {line}")), "{shown}");
    assert!(d
        .execute_line("show stats")
        .unwrap()
        .contains("pending: 1 routes wait for their link"));
    assert!(saved_file(&d).contains(line), "{}", saved_file(&d));
    // The agent derives d0: in effect again.
    assert!(d
        .apply_derivation(&derivation(true), None)
        .failed
        .is_empty());
    assert!(routes_text(&d).contains("02:00:00:00:07:01"));
    assert_eq!(d.stats().state.pending_routes, 0);
    // d0 goes (its host left the overlay): the route waits again, still saved, across
    // another restart (this time with the derived configuration, whose d0 is gone too).
    d.apply_derivation(&derivation(false), None);
    assert_eq!(d.stats().state.pending_routes, 1);
    let d = restart(d, &dir, true);
    assert_eq!(d.stats().state.pending_routes, 1);
    assert!(saved_file(&d).contains(line));
    // A start that restores d0 from the derived configuration has the route at once.
    d.apply_derivation(&derivation(true), None);
    let d = restart(d, &dir, true);
    assert!(routes_text(&d).contains("02:00:00:00:07:01"));
    assert_eq!(d.stats().state.pending_routes, 0);
    // A waiting route can be deleted, and then it is gone for good.
    let d = restart(d, &dir, false);
    assert_eq!(d.stats().state.pending_routes, 1);
    d.execute_line("route del any 02:00:00:00:07:01 link d0")
        .unwrap();
    assert_eq!(d.stats().state.pending_routes, 0);
    let (got, _) = restored(&d);
    assert!(!got.to_script().contains("07:01"));
    let d = restart(d, &dir, true);
    assert_eq!(d.stats().state.pending_routes, 0);
    assert!(!saved_file(&d).contains("07:01"));
    d.shutdown(Leave::Remove);
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 32: the control port takes a configuration of 100,000 routes and 64 links (in
/// batches, each within a script's 100,000 lines), but the start read it back as one script,
/// refused it for its length, and so could not start at all. Now it reads back whole.
#[test]
fn a_configuration_built_in_many_batches_is_restored_whole() {
    let (d, dir) = daemon_with_state("large");
    let links: String = (0..64)
        .map(|l| format!("link add l{l} udp 10.0.{l}.1\n"))
        .collect();
    d.execute_script(&links).unwrap();
    for half in 0..2u32 {
        let batch: String = (0..50_000u32)
            .map(|r| {
                let n = half * 50_000 + r;
                format!(
                    "route add any 02:00:00:{:02x}:{:02x}:{:02x} link l{}\n",
                    n >> 16,
                    (n >> 8) & 255,
                    n & 255,
                    n % 64
                )
            })
            .collect();
        d.execute_script(&batch).unwrap();
    }
    let want = d.local_config();
    assert_eq!(want.routes.len(), 100_000);
    let d = restart(d, &dir, false);
    assert_eq!(d.local_config(), want);
    // And from the file alone (the start wrote it whole).
    let d = restart(d, &dir, false);
    assert_eq!(d.local_config(), want);
    d.shutdown(Leave::Remove);
    std::fs::remove_dir_all(&dir).ok();
}
