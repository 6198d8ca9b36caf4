//! The exposition of a fixed snapshot: names, labels, units, and what must never appear.

use super::*;
use vnet_control::status::{
    DaemonCounters, DataPathKind, DispatchStatus, DispatcherStatus, LinkState, LinkStatus,
    OffloadStatus, PolicyStatus, PortRole, PortStatus, StatsReport,
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
