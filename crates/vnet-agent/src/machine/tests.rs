//! The agent's decisions, driven by hand: etcd's answers and events, the time and the local
//! configuration in; what to write, derive, announce and show out. No etcd, no root.

use super::*;
use vnet_cluster::{CAP_VXLAN, SCHEMA_VERSION};
use vnet_control::parse_line;
use vnet_etcd::{KeyValue, WatchEvent};

const LEASE: i64 = 7;

fn overlay() -> OverlayName {
    "lab".parse().unwrap()
}

fn host(h: &str) -> HostId {
    h.parse().unwrap()
}

fn record(h: &str, last: u8) -> HostRecord {
    HostRecord {
        host_id: host(h),
        addr: format!("10.0.0.{last}").parse().unwrap(),
        udp_port: 4789,
        tcp_port: None,
        capabilities: vec![CAP_VXLAN.into()],
        public_key: None,
        version: SCHEMA_VERSION,
        reach: Default::default(),
    }
}

fn machine(lease: Option<i64>, t0: Instant) -> Machine {
    machine_with(9, Duration::from_secs(5), lease, t0)
}

fn machine_with(
    lease_ttl: i64,
    matrix_interval: Duration,
    lease: Option<i64>,
    t0: Instant,
) -> Machine {
    Machine::new(
        overlay(),
        host("a"),
        record("a", 1),
        lease_ttl,
        matrix_interval,
        lease,
        t0,
    )
}

fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

/// A local configuration with TAP interfaces (name, VNI, last byte of the MAC).
fn local(ifaces: &[(&str, u32, u8)]) -> Config {
    let mut cfg = Config::default();
    let mut gen = || MacAddr([2, 0, 0, 0, 0, 1]);
    for (name, vni, n) in ifaces {
        let line = format!("interface add {name} tap mac {} vni {vni}", mac(*n));
        let cmd = parse_line(&line).unwrap().unwrap();
        cfg.apply(&cmd, &mut gen).unwrap();
    }
    cfg
}

fn placement(h: &str, vni: u32, n: u8, name: &str, epoch: u64) -> InterfaceRecord {
    InterfaceRecord {
        mac: mac(n),
        vni,
        host_id: host(h),
        name: name.into(),
        epoch,
    }
}

fn iface_key(vni: u32, n: u8) -> String {
    key_for_interface(&overlay(), vni, mac(n))
}

fn kv(key: &[u8], value: Vec<u8>, lease: i64, rev: i64) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value,
        mod_revision: rev,
        lease,
        ..KeyValue::default()
    }
}

fn put(key: &[u8], value: Vec<u8>, rev: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Put,
        kv: kv(key, value, 0, rev),
    }
}

fn delete(key: &str, rev: i64) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Delete,
        kv: kv(key.as_bytes(), vec![], 0, rev),
    }
}

fn read(revision: i64, kvs: Vec<KeyValue>) -> RangeResponse {
    RangeResponse {
        revision,
        kvs,
        ..RangeResponse::default()
    }
}

#[test]
fn the_first_session_reads_everything_and_the_next_ones_resume() {
    let t0 = Instant::now();
    let mut m = machine(None, t0);
    m.lease_granted(LEASE, 9);
    // New to the store: register before the read.
    assert_eq!(
        m.start(LEASE),
        Start::ReadAll {
            register_first: true
        }
    );
    let b = record("b", 2);
    let rev = m.absorb_read(&read(
        40,
        vec![kv(
            key_for_host(&overlay(), &host("b")).as_bytes(),
            encode(&b),
            3,
            12,
        )],
    ));
    assert_eq!(rev, 40);
    assert_eq!(m.state().host(&host("b")), Some(&b));
    assert_eq!(m.status.revision, 40);
    // The next session watches on from the read.
    assert_eq!(m.start(LEASE), Start::Resume { from: 41 });
    // A cancel without compaction keeps the place; one with compaction loses it: read
    // again, without registering first (hosts are known).
    assert!(m
        .heard(WatchMessage::Canceled {
            compact_revision: 0,
            reason: "x".into()
        })
        .is_err());
    assert_eq!(m.start(LEASE), Start::Resume { from: 41 });
    let e = m
        .heard(WatchMessage::Canceled {
            compact_revision: 35,
            reason: "compacted".into(),
        })
        .unwrap_err();
    assert!(e.to_string().contains("compacted"), "{e}");
    assert_eq!(
        m.start(LEASE),
        Start::ReadAll {
            register_first: false
        }
    );
}

#[test]
fn events_change_the_state_and_move_the_resume_point() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.absorb_read(&read(10, vec![]));
    let b = record("b", 2);
    let heard = m
        .heard(WatchMessage::Events {
            // The store's revision, not the events': a catch-up comes in several messages.
            revision: 999,
            events: vec![
                put(
                    key_for_host(&overlay(), &host("b")).as_bytes(),
                    encode(&b),
                    50,
                ),
                put(b"/vnet/lab/matrix/b", b"{}".to_vec(), 51),
                put(&[0xff, 0xfe], b"x".to_vec(), 52),
                put(b"/vnet/lab/hosts/c", b"not json".to_vec(), 53),
                delete("/vnet/lab/hosts/zz", 54),
            ],
        })
        .unwrap();
    assert!(heard.changed && !heard.watching);
    assert_eq!(m.state().host(&host("b")), Some(&b));
    assert_eq!(m.pending, vec![ClusterKey::Host(host("b"))]);
    let s = &m.status;
    assert_eq!((s.events, s.bad_entries, s.revision), (5, 2, 999));
    assert_eq!(m.start(LEASE), Start::Resume { from: 55 });
    // Progress moves the point on, never back.
    m.heard(WatchMessage::Progress { revision: 200 }).unwrap();
    m.heard(WatchMessage::Progress { revision: 150 }).unwrap();
    assert_eq!(m.start(LEASE), Start::Resume { from: 201 });
    // Nothing new in an event: no change.
    let again = m
        .heard(WatchMessage::Events {
            revision: 300,
            events: vec![put(
                key_for_host(&overlay(), &host("b")).as_bytes(),
                encode(&b),
                210,
            )],
        })
        .unwrap();
    assert!(!again.changed);
    assert_eq!(m.start(LEASE), Start::Resume { from: 211 });
}

#[test]
fn a_catch_up_and_the_lasting_watch_join_into_the_state_a_single_watch_gives() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.absorb_read(&read(10, vec![]));
    m.begin_watch(t0);
    let (b, c) = (record("b", 2), record("c", 3));
    let (kb, kc) = (
        key_for_host(&overlay(), &host("b")),
        key_for_host(&overlay(), &host("c")),
    );
    let events = |evs: Vec<WatchEvent>| WatchMessage::Events {
        revision: 99,
        events: evs,
    };
    // The lasting watch starts after 14; the state holds 10: a catch-up is needed.
    assert!(m.splice(14));
    // The lasting watch is first with b's removal (at 15)...
    let heard = m.heard(events(vec![delete(&kb, 15)])).unwrap();
    assert!(!heard.changed, "b was not there yet");
    // ...then the catch-up brings b's and c's arrival (11, 12): b's is older than what the
    // lasting watch said about it, c's is applied; the resume point follows the catch-up.
    let caught = m
        .heard_catch_up(events(vec![
            put(kb.as_bytes(), encode(&b), 11),
            put(kc.as_bytes(), encode(&c), 12),
        ]))
        .unwrap();
    assert_eq!(
        caught,
        CaughtUp {
            changed: true,
            done: false
        }
    );
    assert_eq!(m.state().host(&host("b")), None);
    assert_eq!(m.state().host(&host("c")), Some(&c));
    assert_eq!(m.start(LEASE), Start::Resume { from: 13 });
    // An event past the join completes it (and is the lasting watch's to apply).
    let caught = m.heard_catch_up(events(vec![delete(&kc, 16)])).unwrap();
    assert!(caught.done && !caught.changed);
    assert_eq!(m.state().host(&host("c")), Some(&c));
    assert_eq!(m.start(LEASE), Start::Resume { from: 15 });
    // Late catch-up messages change nothing; the lasting watch goes on.
    let late = m.heard_catch_up(events(vec![delete(&kc, 16)])).unwrap();
    assert_eq!(late, CaughtUp::default());
    assert!(m.heard(events(vec![delete(&kc, 16)])).unwrap().changed);
    assert_eq!(m.start(LEASE), Start::Resume { from: 17 });
}

#[test]
fn a_session_whose_state_is_recent_enough_needs_no_catch_up() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.absorb_read(&read(20, vec![]));
    m.begin_watch(t0);
    // The lasting watch starts after 20, where the state is.
    assert!(!m.splice(20));
    let kb = key_for_host(&overlay(), &host("b"));
    let b = record("b", 2);
    // No catch-up runs: its messages are ignored.
    let none = m
        .heard_catch_up(WatchMessage::Events {
            revision: 30,
            events: vec![put(kb.as_bytes(), encode(&b), 21)],
        })
        .unwrap();
    assert_eq!(none, CaughtUp::default());
    assert_eq!(m.state().host(&host("b")), None);
    // The lasting watch's events move the resume point on at once.
    let heard = m
        .heard(WatchMessage::Events {
            revision: 30,
            events: vec![put(kb.as_bytes(), encode(&b), 21)],
        })
        .unwrap();
    assert!(heard.changed);
    assert_eq!(m.start(LEASE), Start::Resume { from: 22 });
}

#[test]
fn a_catch_up_that_starts_after_a_compaction_reads_everything_again() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.absorb_read(&read(10, vec![]));
    m.begin_watch(t0);
    assert!(m.splice(40));
    let err = m.heard_catch_up(WatchMessage::Canceled {
        compact_revision: 30,
        reason: "compacted".into(),
    });
    assert!(err.is_err());
    assert!(matches!(m.start(LEASE), Start::ReadAll { .. }));
}

#[test]
fn the_watch_is_up_once_per_session_and_a_failure_is_said_once() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.begin_watch(t0);
    let created = WatchMessage::Created {
        watch_id: 1,
        revision: 5,
    };
    assert!(m.heard(created.clone()).unwrap().watching);
    assert!(!m.heard(created.clone()).unwrap().watching);
    assert!(m.status.connected);
    assert_eq!(m.status.sessions, 1);
    // The session fails: it was connected (the backoff starts over).
    assert!(m.session_failed("etcd: timed out".into()));
    assert!(!m.status.connected);
    assert_eq!(m.status.last_error, "etcd: timed out");
    assert!(!m.session_failed("etcd: timed out".into()));
    m.begin_watch(t0);
    assert!(m.heard(created).unwrap().watching);
    assert_eq!(m.status.sessions, 2);
    assert!(m.status.last_error.is_empty());
}

#[test]
fn what_an_earlier_run_put_under_our_lease_is_ours_to_take_back() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let mine = placement("a", 1, 1, "vm1", 0);
    let other_lease = placement("a", 1, 2, "vm2", 0);
    let other_host = placement("b", 1, 3, "vm3", 0);
    m.absorb_read(&read(
        20,
        vec![
            kv(iface_key(1, 1).as_bytes(), encode(&mine), LEASE, 5),
            kv(iface_key(1, 2).as_bytes(), encode(&other_lease), 8, 6),
            kv(iface_key(1, 3).as_bytes(), encode(&other_host), LEASE, 7),
        ],
    ));
    // Its interface is gone here: only the placement under our lease is removed, and only
    // if it still holds what we read.
    let steps = m.placements(&local(&[]), LEASE, false);
    assert_eq!(
        steps,
        vec![PlacementStep {
            at: (1, mac(1)),
            write: Some(Write {
                compare: Compare {
                    key: iface_key(1, 1).into_bytes(),
                    target: CompareTarget::Value(encode(&mine)),
                },
                op: TxnOp::Delete {
                    key: iface_key(1, 1).into_bytes(),
                    range_end: None,
                },
            }),
            then: Then::Forget,
        }]
    );
    m.placement_done(&steps[0], true);
    assert!(m.placements(&local(&[]), LEASE, false).is_empty());
}

#[test]
fn a_new_host_registers_in_one_transaction() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let cfg = local(&[("vm1", 1, 1), ("vm2", 2, 2)]);
    let reg = m.registration(&cfg, LEASE).expect("a registration");
    assert_eq!(reg.records.len(), 2);
    assert_eq!(reg.compare.len(), 3);
    assert!(reg
        .compare
        .iter()
        .all(|c| c.target == CompareTarget::Version(0)));
    assert_eq!(
        reg.puts[0],
        TxnOp::Put {
            key: key_for_host(&overlay(), &host("a")).into_bytes(),
            value: encode(&record("a", 1)),
            lease: LEASE,
        }
    );
    assert!(reg
        .puts
        .iter()
        .all(|p| matches!(p, TxnOp::Put { lease, .. } if *lease == LEASE)));
    assert!(m.must_republish(LEASE));
    m.registered(reg, LEASE);
    assert!(!m.must_republish(LEASE));
    assert_eq!(m.published, BTreeSet::from([(1, mac(1)), (2, mac(2))]));
    // Our own record is known at once (derivation must see this host's key).
    assert_eq!(m.state().host(&host("a")), Some(&record("a", 1)));
    assert_eq!(m.pending, vec![ClusterKey::Host(host("a"))]);
    assert_eq!(m.host_claim(false), None);
    // Known now: no second registration.
    assert_eq!(m.registration(&cfg, LEASE), None);
}

#[test]
fn no_registration_where_a_key_exists_or_etcd_would_refuse_it() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    // One placement already in the store.
    m.state
        .insert(ClusterEntry::Interface(placement("b", 2, 2, "x", 0)));
    assert_eq!(
        m.registration(&local(&[("vm1", 1, 1), ("vm2", 2, 2)]), LEASE),
        None
    );
    // More operations than a transaction may have.
    let m = machine(Some(LEASE), t0);
    // `n` interfaces, one per VNI.
    let interfaces = |n: u32| {
        let names: Vec<String> = (0..n).map(|i| format!("vm{i}")).collect();
        let spec: Vec<(&str, u32, u8)> = names
            .iter()
            .zip(1..)
            .map(|(name, vni)| (name.as_str(), vni, 1))
            .collect();
        local(&spec)
    };
    assert!(m.registration(&interfaces(127), LEASE).is_some());
    assert_eq!(m.registration(&interfaces(128), LEASE), None);
}

#[test]
fn the_host_id_is_claimed_not_taken() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let claim = m.host_claim(false).expect("not in the store yet");
    assert_eq!(
        claim,
        HostClaim {
            key: key_for_host(&overlay(), &host("a")).into_bytes(),
            value: encode(&record("a", 1)),
        }
    );
    // Another daemon holds it: stop, and say so.
    let e = m.host_claimed(false).unwrap_err();
    assert!(e.to_string().contains("held by another daemon"), "{e}");
    assert!(m.status.host_id_in_use);
    assert!(m.state().host(&host("a")).is_none());
    m.host_claimed(true).unwrap();
    assert!(!m.status.host_id_in_use);
    assert_eq!(m.host_claim(false), None);
    // Under a new lease everything is put again.
    assert!(m.host_claim(true).is_some());
    // Someone changed our record: put it back.
    m.state.insert(ClusterEntry::Host(record("a", 9)));
    assert!(m.host_claim(false).is_some());
}

#[test]
fn placements_are_put_where_missing_renamed_where_ours_and_left_where_elsewhere() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let old = placement("a", 1, 1, "old", 3);
    m.state.insert(ClusterEntry::Interface(old.clone()));
    m.state
        .insert(ClusterEntry::Interface(placement("b", 1, 2, "vm2", 0)));
    let cfg = local(&[("vm1", 1, 1), ("vm2", 1, 2), ("vm3", 1, 3)]);
    let steps = m.placements(&cfg, LEASE, false);
    let mut renamed = old.clone();
    renamed.name = "vm1".into();
    let put = |key: String, target, value| Write {
        compare: Compare {
            key: key.clone().into_bytes(),
            target,
        },
        op: TxnOp::Put {
            key: key.into_bytes(),
            value,
            lease: LEASE,
        },
    };
    assert_eq!(
        steps,
        vec![
            // Ours under another name: renamed, its epoch kept, if it still holds what we saw.
            PlacementStep {
                at: (1, mac(1)),
                write: Some(put(
                    iface_key(1, 1),
                    CompareTarget::Value(encode(&old)),
                    encode(&renamed)
                )),
                then: Then::Ours,
            },
            // vm2 is served by b: nothing (its routes say so).
            // New: put only if nobody placed it meanwhile.
            PlacementStep {
                at: (1, mac(3)),
                write: Some(put(
                    iface_key(1, 3),
                    CompareTarget::Version(0),
                    encode(&placement("a", 1, 3, "vm3", 0))
                )),
                then: Then::OursIfWritten,
            },
        ]
    );
    // Somebody was faster for vm3: not ours. Ours for vm1 either way.
    m.placement_done(&steps[0], false);
    m.placement_done(&steps[1], false);
    assert_eq!(m.published, BTreeSet::from([(1, mac(1))]));
    m.placement_done(&steps[1], true);
    assert_eq!(m.published, BTreeSet::from([(1, mac(1)), (1, mac(3))]));
    m.published(LEASE);
    // As published: nothing to write, unless forced (a new lease).
    m.state.insert(ClusterEntry::Interface(renamed.clone()));
    m.state
        .insert(ClusterEntry::Interface(placement("a", 1, 3, "vm3", 0)));
    let steps = m.placements(&cfg, LEASE, false);
    assert!(steps.iter().all(|s| s.write.is_none()), "{steps:?}");
    assert_eq!(steps.len(), 2);
    let forced = m.placements(&cfg, LEASE + 1, true);
    assert!(forced.iter().all(|s| s.write.is_some()), "{forced:?}");
}

#[test]
fn the_derivation_is_incremental_until_a_new_read() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let cfg = local(&[("vm1", 1, 1)]);
    assert!(m.derive(&cfg).1.is_none(), "the first derivation is whole");
    assert!(m.derive(&cfg).1.is_some());
    m.absorb_read(&read(3, vec![]));
    assert!(m.derive(&cfg).1.is_none());
    // The keys that changed are handed over once.
    m.pending.push(ClusterKey::Policy);
    m.derive(&cfg);
    assert!(m.pending.is_empty());
}

#[test]
fn a_placement_that_moved_here_is_announced_twice_per_epoch() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let cfg = local(&[("vm1", 1, 1), ("vm2", 1, 2), ("vm3", 1, 3)]);
    m.state
        .insert(ClusterEntry::Interface(placement("a", 1, 1, "vm1", 2)));
    // Never moved (epoch 0), or served elsewhere: no announcement.
    m.state
        .insert(ClusterEntry::Interface(placement("a", 1, 2, "vm2", 0)));
    m.state
        .insert(ClusterEntry::Interface(placement("b", 1, 3, "vm3", 4)));
    m.synced(SyncReport::default(), &cfg);
    let frame = announce_frame(mac(1), None::<Ipv4Addr>).to_vec();
    assert_eq!(m.announcements(), vec![("vm1".to_string(), frame.clone())]);
    assert_eq!(m.announcements(), vec![("vm1".to_string(), frame.clone())]);
    assert!(m.announcements().is_empty());
    // The same epoch again: already announced.
    m.synced(SyncReport::default(), &cfg);
    assert!(m.announcements().is_empty());
    // It moved away and back: a new epoch, announced again.
    m.state
        .insert(ClusterEntry::Interface(placement("a", 1, 1, "vm1", 4)));
    m.synced(SyncReport::default(), &cfg);
    assert_eq!(m.announcements().len(), 1);
    m.announcement_sent();
    assert_eq!(m.status.announcements, 1);
    assert_eq!(m.status.syncs, 3);
}

#[test]
fn a_synchronisation_reports_what_failed_and_conflicted() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.synced(
        SyncReport {
            applied: vec!["link add c-b-v1 udp 10.0.0.2:4789 vni 1".into()],
            failed: vec!["route add any 52:54:00:00:00:09 link x: no such link".into()],
            conflicts: vec!["skipped".into()],
        },
        &local(&[]),
    );
    let st = m.cluster_status("http://e1,http://e2".into());
    assert_eq!(st.failed.len(), 1);
    assert_eq!(st.conflicts, ["skipped"]);
    assert_eq!((st.syncs, st.lease.as_deref()), (1, Some("7")));
    assert_eq!((st.overlay.as_str(), st.host_id.as_str()), ("lab", "a"));
    assert_eq!(st.endpoints, "http://e1,http://e2");
    // All applied the next time: the failures are gone from the status.
    m.synced(SyncReport::default(), &local(&[]));
    assert!(m.cluster_status(String::new()).failed.is_empty());
}

#[test]
fn the_state_is_shown_at_most_once_a_second() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    let ms = Duration::from_millis;
    assert_eq!(m.show(t0, false), Show::Nothing);
    m.synced(SyncReport::default(), &local(&[]));
    assert_eq!(m.show(t0, true), Show::State);
    m.synced(SyncReport::default(), &local(&[]));
    // Within the second: only the time; the change waits.
    assert_eq!(m.show(t0 + ms(500), true), Show::Time);
    assert_eq!(m.show(t0 + ms(600), false), Show::Nothing);
    // The last change of the burst, a second later.
    assert_eq!(m.show(t0 + ms(1000), false), Show::State);
    assert_eq!(m.show(t0 + ms(2500), false), Show::Nothing);
}

#[test]
fn the_lease_is_renewed_or_registered_again() {
    let t0 = Instant::now();
    assert_eq!(machine(Some(0), t0).lease(), None, "no such lease");
    let mut m = machine(Some(5), t0);
    m.lease_renewed(3);
    assert_eq!(m.lease(), Some(5));
    m.lease_renewed(0);
    assert_eq!(m.lease(), None);
    m.lease_granted(LEASE, 9);
    assert_eq!(m.lease(), Some(LEASE));
    assert_eq!(m.keepalive_every_ms(), 3000);
    // The keep-alive thread's findings end the session.
    let found = |expired, lapsed, member_silent| LeaseFindings {
        expired,
        lapsed,
        member_silent,
    };
    assert!(m.check_lease(LeaseFindings::default()).is_ok());
    assert!(m.check_lease(found(false, false, true)).is_err());
    assert_eq!(
        m.lease(),
        Some(LEASE),
        "a silent member is not a lost lease"
    );
    // Renewals unanswered for a TTL: the session ends, but the lease is kept for the next
    // session to ask the store about (it may still live).
    assert!(m.check_lease(found(false, true, false)).is_err());
    assert_eq!(m.lease(), Some(LEASE), "a lapse is not an expiry");
    m.lease_renewed(4);
    assert_eq!(m.lease(), Some(LEASE), "it lived after all: kept");
    assert!(m.check_lease(found(true, true, false)).is_err());
    assert_eq!(m.lease(), None);
    assert_eq!(
        machine_with(0, Duration::ZERO, None, t0).keepalive_every_ms(),
        333
    );
}

#[test]
fn the_matrix_is_put_when_it_changed_or_the_lease_did() {
    let t0 = Instant::now();
    let mut m = machine(Some(LEASE), t0);
    m.published(LEASE);
    let pairs = |bytes| {
        vec![vnet_core::MatrixEntry {
            vni: 1,
            src: mac(1),
            dst: mac(2),
            frames: 1,
            bytes,
        }]
    };
    let v = m.matrix_update(pairs(100), LEASE).expect("first");
    assert_eq!(
        MatrixRecord::decode(&v).unwrap(),
        MatrixRecord::heaviest(host("a"), pairs(100))
    );
    m.matrix_put(v);
    assert_eq!(m.matrix_update(pairs(100), LEASE), None);
    assert!(m.matrix_update(pairs(200), LEASE).is_some());
    assert!(m.matrix_update(pairs(100), LEASE + 1).is_some());
    // A new lease: put again even if unchanged.
    m.lease_granted(LEASE, 9);
    assert!(m.matrix_update(pairs(100), LEASE).is_some());
    // Due at once in a session, then every interval.
    let s = Duration::from_secs;
    m.begin_watch(t0);
    assert!(m.matrix_due(t0));
    m.matrix_done(t0);
    assert!(!m.matrix_due(t0 + s(4)));
    assert!(m.matrix_due(t0 + s(5)));
    assert!(!machine_with(9, Duration::ZERO, None, t0).matrix_due(t0 + s(1000)));
}

#[test]
fn local_changes_are_noticed_once() {
    let mut m = machine(Some(LEASE), Instant::now());
    m.local_seen(3);
    assert!(!m.local_changed(3));
    assert!(m.local_changed(4));
    assert!(!m.local_changed(4));
}
