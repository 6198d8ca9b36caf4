//! The exposition of a fixed snapshot: names, labels, units, and what must never appear.

use super::*;
use vnet_control::status::{
    DaemonCounters, DataPathKind, DispatchStatus, DispatcherStatus, LinkState, LinkStatus,
    OffloadStatus, PolicyStatus, PortRole, PortStatus, StateStatus, StatsReport,
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
            state: StateStatus {
                failing: true,
                unsaved: false,
                errors: 4,
                last_error: Some("appending to the journal: No space left on device".into()),
                pending_routes: 3,
                control_without_token: true,
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
            reach: None,
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
        "vnet_state_saving 0",
        "vnet_state_unsaved 0",
        "vnet_state_write_errors_total 4",
        "vnet_state_pending_routes 3",
        "vnet_control_token_required 0",
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
    // No encrypted link: no crypto family at all, not even its help text.
    assert!(!text.contains("vnet_crypto_"));
    assert!(!text.contains("52:54"));
}

/// A host of `links` links and as many guests, for the size of the exposition.
fn host_with_links(links: usize) -> HostSnapshot {
    let mut snap = snapshot();
    let template = snap.stats.ports[1].clone();
    let link = snap.links[0].clone();
    snap.stats.ports.clear();
    snap.links.clear();
    for i in 0..links {
        let mut p = template.clone();
        p.name = format!("c-h{i:05}-v1");
        p.kind = PortRole::Link;
        snap.stats.ports.push(p.clone());
        p.name = format!("vm{i}");
        p.kind = PortRole::Interface;
        snap.stats.ports.push(p);
        let mut l = link.clone();
        l.name = format!("c-h{i:05}-v1");
        snap.links.push(l);
    }
    snap
}

#[test]
fn every_series_once_in_the_order_set() {
    let text = render(
        &host_with_links(3),
        &HttpCounters::default(),
        &BuildInfo {
            version: "9.9".into(),
            start_time: 1.0,
        },
    );
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').map_or(l, |(series, _)| series))
        .collect();
    let unique: std::collections::BTreeSet<&&str> = samples.iter().collect();
    assert_eq!(unique.len(), samples.len(), "a series appears twice");
    let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} missing"));
    assert!(
        at(r#"vnet_link_state{link="c-h00000-v1",state="up"}"#)
            < at(r#"vnet_link_state{link="c-h00002-v1",state="up"}"#)
    );
}

/// `cargo test --release -p vnet-http -- --ignored --nocapture render_time`: how long a scrape
/// of 1,000 links and 1,000 guests takes to render (median of 15).
#[test]
#[ignore]
fn render_time() {
    let snap = host_with_links(1000);
    let http = HttpCounters::default();
    let info = BuildInfo {
        version: "9.9".into(),
        start_time: 1.0,
    };
    let mut times = Vec::new();
    let mut len = 0;
    for _ in 0..15 {
        let t = std::time::Instant::now();
        len = render(&snap, &http, &info).len();
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "render of 1,000 links: {:?} median ({:?}-{:?}), {len} bytes",
        times[7], times[0], times[14]
    );
}

/// Every part of the exposition present: a kernel fast path, an encrypted link, a rate, a
/// vhost-user interface, the etcd agent, and a label value with characters to escape.
fn rich_snapshot() -> HostSnapshot {
    use crate::source::AgentSnapshot;
    use vnet_control::status::{
        ClusterStatus, CryptoStatus, KernelPathStatus, KernelPortStatus, NicStatus, RateStatus,
        VhostUserStatus,
    };
    let mut snap = host_with_links(2);
    snap.stats.ports[0].path = DataPathKind::Kernel;
    snap.stats.ports[0].kernel = Some(KernelPortStatus {
        rx_frames: 11,
        rx_bytes: 1_100,
        tx_frames: 12,
        tx_bytes: 1_200,
        punted_frames: 1,
        ..Default::default()
    });
    snap.stats.ports[1].policy.rate = Some(RateStatus {
        mbit: 100,
        burst_kb: 64,
        available_bytes: -1_500,
    });
    snap.stats.ports[3].nic = Some(NicStatus::VhostUser(VhostUserStatus {
        connected: true,
        connections: 2,
        queue_pairs_started: 1,
        rx_backlog: 3,
        tx_cut_through: 40,
        rx_direct: 5,
        rx_skipped_hot: 6,
        ..Default::default()
    }));
    snap.stats.kernel = Some(KernelPathStatus {
        mode: vnet_control::FastPathMode::Kernel,
        table_entries: 4,
        table_size: 65_536,
        table_left_out: 0,
        matrix_size: 4_096,
        unknown_link: 7,
        not_vxlan: 8,
        fib_fail: 0,
        vni_mismatch: 0,
        table_full: 0,
    });
    snap.links[1].encrypted = Some(CryptoStatus {
        peer_key: "k".into(),
        session: "established",
        session_age_ms: Some(1_250),
        session_sent: Some(3),
        session_received: Some(4),
        sealed: 30,
        opened: 31,
        initiations_sent: 1,
        responses_sent: 0,
        handshakes_received: 1,
        handshakes_completed: 1,
        rekeys: 0,
        initiations_replayed: 0,
        initiations_throttled: 0,
        bad_handshakes: 2,
    });
    snap.agent = Some(AgentSnapshot {
        status: ClusterStatus {
            overlay: "lab \"one\"\\\n".into(),
            host_id: "h1".into(),
            connected: true,
            revision: 42,
            hosts: 1_000,
            sessions: 2,
            ..Default::default()
        },
        last_sync_age: Some(std::time::Duration::from_millis(2_500)),
    });
    snap
}

#[test]
fn the_whole_exposition_is_as_prometheus_client_wrote_it() {
    let http = HttpCounters::default();
    http.refuse(Refusal::Timeout);
    let text = render(
        &rich_snapshot(),
        &http,
        &BuildInfo {
            version: "9.9".into(),
            start_time: 1_700_000_000.5,
        },
    );
    if std::env::var_os("VNET_WRITE_GOLDEN").is_some() {
        let _ = std::fs::write("src/metrics/golden.txt", &text);
    }
    assert_eq!(text, include_str!("golden.txt"));
}
