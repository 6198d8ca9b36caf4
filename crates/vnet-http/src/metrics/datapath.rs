//! The data path under the ports: the links (state, kind, an encrypted link's sessions), the
//! kernel fast path, the dispatcher threads and offloads, and the vhost-user devices.

use vnet_control::status::{CryptoStatus, DataPathKind, KernelPortStatus, LinkState, NicStatus};

use super::builder::{port_labels, Builder, Field, FieldCounters, Labels, Unit};
use crate::source::HostSnapshot;

/// An encrypted link's counters, by its [`CryptoStatus`] field.
const CRYPTO: &[Field<CryptoStatus>] = &[
    (
        "crypto_sealed_datagrams",
        "Datagrams sealed for an encrypted link.",
        None,
        |e| e.sealed,
    ),
    (
        "crypto_opened_datagrams",
        "Datagrams of an encrypted link that authenticated.",
        None,
        |e| e.opened,
    ),
    (
        "crypto_initiations_sent",
        "Handshake initiations sent.",
        None,
        |e| e.initiations_sent,
    ),
    (
        "crypto_responses_sent",
        "Handshake responses sent.",
        None,
        |e| e.responses_sent,
    ),
    (
        "crypto_handshake_messages_received",
        "Handshake messages received.",
        None,
        |e| e.handshakes_received,
    ),
    (
        "crypto_handshakes_completed",
        "Handshakes that gave a session.",
        None,
        |e| e.handshakes_completed,
    ),
    (
        "crypto_rekeys",
        "Sessions replaced by a new handshake.",
        None,
        |e| e.rekeys,
    ),
    (
        "crypto_initiations_replayed",
        "Handshake initiations refused as replays.",
        None,
        |e| e.initiations_replayed,
    ),
    (
        "crypto_initiations_throttled",
        "Handshake initiations refused unread by the link's budget.",
        None,
        |e| e.initiations_throttled,
    ),
    (
        "crypto_bad_handshakes",
        "Malformed or unexpected handshake messages.",
        None,
        |e| e.bad_handshakes,
    ),
];

/// The kernel's share of a port's counters, by its [`KernelPortStatus`] field.
const KERNEL_PORT: &[Field<KernelPortStatus>] = &[
    ("kernel_port_receive_frames", "Frames the kernel fast path received from the port (included in vnet_port_receive_frames_total).", None, |k| k.rx_frames),
    ("kernel_port_receive", "Bytes the kernel fast path received from the port.", Some(Unit::Bytes), |k| k.rx_bytes),
    ("kernel_port_transmit_frames", "Frames the kernel fast path sent to the port.", None, |k| k.tx_frames),
    ("kernel_port_transmit", "Bytes the kernel fast path sent to the port.", Some(Unit::Bytes), |k| k.tx_bytes),
    ("kernel_port_punted_frames", "Frames the kernel handed to vnetd.", None, |k| k.punted_frames),
    ("kernel_port_from_vnetd_frames", "Frames vnetd sent to the guest through the kernel.", None, |k| k.from_vnetd_frames),
    ("kernel_port_neigh_miss_frames", "Frames to a link whose next hop was not resolved yet (sent by vnetd instead).", None, |k| k.neigh_miss),
    ("kernel_port_encap_fail_frames", "Frames the kernel could not encapsulate (sent by vnetd instead).", None, |k| k.encap_fail),
    ("kernel_port_gro_passed_datagrams", "Merged UDP datagrams from the underlay passed on to vnetd's socket.", None, |k| k.gro_passed),
];

pub(super) fn links(b: &mut Builder, snap: &HostSnapshot) {
    let state = b.gauge(
        "link_state",
        "1 for the link's current state (up, connecting, down), 0 for the others.",
        None,
    );
    let info = b.gauge("link_info", "A link's kind, peer and VNI (always 1).", None);
    let crypto = FieldCounters::new(b, CRYPTO);
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
    let states = [LinkState::Up, LinkState::Connecting, LinkState::Down]
        .map(|s| (s, Labels::of("state", s.as_str())));
    for l in &snap.links {
        let ll = Labels::of("link", &l.name);
        for (s, labels) in &states {
            let v = if l.state == *s { 1.0 } else { 0.0 };
            state.set_with(&ll, labels, v);
        }
        info.set(
            &ll.clone()
                .with("kind", l.kind)
                .with("peer", l.peer())
                .with("vni", itoa::Buffer::new().format(l.vni))
                .with(
                    "encrypted",
                    if l.encrypted.is_some() {
                        "true"
                    } else {
                        "false"
                    },
                ),
            1.0,
        );
        if let Some(e) = &l.encrypted {
            crypto.set(&ll, e);
            session.set(&ll, if e.session_age_ms.is_some() { 1.0 } else { 0.0 });
            if let Some(ms) = e.session_age_ms {
                age.set(&ll, ms as f64 / 1000.0);
            }
        }
    }
}

/// The kernel fast path: which path serves each port, the kernel's share of its counters
/// (already included in the port's), and the fast path's table and refusals.
pub(super) fn kernel(b: &mut Builder, snap: &HostSnapshot) {
    let path = b.gauge(
        "port_data_path",
        "1 for the data path that serves the port (kernel: the eBPF fast path; user: vnetd), 0 for the other.",
        None,
    );
    let counters = FieldCounters::new(b, KERNEL_PORT);
    let paths =
        [DataPathKind::Kernel, DataPathKind::User].map(|x| (x, Labels::of("path", x.as_str())));
    for p in &snap.stats.ports {
        let l = port_labels(p);
        for (x, labels) in &paths {
            let v = if p.path == *x { 1.0 } else { 0.0 };
            path.set_with(&l, labels, v);
        }
        if let Some(k) = &p.kernel {
            counters.set(&l, k);
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
    info.set(&Labels::of("mode", &k.mode.to_string()), 1.0);
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

pub(super) fn dispatch(b: &mut Builder, snap: &HostSnapshot) {
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
        let l = Labels::of("dispatcher", itoa::Buffer::new().format(x.index));
        for m in ["polling", "guest-driven"] {
            let v = if x.mode == m { 1.0 } else { 0.0 };
            mode.set_with(&l, &Labels::of("mode", m), v);
        }
        switches.set(&l, x.switches);
        wakeups.set(&l, x.wakeups);
        frames.set(&l, x.frames);
        restarts.set(&l, x.restarts);
        sources.set(&l, x.sources as f64);
    }
    let configured = b.gauge(
        "datapath_info",
        "The configured dispatch mode and yield strategy (always 1).",
        None,
    );
    configured.set(
        &Labels::of("mode", &d.settings.mode.to_string())
            .with("yield", &d.settings.yield_strategy.to_string())
            .with("dispatchers", &d.settings.dispatchers.to_string()),
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

pub(super) fn vhost(b: &mut Builder, snap: &HostSnapshot) {
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
    let backlog = b.gauge(
        "vhost_rx_backlog_frames",
        "Frames waiting for the guest's receive buffers.",
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
        let l = Labels::of("interface", &p.name);
        connected.set(&l, if v.connected { 1.0 } else { 0.0 });
        qp.set(&l, v.queue_pairs_started as f64);
        backlog.set(&l, v.rx_backlog as f64);
        conns.set(&l, v.connections);
        perr.set(&l, v.protocol_errors);
        mfault.set(&l, v.memory_faults);
        bad.set(&l, v.bad_chains);
        for (dir, path, n) in [
            ("tx", "cut_through", v.tx_cut_through),
            ("tx", "copied", v.tx_copied),
            ("rx", "cut_through", v.rx_cut_through),
            ("rx", "copied", v.rx_copied),
            ("rx", "direct", v.rx_direct),
            ("rx", "direct_fallback", v.rx_direct_fallback),
        ] {
            frames.set(&l.clone().with("direction", dir).with("path", path), n);
        }
        kicks.set(&l, v.kicks);
        notes.set_with(&l, &Labels::of("direction", "tx"), v.tx_notifications);
        notes.set_with(&l, &Labels::of("direction", "rx"), v.rx_notifications);
        early.set(&l, v.rx_early);
        masked.set(&l, v.rx_early_masked);
        eob.set(&l, v.rx_end_of_burst);
        skipped.set_with(&l, &Labels::of("why", "cold"), v.rx_skipped_cold);
        skipped.set_with(&l, &Labels::of("why", "hot"), v.rx_skipped_hot);
        nothing.set(&l, v.rx_early_found_nothing);
    }
}
