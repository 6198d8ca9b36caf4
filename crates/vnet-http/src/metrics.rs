//! `/metrics`: the daemon's status structs in the Prometheus/OpenMetrics text format, through
//! `prometheus-client`.
//!
//! A fresh registry is filled from one snapshot per scrape, so a port that was removed
//! disappears from the next scrape and nothing is kept between scrapes. Names follow the
//! Prometheus conventions: prefix `vnet_`, counters end in `_total`, base units (bytes,
//! seconds), and bounded label sets: ports, links, dispatchers and drop reasons are as many
//! as the configuration has; guest MACs are never labels (the traffic matrix is in the live
//! view and `show matrix`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry, Unit};
use vnet_control::status::{DataPathKind, LinkState, NicStatus, PortStatus};
use vnet_core::DropReason;

use crate::server::{HttpCounters, Refusal};
use crate::source::HostSnapshot;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What `vnet_build_info` says.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    pub version: String,
    /// Seconds since the Unix epoch when the daemon started.
    pub start_time: f64,
}

type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter<u64>>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

struct Builder {
    reg: Registry,
}

// The encoder ends every help text with a period of its own.
fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

impl Builder {
    fn register(&mut self, name: &str, help: &str, unit: Option<Unit>, m: impl Metric) {
        let help = help_text(help);
        match unit {
            Some(u) => self.reg.register_with_unit(name, help, u, m),
            None => self.reg.register(name, help, m),
        }
    }

    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Counters {
        let f = Counters::default();
        self.register(name, help, unit, f.clone());
        f
    }

    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>) -> Gauges {
        let f = Gauges::default();
        self.register(name, help, unit, f.clone());
        f
    }

    /// A counter without labels.
    fn counter1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: u64) {
        let c: Counter<u64> = Counter::default();
        c.inc_by(v);
        self.register(name, help, unit, c);
    }

    /// A gauge without labels.
    fn gauge1(&mut self, name: &str, help: &str, unit: Option<Unit>, v: f64) {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(v);
        self.register(name, help, unit, g);
    }
}

fn set(f: &Counters, labels: Labels, v: u64) {
    f.get_or_create(&labels).inc_by(v);
}

fn gset(f: &Gauges, labels: Labels, v: f64) {
    f.get_or_create(&labels).set(v);
}

fn port_labels(p: &PortStatus) -> Labels {
    vec![
        ("role", p.kind.as_str().to_string()),
        ("port", p.name.clone()),
        ("vni", p.vni.to_string()),
    ]
}

fn with(mut l: Labels, k: &'static str, v: impl Into<String>) -> Labels {
    l.push((k, v.into()));
    l
}

/// The whole exposition for one snapshot.
pub fn render(snap: &HostSnapshot, http: &HttpCounters, info: &BuildInfo) -> String {
    let mut b = Builder {
        reg: Registry::with_prefix("vnet"),
    };

    let build = b.gauge("build_info", "vnetd's version (always 1).", None);
    gset(&build, vec![("version", info.version.clone())], 1.0);
    b.gauge1(
        "start_time",
        "When vnetd started, seconds since the Unix epoch.",
        Some(Unit::Seconds),
        info.start_time,
    );

    // Ports: interfaces (frames from and to a guest) and links (from and to a peer host).
    let rx_frames = b.counter(
        "port_receive_frames",
        "Frames vnet received from the port (from the guest, or from the link's peer).",
        None,
    );
    let rx_bytes = b.counter(
        "port_receive",
        "Bytes vnet received from the port.",
        Some(Unit::Bytes),
    );
    let tx_frames = b.counter(
        "port_transmit_frames",
        "Frames vnet sent to the port.",
        None,
    );
    let tx_bytes = b.counter(
        "port_transmit",
        "Bytes vnet sent to the port.",
        Some(Unit::Bytes),
    );
    let drops = b.counter(
        "port_drops",
        "Frames dropped at the port, by reason (docs/control-language.md, show stats).",
        None,
    );
    let rate_limit = b.gauge(
        "port_rate_limit_bytes_per_second",
        "The port's token-bucket rate (ports with a rate only).",
        None,
    );
    let bucket = b.gauge(
        "port_rate_bucket",
        "Bytes the port's token bucket holds now (may be below zero by one frame).",
        Some(Unit::Bytes),
    );
    for p in &snap.stats.ports {
        let l = port_labels(p);
        set(&rx_frames, l.clone(), p.counters.rx_frames);
        set(&rx_bytes, l.clone(), p.counters.rx_bytes);
        set(&tx_frames, l.clone(), p.counters.tx_frames);
        set(&tx_bytes, l.clone(), p.counters.tx_bytes);
        // Every reason, zeros included, so that rate() sees a drop's first occurrence.
        for r in DropReason::ALL {
            let n = p.counters.drops.get(r.as_str()).copied().unwrap_or(0);
            set(&drops, with(l.clone(), "reason", r.as_str()), n);
        }
        if let Some(rate) = &p.policy.rate {
            gset(&rate_limit, l.clone(), rate.mbit as f64 * 125_000.0);
            gset(&bucket, l.clone(), rate.available_bytes as f64);
        }
    }

    // The VXLAN socket as a whole, and what was dropped before any port was known.
    let d = &snap.stats.daemon;
    b.counter1(
        "udp_received_datagrams",
        "Datagrams the VXLAN socket received, for all links.",
        None,
        d.rx_datagrams,
    );
    b.counter1(
        "udp_received",
        "Bytes of the datagrams the VXLAN socket received.",
        Some(Unit::Bytes),
        d.rx_bytes,
    );
    let unmatched_drops = b.counter(
        "unmatched_drops",
        "Datagrams and connections dropped before a port was known (unknown peer, bad VXLAN header), by reason.",
        None,
    );
    for r in DropReason::ALL {
        let n = d.drops.get(r.as_str()).copied().unwrap_or(0);
        set(
            &unmatched_drops,
            vec![("reason", r.as_str().to_string())],
            n,
        );
    }
    b.counter1(
        "control_errors",
        "Refused control connections, bad control lines and failed authentications.",
        None,
        d.control_errors,
    );

    links(&mut b, snap);
    kernel(&mut b, snap);
    dispatch(&mut b, snap);
    vhost(&mut b, snap);
    agent(&mut b, snap);

    // The listener itself.
    let responses = b.counter(
        "http_responses",
        "Responses of the HTTP listener, by status code.",
        None,
    );
    for (code, n) in http.responses() {
        set(&responses, vec![("code", code.to_string())], n);
    }
    let refused = b.counter(
        "http_refused",
        "Requests and connections the HTTP listener refused, by reason.",
        None,
    );
    for r in Refusal::ALL {
        set(
            &refused,
            vec![("reason", r.as_str().to_string())],
            http.refused(r),
        );
    }
    b.counter1(
        "http_connections",
        "Connections the HTTP listener accepted.",
        None,
        http.accepted(),
    );
    b.gauge1(
        "http_active_connections",
        "Connections being served now.",
        None,
        http.active() as f64,
    );

    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &b.reg);
    out
}

fn links(b: &mut Builder, snap: &HostSnapshot) {
    let state = b.gauge(
        "link_state",
        "1 for the link's current state (up, connecting, down), 0 for the others.",
        None,
    );
    let info = b.gauge("link_info", "A link's kind, peer and VNI (always 1).", None);
    let c = |b: &mut Builder, name: &str, help: &str| b.counter(name, help, None);
    let sealed = c(
        b,
        "crypto_sealed_datagrams",
        "Datagrams sealed for an encrypted link.",
    );
    let opened = c(
        b,
        "crypto_opened_datagrams",
        "Datagrams of an encrypted link that authenticated.",
    );
    let init_sent = c(b, "crypto_initiations_sent", "Handshake initiations sent.");
    let resp_sent = c(b, "crypto_responses_sent", "Handshake responses sent.");
    let hs_recv = c(
        b,
        "crypto_handshake_messages_received",
        "Handshake messages received.",
    );
    let hs_done = c(
        b,
        "crypto_handshakes_completed",
        "Handshakes that gave a session.",
    );
    let rekeys = c(b, "crypto_rekeys", "Sessions replaced by a new handshake.");
    let replayed = c(
        b,
        "crypto_initiations_replayed",
        "Handshake initiations refused as replays.",
    );
    let throttled = c(
        b,
        "crypto_initiations_throttled",
        "Handshake initiations refused unread by the link's budget.",
    );
    let bad_hs = c(
        b,
        "crypto_bad_handshakes",
        "Malformed or unexpected handshake messages.",
    );
    let session = b.gauge(
        "crypto_session_established",
        "1 when the encrypted link has a session to send on.",
        None,
    );
    let age = b.gauge(
        "crypto_session_age",
        "Age of the encrypted link's current session.",
        Some(Unit::Seconds),
    );
    for l in &snap.links {
        let ll = vec![("link", l.name.clone())];
        for s in [LinkState::Up, LinkState::Connecting, LinkState::Down] {
            let v = if l.state == s { 1.0 } else { 0.0 };
            gset(&state, with(ll.clone(), "state", s.as_str()), v);
        }
        gset(
            &info,
            vec![
                ("link", l.name.clone()),
                ("kind", l.kind.to_string()),
                ("peer", l.peer().to_string()),
                ("vni", l.vni.to_string()),
                ("encrypted", l.encrypted.is_some().to_string()),
            ],
            1.0,
        );
        if let Some(e) = &l.encrypted {
            set(&sealed, ll.clone(), e.sealed);
            set(&opened, ll.clone(), e.opened);
            set(&init_sent, ll.clone(), e.initiations_sent);
            set(&resp_sent, ll.clone(), e.responses_sent);
            set(&hs_recv, ll.clone(), e.handshakes_received);
            set(&hs_done, ll.clone(), e.handshakes_completed);
            set(&rekeys, ll.clone(), e.rekeys);
            set(&replayed, ll.clone(), e.initiations_replayed);
            set(&throttled, ll.clone(), e.initiations_throttled);
            set(&bad_hs, ll.clone(), e.bad_handshakes);
            gset(
                &session,
                ll.clone(),
                if e.session_age_ms.is_some() { 1.0 } else { 0.0 },
            );
            if let Some(ms) = e.session_age_ms {
                gset(&age, ll.clone(), ms as f64 / 1000.0);
            }
        }
    }
}

/// The kernel fast path: which path serves each port, the kernel's share of its counters
/// (already included in the port's), and the fast path's table and refusals.
fn kernel(b: &mut Builder, snap: &HostSnapshot) {
    let path = b.gauge(
        "port_data_path",
        "1 for the data path that serves the port (kernel: the eBPF fast path; user: vnetd), 0 for the other.",
        None,
    );
    let c = |b: &mut Builder, name: &str, help: &str, unit| b.counter(name, help, unit);
    let rx_frames = c(b, "kernel_port_receive_frames", "Frames the kernel fast path received from the port (included in vnet_port_receive_frames_total).", None);
    let rx_bytes = c(
        b,
        "kernel_port_receive",
        "Bytes the kernel fast path received from the port.",
        Some(Unit::Bytes),
    );
    let tx_frames = c(
        b,
        "kernel_port_transmit_frames",
        "Frames the kernel fast path sent to the port.",
        None,
    );
    let tx_bytes = c(
        b,
        "kernel_port_transmit",
        "Bytes the kernel fast path sent to the port.",
        Some(Unit::Bytes),
    );
    let punted = c(
        b,
        "kernel_port_punted_frames",
        "Frames the kernel handed to vnetd.",
        None,
    );
    let from_vnetd = c(
        b,
        "kernel_port_from_vnetd_frames",
        "Frames vnetd sent to the guest through the kernel.",
        None,
    );
    let neigh_miss = c(
        b,
        "kernel_port_neigh_miss_frames",
        "Frames to a link whose next hop was not resolved yet (sent by vnetd instead).",
        None,
    );
    let encap_fail = c(
        b,
        "kernel_port_encap_fail_frames",
        "Frames the kernel could not encapsulate (sent by vnetd instead).",
        None,
    );
    let gro_passed = c(
        b,
        "kernel_port_gro_passed_datagrams",
        "Merged UDP datagrams from the underlay passed on to vnetd's socket.",
        None,
    );
    for p in &snap.stats.ports {
        let l = port_labels(p);
        for x in [DataPathKind::Kernel, DataPathKind::User] {
            let v = if p.path == x { 1.0 } else { 0.0 };
            gset(&path, with(l.clone(), "path", x.as_str()), v);
        }
        if let Some(k) = &p.kernel {
            set(&rx_frames, l.clone(), k.rx_frames);
            set(&rx_bytes, l.clone(), k.rx_bytes);
            set(&tx_frames, l.clone(), k.tx_frames);
            set(&tx_bytes, l.clone(), k.tx_bytes);
            set(&punted, l.clone(), k.punted_frames);
            set(&from_vnetd, l.clone(), k.from_vnetd_frames);
            set(&neigh_miss, l.clone(), k.neigh_miss);
            set(&encap_fail, l.clone(), k.encap_fail);
            set(&gro_passed, l, k.gro_passed);
        }
    }
    let Some(k) = &snap.stats.kernel else {
        return;
    };
    let info = b.gauge(
        "kernel_fastpath_info",
        "The kernel fast path's mode (kernel, off) while it is loaded (always 1).",
        None,
    );
    gset(&info, vec![("mode", k.mode.to_string())], 1.0);
    for (name, help, v) in [
        (
            "kernel_table_entries",
            "Entries in the fast path's forwarding table.",
            k.table_entries,
        ),
        (
            "kernel_table_size",
            "The fast path's forwarding table's capacity.",
            k.table_size,
        ),
        (
            "kernel_table_left_out",
            "Entries the full table could not take (their destinations go through vnetd).",
            k.table_left_out,
        ),
        (
            "kernel_matrix_size",
            "The fast path's traffic matrix capacity.",
            k.matrix_size,
        ),
    ] {
        b.gauge1(name, help, None, v as f64);
    }
    for (name, help, v) in [
        (
            "kernel_unknown_link_datagrams",
            "Underlay datagrams for no link of the fast path (left to vnetd).",
            k.unknown_link,
        ),
        (
            "kernel_not_vxlan_datagrams",
            "Underlay datagrams that were not VXLAN (left to vnetd).",
            k.not_vxlan,
        ),
        (
            "kernel_fib_fail",
            "Route lookups of the fast path that failed.",
            k.fib_fail,
        ),
        (
            "kernel_table_full",
            "Table insertions refused because the table was full.",
            k.table_full,
        ),
    ] {
        b.counter1(name, help, None, v);
    }
}

fn dispatch(b: &mut Builder, snap: &HostSnapshot) {
    let d = &snap.stats.dispatch;
    let mode = b.gauge(
        "dispatcher_mode",
        "1 for the mode the dispatcher thread runs in now (polling, guest-driven), 0 for the other.",
        None,
    );
    let switches = b.counter(
        "dispatcher_mode_switches",
        "Switches between polling and guest-driven (adaptive mode).",
        None,
    );
    let wakeups = b.counter("dispatcher_wakeups", "Times the dispatcher woke up.", None);
    let frames = b.counter("dispatcher_frames", "Frames the dispatcher read.", None);
    let sources = b.gauge(
        "dispatcher_descriptors",
        "Descriptors the dispatcher reads.",
        None,
    );
    let restarts = b.counter(
        "dispatcher_restarts",
        "Panics caught in the dispatcher's loop, each followed by a restart (a bug; see the log).",
        None,
    );
    for x in &d.dispatchers {
        let l = vec![("dispatcher", x.index.to_string())];
        for m in ["polling", "guest-driven"] {
            let v = if x.mode == m { 1.0 } else { 0.0 };
            gset(&mode, with(l.clone(), "mode", m), v);
        }
        set(&switches, l.clone(), x.switches);
        set(&wakeups, l.clone(), x.wakeups);
        set(&frames, l.clone(), x.frames);
        set(&restarts, l.clone(), x.restarts);
        gset(&sources, l, x.sources as f64);
    }
    let configured = b.gauge(
        "datapath_info",
        "The configured dispatch mode and yield strategy (always 1).",
        None,
    );
    gset(
        &configured,
        vec![
            ("mode", d.settings.mode.to_string()),
            ("yield", d.settings.yield_strategy.to_string()),
            ("dispatchers", d.settings.dispatchers.to_string()),
        ],
        1.0,
    );
    let o = &d.offload;
    for (name, help, v) in [
        (
            "offload_gso_frames",
            "Guest TSO frames cut into segments in software.",
            o.gso_frames,
        ),
        (
            "offload_gso_segments",
            "Segments those frames were cut into.",
            o.gso_segments,
        ),
        (
            "offload_udp_gso_sends",
            "sendmsg calls with UDP_SEGMENT.",
            o.udp_gso_sends,
        ),
        (
            "offload_udp_batch_sends",
            "sendmmsg calls.",
            o.udp_batch_sends,
        ),
        (
            "offload_gro_merged_segments",
            "Segments merged into larger frames for guests.",
            o.gro_merged,
        ),
        (
            "offload_gro_frames",
            "Frames those segments were merged into.",
            o.gro_frames,
        ),
        (
            "offload_checksums_completed",
            "Partial checksums vnet completed.",
            o.csum_completed,
        ),
        (
            "offload_partial_checksums",
            "Partial checksums passed on to a guest.",
            o.partial_csum,
        ),
        (
            "offload_tunnel_gso",
            "Kernel-peer datagrams carrying a whole TSO frame.",
            o.tunnel_gso,
        ),
    ] {
        b.counter1(name, help, None, v);
    }
}

fn vhost(b: &mut Builder, snap: &HostSnapshot) {
    let connected = b.gauge(
        "vhost_connected",
        "1 while a VMM is connected to the vhost-user interface.",
        None,
    );
    let qp = b.gauge(
        "vhost_queue_pairs_started",
        "Queue pairs the guest started.",
        None,
    );
    let c = |b: &mut Builder, name: &str, help: &str| b.counter(name, help, None);
    let conns = c(
        b,
        "vhost_connections",
        "VMM connections to the vhost-user socket.",
    );
    let perr = c(b, "vhost_protocol_errors", "vhost-user protocol errors.");
    let mfault = c(
        b,
        "vhost_memory_faults",
        "Frontends dropped for cutting guest memory short (SIGBUS survived).",
    );
    let bad = c(
        b,
        "vhost_bad_chains",
        "Descriptor chains refused as malformed.",
    );
    let frames = c(
        b,
        "vhost_frames",
        "Frames by direction (tx: from the guest) and path (cut_through, copied, direct, direct_fallback).",
    );
    let kicks = c(b, "vhost_kicks", "Transmit kicks from the guest.");
    let notes = c(
        b,
        "vhost_notifications",
        "Notifications sent to the guest, by direction.",
    );
    let early = c(
        b,
        "vhost_early_notifications",
        "Early receive notifications (optimistic).",
    );
    let masked = c(
        b,
        "vhost_early_notifications_masked",
        "Early notifications the guest had masked.",
    );
    let eob = c(
        b,
        "vhost_end_of_burst_notifications",
        "End-of-burst notifications sent.",
    );
    let skipped = c(
        b,
        "vhost_end_of_burst_skipped",
        "End-of-burst notifications skipped, by why (cold, hot).",
    );
    let nothing = c(
        b,
        "vhost_early_notifications_found_nothing",
        "Early notifications after which no frame arrived.",
    );
    for p in &snap.stats.ports {
        let Some(NicStatus::VhostUser(v)) = &p.nic else {
            continue;
        };
        let l = vec![("interface", p.name.clone())];
        gset(&connected, l.clone(), if v.connected { 1.0 } else { 0.0 });
        gset(&qp, l.clone(), v.queue_pairs_started as f64);
        set(&conns, l.clone(), v.connections);
        set(&perr, l.clone(), v.protocol_errors);
        set(&mfault, l.clone(), v.memory_faults);
        set(&bad, l.clone(), v.bad_chains);
        for (dir, path, n) in [
            ("tx", "cut_through", v.tx_cut_through),
            ("tx", "copied", v.tx_copied),
            ("rx", "cut_through", v.rx_cut_through),
            ("rx", "copied", v.rx_copied),
            ("rx", "direct", v.rx_direct),
            ("rx", "direct_fallback", v.rx_direct_fallback),
        ] {
            let ll = with(with(l.clone(), "direction", dir), "path", path);
            set(&frames, ll, n);
        }
        set(&kicks, l.clone(), v.kicks);
        set(
            &notes,
            with(l.clone(), "direction", "tx"),
            v.tx_notifications,
        );
        set(
            &notes,
            with(l.clone(), "direction", "rx"),
            v.rx_notifications,
        );
        set(&early, l.clone(), v.rx_early);
        set(&masked, l.clone(), v.rx_early_masked);
        set(&eob, l.clone(), v.rx_end_of_burst);
        set(&skipped, with(l.clone(), "why", "cold"), v.rx_skipped_cold);
        set(&skipped, with(l.clone(), "why", "hot"), v.rx_skipped_hot);
        set(&nothing, l, v.rx_early_found_nothing);
    }
}

fn agent(b: &mut Builder, snap: &HostSnapshot) {
    let Some(a) = &snap.agent else {
        return;
    };
    let s = &a.status;
    let info = b.gauge(
        "etcd_info",
        "The overlay and host id of this daemon's etcd agent (always 1).",
        None,
    );
    gset(
        &info,
        vec![
            ("overlay", s.overlay.clone()),
            ("host_id", s.host_id.clone()),
        ],
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

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_control::status::{
        DaemonCounters, DispatchStatus, DispatcherStatus, LinkStatus, OffloadStatus, PolicyStatus,
        PortRole, StatsReport,
    };
    use vnet_control::DataPathSettings;
    use vnet_core::PortCountersSnapshot;

    fn snapshot() -> HostSnapshot {
        let port = |kind, name: &str, rx: u64| PortStatus {
            kind,
            name: name.into(),
            vni: 7,
            path: DataPathKind::User,
            kernel: None,
            counters: PortCountersSnapshot {
                rx_frames: rx / 100,
                rx_bytes: rx,
                tx_frames: 1,
                tx_bytes: 60,
                drops: [("spoofed_src".to_string(), 3)].into_iter().collect(),
            },
            nic: None,
            policy: PolicyStatus {
                rate: None,
                any_source: None,
            },
        };
        HostSnapshot {
            stats: StatsReport {
                ports: vec![
                    port(PortRole::Interface, "vm1", 1000),
                    port(PortRole::Link, "to-b", 500),
                ],
                daemon: DaemonCounters {
                    rx_datagrams: 9,
                    rx_bytes: 900,
                    drops: Default::default(),
                    control_errors: 2,
                },
                dispatch: DispatchStatus {
                    settings: DataPathSettings::default(),
                    dispatchers: vec![DispatcherStatus {
                        index: 0,
                        mode: "guest-driven",
                        switches: 0,
                        wakeups: 4,
                        frames: 8,
                        frames_per_wakeup: 2.0,
                        sources: 3,
                        restarts: 2,
                    }],
                    offload: OffloadStatus::default(),
                    udp_gso: true,
                    udp_gro: true,
                },
                kernel: None,
            },
            links: vec![LinkStatus {
                name: "to-b".into(),
                kind: "udp",
                remote: Some("10.0.0.2:4789".into()),
                dev: None,
                vni: 7,
                state: LinkState::Up,
                rate: None,
                encrypted: None,
            }],
            interfaces: vec![],
            agent: None,
        }
    }

    #[test]
    fn the_exposition() {
        let http = HttpCounters::default();
        http.refuse(Refusal::Timeout);
        let text = render(
            &snapshot(),
            &http,
            &BuildInfo {
                version: "9.9".into(),
                start_time: 1.0,
            },
        );
        for want in [
            r#"vnet_build_info{version="9.9"} 1"#,
            r#"vnet_port_receive_bytes_total{role="interface",port="vm1",vni="7"} 1000"#,
            r#"vnet_port_receive_frames_total{role="link",port="to-b",vni="7"} 5"#,
            r#"vnet_port_drops_total{role="interface",port="vm1",vni="7",reason="spoofed_src"} 3"#,
            r#"vnet_port_drops_total{role="link",port="to-b",vni="7",reason="no_route"} 0"#,
            r#"vnet_link_state{link="to-b",state="up"} 1"#,
            r#"vnet_link_state{link="to-b",state="down"} 0"#,
            "vnet_udp_received_datagrams_total 9",
            "vnet_control_errors_total 2",
            r#"vnet_dispatcher_restarts_total{dispatcher="0"} 2"#,
            r#"vnet_http_refused_total{reason="timeout"} 1"#,
            r#"vnet_port_data_path{role="interface",port="vm1",vni="7",path="user"} 1"#,
            "# TYPE vnet_port_transmit_bytes counter",
            "# UNIT vnet_port_transmit_bytes bytes",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        assert!(!text.contains(".."), "a help text ends in two periods");
        // No etcd agent: no etcd metrics; no guest MAC anywhere.
        assert!(!text.contains("vnet_etcd_"));
        assert!(!text.contains("52:54"));
    }
}
