//! The lab every test runs in (a namespace with ports, an underlay and a FastPath on them),
//! the specs that build it, and the frames the tests send: shared by all the topics.

use std::net::Ipv4Addr;
use std::process::Command;

use vnet_core::{MacMatch, PortId, RouteRule};
use vnet_fastpath::*;
use vnet_wire::MacAddr;

pub const A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]);
pub const B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0b]);
pub const C: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0c]);
pub const D: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0d]);
pub const NEIGH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// The underlay device's own MAC: datagrams for another MAC are not this host's.
pub const U0_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
pub const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
pub const UNRESOLVED: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 3);

pub const PORT_A: PortId = PortId(1);
pub const PORT_B: PortId = PortId(2);
pub const LINK_C: PortId = PortId(3);
pub const LINK_D: PortId = PortId(4);

pub fn require() -> bool {
    std::env::var("VNET_REQUIRE_BPF").as_deref() == Ok("1")
}

pub fn skip(why: &str) -> Option<Lab> {
    if require() {
        panic!("VNET_REQUIRE_BPF=1 but {why}");
    }
    eprintln!("skipped: {why} (set VNET_REQUIRE_BPF=1 to make this a failure)");
    None
}

pub fn sh(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .expect("ip (iproute2) runs");
    assert!(st.success(), "ip {args:?} failed");
}

pub fn ifindex(name: &str) -> u32 {
    // Not /sys/class/net: sysfs shows the namespace it was mounted in, not this thread's.
    let c = std::ffi::CString::new(name).expect("no NUL in a device name");
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert!(i != 0, "no device {name}");
    i
}

pub struct Lab {
    pub fp: FastPath,
    pub pa: u32,
    pub pb: u32,
    pub punt_a: u32,
    pub underlay: u32,
}

impl Lab {
    /// `f` as port A's guest sends it (no GSO).
    pub fn run_from_a(&self, f: &[u8]) -> TestRun {
        self.fp
            .test_run(Program::PortIngress, f, self.pa, 0)
            .expect("test run")
    }

    /// `f` as it arrives on the underlay (no GSO).
    pub fn run_from_underlay(&self, f: &[u8]) -> TestRun {
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
pub fn lab_with(cfg: FastPathConfig) -> Option<Lab> {
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
pub fn attach_lab(fp: &mut FastPath, [a, b, c, d]: [PortId; 4], with_b: bool) -> ApplyReport {
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
pub fn port_spec(id: PortId, ifindex: u32, punt_ifindex: u32, mac: MacAddr, vni: u32) -> PortSpec {
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
pub fn link_spec(id: PortId, vni: u32, remote: Ipv4Addr, rate: Option<Rate>) -> LinkSpec {
    LinkSpec {
        id,
        vni,
        remote,
        local: LOCAL,
        udp_port: 4789,
        rate,
        via_device: None,
        src_port: None,
        punt: false,
        path_mtu: None,
        relay_tag: None,
    }
}

/// Ports and links of VNI 1 for `compile`.
pub fn compile_ports(ports: &[(PortId, Egress)]) -> Vec<CompilePort> {
    ports
        .iter()
        .map(|&(id, egress)| CompilePort { id, vni: 1, egress })
        .collect()
}

/// Routes of VNI 1 sending each destination MAC (from any source) to its port.
pub fn exact_routes(dests: &[(MacAddr, PortId)]) -> Vec<RouteRule> {
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
pub fn set_neighbour(lladdr: &str) {
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
pub fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

pub fn lab() -> Option<Lab> {
    lab_with(FastPathConfig::default())
}

/// An Ethernet + IPv4 + UDP frame with `payload` bytes of payload.
pub fn frame(dst: MacAddr, src: MacAddr, payload: usize) -> Vec<u8> {
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

pub fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A UDP datagram from `src_ip`:`sport` to 10.9.0.1:4789 carrying `payload`, as a frame on
/// the underlay; with a valid UDP checksum when `with_csum` (else 0, as VXLAN sends).
pub fn udp_to_u0(src_ip: Ipv4Addr, sport: u16, payload: &[u8], with_csum: bool) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&U0_MAC);
    f.extend_from_slice(&NEIGH_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (20 + 8 + payload.len()) as u16;
    let mut ip = [
        0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0, 0, 0, 0, 0, 10, 9, 0, 1,
    ];
    ip[2..4].copy_from_slice(&tot.to_be_bytes());
    ip[12..16].copy_from_slice(&src_ip.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut udp = Vec::new();
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&4789u16.to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    if with_csum {
        let c = udp_csum(src_ip, Ipv4Addr::new(10, 9, 0, 1), &udp);
        udp[6..8].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&udp);
    f
}

/// The UDP checksum of `udp` (its checksum field zero) between `src` and `dst`.
pub fn udp_csum(src: Ipv4Addr, dst: Ipv4Addr, udp: &[u8]) -> u16 {
    let mut b = Vec::new();
    b.extend_from_slice(&src.octets());
    b.extend_from_slice(&dst.octets());
    b.extend_from_slice(&[0, 17]);
    b.extend_from_slice(&(udp.len() as u16).to_be_bytes());
    b.extend_from_slice(udp);
    csum(&b)
}

/// A VXLAN datagram from `src_ip` to 10.9.0.1:4789 carrying `inner` in `vni`, as a frame on
/// the underlay.
pub fn vxlan(src_ip: Ipv4Addr, vni: u32, flags: u8, inner: &[u8]) -> Vec<u8> {
    let mut p = vec![flags, 0, 0, 0];
    p.extend_from_slice(&(vni << 8).to_be_bytes());
    p.extend_from_slice(inner);
    udp_to_u0(src_ip, 0xc000, &p, false)
}

/// How many tcx ingress programs `ifindex` has.
pub fn tcx_count(ifindex: u32) -> u32 {
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
