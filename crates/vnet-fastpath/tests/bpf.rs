//! The programs, loaded through the kernel's verifier and run with `BPF_PROG_TEST_RUN` on
//! crafted frames: forwarded, encapsulated, punted, spoofed, oversize, VLAN, broadcast, rate
//! limited, decapsulated (valid and hostile VXLAN, lengths that disagree with the datagram),
//! decisions into another VNI, and the punt TAP's way back; plus table updates, the outer
//! cache's invalidation, locked rate rewrites, the forwarding sysctl put back, pinning and the
//! takeover by a later process, and cleanup. Needs root: each test runs in a network
//! namespace of its own (made by `unshare` on the test's thread) with veth devices, so nothing
//! touches the host but the pins of the pinning tests (a directory of their own on bpffs,
//! removed by the test).
//! Without root the tests skip with a reason, unless VNET_REQUIRE_BPF=1 (CI), which fails.

use std::net::Ipv4Addr;
use std::process::Command;

use vnet_core::{ForwardingTable, MacMatch, PortId, PortInfo, PortKind, RouteRule};
use vnet_fastpath::*;
use vnet_wire::MacAddr;

const A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]);
const B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0b]);
const C: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0c]);
const D: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0d]);
const NEIGH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// The underlay device's own MAC: datagrams for another MAC are not this host's.
const U0_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const UNRESOLVED: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 3);

const PORT_A: PortId = PortId(1);
const PORT_B: PortId = PortId(2);
const LINK_C: PortId = PortId(3);
const LINK_D: PortId = PortId(4);

fn require() -> bool {
    std::env::var("VNET_REQUIRE_BPF").as_deref() == Ok("1")
}

fn skip(why: &str) -> Option<Lab> {
    if require() {
        panic!("VNET_REQUIRE_BPF=1 but {why}");
    }
    eprintln!("skipped: {why} (set VNET_REQUIRE_BPF=1 to make this a failure)");
    None
}

fn sh(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .expect("ip (iproute2) runs");
    assert!(st.success(), "ip {args:?} failed");
}

fn ifindex(name: &str) -> u32 {
    // Not /sys/class/net: sysfs shows the namespace it was mounted in, not this thread's.
    let c = std::ffi::CString::new(name).expect("no NUL in a device name");
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert!(i != 0, "no device {name}");
    i
}

struct Lab {
    fp: FastPath,
    pa: u32,
    pb: u32,
    punt_a: u32,
    underlay: u32,
}

impl Lab {
    /// `f` as port A's guest sends it (no GSO).
    fn run_from_a(&self, f: &[u8]) -> TestRun {
        self.fp
            .test_run(Program::PortIngress, f, self.pa, 0)
            .expect("test run")
    }

    /// `f` as it arrives on the underlay (no GSO).
    fn run_from_underlay(&self, f: &[u8]) -> TestRun {
        self.fp
            .test_run(Program::UnderlayIngress, f, self.underlay, 0)
            .expect("test run")
    }
}

/// A private network namespace for this thread with: port A (veth pa/pa-g) and its punt
/// device, port B (veth pb/pb-g) and its punt device, an underlay `u0` (veth, 10.9.0.1/24)
/// with a permanent neighbour 10.9.0.2; and a FastPath with ports A and B attached, links C
/// (to 10.9.0.2) and D (to the unresolved 10.9.0.3), and routes A, B to the ports and C, D to
/// the links.
fn lab_with(cfg: FastPathConfig) -> Option<Lab> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: loading BPF programs needs privileges");
    }
    // SAFETY: unshare only changes this thread's namespace; each test has its own thread (or,
    // with --test-threads=1, every later test also unshares its own namespace first).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return skip(&format!(
            "unshare(CLONE_NEWNET) failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // No IPv6 autoconfiguration chatter on the test's devices: it would reach the programs as
    // frames nobody sent (this thread's /proc/sys/net is the new namespace's).
    for knob in ["all", "default"] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1");
    }
    for l in [
        "link add pa type veth peer name pa-g",
        "link add pb type veth peer name pb-g",
        // (this kernel has no dummy driver: veth pairs stand in for TAPs and the underlay)
        "link add punta type veth peer name punta-p",
        "link add puntb type veth peer name puntb-p",
        "link add u0 address 02:00:00:00:00:01 type veth peer name u0-p",
        "addr add 10.9.0.1/24 dev u0",
    ] {
        sh(&l.split(' ').collect::<Vec<_>>());
    }
    for d in [
        "lo", "pa", "pa-g", "pb", "pb-g", "punta", "punta-p", "puntb", "puntb-p", "u0", "u0-p",
    ] {
        sh(&["link", "set", d, "up"]);
    }
    set_neighbour("02:00:00:00:00:02");
    let mut fp = match FastPath::open(&cfg) {
        Ok(fp) => fp,
        Err(Unavailable::Verifier { program, log }) => {
            panic!("verifier refused {program}:\n{log}")
        }
        Err(e) => return skip(&e.to_string()),
    };
    let r = attach_lab(&mut fp, [PORT_A, PORT_B, LINK_C, LINK_D], true);
    assert_eq!(r.written, 4);
    Some(Lab {
        fp,
        pa: ifindex("pa"),
        pb: ifindex("pb"),
        punt_a: ifindex("punta"),
        underlay: ifindex("u0"),
    })
}

/// Attaches the namespace's devices made by `lab_with`: the underlay, port A and (`with_b`)
/// port B, links C and D, and the table routing A, B, C, D to them, under the ids `[a, b, c,
/// d]` (a new process numbers its ports anew). What the table apply reported.
fn attach_lab(fp: &mut FastPath, [a, b, c, d]: [PortId; 4], with_b: bool) -> ApplyReport {
    fp.attach_underlay(ifindex("u0"))
        .expect("underlay attaches");
    fp.attach_port(&port_spec(a, ifindex("pa"), ifindex("punta"), A, 1))
        .expect("port A");
    let mut ports = vec![(a, Egress::FastPort)];
    let mut dests = vec![(A, a)];
    if with_b {
        fp.attach_port(&port_spec(b, ifindex("pb"), ifindex("puntb"), B, 1))
            .expect("port B");
        ports.push((b, Egress::FastPort));
        dests.push((B, b));
    }
    fp.set_link(&link_spec(c, 1, REMOTE, None)).expect("link C");
    fp.set_link(&link_spec(d, 1, UNRESOLVED, None))
        .expect("link D");
    ports.extend([(c, Egress::UdpLink), (d, Egress::UdpLink)]);
    dests.extend([(C, c), (D, d)]);
    fp.apply_table(&compile(
        &compile_ports(&ports),
        &exact_routes(&dests),
        false,
    ))
    .expect("table")
}

/// A port of the test's MTU (1450), delivered by egress, with the default policy.
fn port_spec(id: PortId, ifindex: u32, punt_ifindex: u32, mac: MacAddr, vni: u32) -> PortSpec {
    PortSpec {
        id,
        ifindex,
        punt_ifindex,
        mac,
        vni,
        mtu: 1450,
        delivery: Delivery::Egress,
        policy: PortPolicy::default(),
    }
}

/// A VXLAN link from LOCAL to `remote`'s port 4789.
fn link_spec(id: PortId, vni: u32, remote: Ipv4Addr, rate: Option<Rate>) -> LinkSpec {
    LinkSpec {
        id,
        vni,
        remote,
        local: LOCAL,
        udp_port: 4789,
        rate,
        via_device: None,
    }
}

/// Ports and links of VNI 1 for `compile`.
fn compile_ports(ports: &[(PortId, Egress)]) -> Vec<CompilePort> {
    ports
        .iter()
        .map(|&(id, egress)| CompilePort { id, vni: 1, egress })
        .collect()
}

/// Routes of VNI 1 sending each destination MAC (from any source) to its port.
fn exact_routes(dests: &[(MacAddr, PortId)]) -> Vec<RouteRule> {
    dests
        .iter()
        .map(|&(m, dest)| RouteRule {
            vni: 1,
            src: MacMatch::Any,
            dst: MacMatch::Exact(m),
            dest,
        })
        .collect()
}

/// Points the underlay's neighbour 10.9.0.2 at `lladdr`.
fn set_neighbour(lladdr: &str) {
    sh(&[
        "neigh",
        "replace",
        "10.9.0.2",
        "lladdr",
        lladdr,
        "dev",
        "u0",
        "nud",
        "permanent",
    ]);
}

/// Waits up to two seconds for `done` (the kernel may finish releasing links a moment after
/// their descriptors close).
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn lab() -> Option<Lab> {
    lab_with(FastPathConfig::default())
}

/// An Ethernet + IPv4 + UDP frame with `payload` bytes of payload.
fn frame(dst: MacAddr, src: MacAddr, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (20 + 8 + payload) as u16;
    let mut ip = [
        0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0, 192, 168, 50, 1, 192, 168, 50, 2,
    ];
    ip[2..4].copy_from_slice(&tot.to_be_bytes());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0x30, 0x39, 0x30, 0x3a]);
    f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend((0..payload).map(|i| i as u8));
    f
}

fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A VXLAN datagram from `src_ip` to 10.9.0.1:4789 carrying `inner` in `vni`, as a frame on
/// the underlay.
fn vxlan(src_ip: Ipv4Addr, vni: u32, flags: u8, inner: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&U0_MAC);
    f.extend_from_slice(&NEIGH_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (20 + 8 + 8 + inner.len()) as u16;
    let mut ip = [
        0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 10, 9, 0, 1,
    ];
    ip[2..4].copy_from_slice(&tot.to_be_bytes());
    ip[12..16].copy_from_slice(&src_ip.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb5]);
    f.extend_from_slice(&((8 + 8 + inner.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&[flags, 0, 0, 0]);
    f.extend_from_slice(&(vni << 8).to_be_bytes());
    f.extend_from_slice(inner);
    f
}

#[test]
fn known_unicast_between_ports_is_redirected_and_counted() {
    let Some(l) = lab() else { return };
    let f = frame(B, A, 100);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(r.data, f, "forwarded unchanged");
    let a = l.fp.port_counters(PORT_A).unwrap();
    let b = l.fp.port_counters(PORT_B).unwrap();
    assert_eq!(
        (a.rx_frames, a.rx_bytes, a.punted_frames),
        (1, f.len() as u64, 0)
    );
    assert_eq!((b.tx_frames, b.tx_bytes), (1, f.len() as u64));
    let m = l.fp.matrix().unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].vni, m[0].src, m[0].dst, m[0].frames), (1, A, B, 1));
}

#[test]
fn frames_for_a_link_are_encapsulated_in_vxlan() {
    let Some(l) = lab() else { return };
    let f = frame(C, A, 200);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    let d = &r.data;
    eprintln!(
        "global {:?} port {:?}",
        l.fp.global_counters(),
        l.fp.port_counters(PORT_A)
    );
    assert_eq!(d.len(), f.len() + 50);
    assert_eq!(
        &d[0..6],
        &NEIGH_MAC,
        "outer destination from the neighbour table"
    );
    assert_eq!(&d[12..14], &[0x08, 0x00]);
    let ip = &d[14..34];
    assert_eq!(ip[0], 0x45);
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, f.len() + 36);
    assert_eq!(ip[9], 17);
    assert_eq!(&ip[12..16], &LOCAL.octets());
    assert_eq!(&ip[16..20], &REMOTE.octets());
    assert_eq!(csum(ip), 0, "outer IPv4 checksum valid");
    let udp = &d[34..42];
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    assert!((32768..=60999).contains(&sport), "source port {sport}");
    assert_eq!(&udp[2..4], &4789u16.to_be_bytes());
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, f.len() + 16);
    assert_eq!(&udp[6..8], &[0, 0], "UDP checksum 0, as the kernel's VXLAN");
    assert_eq!(
        &d[42..50],
        &[0x08, 0, 0, 0, 0, 0, 1, 0],
        "VXLAN header, VNI 1"
    );
    assert_eq!(&d[50..], &f[..], "the inner frame whole");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.tx_frames, c.tx_bytes), (1, f.len() as u64));
    // The same flow keeps its source port (flow hash), as the kernel's VXLAN.
    let again = l.run_from_a(&f);
    assert_eq!(&again.data[34..36], &udp[0..2]);
}

/// A route change written incrementally (`recompile` + `update_table`, as the engine does on
/// a route event): only the moved destination's entry is written, and frames follow it.
#[test]
fn an_incremental_update_writes_the_moved_destination_only() {
    let Some(mut l) = lab() else { return };
    let kinds = [
        (PORT_A, Egress::FastPort, PortKind::Interface),
        (PORT_B, Egress::FastPort, PortKind::Interface),
        (LINK_C, Egress::UdpLink, PortKind::OverlayLink),
        (LINK_D, Egress::UdpLink, PortKind::OverlayLink),
    ];
    let rules = exact_routes(&[(A, PORT_A), (B, PORT_B), (C, LINK_C), (D, LINK_D)]);
    let mut ft = ForwardingTable::new(
        1,
        kinds
            .iter()
            .map(|(id, _, k)| (*id, PortInfo { vni: 1, kind: *k })),
        rules.iter().copied(),
    );
    let cp: Vec<CompilePort> = kinds
        .iter()
        .map(|(id, e, _)| CompilePort {
            id: *id,
            vni: 1,
            egress: *e,
        })
        .collect();
    let port = |id: PortId| cp.iter().find(|p| p.id == id).copied();
    // B moves from port B to link C.
    let old = rules[1];
    let new = RouteRule {
        dest: LINK_C,
        ..old
    };
    assert!(ft.remove_route(&old) && ft.insert_route(new));
    let touched = [Touched::Dst(1, B)];
    let r =
        l.fp.update_table(|t| recompile(t, ft.routes(), &touched, port, false))
            .expect("update");
    assert_eq!((r.written, r.deleted, r.left_out), (1, 0, 0));
    assert_eq!(l.fp.table_len(), 4);
    let f = frame(B, A, 100);
    let out = l.run_from_a(&f);
    assert_eq!(out.verdict, TCX_REDIRECT);
    assert_eq!(out.data.len(), f.len() + 50, "encapsulated towards link C");
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().tx_frames, 1);
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
    // B goes: its entry is deleted, and its frames are punted.
    assert!(ft.remove_route(&new));
    let r =
        l.fp.update_table(|t| recompile(t, ft.routes(), &touched, port, false))
            .expect("update");
    assert_eq!((r.written, r.deleted), (0, 1));
    let punted = l.fp.port_counters(PORT_A).unwrap().punted_frames;
    let out = l.run_from_a(&f);
    assert_eq!(
        (out.verdict, out.data == f),
        (TCX_REDIRECT, true),
        "to the punt TAP, unchanged"
    );
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted + 1
    );
}

#[test]
fn unresolved_next_hop_and_unknown_destinations_are_punted() {
    let Some(l) = lab() else { return };
    for (dst, what) in [
        (D, "unresolved neighbour"),
        (MacAddr([0x52, 0x54, 0, 0, 0, 0x99]), "no rule"),
    ] {
        let r = l.run_from_a(&frame(dst, A, 64));
        assert_eq!(r.verdict, TCX_REDIRECT, "{what}: to the punt TAP");
    }
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(a.punted_frames, 2);
    assert_eq!(a.neigh_miss, 1);
    assert_eq!(a.rx_frames, 0, "the kernel forwarded nothing itself");
    assert_eq!(l.fp.link_counters(LINK_D).unwrap().tx_frames, 0);
}

#[test]
fn broadcast_multicast_and_vlan_go_to_the_slow_path() {
    let Some(l) = lab() else { return };
    let mut vlan = frame(B, A, 64);
    vlan.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    for f in [
        frame(MacAddr::BROADCAST, A, 64),
        frame(MacAddr([0x01, 0x00, 0x5e, 0, 0, 1]), A, 64),
        vlan,
    ] {
        let r = l.run_from_a(&f);
        assert_eq!(r.verdict, TCX_REDIRECT);
        assert_eq!(r.data, f);
    }
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.punted_frames, a.rx_frames), (3, 0));
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
}

#[test]
fn spoofed_sources_are_dropped_unless_any_source() {
    let Some(mut l) = lab() else { return };
    let f = frame(B, C, 64);
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_DROP);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().drops.get("spoofed_src"),
        Some(&1)
    );
    l.fp.update_port(
        PORT_A,
        &PortPolicy {
            any_source: true,
            rate: None,
        },
    )
    .unwrap();
    let r = l.run_from_a(&f);
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 1);
}

#[test]
fn oversize_frames_and_gso_segments_are_dropped() {
    let Some(l) = lab() else { return };
    // MTU 1450: a 1464-byte frame is the largest that passes.
    let ok = frame(B, A, 1450 - 28);
    assert_eq!(ok.len(), 1464);
    assert_eq!(l.run_from_a(&ok).verdict, TCX_REDIRECT);
    let big = frame(B, A, 1450 - 28 + 1);
    assert_eq!(l.run_from_a(&big).verdict, TCX_DROP);
    // A GSO frame whose segments (gso_size + IPv4 + UDP headers) would exceed the MTU.
    let gso = frame(B, A, 3000); // test_run takes at most about a page
    assert_eq!(
        l.fp.test_run(Program::PortIngress, &gso, l.pa, 1422)
            .unwrap()
            .verdict,
        TCX_REDIRECT
    );
    assert_eq!(
        l.fp.test_run(Program::PortIngress, &gso, l.pa, 1423)
            .unwrap()
            .verdict,
        TCX_DROP
    );
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(a.drops.get("oversize"), Some(&2));
    assert_eq!(a.rx_frames, 2);
    // Runts (< 14 bytes) cannot be fed to BPF_PROG_TEST_RUN (the kernel refuses data shorter
    // than an Ethernet header), so `truncated` is exercised only by the program's check.
}

#[test]
fn the_rate_limit_drops_beyond_the_bucket() {
    let Some(mut l) = lab() else { return };
    // 8 Mbit/s = 1 MB/s, a 3000-byte bucket: three 1000-byte frames pass at once, a fourth
    // only if a microsecond or so refilled a token, then drops.
    l.fp.update_port(
        PORT_A,
        &PortPolicy {
            any_source: false,
            rate: Some(Rate {
                bits_per_sec: 8_000_000,
                burst_bytes: 3000,
            }),
        },
    )
    .unwrap();
    let f = frame(B, A, 1000 - 42);
    assert_eq!(f.len(), 1000);
    let passed = (0..10)
        .filter(|_| l.run_from_a(&f).verdict == TCX_REDIRECT)
        .count();
    assert!((3..=4).contains(&passed), "{passed} passed");
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!(
        a.drops.get("rate_limited").copied(),
        Some(10 - passed as u64)
    );
    assert!(l.fp.rate_available(PORT_A).unwrap().unwrap() <= 0);
    // After 5 ms, about 5000 bytes more: the bucket is full (3000) again.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(l.run_from_a(&f).verdict, TCX_REDIRECT);
    // Removing the limit lets everything through.
    l.fp.update_port(PORT_A, &PortPolicy::default()).unwrap();
    for _ in 0..10 {
        assert_eq!(l.run_from_a(&f).verdict, TCX_REDIRECT);
    }
}

#[test]
fn valid_vxlan_for_a_local_port_is_decapsulated() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 300);
    let r = l.run_from_underlay(&vxlan(REMOTE, 1, 0x08, &inner));
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(r.data, inner, "exactly the inner frame");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.rx_bytes), (1, inner.len() as u64));
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 1);
}

#[test]
fn hostile_or_foreign_vxlan_goes_on_to_the_stack_untouched() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 64);
    let mut bad_reserved = vxlan(REMOTE, 1, 0x08, &inner);
    bad_reserved[49] = 1; // reserved byte after the VNI
    let mut other_port = vxlan(REMOTE, 1, 0x08, &inner);
    other_port[36..38].copy_from_slice(&4790u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown VNI", vxlan(REMOTE, 7, 0x08, &inner)),
        (
            "unknown peer",
            vxlan(Ipv4Addr::new(10, 9, 0, 66), 1, 0x08, &inner),
        ),
        ("no I flag", vxlan(REMOTE, 1, 0x00, &inner)),
        ("reserved bits", bad_reserved),
        ("other UDP port", other_port),
        ("no inner frame", vxlan(REMOTE, 1, 0x08, &inner[..10])),
        (
            "inner broadcast",
            vxlan(REMOTE, 1, 0x08, &frame(MacAddr::BROADCAST, C, 64)),
        ),
        (
            "inner for a link (no hairpin)",
            vxlan(REMOTE, 1, 0x08, &frame(D, C, 64)),
        ),
        ("inner oversize", vxlan(REMOTE, 1, 0x08, &frame(A, C, 1500))),
    ];
    for (what, f) in cases {
        let r = l.run_from_underlay(&f);
        assert_eq!(r.verdict, TCX_NEXT, "{what}");
        assert_eq!(r.data, f, "{what}: untouched");
    }
    // A datagram that says GSO but is not a tunnel GSO skb (here: no GSO type at all, as a UDP
    // GRO aggregate of several VXLAN datagrams has none of the tunnel bits) is not decapsulated.
    let r =
        l.fp.test_run(
            Program::UnderlayIngress,
            &vxlan(REMOTE, 1, 0x08, &inner),
            l.underlay,
            1400,
        )
        .unwrap();
    assert_eq!(r.verdict, TCX_NEXT);
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.gro_passed), (0, 1));
    let g = l.fp.global_counters().unwrap();
    assert!(g.unknown_link >= 2, "{g:?}");
    assert!(g.not_vxlan >= 1, "{g:?}");
}

#[test]
fn the_punt_tap_delivers_what_vnetd_writes() {
    let Some(l) = lab() else { return };
    let f = frame(A, B, 80);
    let r =
        l.fp.test_run(Program::PuntIngress, &f, l.punt_a, 0)
            .unwrap();
    assert_eq!(r.verdict, TCX_REDIRECT);
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.slow_tx_frames, a.slow_tx_bytes), (1, f.len() as u64));
    // A device that is no port's punt TAP: not ours, go on.
    assert_eq!(
        l.fp.test_run(Program::PuntIngress, &f, l.pb, 0)
            .unwrap()
            .verdict,
        TCX_NEXT
    );
}

#[test]
fn table_updates_are_minimal_and_a_full_table_stays_slow() {
    let Some(mut l) = lab_with(FastPathConfig {
        max_table: 5,
        ..FastPathConfig::default()
    }) else {
        return;
    };
    let ports = compile_ports(&[
        (PORT_A, Egress::FastPort),
        (PORT_B, Egress::FastPort),
        (LINK_C, Egress::UdpLink),
    ]);
    let mut rules = exact_routes(&[(A, PORT_A), (B, PORT_B), (C, LINK_C)]);
    // Same three destinations (D's entry goes): one delete, nothing rewritten.
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.deleted, r.left_out), (0, 1, 0));
    // B moves to the link: one overwrite.
    rules[1].dest = LINK_C;
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.deleted), (1, 0));
    let f = frame(B, A, 64);
    let out = l.run_from_a(&f);
    assert_eq!(out.data.len(), f.len() + 50, "B now goes out encapsulated");
    // Five more destinations into a table of five: two fit, three stay slow (counted).
    let more: Vec<_> = (0..5u8)
        .map(|i| (MacAddr([0x52, 0x54, 0, 0, 1, i]), PORT_B))
        .collect();
    rules.extend(exact_routes(&more));
    let r = l.fp.apply_table(&compile(&ports, &rules, false)).unwrap();
    assert_eq!((r.written, r.left_out), (2, 3));
    assert_eq!(l.fp.table_len(), 5);
    assert_eq!(l.fp.global_counters().unwrap().table_full, 3);
    let slow = frame(MacAddr([0x52, 0x54, 0, 0, 1, 4]), A, 64);
    let punted_before = l.fp.port_counters(PORT_A).unwrap().punted_frames;
    l.run_from_a(&slow);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted_before + 1
    );
    // Detaching port B turns its entries slow before its slot goes.
    l.fp.detach_port(PORT_B).unwrap();
    let r = l.run_from_a(&frame(MacAddr([0x52, 0x54, 0, 0, 1, 0]), A, 64));
    assert_eq!(r.verdict, TCX_REDIRECT);
    assert_eq!(
        l.fp.port_counters(PORT_A).unwrap().punted_frames,
        punted_before + 2
    );
}

/// How many tcx ingress programs `ifindex` has.
fn tcx_count(ifindex: u32) -> u32 {
    let mut opts = libbpf_sys::bpf_prog_query_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_query_opts>() as _,
        ..Default::default()
    };
    // SAFETY: `opts` is initialised with its own size and has no output buffers, so the
    // kernel only writes its count fields.
    let rc = unsafe {
        libbpf_sys::bpf_prog_query_opts(ifindex as i32, libbpf_sys::BPF_TCX_INGRESS, &mut opts)
    };
    assert_eq!(rc, 0, "prog query on {ifindex}");
    // SAFETY: the union's `count` member is the one the kernel fills for this query.
    unsafe { opts.__bindgen_anon_1.count }
}

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

/// Sets the IPv4 header's total length of a `vxlan()` datagram (checksum kept valid).
fn set_ip_len(f: &mut [u8], tot: u16) {
    f[16..18].copy_from_slice(&tot.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = csum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

fn set_udp_len(f: &mut [u8], len: u16) {
    f[38..40].copy_from_slice(&len.to_be_bytes());
}

#[test]
fn vxlan_whose_lengths_disagree_with_the_datagram_is_not_decapsulated() {
    let Some(l) = lab() else { return };
    let inner = frame(A, C, 300);
    let good = vxlan(REMOTE, 1, 0x08, &inner);
    let (tot, ulen) = ((good.len() - 14) as u16, (good.len() - 34) as u16);
    // Bytes after the datagram (an Ethernet pad, or junk): not part of the inner frame.
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0xee; 24]);
    // The IP length says less than the frame holds, consistently with the UDP length.
    let mut short_ip = good.clone();
    set_ip_len(&mut short_ip, tot - 4);
    set_udp_len(&mut short_ip, ulen - 4);
    // A UDP length shorter than the IP payload (the stack delivers only that much).
    let mut short_udp = good.clone();
    set_udp_len(&mut short_udp, ulen - 4);
    // A UDP length beyond the IP payload (the stack drops it).
    let mut long_udp = good.clone();
    set_udp_len(&mut long_udp, ulen + 4);
    // An IP length beyond the frame (truncated on the way).
    let mut long_ip = good.clone();
    set_ip_len(&mut long_ip, tot + 20);
    set_udp_len(&mut long_ip, ulen + 20);
    let cases = [
        ("trailing bytes", trailing),
        ("short IP length", short_ip),
        ("short UDP length", short_udp),
        ("long UDP length", long_udp),
        ("truncated datagram", long_ip),
    ];
    for (what, f) in &cases {
        let r = l.run_from_underlay(f);
        assert_eq!(
            (r.verdict, r.data == *f),
            (TCX_NEXT, true),
            "{what}: passed on to the stack untouched"
        );
    }
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!((c.rx_frames, c.bad_length), (0, cases.len() as u64));
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 0);
    // The well-formed datagram still is decapsulated.
    let r = l.run_from_underlay(&good);
    assert_eq!((r.verdict, r.data), (TCX_REDIRECT, inner));
}

#[test]
fn vxlan_sent_to_another_hosts_mac_is_not_taken() {
    let Some(l) = lab() else { return };
    // As a promiscuous underlay device sees it: the stack drops it, so must the fast path.
    let mut f = vxlan(REMOTE, 1, 0x08, &frame(A, C, 100));
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x77]);
    let r = l.run_from_underlay(&f);
    assert_eq!((r.verdict, r.data == f), (TCX_NEXT, true));
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().rx_frames, 0);
}

#[test]
fn a_links_rate_is_charged_for_what_goes_on_to_vnetd_too() {
    let Some(mut l) = lab() else { return };
    // 8 Mbit/s with a 3000-byte bucket on what arrives from link C.
    let rate = Rate {
        bits_per_sec: 8_000_000,
        burst_bytes: 3000,
    };
    l.fp.set_link(&link_spec(LINK_C, 1, REMOTE, Some(rate)))
        .unwrap();
    // Inner broadcasts (and a datagram with reserved bits set, which vnetd also takes) are
    // vnetd's to forward: the kernel passes them on, but charges them first, so that the
    // link's one bucket holds for both paths (vnetd does not charge links the kernel serves).
    let bcast = vxlan(REMOTE, 1, 0x08, &frame(MacAddr::BROADCAST, C, 1000 - 42));
    let mut reserved = vxlan(REMOTE, 1, 0x08, &frame(B, C, 1000 - 42));
    reserved[49] = 1;
    let verdicts: Vec<i32> = [&bcast, &reserved, &bcast, &reserved, &bcast, &bcast]
        .iter()
        .map(|f| l.run_from_underlay(f).verdict)
        .collect();
    let passed = verdicts.iter().filter(|v| **v == TCX_NEXT).count();
    assert!((3..=4).contains(&passed), "{verdicts:?}");
    assert!(verdicts[4..].iter().all(|v| *v == TCX_DROP), "{verdicts:?}");
    let c = l.fp.link_counters(LINK_C).unwrap();
    assert_eq!(
        c.drops.get("rate_limited").copied(),
        Some(6 - passed as u64)
    );
    // and the bucket is empty for what the kernel itself would deliver
    let r = l.run_from_underlay(&vxlan(REMOTE, 1, 0x08, &frame(A, C, 100)));
    assert_eq!(r.verdict, TCX_DROP);
}

#[test]
fn a_decision_into_another_vni_is_not_followed() {
    let Some(mut l) = lab() else { return };
    // Port B and link C move to VNI 2 while the table (compiled when they were in VNI 1)
    // still sends VNI 1's B and C to them: an inconsistent table, as a bug in compile()
    // would write. Isolation must not rest on it.
    let pb = l.pb;
    l.fp.detach_port(PORT_B).unwrap();
    l.fp.attach_port(&port_spec(PORT_B, pb, ifindex("puntb"), B, 2))
        .unwrap();
    l.fp.set_link(&link_spec(LINK_C, 2, REMOTE, None)).unwrap();
    // And an entry of VNI 2 that sends frames from link C to port A (VNI 1).
    let mut t = compile(
        &compile_ports(&[
            (PORT_A, Egress::FastPort),
            (PORT_B, Egress::FastPort),
            (LINK_C, Egress::UdpLink),
        ]),
        &exact_routes(&[(B, PORT_B), (C, LINK_C)]),
        false,
    );
    t.entries.insert(
        FwdKey {
            vni: 2,
            kind: KeyKind::Dst,
            src: MacAddr::ZERO,
            dst: A,
        },
        FwdEntry {
            action: Action::Port(PORT_A),
            check_src: false,
        },
    );
    l.fp.apply_table(&t).unwrap();
    for (dst, what) in [(B, "a port of VNI 2"), (C, "a link of VNI 2")] {
        let f = frame(dst, A, 100);
        let r = l.run_from_a(&f);
        assert_eq!(
            (r.verdict, r.data == f),
            (TCX_REDIRECT, true),
            "{what}: to vnetd (the punt TAP), unchanged"
        );
    }
    assert_eq!(l.fp.port_counters(PORT_B).unwrap().tx_frames, 0);
    assert_eq!(l.fp.link_counters(LINK_C).unwrap().tx_frames, 0);
    let a = l.fp.port_counters(PORT_A).unwrap();
    assert_eq!((a.rx_frames, a.punted_frames), (0, 2));
    // From link C (VNI 2) to port A (VNI 1): passed to vnetd, not delivered.
    let f = vxlan(REMOTE, 2, 0x08, &frame(A, C, 100));
    let r = l.run_from_underlay(&f);
    assert_eq!(r.verdict, TCX_NEXT);
    assert_eq!(l.fp.port_counters(PORT_A).unwrap().tx_frames, 0);
    assert_eq!(l.fp.global_counters().unwrap().vni_mismatch, 3);
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

/// Keeps the calling thread on one CPU (the outer cache is per CPU).
fn pin_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it, and
    // sched_getcpu / sched_setaffinity only read what we pass.
    unsafe {
        let cpu = libc::sched_getcpu().max(0) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

#[test]
fn invalidating_the_outer_cache_takes_a_changed_next_hop_at_once() {
    let Some(l) = lab() else { return };
    pin_to_one_cpu();
    let f = frame(C, A, 100);
    let dmac = |l: &Lab| {
        let r = l.run_from_a(&f);
        assert_eq!(r.verdict, TCX_REDIRECT);
        r.data[0..6].to_vec()
    };
    assert_eq!(dmac(&l), NEIGH_MAC);
    let moved = [0x02, 0, 0, 0, 0, 0x22];
    set_neighbour("02:00:00:00:00:22");
    // Cached for a second...
    assert_eq!(dmac(&l), NEIGH_MAC);
    // ...unless told: from another thread, as vnetd's netlink watcher does.
    let inv = l.fp.outer_cache_invalidator();
    std::thread::spawn(move || inv.invalidate().unwrap())
        .join()
        .unwrap();
    assert_eq!(dmac(&l), moved);
}

#[test]
fn rate_updates_take_the_buckets_lock() {
    let Some(mut l) = lab() else { return };
    let big = Rate {
        bits_per_sec: 8_000_000,
        burst_bytes: 1 << 20,
    };
    let small = Rate {
        bits_per_sec: 8_000,
        burst_bytes: 3000,
    };
    let policy = |rate| PortPolicy {
        any_source: false,
        rate: Some(rate),
    };
    l.fp.update_port(PORT_A, &policy(small)).unwrap();
    assert_eq!(l.fp.rate_available(PORT_A).unwrap(), Some(3000));
    // The guest sends as fast as it can while the bucket is rewritten, alternately full at
    // 1 MB and at 3000 bytes: read back under the lock right after a rewrite to 3000 bytes,
    // the bucket never holds more (an unlocked rewrite racing a program's update could leave
    // the program's view of the 1 MB bucket behind). A race: without BPF_F_LOCK this caught it
    // in about one run in four here; with it, never.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let sender = std::thread::spawn(move || {
        // SAFETY: plain socket(2); the fd is owned by the OwnedFd below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            )
        };
        assert!(fd >= 0, "packet socket");
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data, valid all zero.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex("pa-g") as i32;
        sll.sll_halen = 6;
        let f = frame(B, A, 1000);
        // Batches of frames per system call, so the program runs as often as it can.
        let mut iov = libc::iovec {
            iov_base: f.as_ptr() as *mut libc::c_void,
            iov_len: f.len(),
        };
        // SAFETY: mmsghdr is plain data, valid all zero; its pointers are set below.
        let mut msgs: Vec<libc::mmsghdr> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
        for m in msgs.iter_mut() {
            m.msg_hdr.msg_name = (&mut sll as *mut libc::sockaddr_ll).cast();
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            m.msg_hdr.msg_iov = &mut iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        let mut n = 0u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: every mmsghdr points at `sll` and `iov`, which point at live memory
            // (`f`) of the lengths given, for the duration of the call.
            let r = unsafe {
                libc::sendmmsg(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    msgs.as_mut_ptr(),
                    msgs.len() as u32,
                    0,
                )
            };
            n += r.max(0) as u64;
        }
        n
    });
    let t0 = std::time::Instant::now();
    let mut torn = 0;
    let mut rounds = 0;
    while t0.elapsed() < std::time::Duration::from_secs(2) {
        l.fp.update_port(PORT_A, &policy(big)).unwrap();
        l.fp.update_port(PORT_A, &policy(small)).unwrap();
        if l.fp.rate_available(PORT_A).unwrap().unwrap() > 3000 {
            torn += 1;
        }
        rounds += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sender.join().unwrap();
    let a = l.fp.port_counters(PORT_A).unwrap();
    eprintln!("{rounds} rewrites, {sent} frames sent, {a:?}");
    assert!(a.rx_frames + a.drops.values().sum::<u64>() > 1000, "{a:?}");
    assert_eq!(
        torn, 0,
        "{torn} of {rounds} reads saw a bucket fuller than its cap"
    );
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
    let fwd = libbpf_rs::MapHandle::from_pinned_path(dir.join("maps/fwd")).expect("fwd pinned");
    assert_eq!(
        libbpf_rs::MapCore::max_entries(&fwd),
        1024,
        "the new map is the pinned one"
    );
    fp.teardown();
    assert!(!dir.exists());
}
