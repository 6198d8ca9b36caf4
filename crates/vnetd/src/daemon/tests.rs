//! Tests of `daemon.rs`, in a file of their own so that the module reads as what it does.

use super::*;
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
    let local_changes = d.local_changes.load(Relaxed);
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
    assert_eq!(d.local_changes.load(Relaxed), local_changes);
    // What the state directory gets: the local script, rendered without a copy.
    let st = d.lock();
    assert_eq!(st.local_script(), st.local_config().to_script());
    assert!(!st.local_script().contains("52:54:00:00:00:09"));
    drop(st);

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
    assert!(d.local_changes.load(Relaxed) > local_changes);
    d.shutdown(Leave::Remove);
}

fn route(line: &str) -> Command {
    parse_line(line).unwrap().unwrap()
}

fn generation(d: &Daemon) -> u64 {
    d.lock().engine.snapshot_generation()
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
        d.lock().derived_in_step = Some(d.local_changes.load(Relaxed));
        let r = d.apply_derivation(&first, Some(&cmds));
        assert!(r.failed.is_empty(), "{:?}", &r.failed[..1]);
        d.lock().derived_in_step = Some(d.local_changes.load(Relaxed));
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
    d.lock().before_engine = Some(Box::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.recv();
    }));
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
            let _ = tx.send((shown, links));
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(5));
    release_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();
    reader.join().unwrap();
    let (shown, links) = answered.expect("show waited for the change in progress");
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

/// A daemon with a state directory in a fresh temporary directory (its writer's sources set
/// as `main` sets them), started from nothing.
fn daemon_with_state(tag: &str) -> (std::sync::Arc<Daemon>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "vnetd-{tag}-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    let sd = crate::state::StateDir::open(&dir).expect("state dir");
    let saver = Saver::new(sd, Default::default(), 0).expect("saver");
    let engine = Engine::new("127.0.0.1:0".parse().unwrap()).expect("engine");
    let d = std::sync::Arc::new(Daemon::new(engine, Some(saver)));
    let saver = d.saver().unwrap();
    let weak = std::sync::Arc::downgrade(&d);
    saver.set_derived_source(Box::new(move || weak.upgrade()?.render_derived()));
    let weak = std::sync::Arc::downgrade(&d);
    saver.set_local_source(Box::new(move || weak.upgrade()?.render_local()));
    d.restore(&Config::default(), &Config::default(), None)
        .expect("restore");
    (d, dir)
}

/// What a start would restore from the state directory as it is now (as `main` reads it).
fn restored(d: &Daemon) -> (Config, Vec<String>) {
    let sd = d.saver().unwrap().dir();
    let text = sd.read(crate::state::LOCAL).unwrap();
    let replay = crate::journal::replay(
        text.as_deref().map_or(0, crate::journal::file_sequence),
        &mut sd.read_segments().unwrap(),
    );
    let saved = crate::restore::Saved {
        text: text.as_deref().unwrap_or_default(),
        journal: &replay.records,
    };
    let plan =
        crate::restore::plan(Some(saved), None, None, &[], &mut MacAddr::random).expect("plan");
    let mut notes = replay.notes;
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
        if crate::journal::file_sequence(&text) > 1000 {
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
    let st = d.lock();
    let want: Vec<String> = st
        .cfg
        .routes
        .iter()
        .map(|r| serde_json::to_string(&RouteStatus::new(r, &st.cfg)).unwrap())
        .collect();
    let got: Vec<String> = route_rows(&st)
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        route_rows(&st).iter().map(|r| r.vni).collect::<Vec<_>>(),
        [7, 9, 9]
    );
}

/// `show routes to MAC` is `show routes` less the rows whose destination does not match MAC,
/// whether answered from the state or from the view a change in progress published.
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
    let st = d.lock();
    let all = route_rows(&st);
    for &mac in &macs {
        let want: Vec<RouteStatus> = st
            .cfg
            .routes
            .iter()
            .zip(&all)
            .filter(|(r, _)| r.dst.matches(mac))
            .map(|(_, row)| row.clone())
            .collect();
        assert!(
            !want.is_empty() && want.len() < all.len(),
            "{mac}: a useful case"
        );
        assert_eq!(
            json(&route_rows_to(&st, mac)),
            json(&want),
            "{mac} from the state"
        );
        assert_eq!(json(&rows_to(&all, mac)), json(&want), "{mac} from a view");
    }
    drop(st);
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

/// The view's rows carry a destination as `MacMatch` renders it: reading it back must agree
/// with `MacMatch::matches` for every form (a new form or spelling would fail here, not drop
/// rows from `show routes to MAC` during a change).
#[test]
fn a_rendered_destination_matches_as_the_rule_does() {
    use vnet_core::MacMatch;
    let macs: Vec<MacAddr> = [
        "02:00:00:00:00:01",
        "02:00:00:00:00:02",
        "ff:ff:ff:ff:ff:ff",
    ]
    .iter()
    .map(|m| m.parse().unwrap())
    .collect();
    let mut forms = vec![MacMatch::Any];
    for &m in &macs {
        forms.extend([MacMatch::Exact(m), MacMatch::Not(m)]);
    }
    for rule in &forms {
        for &mac in &macs {
            assert_eq!(
                row_dst_matches(&rule.to_string(), mac),
                rule.matches(mac),
                "{rule} against {mac}"
            );
        }
    }
}
