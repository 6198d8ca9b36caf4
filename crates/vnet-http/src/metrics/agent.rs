//! The etcd agent (`vnetd --etcd`): its session, what it derived, and its counters.

use super::builder::{Builder, Labels, Unit};
use crate::source::HostSnapshot;

pub(super) fn agent(b: &mut Builder, snap: &HostSnapshot) {
    let Some(a) = &snap.agent else {
        return;
    };
    let s = &a.status;
    let info = b.gauge(
        "etcd_info",
        "The overlay and host id of this daemon's etcd agent (always 1).",
        None,
    );
    info.set(
        &Labels::of("overlay", &s.overlay).with("host_id", &s.host_id),
        1.0,
    );
    let flag = |v: bool| if v { 1.0 } else { 0.0 };
    for (name, help, v) in [
        (
            "etcd_connected",
            "1 while the agent's session with etcd is up.",
            flag(s.connected),
        ),
        (
            "etcd_synced",
            "1 when connected and every derived command is applied.",
            flag(a.synced()),
        ),
        (
            "etcd_conflicts",
            "What the last derivation skipped (show cluster lists them).",
            s.conflicts.len() as f64,
        ),
        (
            "etcd_failed_commands",
            "Derived commands the running configuration refused (retried at the next change).",
            s.failed.len() as f64,
        ),
        (
            "etcd_revision",
            "The etcd revision the agent has seen.",
            s.revision as f64,
        ),
        (
            "etcd_hosts",
            "Hosts registered in the overlay.",
            s.hosts as f64,
        ),
        (
            "etcd_interfaces",
            "Interfaces placed in the overlay.",
            s.interfaces as f64,
        ),
        (
            "etcd_operator_routes",
            "Operator routes in the overlay.",
            s.operator_routes as f64,
        ),
        (
            "etcd_host_id_in_use",
            "1 when another daemon's lease holds this host id.",
            flag(s.host_id_in_use),
        ),
    ] {
        b.gauge1(name, help, None, v);
    }
    if let Some(age) = a.last_sync_age {
        b.gauge1(
            "etcd_last_sync_age",
            "Time since the agent last synchronised the derived configuration.",
            Some(Unit::Seconds),
            age.as_secs_f64(),
        );
    }
    for (name, help, v) in [
        (
            "etcd_sessions",
            "Sessions with etcd (reconnections + 1).",
            s.sessions,
        ),
        (
            "etcd_syncs",
            "Synchronisations of the derived configuration.",
            s.syncs,
        ),
        ("etcd_events", "Watch events received.", s.events),
        (
            "etcd_bad_entries",
            "Entries of the store ignored as invalid.",
            s.bad_entries,
        ),
        (
            "etcd_announcements",
            "RARP announcements sent for guests that moved here.",
            s.announcements,
        ),
    ] {
        b.counter1(name, help, None, v);
    }
}
