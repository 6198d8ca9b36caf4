//! Test support for the hot path without root: a `Shared` whose VXLAN socket is on loopback,
//! snapshots built from test ports, a port that records what it was given, and a guest NIC
//! that records what it was written. For the few tests that need root: a network namespace
//! of the test's own and `ip` to fill it.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vnet_control::PortPolicy;
use vnet_core::{
    DropReason, FastMap, FastSet, ForwardingTable, MacMatch, PortId, PortInfo, PortKind, RouteRule,
};
use vnet_offload::VirtioNetHdr;
use vnet_wire::MacAddr;
use vnet_wire::VxlanRepr;

use crate::batch::UdpLinkTx;
use crate::guard::PortGuard;
use crate::nic::GuestNic;
use crate::port::{Frame, Port, Tx};
use crate::shared::{PortEntry, Shared, Snapshot};
use crate::vxlan_socket::VxlanSocket;

/// Moves the calling test's thread into a network namespace of its own; false (with a line
/// saying why the test skips) without root or when unshare fails.
pub fn private_netns() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a network namespace of its own)");
        return false;
    }
    // SAFETY: unshare changes only this thread's namespace (threads it starts later inherit
    // it); each test's thread is its own.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!("skipped: unshare: {}", std::io::Error::last_os_error());
        return false;
    }
    true
}

/// Runs `ip` with the words of `args`; panics if it fails.
pub fn ip(args: &str) {
    let st = std::process::Command::new("ip")
        .args(args.split(' '))
        .status()
        .expect("ip (iproute2) runs");
    assert!(st.success(), "ip {args}");
}

pub fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, last])
}

/// An Ethernet frame from `src` to `dst` with `len` bytes in all (IPv4 ethertype, a pattern).
pub fn frame(dst: MacAddr, src: MacAddr, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(14)];
    f[..6].copy_from_slice(&dst.0);
    f[6..12].copy_from_slice(&src.0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    for (i, b) in f.iter_mut().enumerate().skip(14) {
        *b = (i * 7) as u8;
    }
    f.truncate(len);
    f
}

pub fn shared() -> Arc<Shared> {
    shared_on("127.0.0.1:0")
}

/// A `Shared` whose VXLAN socket is bound to `addr` (IPv6 loopback for an IPv6 underlay).
pub fn shared_on(addr: &str) -> Arc<Shared> {
    let sock = VxlanSocket::bind(addr.parse().expect("addr")).expect("loopback socket");
    Arc::new(Shared::new(Arc::new(sock)))
}

/// What a recording port was given.
#[derive(Debug, Clone)]
pub struct Sent {
    pub vh: VirtioNetHdr,
    pub macs: [u8; 12],
    /// The whole frame as the port would send it: the checked MACs, then the rest.
    pub bytes: Vec<u8>,
    pub sole: bool,
}

/// A port that records every frame, or fails with `fail`.
#[derive(Default)]
pub struct Recorder {
    pub sent: Mutex<Vec<Sent>>,
    pub fail: Option<DropReason>,
}

impl Recorder {
    pub fn take(&self) -> Vec<Sent> {
        std::mem::take(&mut *self.sent.lock().expect("lock"))
    }
}

impl Port for Recorder {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        if let Some(r) = self.fail {
            return Err(r);
        }
        let whole = f.copy_into(tx.scratch);
        let mut bytes = f.macs.to_vec();
        bytes.extend_from_slice(&whole[12..]);
        self.sent.lock().expect("lock").push(Sent {
            vh: f.vh,
            macs: f.macs,
            bytes,
            sole: f.sole,
        });
        Ok(())
    }
}

/// A guest NIC that records what it is written.
pub struct FakeNic {
    pub vnet_hdr: bool,
    pub max_frame: usize,
    pub writes: Mutex<Vec<(VirtioNetHdr, Vec<u8>)>>,
}

impl FakeNic {
    pub fn new(vnet_hdr: bool, mtu: usize) -> FakeNic {
        FakeNic {
            vnet_hdr,
            max_frame: mtu + 18,
            writes: Mutex::new(Vec::new()),
        }
    }

    pub fn take(&self) -> Vec<(VirtioNetHdr, Vec<u8>)> {
        std::mem::take(&mut *self.writes.lock().expect("lock"))
    }
}

impl GuestNic for FakeNic {
    fn write(&self, _q: usize, vh: &VirtioNetHdr, parts: &[&[u8]]) -> Result<(), DropReason> {
        self.writes
            .lock()
            .expect("lock")
            .push((*vh, parts.concat()));
        Ok(())
    }

    fn has_vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }
}

/// A port of a test snapshot.
pub struct TestPort {
    pub id: PortId,
    pub kind: PortKind,
    pub vni: u32,
    pub port: Arc<dyn Port>,
    /// Interfaces: the guest's MAC (the source check).
    pub mac: Option<MacAddr>,
    pub policy: PortPolicy,
    /// UDP links: the peer's address, for demultiplexing.
    pub udp_peer: Option<IpAddr>,
}

impl TestPort {
    pub fn interface(id: u32, m: MacAddr, port: Arc<dyn Port>) -> TestPort {
        TestPort {
            id: PortId(id),
            kind: PortKind::Interface,
            vni: 1,
            port,
            mac: Some(m),
            policy: PortPolicy::default(),
            udp_peer: None,
        }
    }

    pub fn link(id: u32, port: Arc<dyn Port>) -> TestPort {
        TestPort {
            id: PortId(id),
            kind: PortKind::OverlayLink,
            vni: 1,
            port,
            mac: None,
            policy: PortPolicy::default(),
            udp_peer: None,
        }
    }
}

/// A route `any -> dst` to port `to` in VNI 1.
pub fn route(dst: MacAddr, to: u32) -> RouteRule {
    RouteRule {
        vni: 1,
        src: MacMatch::Any,
        dst: MacMatch::Exact(dst),
        dest: PortId(to),
    }
}

/// Publishes a snapshot of `ports` and `rules` in `shared`.
pub fn publish(shared: &Shared, ports: Vec<TestPort>, rules: Vec<RouteRule>) {
    let udp = shared.snapshot.load().udp.clone();
    let mut snap = Snapshot::empty(udp);
    let (mut entries, mut udp_peers, mut udp_ips) =
        (FastMap::default(), FastMap::default(), FastSet::default());
    for p in ports {
        let guard = match p.mac {
            Some(m) => PortGuard::interface(m, &p.policy),
            None => PortGuard::link(&p.policy),
        };
        entries.insert(
            p.id,
            PortEntry {
                info: PortInfo {
                    vni: p.vni,
                    kind: p.kind,
                },
                port: p.port,
                counters: Default::default(),
                guard: Arc::new(guard),
            },
        );
        if let Some(ip) = p.udp_peer {
            udp_peers.insert((ip, p.vni), p.id);
            udp_ips.insert(ip);
        }
    }
    let generation = shared.snapshot.load().table.generation() + 1;
    snap.table = ForwardingTable::new(
        generation,
        entries.iter().map(|(id, e)| (*id, e.info)),
        rules,
    );
    snap.ports = Arc::new(entries);
    snap.udp_peers = Arc::new(udp_peers);
    snap.udp_ips = Arc::new(udp_ips);
    shared.snapshot.store(Arc::new(snap));
}

/// A link path straight to `to`.
pub fn path_to(to: SocketAddr) -> Arc<crate::reach::PathCell> {
    Arc::new(crate::reach::PathCell::from_pointee(
        crate::reach::LinkPath::direct(to),
    ))
}

/// A udp link on `shared`'s socket to a receiver on loopback (returned, with a timeout).
pub fn udp_link(shared: &Shared, vni: u32) -> (Arc<UdpLinkTx>, UdpSocket) {
    let rx = UdpSocket::bind("127.0.0.1:0").expect("receiver");
    rx.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let to: SocketAddr = rx.local_addr().expect("addr");
    let link = UdpLinkTx {
        sock: shared.snapshot.load().udp.clone(),
        path: path_to(to),
        fixed_peer: Some(to),
        header: VxlanRepr { vni }.header(),
        gso_refused: AtomicUsize::new(usize::MAX),
        crypto: None,
        counters: Default::default(),
    };
    (Arc::new(link), rx)
}

/// The counters of port `id` in `shared`'s snapshot.
pub fn counters(shared: &Shared, id: u32) -> vnet_core::PortCountersSnapshot {
    shared.port_counters(PortId(id)).expect("port").snapshot()
}
