//! TCP tunnels to relays: issue #31's last fallback, for a host whose UDP does not pass at all
//! (a firewall that lets out only TCP). A host reaches a relay over TCP at the relay's VXLAN
//! port, and the tunnel is a plain pipe between that connection and a UDP socket of this vnetd
//! on the loopback address, its *local end*, connected to this host's own VXLAN port: what the
//! VXLAN socket sends to the local end goes over TCP, each datagram after its length (2 bytes,
//! big-endian); what comes over TCP is sent from the local end to the VXLAN port. To reach's
//! machine, the data path and the relay the local end is one more endpoint of the peer, so
//! nothing else changes: pings and pongs are authenticated, bindings and relay datagrams
//! admitted and counted exactly as over UDP, and the TCP side trusts no byte it carries.
//!
//! The relay side (`--relay`) accepts at most [`MAX_TUNNELS`] tunnels; either side closes a
//! tunnel that carried nothing for [`IDLE`] (reach's heartbeats cross it every 2.5 s).
//! [`Deframer`], the framing, is pure and tested without sockets.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use vnet_core::LockRecover;
use vnet_reach::Tag;

/// Tunnels a relay accepts at once.
pub const MAX_TUNNELS: usize = 256;
/// A tunnel that carried nothing either way for this long is closed.
pub const IDLE: Duration = Duration::from_secs(30);
/// How long a connection to one of a relay's endpoints may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// After a tunnel to a relay failed or closed, the next try waits this long.
pub const RETRY_MS: u64 = 5_000;
/// A tunnel no longer wanted (UDP to the relay answers again) is kept this long first.
pub const LINGER_MS: u64 = 30_000;
/// How often the pipe's threads look at their stop flag.
const TICK: Duration = Duration::from_millis(200);
/// The largest datagram a tunnel carries (a UDP payload).
const MAX_DATAGRAM: usize = u16::MAX as usize;

/// Cuts a TCP byte stream into the datagrams it carries: each is a 2-byte big-endian length
/// and that many bytes. Holds at most one partial datagram; a length of 0 is malformed (the
/// tunnel is closed).
#[derive(Debug, Default)]
pub struct Deframer {
    buf: Vec<u8>,
}

impl Deframer {
    /// Appends `bytes` and hands each complete datagram to `f`; Err on a malformed length.
    pub fn push(&mut self, bytes: &[u8], mut f: impl FnMut(&[u8])) -> Result<(), ()> {
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            if rest.len() < 2 {
                break;
            }
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            if len == 0 {
                return Err(());
            }
            if rest.len() < 2 + len {
                break;
            }
            f(&rest[2..2 + len]);
            at += 2 + len;
        }
        self.buf.drain(..at);
        Ok(())
    }

    /// Bytes held of a datagram not complete yet.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// The bytes in front of a datagram on a tunnel: its length.
const FRAME_HEADER: usize = 2;

/// One datagram as it goes over TCP; None for one a tunnel cannot carry (empty, too large).
#[cfg(test)]
pub fn frame(datagram: &[u8]) -> Option<Vec<u8>> {
    let mut v = vec![0; FRAME_HEADER + datagram.len()];
    v[FRAME_HEADER..].copy_from_slice(datagram);
    frame_in_place(&mut v, datagram.len()).map(|f| f.to_vec())
}

/// The datagram of `n` bytes at `buf[FRAME_HEADER..]` framed where it is (its length written
/// in front): what goes over TCP, without a copy or an allocation per datagram. None for one a
/// tunnel cannot carry (empty, too large).
pub fn frame_in_place(buf: &mut [u8], n: usize) -> Option<&[u8]> {
    if n == 0 || n > MAX_DATAGRAM || buf.len() < FRAME_HEADER + n {
        return None;
    }
    buf[..FRAME_HEADER].copy_from_slice(&(n as u16).to_be_bytes());
    Some(&buf[..FRAME_HEADER + n])
}

/// What the tunnels tell the reach thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelEvent {
    /// A tunnel is up: its local end, the relay it goes to (None: a member's, at this relay)
    /// and the TCP peer's address.
    Opened {
        local: SocketAddr,
        toward: Option<Tag>,
        remote: SocketAddr,
    },
    /// A tunnel closed (`local`: None when the connection never came up).
    Closed {
        local: Option<SocketAddr>,
        toward: Option<Tag>,
    },
}

/// Counts for `show reach`.
#[derive(Debug, Default)]
pub struct TunnelCounters {
    pub open: AtomicUsize,
    pub opened: AtomicU64,
    /// Connections a relay refused: [`MAX_TUNNELS`] reached.
    pub refused: AtomicU64,
    /// Tunnels closed for a malformed length.
    pub malformed: AtomicU64,
    /// Datagrams carried over TCP, each way.
    pub datagrams_out: AtomicU64,
    pub datagrams_in: AtomicU64,
}

struct Client {
    stop: Arc<AtomicBool>,
    local: Option<SocketAddr>,
    unwanted_since_ms: Option<u64>,
}

/// The tunnels of one vnetd: those it opened to relays and, on a relay, those it accepted.
pub struct Tunnels {
    /// Where local ends send to: this host's VXLAN port.
    vxlan: SocketAddr,
    events_tx: Sender<TunnelEvent>,
    events: Receiver<TunnelEvent>,
    clients: HashMap<Tag, Client>,
    /// After a failed or closed tunnel to a relay: not before this (ms).
    retry_at: HashMap<Tag, u64>,
    /// Each open tunnel's local end and its TCP peer.
    remotes: HashMap<SocketAddr, SocketAddr>,
    stop: Arc<AtomicBool>,
    /// Tunnels a relay accepts at once ([`MAX_TUNNELS`]).
    limit: usize,
    pub counters: Arc<TunnelCounters>,
}

impl Drop for Tunnels {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for c in self.clients.values() {
            c.stop.store(true, Relaxed);
        }
    }
}

impl Tunnels {
    /// Tunnels for the VXLAN socket at `vxlan` (an unspecified address: the loopback).
    pub fn new(vxlan: SocketAddr) -> Tunnels {
        let ip = match vxlan.ip() {
            ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            ip => ip,
        };
        let (events_tx, events) = channel();
        Tunnels {
            vxlan: SocketAddr::new(ip, vxlan.port()),
            events_tx,
            events,
            clients: HashMap::new(),
            retry_at: HashMap::new(),
            remotes: HashMap::new(),
            stop: Arc::new(AtomicBool::new(false)),
            limit: MAX_TUNNELS,
            counters: Arc::new(TunnelCounters::default()),
        }
    }

    /// (A relay.) Accepts members' tunnels on TCP at `addr` (the VXLAN socket's address).
    pub fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let bound = l.local_addr()?;
        let (vxlan, tx, stop, counters) = (
            self.vxlan,
            self.events_tx.clone(),
            self.stop.clone(),
            self.counters.clone(),
        );
        let live = Arc::new(AtomicUsize::new(0));
        let limit = self.limit;
        std::thread::Builder::new()
            .name("reach-tunnels".into())
            .spawn(move || {
                while !stop.load(Relaxed) {
                    match l.accept() {
                        Ok((s, from)) => {
                            // Counted here, not once the pipe runs: a burst of connections
                            // cannot start more than the limit of threads.
                            if live.fetch_add(1, Relaxed) >= limit {
                                live.fetch_sub(1, Relaxed);
                                counters.refused.fetch_add(1, Relaxed);
                                debug!(%from, "reach: tunnel refused (too many)");
                                continue;
                            }
                            let (tx, stop, counters, done) =
                                (tx.clone(), stop.clone(), counters.clone(), live.clone());
                            let spawned = std::thread::Builder::new()
                                .name("reach-tunnel".into())
                                .spawn(move || {
                                    pipe(s, vxlan, None, &tx, &stop, &counters);
                                    done.fetch_sub(1, Relaxed);
                                });
                            if spawned.is_err() {
                                live.fetch_sub(1, Relaxed);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(TICK),
                        Err(e) => {
                            warn!("reach: tunnel accept: {e}");
                            std::thread::sleep(TICK);
                        }
                    }
                }
            })?;
        info!(%bound, "reach: accepting TCP tunnels");
        Ok(bound)
    }

    /// The events since the last call.
    pub fn events(&mut self, now_ms: u64) -> Vec<TunnelEvent> {
        let ev: Vec<TunnelEvent> = self.events.try_iter().collect();
        for e in &ev {
            match e {
                TunnelEvent::Opened {
                    local,
                    toward,
                    remote,
                } => {
                    self.remotes.insert(*local, *remote);
                    if let Some(c) = toward.and_then(|t| self.clients.get_mut(&t)) {
                        c.local = Some(*local);
                    }
                }
                TunnelEvent::Closed { local, toward } => {
                    if let Some(l) = local {
                        self.remotes.remove(l);
                    }
                    if let Some(t) = toward {
                        self.clients.remove(t);
                        self.retry_at.insert(*t, now_ms + RETRY_MS);
                    }
                }
            }
        }
        ev
    }

    /// The TCP peer of the tunnel whose local end is `local`.
    pub fn remote_of(&self, local: SocketAddr) -> Option<SocketAddr> {
        self.remotes.get(&local).copied()
    }

    /// Opens a tunnel to each relay in `wanted` (with the endpoints to try) that has none, and
    /// closes those no longer wanted for [`LINGER_MS`].
    pub fn reconcile(&mut self, wanted: &[(Tag, Vec<SocketAddr>)], now_ms: u64) {
        for (tag, targets) in wanted {
            if let Some(c) = self.clients.get_mut(tag) {
                c.unwanted_since_ms = None;
                continue;
            }
            if self.retry_at.get(tag).is_some_and(|t| now_ms < *t) || targets.is_empty() {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            self.clients.insert(
                *tag,
                Client {
                    stop: stop.clone(),
                    local: None,
                    unwanted_since_ms: None,
                },
            );
            let (tag, targets, vxlan, tx, counters, all) = (
                *tag,
                targets.clone(),
                self.vxlan,
                self.events_tx.clone(),
                self.counters.clone(),
                self.stop.clone(),
            );
            info!(relay = %tag, ?targets, "reach: no UDP to the relay; opening a TCP tunnel");
            let spawned = std::thread::Builder::new()
                .name("reach-tunnel".into())
                .spawn(move || {
                    for to in &targets {
                        if stop.load(Relaxed) || all.load(Relaxed) {
                            break;
                        }
                        match TcpStream::connect_timeout(to, CONNECT_TIMEOUT) {
                            Ok(s) => {
                                let both = StopEither(stop.clone(), all.clone());
                                pipe(s, vxlan, Some(tag), &tx, &both, &counters);
                                return;
                            }
                            Err(e) => debug!(%to, "reach: tunnel connect: {e}"),
                        }
                    }
                    let _ = tx.send(TunnelEvent::Closed {
                        local: None,
                        toward: Some(tag),
                    });
                });
            if spawned.is_err() {
                self.clients.remove(&tag);
            }
        }
        for (tag, c) in self.clients.iter_mut() {
            if wanted.iter().any(|(t, _)| t == tag) {
                continue;
            }
            let since = *c.unwanted_since_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(since) >= LINGER_MS && !c.stop.load(Relaxed) {
                info!(relay = %tag, local = ?c.local, "reach: UDP to the relay answers again; closing its TCP tunnel");
                c.stop.store(true, Relaxed);
            }
        }
    }
}

/// A stop flag the pipe looks at: its own, or all of them.
trait Stop: Send + Sync {
    fn stopped(&self) -> bool;
}

impl Stop for Arc<AtomicBool> {
    fn stopped(&self) -> bool {
        self.load(Relaxed)
    }
}

struct StopEither(Arc<AtomicBool>, Arc<AtomicBool>);

impl Stop for StopEither {
    fn stopped(&self) -> bool {
        self.0.load(Relaxed) || self.1.load(Relaxed)
    }
}

/// A read that found nothing within its timeout (or was interrupted): look at the stop flag
/// and read again.
fn no_data(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Runs one tunnel until it closes: TCP to the local end's UDP socket on this thread, the
/// other way on a second one.
fn pipe(
    tcp: TcpStream,
    vxlan: SocketAddr,
    toward: Option<Tag>,
    tx: &Sender<TunnelEvent>,
    stop: &(impl Stop + ?Sized),
    counters: &TunnelCounters,
) {
    let remote = tcp.peer_addr().ok();
    let setup = || -> io::Result<(UdpSocket, TcpStream)> {
        let udp = UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))?;
        // Connected: the local end takes datagrams from the VXLAN port alone.
        udp.connect(vxlan)?;
        udp.set_read_timeout(Some(TICK))?;
        tcp.set_nodelay(true)?;
        tcp.set_read_timeout(Some(TICK))?;
        let writer = tcp.try_clone()?;
        Ok((udp, writer))
    };
    let (udp, mut writer) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warn!("reach: tunnel set-up: {e}");
            let _ = tx.send(TunnelEvent::Closed {
                local: None,
                toward,
            });
            return;
        }
    };
    let local = udp.local_addr().ok();
    let (Some(local), Some(remote)) = (local, remote) else {
        let _ = tx.send(TunnelEvent::Closed {
            local: None,
            toward,
        });
        return;
    };
    counters.open.fetch_add(1, Relaxed);
    counters.opened.fetch_add(1, Relaxed);
    info!(%local, %remote, relay = ?toward.map(|t| t.to_string()), "reach: TCP tunnel open");
    let _ = tx.send(TunnelEvent::Opened {
        local,
        toward,
        remote,
    });
    let done = AtomicBool::new(false);
    let last_in = std::sync::Mutex::new(Instant::now());
    let touch = || {
        *last_in.lock_or_recover() = Instant::now();
    };
    let idle = || last_in.lock_or_recover().elapsed() >= IDLE;
    let over = || done.load(Relaxed) || stop.stopped() || idle();
    std::thread::scope(|s| {
        // Local end -> TCP.
        s.spawn(|| {
            let mut buf = vec![0u8; FRAME_HEADER + MAX_DATAGRAM];
            while !over() {
                match udp.recv(&mut buf[FRAME_HEADER..]) {
                    Ok(n) => {
                        let Some(f) = frame_in_place(&mut buf, n) else {
                            continue;
                        };
                        if writer.write_all(f).is_err() {
                            break;
                        }
                        counters.datagrams_out.fetch_add(1, Relaxed);
                    }
                    // The VXLAN port not there for a moment (a restart) is no reason to close.
                    Err(e) if no_data(&e) || e.kind() == io::ErrorKind::ConnectionRefused => {}
                    Err(_) => break,
                }
            }
            done.store(true, Relaxed);
        });
        // TCP -> local end.
        let mut reader = &tcp;
        let mut de = Deframer::default();
        let mut buf = vec![0u8; 64 * 1024];
        while !over() {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    touch();
                    let r = de.push(&buf[..n], |d| {
                        counters.datagrams_in.fetch_add(1, Relaxed);
                        let _ = udp.send(d);
                    });
                    if r.is_err() {
                        counters.malformed.fetch_add(1, Relaxed);
                        break;
                    }
                }
                Err(e) if no_data(&e) => {}
                Err(_) => break,
            }
        }
        done.store(true, Relaxed);
        let _ = tcp.shutdown(Shutdown::Both);
    });
    counters.open.fetch_sub(1, Relaxed);
    info!(%local, %remote, "reach: TCP tunnel closed");
    let _ = tx.send(TunnelEvent::Closed {
        local: Some(local),
        toward,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_come_out_whole_however_the_stream_is_cut() {
        let dgrams: Vec<Vec<u8>> = vec![vec![1], vec![2; 300], vec![3; 65535], vec![4; 7]];
        let stream: Vec<u8> = dgrams.iter().flat_map(|d| frame(d).unwrap()).collect();
        for cut in [1usize, 2, 3, 5, 1000, 70_000] {
            let mut de = Deframer::default();
            let mut got = Vec::new();
            for chunk in stream.chunks(cut) {
                de.push(chunk, |d| got.push(d.to_vec())).unwrap();
                assert!(de.pending() < 2 + 65535, "holds at most one datagram");
            }
            assert_eq!(got, dgrams, "cut {cut}");
            assert_eq!(de.pending(), 0);
        }
    }

    #[test]
    fn an_empty_datagram_is_malformed_and_nothing_oversized_is_framed() {
        let mut de = Deframer::default();
        assert!(de.push(&[0, 0, 9], |_| panic!("no datagram")).is_err());
        assert_eq!(frame(&[]), None);
        assert_eq!(frame(&vec![0; 65536]), None);
        assert_eq!(frame(&[7]).unwrap(), vec![0, 1, 7]);
    }

    /// A relay takes at most its limit of tunnels at once; the next connection is refused and
    /// counted, and one closing makes room again.
    #[test]
    fn a_relay_takes_at_most_its_limit_of_tunnels() {
        let vx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut relay = Tunnels::new(vx.local_addr().unwrap());
        relay.limit = 2;
        let at = relay.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let wait = |what: &str, f: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !f() {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let a = TcpStream::connect(at).unwrap();
        let _b = TcpStream::connect(at).unwrap();
        wait("two open", &|| relay.counters.open.load(Relaxed) == 2);
        let _c = TcpStream::connect(at).unwrap();
        wait("the third refused", &|| {
            relay.counters.refused.load(Relaxed) == 1
        });
        drop(a);
        wait("one closed", &|| relay.counters.open.load(Relaxed) == 1);
        let _d = TcpStream::connect(at).unwrap();
        wait("room again", &|| relay.counters.open.load(Relaxed) == 2);
        assert_eq!(relay.counters.refused.load(Relaxed), 1);
    }

    /// Two tunnels ends on loopback: a "relay" accepting and a "member" connecting, each with
    /// a UDP socket standing for its VXLAN port. A datagram from one VXLAN socket to its local
    /// end comes out of the other local end into the other VXLAN socket, both ways; a
    /// connection that sends garbage is closed and counted. (Loopback only; no root.)
    #[test]
    fn a_tunnel_carries_datagrams_both_ways_between_two_vxlan_sockets() {
        let relay_vx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let member_vx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&relay_vx, &member_vx] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        let mut relay = Tunnels::new(relay_vx.local_addr().unwrap());
        let at = relay.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut member = Tunnels::new(member_vx.local_addr().unwrap());
        let tag = Tag([7; 8]);
        member.reconcile(&[(tag, vec![at])], 0);
        let wait = |t: &mut Tunnels| -> SocketAddr {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                for e in t.events(0) {
                    if let TunnelEvent::Opened { local, .. } = e {
                        return local;
                    }
                }
                assert!(Instant::now() < deadline, "no tunnel opened");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let m_end = wait(&mut member);
        let r_end = wait(&mut relay);
        assert_eq!(member.remote_of(m_end), Some(at));
        let mut buf = [0u8; 70_000];
        // Member -> relay.
        member_vx.send_to(&[0x20; 1400], m_end).unwrap();
        let (n, from) = relay_vx.recv_from(&mut buf).unwrap();
        assert_eq!((n, from), (1400, r_end));
        // Relay -> member, a large one.
        relay_vx.send_to(&vec![0x22; 60_000], r_end).unwrap();
        let (n, from) = member_vx.recv_from(&mut buf).unwrap();
        assert_eq!((n, from), (60_000, m_end));
        // The local end takes datagrams from its VXLAN port only.
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(&[0x20; 10], m_end).unwrap();
        relay_vx
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(
            relay_vx.recv_from(&mut buf).is_err(),
            "a stranger's datagram crossed"
        );
        // Garbage on a raw connection to the relay: closed and counted.
        let mut raw = TcpStream::connect(at).unwrap();
        raw.write_all(&[0, 0, 1, 2, 3]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while relay.counters.malformed.load(Relaxed) == 0 {
            assert!(Instant::now() < deadline, "garbage not counted");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Not wanted any more: closed after the linger time.
        member.reconcile(&[], 1);
        member.reconcile(&[], 1 + LINGER_MS);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if member
                .events(2 + LINGER_MS)
                .iter()
                .any(|e| matches!(e, TunnelEvent::Closed { local: Some(l), .. } if *l == m_end))
            {
                break;
            }
            assert!(Instant::now() < deadline, "the unwanted tunnel stayed open");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
