//! The text form of `show`: every table and summary line, as the `Display` of the typed
//! status. Byte for byte what the control port has always printed (scripts, tests and people
//! parse it): the tests below pin the rendering of a fixed status.

use std::collections::BTreeMap;
use std::fmt::{self, Display, Formatter};

use super::Col::{Left as L, Rest, Right as R};
use super::{
    ClusterReport, Columns, InterfaceTable, LinkReach, LinkTable, ListenerTable, MatrixReport,
    RouteTable, StatsReport,
};
use crate::command::RateLimit;

/// A port's policy in the text tables: `any-source`, `rate M burst K`, or `-`.
fn policy_text(any_source: bool, rate: Option<&RateLimit>) -> String {
    let mut parts = Vec::new();
    if any_source {
        parts.push("any-source".to_string());
    }
    if let Some(r) = rate {
        parts.push(r.to_string());
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(" ")
    }
}

/// Drop counters as `reason=n ...`, or `-`.
fn drops_text(d: &BTreeMap<String, u64>) -> String {
    if d.is_empty() {
        "-".to_string()
    } else {
        d.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Display for InterfaceTable {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        const T: Columns = Columns(&[L(16), L(10), L(15), L(17), R(5), L(16), R(8), L(6), Rest]);
        T.row(
            f,
            &[
                &"NAME", &"TYPE", &"IFNAME", &"MAC", &"MTU", &"NETNS", &"VNI", &"PATH", &"POLICY",
            ],
        )?;
        for row in &self.0 {
            let i = &row.interface;
            let path = row.path.map(|p| p.as_str()).unwrap_or("-");
            let mtu = if i.mtu == 0 {
                "-".to_string()
            } else {
                i.mtu.to_string()
            };
            T.row(
                f,
                &[
                    &i.name,
                    &i.kind,
                    &i.ifname,
                    &i.mac.to_string(),
                    &mtu,
                    &i.netns.as_deref().unwrap_or("-"),
                    &i.vni,
                    &path,
                    &policy_text(i.any_source, i.rate.as_ref()),
                ],
            )?;
        }
        Ok(())
    }
}

impl Display for LinkTable {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        const T: Columns = Columns(&[L(16), L(10), L(28), R(8), L(10), L(16), Rest]);
        T.row(
            f,
            &[
                &"NAME",
                &"TYPE",
                &"REMOTE/DEVICE",
                &"VNI",
                &"STATE",
                &"PATH/MTU",
                &"POLICY",
            ],
        )?;
        for r in &self.0 {
            // An encrypted link says so beside its state ("up+enc").
            let state = format!(
                "{}{}",
                r.state.as_str(),
                if r.encrypted.is_some() { "+enc" } else { "" }
            );
            T.row(
                f,
                &[
                    &r.name,
                    &r.kind,
                    &r.peer(),
                    &r.vni,
                    &state,
                    &r.reach.as_ref().map_or("-".to_string(), LinkReach::column),
                    &policy_text(false, r.rate.as_ref()),
                ],
            )?;
        }
        Ok(())
    }
}

impl Display for RouteTable {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        const T: Columns = Columns(&[L(24), L(24), L(28), R(8)]);
        T.row(f, &[&"SOURCE", &"DESTINATION", &"TO", &"VNI"])?;
        for r in &self.0 {
            T.row(
                f,
                &[&r.src, &r.dst, &format!("{} {}", r.to, r.name), &r.vni],
            )?;
        }
        Ok(())
    }
}

impl Display for ListenerTable {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for a in &self.0 {
            writeln!(f, "tcp {a}")?;
        }
        Ok(())
    }
}

impl Display for MatrixReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        const T: Columns = Columns(&[R(8), L(17), L(17), R(12), R(14)]);
        T.row(f, &[&"VNI", &"SOURCE", &"DESTINATION", &"FRAMES", &"BYTES"])?;
        for p in &self.pairs {
            T.row(
                f,
                &[
                    &p.vni,
                    &p.src.to_string(),
                    &p.dst.to_string(),
                    &p.frames,
                    &p.bytes,
                ],
            )?;
        }
        if self.overflow > 0 {
            writeln!(
                f,
                "({} frames of pairs beyond the table's capacity)",
                self.overflow
            )?;
        }
        Ok(())
    }
}

impl Display for ClusterReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match &self.agent {
            None => f.write_str("no etcd agent (vnetd runs without --etcd)\n")?,
            Some(s) => {
                let policy = s
                    .policy
                    .get("template")
                    .and_then(|t| t.as_str())
                    .map(String::from)
                    .unwrap_or_else(|| s.policy.to_string());
                let lease = s.lease.as_deref().unwrap_or("-");
                writeln!(f, "overlay: {}", s.overlay)?;
                writeln!(f, "host_id: {}", s.host_id)?;
                writeln!(f, "connected: {}", s.connected)?;
                writeln!(f, "endpoints: {}", s.endpoints)?;
                writeln!(f, "lease: {lease}")?;
                writeln!(f, "revision: {}", s.revision)?;
                writeln!(f, "policy: {policy}")?;
                writeln!(
                    f,
                    "hosts: {}, interfaces: {}, operator routes: {}",
                    s.hosts, s.interfaces, s.operator_routes
                )?;
                writeln!(
                    f,
                    "sessions: {}, syncs: {}, events: {}, bad entries: {}, announcements: {}",
                    s.sessions, s.syncs, s.events, s.bad_entries, s.announcements
                )?;
                if s.host_id_in_use {
                    f.write_str("host_id_in_use: true (another daemon holds this host id)\n")?;
                }
                if !s.last_error.is_empty() {
                    writeln!(f, "last_error: {}", s.last_error)?;
                }
                for c in &s.conflicts {
                    writeln!(f, "conflict: {c}")?;
                }
                for c in &s.failed {
                    writeln!(f, "not applied: {c}")?;
                }
            }
        }
        writeln!(f, "derived ({} lines):", self.derived.len())?;
        for l in &self.derived {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

impl Display for StatsReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let r = self;
        writeln!(
            f,
            "{:<9} {:<16} {:>8} {:>12} {:>14} {:>12} {:>14}  DROPS",
            "KIND", "NAME", "VNI", "RX FRAMES", "RX BYTES", "TX FRAMES", "TX BYTES"
        )?;
        for p in &r.ports {
            writeln!(
                f,
                "{:<9} {:<16} {:>8} {:>12} {:>14} {:>12} {:>14}  {}",
                p.kind.as_str(),
                p.name,
                p.vni,
                p.counters.rx_frames,
                p.counters.rx_bytes,
                p.counters.tx_frames,
                p.counters.tx_bytes,
                drops_text(&p.counters.drops)
            )?;
        }
        if let Some(k) = &r.kernel {
            writeln!(
                f,
                "kernel fast path: {}; forwarding map {}/{} entries{}; {} datagrams from unknown links passed to vnetd",
                k.mode,
                k.table_entries,
                k.table_size,
                if k.table_left_out > 0 {
                    format!(" ({} left out: map full)", k.table_left_out)
                } else {
                    String::new()
                },
                k.unknown_link
            )?;
            for p in r.ports.iter().filter(|p| p.kernel.is_some()) {
                if let Some(kp) = &p.kernel {
                    writeln!(
                        f,
                        "  {} {}: kernel forwarded {} frames in, {} out; {} handed to vnetd, {} from vnetd",
                        p.kind.as_str(),
                        p.name,
                        kp.rx_frames,
                        kp.tx_frames,
                        kp.punted_frames,
                        kp.from_vnetd_frames
                    )?;
                }
            }
        }
        writeln!(
            f,
            "daemon: {} datagrams received; drops: {}; control errors: {}",
            r.daemon.rx_datagrams,
            drops_text(&r.daemon.drops),
            r.daemon.control_errors
        )?;
        let st = &r.state;
        match (&st.last_error, st.failing || st.unsaved) {
            (Some(e), true) => writeln!(
                f,
                "state: NOT BEING SAVED{}: {e} ({} failed writes); a change is refused until the state directory can be written",
                if st.unsaved {
                    " (the running configuration has changes a restart would lose)"
                } else {
                    ""
                },
                st.errors
            )?,
            (_, true) => writeln!(f, "state: NOT BEING SAVED ({} failed writes)", st.errors)?,
            (_, false) if st.errors > 0 => {
                writeln!(f, "state: saved ({} failed writes before)", st.errors)?
            }
            (_, false) => writeln!(f, "state: saved")?,
        }
        if st.pending_routes > 0 {
            writeln!(
                f,
                "pending: {} routes wait for their link (show config)",
                st.pending_routes
            )?;
        }
        if st.control_without_token {
            writeln!(
                f,
                "control: no token: every local user controls this daemon (give vnetd --token-file)"
            )?;
        }
        let d = &r.dispatch;
        let s = &d.settings;
        let onoff = |v: bool| if v { "on" } else { "off" };
        writeln!(
            f,
            "data path: mode {} ({} dispatchers, yield {}, T_sleep {} us, T_nowork {} us, adaptive {}..{} pkt/s over {} ms); UDP GSO {}, GRO {}",
            s.mode,
            s.dispatchers,
            s.yield_strategy,
            s.yield_sleep_us,
            s.yield_nowork_us,
            s.adaptive_low,
            s.adaptive_high,
            s.adaptive_window_ms,
            onoff(d.udp_gso),
            onoff(d.udp_gro),
        )?;
        for x in &d.dispatchers {
            writeln!(
                f,
                "  dispatcher {}: now {}, {} switches, {} wake-ups, {} frames, {} frames per wake-up, {} descriptors, {} restarts",
                x.index, x.mode, x.switches, x.wakeups, x.frames, x.frames_per_wakeup, x.sources, x.restarts
            )?;
        }
        let o = &d.offload;
        writeln!(
            f,
            "  offload: {} guest frames cut into {} segments ({} UDP_SEGMENT sends, {} sendmmsg calls); {} segments merged into {} frames for guests; {} checksums completed, {} partial ones passed on",
            o.gso_frames,
            o.gso_segments,
            o.udp_gso_sends,
            o.udp_batch_sends,
            o.gro_merged,
            o.gro_frames,
            o.csum_completed,
            o.partial_csum
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use vnet_core::{MatrixEntry, PortCountersSnapshot};
    use vnet_wire::MacAddr;

    use super::super::*;
    use crate::command::FastPathMode;
    use crate::{parse_line, Config};

    /// A configuration with one of everything `show` prints.
    fn config() -> Config {
        let mut cfg = Config::default();
        let mut n = 0u8;
        let mut gen = || {
            n += 1;
            MacAddr([2, 0, 0, 0, 0, n])
        };
        for line in [
            "interface add vm1 tap mac 52:54:00:00:00:01 vni 5",
            "interface add c1 veth netns ns1 mtu 1450 any-source rate 100 burst 64",
            "interface add vm2 netdev tap-vm2 vni 7 rate 10",
            "link add up udp 10.0.0.2 vni 5 rate 50",
            "link add t1 tcp 10.0.0.3:7000",
            "link add d1 direct eth1 vni 7",
            "route add any 52:54:00:00:00:09 link up",
            "route add 52:54:00:00:00:01 broadcast interface c1",
            "listen tcp 0.0.0.0:7000",
            "listen tcp [::1]:7001",
        ] {
            let cmd = parse_line(line).expect(line).expect(line);
            cfg.apply(&cmd, &mut gen).expect(line);
        }
        cfg
    }

    fn interfaces(cfg: &Config) -> InterfaceTable {
        let paths = [Some(DataPathKind::User), Some(DataPathKind::Kernel), None];
        InterfaceTable(
            cfg.interfaces
                .iter()
                .zip(paths)
                .map(|(i, path)| InterfaceStatus {
                    interface: i.clone(),
                    path,
                })
                .collect(),
        )
    }

    fn crypto() -> CryptoStatus {
        CryptoStatus {
            peer_key: "k".into(),
            session: "established",
            session_age_ms: Some(1),
            session_sent: None,
            session_received: None,
            sealed: 1,
            opened: 2,
            initiations_sent: 3,
            responses_sent: 4,
            handshakes_received: 5,
            handshakes_completed: 6,
            rekeys: 7,
            initiations_replayed: 8,
            initiations_throttled: 9,
            bad_handshakes: 10,
        }
    }

    fn links(cfg: &Config) -> LinkTable {
        let states = [LinkState::Up, LinkState::Connecting, LinkState::Down];
        LinkTable(
            cfg.links
                .iter()
                .zip(states)
                .map(|(l, state)| {
                    let rate = cfg.link_rates.get(&l.name).copied();
                    // The encrypted udp link is a reach link too, punched on a 1400-byte path.
                    let reach = (l.name == "up").then(|| LinkReach {
                        path: "punched".into(),
                        to: Some("203.0.113.7:4789".into()),
                        mtu: Some(1400),
                    });
                    LinkStatus::new(l, state, rate, (l.name == "up").then(crypto)).with_reach(reach)
                })
                .collect(),
        )
    }

    fn routes(cfg: &Config) -> RouteTable {
        RouteTable(
            cfg.routes
                .iter()
                .map(|r| RouteStatus::new(r, cfg))
                .collect(),
        )
    }

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    fn matrix(overflow: u64) -> MatrixReport {
        MatrixReport {
            pairs: vec![
                MatrixEntry {
                    vni: 5,
                    src: mac(1),
                    dst: mac(2),
                    frames: 10,
                    bytes: 15_000,
                },
                MatrixEntry {
                    vni: 16_777_215,
                    src: mac(3),
                    dst: MacAddr([0xff; 6]),
                    frames: u64::MAX,
                    bytes: u64::MAX,
                },
            ],
            overflow,
        }
    }

    fn cluster(agent: bool) -> ClusterReport {
        ClusterReport {
            agent: agent.then(|| ClusterStatus {
                overlay: "lab".into(),
                host_id: "a".into(),
                connected: true,
                endpoints: "http://127.0.0.1:2379,http://127.0.0.2:2379".into(),
                lease: Some("694d7c2b1a2c3d4e".into()),
                revision: 42,
                policy: serde_json::json!({"template": "star", "proxy": "hub"}),
                hosts: 3,
                interfaces: 7,
                operator_routes: 1,
                sessions: 2,
                syncs: 9,
                events: 30,
                bad_entries: 1,
                announcements: 4,
                last_error: "etcd: timed out".into(),
                conflicts: vec!["link c-b-v1 skipped: a local link has its name".into()],
                failed: vec!["route add any 52:54:00:00:00:09 link c-b-v1: no such link".into()],
                host_id_in_use: true,
            }),
            derived: vec![
                "link add c-b-v1 udp 10.0.0.2:4789 vni 1".into(),
                "route add any 52:54:00:00:0b:01 link c-b-v1".into(),
            ],
        }
    }

    fn counters(base: u64, drops: &[(&str, u64)]) -> PortCountersSnapshot {
        PortCountersSnapshot {
            rx_frames: base,
            rx_bytes: base * 1000,
            tx_frames: base + 1,
            tx_bytes: (base + 1) * 1000,
            drops: drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn stats(kernel: bool) -> StatsReport {
        let policy = PolicyStatus {
            rate: None,
            any_source: None,
        };
        StatsReport {
            ports: vec![
                PortStatus {
                    kind: PortRole::Interface,
                    name: "vm1".into(),
                    vni: 5,
                    path: DataPathKind::Kernel,
                    counters: counters(12, &[("spoofed_src", 2), ("rate_limited", 1)]),
                    kernel: kernel.then(|| KernelPortStatus {
                        rx_frames: 5,
                        tx_frames: 6,
                        punted_frames: 7,
                        from_vnetd_frames: 8,
                        ..KernelPortStatus::default()
                    }),
                    nic: None,
                    policy: policy.clone(),
                },
                PortStatus {
                    kind: PortRole::Link,
                    name: "up".into(),
                    vni: 5,
                    path: DataPathKind::User,
                    counters: counters(0, &[]),
                    kernel: None,
                    nic: None,
                    policy,
                },
            ],
            daemon: DaemonCounters {
                rx_datagrams: 100,
                rx_bytes: 150_000,
                drops: BTreeMap::from([("unknown_peer".to_string(), 3)]),
                control_errors: 1,
            },
            state: StateStatus::default(),
            dispatch: DispatchStatus {
                settings: DataPathSettings::default(),
                dispatchers: vec![
                    DispatcherStatus {
                        index: 0,
                        mode: "polling",
                        switches: 1,
                        wakeups: 3,
                        frames: 10,
                        frames_per_wakeup: 3.33,
                        sources: 2,
                        restarts: 0,
                    },
                    DispatcherStatus {
                        index: 1,
                        mode: "guest-driven",
                        switches: 0,
                        wakeups: 0,
                        frames: 0,
                        frames_per_wakeup: 0.0,
                        sources: 1,
                        restarts: 2,
                    },
                ],
                offload: OffloadStatus {
                    gso_frames: 1,
                    gso_segments: 2,
                    udp_gso_sends: 3,
                    udp_batch_sends: 4,
                    gro_merged: 5,
                    gro_frames: 6,
                    partial_csum: 7,
                    csum_completed: 8,
                    tunnel_gso: 9,
                },
                udp_gso: true,
                udp_gro: false,
            },
            kernel: kernel.then_some(KernelPathStatus {
                mode: FastPathMode::Kernel,
                table_entries: 10,
                table_size: 4096,
                table_left_out: 2,
                matrix_size: 0,
                unknown_link: 4,
                not_vxlan: 0,
                fib_fail: 0,
                vni_mismatch: 0,
                table_full: 0,
            }),
        }
    }

    // What the control port printed for the status above before the rendering moved here from
    // vnetd (checked against that code when it moved): scripts and tests parse these.
    const INTERFACES: &str = r#"NAME             TYPE       IFNAME          MAC                 MTU NETNS                 VNI PATH   POLICY
vm1              tap        vn-vm1          52:54:00:00:00:01  1500 -                       5 user   -
c1               veth       vn-c1           02:00:00:00:00:01  1450 ns1                     1 kernel any-source rate 100 burst 64
vm2              netdev     tap-vm2         02:00:00:00:00:02     - -                       7 -      rate 10 burst 1024
"#;
    const INTERFACES_JSON: &str = r#"[{"any_source":false,"client":false,"ifname":"vn-vm1","kind":"tap","mac":"52:54:00:00:00:01","mtu":1500,"name":"vm1","netns":null,"offload":true,"path":"user","queues":1,"rate":null,"socket":null,"vni":5},{"any_source":true,"client":false,"ifname":"vn-c1","kind":"veth","mac":"02:00:00:00:00:01","mtu":1450,"name":"c1","netns":"ns1","offload":true,"path":"kernel","queues":1,"rate":{"burst_kb":64,"mbit":100},"socket":null,"vni":1},{"any_source":false,"client":false,"ifname":"tap-vm2","kind":"netdev","mac":"02:00:00:00:00:02","mtu":0,"name":"vm2","netns":null,"offload":true,"queues":1,"rate":{"burst_kb":1024,"mbit":10},"socket":null,"vni":7}]"#;
    // PATH/MTU came with issue #31 (a reach link's path and its MTU), before POLICY.
    const LINKS: &str = r#"NAME             TYPE       REMOTE/DEVICE                     VNI STATE      PATH/MTU         POLICY
up               udp        10.0.0.2:4789                       5 up+enc     punched 1400     rate 50 burst 1024
t1               tcp        10.0.0.3:7000                       1 connecting -                -
d1               direct     eth1                                7 down       -                -
"#;
    const ROUTES: &str = r#"SOURCE                   DESTINATION              TO                                VNI
any                      52:54:00:00:00:09        link up                             5
52:54:00:00:00:01        broadcast                interface c1                        1
"#;
    const LISTENERS: &str = r#"tcp 0.0.0.0:7000
tcp [::1]:7001
"#;
    const LISTENERS_JSON: &str = r#"["tcp 0.0.0.0:7000","tcp [::1]:7001"]"#;
    const MATRIX: &str = r#"     VNI SOURCE            DESTINATION             FRAMES          BYTES
       5 52:54:00:00:00:01 52:54:00:00:00:02           10          15000
16777215 52:54:00:00:00:03 ff:ff:ff:ff:ff:ff 18446744073709551615 18446744073709551615
"#;
    const CLUSTER_AGENT: &str = r#"overlay: lab
host_id: a
connected: true
endpoints: http://127.0.0.1:2379,http://127.0.0.2:2379
lease: 694d7c2b1a2c3d4e
revision: 42
policy: star
hosts: 3, interfaces: 7, operator routes: 1
sessions: 2, syncs: 9, events: 30, bad entries: 1, announcements: 4
host_id_in_use: true (another daemon holds this host id)
last_error: etcd: timed out
conflict: link c-b-v1 skipped: a local link has its name
not applied: route add any 52:54:00:00:00:09 link c-b-v1: no such link
"#;
    // What `show cluster` prints after the agent's part, with or without an agent.
    const CLUSTER_DERIVED: &str = r#"derived (2 lines):
  link add c-b-v1 udp 10.0.0.2:4789 vni 1
  route add any 52:54:00:00:0b:01 link c-b-v1
"#;
    const NO_AGENT: &str = "no etcd agent (vnetd runs without --etcd)\n";
    // `show stats` is the ports, the kernel fast path's lines (when it is loaded), the rest.
    const STATS_PORTS: &str = r#"KIND      NAME                  VNI    RX FRAMES       RX BYTES    TX FRAMES       TX BYTES  DROPS
interface vm1                     5           12          12000           13          13000  rate_limited=1 spoofed_src=2
link      up                      5            0              0            1           1000  -
"#;
    const STATS_KERNEL: &str = r#"kernel fast path: kernel; forwarding map 10/4096 entries (2 left out: map full); 4 datagrams from unknown links passed to vnetd
  interface vm1: kernel forwarded 5 frames in, 6 out; 7 handed to vnetd, 8 from vnetd
"#;
    const STATS_REST: &str = r#"daemon: 100 datagrams received; drops: unknown_peer=3; control errors: 1
state: saved
data path: mode adaptive (1 dispatchers, yield immediate, T_sleep 50 us, T_nowork 1000 us, adaptive 1000..10000 pkt/s over 5 ms); UDP GSO on, GRO off
  dispatcher 0: now polling, 1 switches, 3 wake-ups, 10 frames, 3.33 frames per wake-up, 2 descriptors, 0 restarts
  dispatcher 1: now guest-driven, 0 switches, 0 wake-ups, 0 frames, 0 frames per wake-up, 1 descriptors, 2 restarts
  offload: 1 guest frames cut into 2 segments (3 UDP_SEGMENT sends, 4 sendmmsg calls); 5 segments merged into 6 frames for guests; 8 checksums completed, 7 partial ones passed on
"#;

    #[test]
    fn the_renderings_of_a_fixed_status_are_pinned() {
        let cfg = config();
        let ifaces = interfaces(&cfg);
        let listeners = ListenerTable(cfg.listeners.clone());
        let cases = [
            ("interfaces", ifaces.to_string(), INTERFACES.into()),
            (
                "interfaces json",
                serde_json::to_string(&ifaces).unwrap(),
                INTERFACES_JSON.into(),
            ),
            ("links", links(&cfg).to_string(), LINKS.into()),
            ("routes", routes(&cfg).to_string(), ROUTES.into()),
            ("listeners", listeners.to_string(), LISTENERS.into()),
            (
                "listeners json",
                serde_json::to_string(&listeners).unwrap(),
                LISTENERS_JSON.into(),
            ),
            ("matrix", matrix(0).to_string(), MATRIX.into()),
            (
                "matrix overflow",
                matrix(7).to_string(),
                format!("{MATRIX}(7 frames of pairs beyond the table's capacity)\n"),
            ),
            (
                "cluster",
                cluster(true).to_string(),
                format!("{CLUSTER_AGENT}{CLUSTER_DERIVED}"),
            ),
            (
                "cluster without agent",
                cluster(false).to_string(),
                format!("{NO_AGENT}{CLUSTER_DERIVED}"),
            ),
            (
                "stats",
                stats(true).to_string(),
                format!("{STATS_PORTS}{STATS_KERNEL}{STATS_REST}"),
            ),
            (
                "stats without kernel",
                stats(false).to_string(),
                format!("{STATS_PORTS}{STATS_REST}"),
            ),
            (
                "stats of a daemon whose state is not being saved",
                {
                    let mut s = stats(false);
                    s.state = StateStatus {
                        failing: true,
                        unsaved: true,
                        errors: 3,
                        last_error: Some("syncing the journal: Input/output error".into()),
                        pending_routes: 2,
                        control_without_token: true,
                    };
                    s.to_string()
                },
                format!(
                    "{STATS_PORTS}{}",
                    STATS_REST.replace(
                        "state: saved\n",
                        "state: NOT BEING SAVED (the running configuration has changes a restart would lose): syncing the journal: Input/output error (3 failed writes); a change is refused until the state directory can be written\n\
                         pending: 2 routes wait for their link (show config)\n\
                         control: no token: every local user controls this daemon (give vnetd --token-file)\n"
                    )
                ),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
    }
}
