//! The fast path's life on the machine: what it leaves attached when dropped, settings it
//! refuses, the forwarding sysctl it puts back, pinning and the takeover by a later process.

use crate::helpers::*;
use vnet_core::PortId;
use vnet_fastpath::*;

#[test]
fn dropping_the_fast_path_leaves_nothing_attached() {
    let Some(l) = lab() else { return };
    let (pa, pb, u0) = (l.pa, l.pb, l.underlay);
    assert_eq!((tcx_count(pa), tcx_count(pb), tcx_count(u0)), (1, 1, 1));
    drop(l);
    // The links go with their descriptors; the kernel may finish releasing them a moment after
    // the close returns.
    wait_until(|| (tcx_count(pa), tcx_count(pb), tcx_count(u0)) == (0, 0, 0));
    assert_eq!((tcx_count(pa), tcx_count(pb), tcx_count(u0)), (0, 0, 0));
    // and a new one attaches again
    let Some(l2) = lab_reuse() else { return };
    assert_eq!(tcx_count(l2.pa), 1);
}

/// A second FastPath on the devices of the current namespace.
fn lab_reuse() -> Option<Lab> {
    let mut fp = FastPath::open(&FastPathConfig::default()).ok()?;
    let pa = ifindex("pa");
    fp.attach_port(&port_spec(PORT_A, pa, ifindex("punta"), A, 1))
        .unwrap();
    Some(Lab {
        fp,
        pa,
        pb: 0,
        punt_a: 0,
        underlay: 0,
    })
}

#[test]
fn bad_settings_are_refused_in_words() {
    let Some(mut l) = lab() else { return };
    let e =
        l.fp.attach_port(&port_spec(PortId(9), l.pa, l.punt_a, A, 1));
    assert!(matches!(e, Err(Error::AlreadyAttached(_))), "{e:?}");
    let e =
        l.fp.attach_port(&port_spec(PortId(9), 999_999, 999_998, A, 1));
    assert!(matches!(e, Err(Error::Attach { .. })), "{e:?}");
    // the failed attach left no port behind
    assert!(matches!(
        l.fp.port_counters(PortId(9)),
        Err(Error::UnknownPort(_))
    ));
    assert!(FastPath::open(&FastPathConfig {
        max_table: 0,
        ..Default::default()
    })
    .is_err());
}

fn forwarding(dev: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dev}/forwarding"))
        .expect("forwarding sysctl")
        .trim()
        .to_string()
}

#[test]
fn a_ports_device_gets_its_forwarding_back() {
    let Some(mut l) = lab() else { return };
    // Off in a new namespace; on while the port is attached (bpf_fib_lookup needs it).
    assert_eq!(
        (forwarding("pa"), forwarding("pb")),
        ("1".into(), "1".into())
    );
    assert_eq!(forwarding("u0"), "0");
    let orig = l.fp.forwarding_originals();
    l.fp.detach_port(PORT_A).unwrap();
    assert_eq!(forwarding("pa"), "0", "restored on detach");
    let pa = l.pa;
    drop(l);
    assert_eq!(forwarding("pb"), "0", "restored when the fast path goes");
    // What was recorded, for a later process to restore.
    assert_eq!(orig.len(), 2);
    assert!(orig.iter().all(|o| !o.enabled), "{orig:?}");
    assert!(orig.iter().any(|o| o.ifname == "pa" && o.ifindex == pa));
    // A value known from an earlier run wins over the one found at attach.
    let mut fp = FastPath::open(&FastPathConfig::default()).unwrap();
    fp.set_forwarding_original(ForwardingOriginal {
        ifindex: pa,
        ifname: "pa".into(),
        enabled: true,
    });
    std::fs::write("/proc/sys/net/ipv4/conf/pb/forwarding", "0").unwrap();
    fp.attach_port(&port_spec(PORT_A, pa, ifindex("punta"), A, 1))
        .unwrap();
    assert_eq!(forwarding("pa"), "1");
    fp.restore_forwarding_all();
    assert_eq!(forwarding("pa"), "1", "the known original");
    assert!(fp.forwarding_originals().is_empty());
}

/// A pin directory of this test's own on the machine's bpffs, and a configuration pinning
/// there.
fn pinned_config(what: &str) -> (std::path::PathBuf, FastPathConfig) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::path::PathBuf::from(format!(
        "{}/vnet-test-{what}-{}-{nanos}",
        pin::BPFFS,
        std::process::id()
    ));
    let cfg = FastPathConfig {
        pin_dir: Some(dir.clone()),
        ..Default::default()
    };
    (dir, cfg)
}

/// Where the maps are pinned in pin directory `dir`: `maps-HASH`, HASH their layout's.
fn maps_dir(dir: &std::path::Path) -> std::path::PathBuf {
    let found: Vec<_> = std::fs::read_dir(dir)
        .expect("the pin directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("maps-"))
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

/// The ports and links of `lab_with` under other ids, attached by a FastPath that takes over;
/// `with_b`: port B and its route too.
fn take_over(fp: &mut FastPath, with_b: bool) -> ApplyReport {
    let ids = [PortId(11), PortId(12), PortId(13), PortId(14)];
    let held = attach_lab(fp, ids, with_b);
    assert_eq!(
        (held.written, held.deleted),
        (0, 0),
        "a table written while taking over"
    );
    fp.commit().expect("commit")
}

#[test]
fn a_pinned_fast_path_outlives_its_process_and_is_taken_over() {
    let (dir, cfg) = pinned_config("takeover");
    let Some(l) = lab_with(cfg.clone()) else {
        return;
    };
    assert!(l.fp.pinned());
    assert!(!l.fp.taking_over(), "nothing to take over at a first start");
    let (pa, pb, u0) = (l.pa, l.pb, l.underlay);
    let f = frame(B, A, 100);
    let r = l.fp.test_run(Program::PortIngress, &f, pa, 0).unwrap();
    assert_eq!(r.verdict, TCX_REDIRECT);
    let before = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(before.rx_frames, 1);
    // The process "ends": its descriptors close, the pins keep everything attached.
    drop(l);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!((tcx_count(pa), tcx_count(pb), tcx_count(u0)), (1, 1, 1));

    // The next one takes it all back, writes nothing and swaps its programs in.
    let mut fp = FastPath::open(&cfg).expect("second open");
    assert!(fp.taking_over());
    let report = take_over(&mut fp, true);
    assert_eq!(
        (report.written, report.deleted),
        (0, 0),
        "the same table rewritten"
    );
    assert!(!fp.taking_over());
    assert_eq!(
        (tcx_count(pa), tcx_count(pb), tcx_count(u0)),
        (1, 1, 1),
        "attached twice"
    );
    assert_eq!(fp.table_len(), 4);
    // The counters carried over (the same slot, the same map).
    assert_eq!(fp.port_counters(PortId(11)).unwrap().rx_frames, 1);
    let r = fp.test_run(Program::PortIngress, &f, pa, 0).unwrap();
    assert_eq!(
        r.verdict, TCX_REDIRECT,
        "the taken-over table still forwards A to B"
    );
    assert_eq!(fp.port_counters(PortId(12)).unwrap().tx_frames, 2);
    drop(fp);

    // A third one whose configuration no longer has port B: B's attachment and entries go.
    let mut fp = FastPath::open(&cfg).expect("third open");
    let report = take_over(&mut fp, false);
    assert_eq!(report.deleted, 1, "B's entry");
    assert_eq!(fp.table_len(), 3);
    wait_until(|| tcx_count(pb) == 0);
    assert_eq!((tcx_count(pa), tcx_count(pb), tcx_count(u0)), (1, 0, 1));
    assert!(!dir.join("links").join(format!("port-{pb}")).exists());

    // A teardown leaves nothing: no attachment, no pin.
    fp.teardown();
    wait_until(|| (tcx_count(pa), tcx_count(u0)) == (0, 0));
    assert_eq!((tcx_count(pa), tcx_count(pb), tcx_count(u0)), (0, 0, 0));
    assert!(!dir.exists(), "{} stayed", dir.display());
}

#[test]
fn pinned_maps_of_another_size_are_replaced_not_reused() {
    let (dir, cfg) = pinned_config("resize");
    let Some(l) = lab_with(cfg.clone()) else {
        return;
    };
    let pa = l.pa;
    drop(l);
    // Another table size (an upgrade, or a changed --fastpath-table-size): new maps, filled
    // before the attachments switch to the programs that use them.
    let cfg2 = FastPathConfig {
        max_table: 1024,
        ..cfg
    };
    let mut fp = FastPath::open(&cfg2).expect("open with another size");
    assert!(fp.taking_over(), "the attachments are still to take over");
    let report = take_over(&mut fp, true);
    assert_eq!(report.written, 4, "the whole table into the new map");
    let f = frame(B, A, 100);
    assert_eq!(
        fp.test_run(Program::PortIngress, &f, pa, 0)
            .unwrap()
            .verdict,
        TCX_REDIRECT
    );
    assert_eq!(tcx_count(pa), 1);
    let fwd =
        libbpf_rs::MapHandle::from_pinned_path(maps_dir(&dir).join("fwd")).expect("fwd pinned");
    assert_eq!(
        libbpf_rs::MapCore::max_entries(&fwd),
        1024,
        "the new map is the pinned one"
    );
    fp.teardown();
    assert!(!dir.exists());
}

#[test]
fn pinned_maps_are_reused_only_by_their_layout() {
    let (dir, cfg) = pinned_config("layout");
    let Some(l) = lab_with(cfg.clone()) else {
        return;
    };
    let pa = l.pa;
    drop(l);
    let own = maps_dir(&dir);
    let f = frame(B, A, 100);

    // Maps pinned by a vnet from before the layout hash (in `maps/`): this layout is no longer
    // theirs (reach's link keys have the remote's port, #31), so they are not reused either:
    // new maps, filled, pinned in this layout's directory; `maps/` goes. (Had the layouts been
    // equal they would have been reused and moved: `layout::reusable_maps_dirs`, unit-tested.)
    std::fs::rename(&own, dir.join("maps")).unwrap();
    let mut fp = FastPath::open(&cfg).expect("open over unhashed maps");
    let report = take_over(&mut fp, true);
    assert_eq!(report.written, 4, "the whole table into new maps");
    assert!(own.join("fwd").exists() && !dir.join("maps").exists());
    drop(fp);

    // Maps of another layout (another hash; the same types and sizes): not reused. New maps,
    // filled, then pinned in place of those, which go.
    let other = dir.join("maps-0000000000000001");
    std::fs::rename(&own, &other).unwrap();
    let mut fp = FastPath::open(&cfg).expect("open over another layout's maps");
    assert!(fp.taking_over(), "the attachments are still to take over");
    let report = take_over(&mut fp, true);
    assert_eq!(report.written, 4, "the whole table into new maps");
    assert!(!other.exists(), "the other layout's maps stayed pinned");
    assert_eq!(maps_dir(&dir), own);
    assert_eq!(
        fp.test_run(Program::PortIngress, &f, pa, 0)
            .unwrap()
            .verdict,
        TCX_REDIRECT
    );
    fp.teardown();
    assert!(!dir.exists());
}
