//! TCP links: a framed stream (see `vnet_wire::StreamDecoder`) for networks that block UDP.
//!
//! A link owns a bounded queue of outgoing records and one writer thread. The dialing side's
//! writer also (re)connects with exponential backoff; the accepting side's writer waits for a
//! listener to hand it a connection. Each connection gets a reader thread that feeds the
//! forwarding engine and, on end of stream or a protocol error, retires the connection.
//!
//! TCP links are not authenticated: a connection is the peer's if it comes from the peer's
//! address. So a new connection never replaces a live one (whoever can connect from that
//! address would take the link over): it is held, one per link, until the current one is
//! seen dead (end of stream, an error, or the keepalive/user timeout below), and refused if
//! that does not happen within [`HOLD_TIMEOUT`]. A restarted peer gets through once its old
//! connection ends; a rebooted one once the dead connection is noticed (seconds).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use vnet_control::status::LinkState;

use tracing::{debug, info, warn};
use vnet_core::{CondvarRecover, DropReason, LockRecover, PortId};
use vnet_offload::VirtioNetHdr;
use vnet_wire::{
    stream_record_prefix, StreamDecoder, StreamHello, VxlanPacket, VxlanRepr, STREAM_HELLO_LEN,
    VXLAN_HEADER_LEN,
};

use crate::batch::TxBatch;
use crate::forward::{process, Arrival, FwdCtx as RxCtx};
use crate::port::{Frame, Port, Tx};
use crate::ports::{send_segments, Opened};
use crate::shared::Shared;
use crate::sys::{wait_readable, EventFd, Wake};
use crate::worker::Worker;

/// Records waiting while the peer is unreachable; beyond this they are dropped (`queue_full`).
pub const TCP_QUEUE_LEN: usize = 1024;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a connect attempt waits for an answer. The kernel retransmits the SYN after 1 s,
/// so an underlay that comes back is answered within about a second.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Data the peer has not acknowledged for this long ends the connection (`TCP_USER_TIMEOUT`),
/// instead of the kernel's retransmission backoff, which after a long underlay cut leaves the
/// next retransmission many seconds away and, by default, gives up only after ~15 minutes.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(4);
/// Keepalive probes on an idle connection (no data to acknowledge): first after this much
/// silence, then every `TCP_KEEPALIVE_INTERVAL`; `TCP_KEEPALIVE_PROBES` unanswered probes (or
/// `TCP_USER_TIMEOUT`, whichever comes first) end it. So a silent dead peer is noticed in ~4 s.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(1);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
pub const TCP_KEEPALIVE_PROBES: u32 = 3;
const MAX_PENDING_HANDSHAKES: usize = 64;
/// How long a new connection for a `tcp accept` link waits, ungreeted, for the link's live
/// connection to end. Shorter than the dialer's wait for the greeting (`HANDSHAKE_TIMEOUT`),
/// so a connection let in is greeted before its dialer gives up; a refused dialer dials again.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpRole {
    Dial(SocketAddr),
    Accept,
}

const DOWN: u8 = 0;
const CONNECTING: u8 = 1;
const UP: u8 = 2;

struct Conn {
    stream: Arc<TcpStream>,
    id: u64,
}

pub struct TcpLink {
    /// This link, for the reader threads a connection starts.
    me: Weak<TcpLink>,
    port: PortId,
    vni: u32,
    role: TcpRole,
    queue: Mutex<VecDeque<Vec<u8>>>,
    wake: Condvar,
    conn: Mutex<Option<Conn>>,
    /// Signalled when the current connection is retired (or the link stops).
    conn_gone: Condvar,
    /// A new connection is held waiting for the current one to end (changed under `conn`).
    held: AtomicBool,
    next_conn: AtomicU64,
    state: AtomicU8,
    stop: AtomicBool,
    shared: Arc<Shared>,
}

impl TcpLink {
    /// Starts the link's writer thread.
    pub fn start(
        shared: Arc<Shared>,
        port: PortId,
        vni: u32,
        role: TcpRole,
    ) -> io::Result<(Arc<TcpLink>, Worker)> {
        let link = Arc::new_cyclic(|me| TcpLink {
            me: me.clone(),
            port,
            vni,
            role,
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            conn: Mutex::new(None),
            conn_gone: Condvar::new(),
            held: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
            state: AtomicU8::new(if matches!(role, TcpRole::Dial(_)) {
                CONNECTING
            } else {
                DOWN
            }),
            stop: AtomicBool::new(false),
            shared,
        });
        let l = link.clone();
        let stopper = link.clone();
        let worker = Worker::spawn_with_stopper(
            format!("tcp-link-{}", port.0),
            move |_stop| l.writer_loop(),
            move || stopper.shutdown(),
        )?;
        Ok((link, worker))
    }

    pub fn state(&self) -> LinkState {
        match self.state.load(Relaxed) {
            UP => LinkState::Up,
            CONNECTING => LinkState::Connecting,
            _ => LinkState::Down,
        }
    }

    /// Queues one frame, gathered from `parts`, for the peer.
    pub fn send(&self, parts: &[&[u8]]) -> Result<(), DropReason> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut record = Vec::with_capacity(4 + 8 + len);
        record.extend_from_slice(&stream_record_prefix(8 + len));
        record.extend_from_slice(&VxlanRepr { vni: self.vni }.header());
        for p in parts {
            record.extend_from_slice(p);
        }
        let mut q = self.queue.lock_or_recover();
        if q.len() >= TCP_QUEUE_LEN {
            return Err(DropReason::QueueFull);
        }
        q.push_back(record);
        drop(q);
        self.wake.notify_all();
        Ok(())
    }

    fn shutdown(&self) {
        self.stop.store(true, SeqCst);
        if let Some(c) = self.conn.lock_or_recover().take() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.conn_gone.notify_all();
        self.wake.notify_all();
    }

    /// Makes a dialed, greeted connection the link's.
    fn attach(self: &Arc<Self>, stream: TcpStream) {
        let mut c = self.conn.lock_or_recover();
        self.install(&mut c, stream);
    }

    /// Refuses an offered connection (counted `bad_stream`); false, `offer`'s answer.
    fn refuse(&self, peer: Option<std::net::SocketAddr>, why: &str) -> bool {
        warn!(port = self.port.0, ?peer, "tcp link: {why}");
        self.count(DropReason::BadStream);
        false
    }

    /// Takes a connection a listener accepted for this link (its greeting read, ours not yet
    /// sent): greets it and makes it the link's if the link has no live connection, or once the
    /// live one ends within [`HOLD_TIMEOUT`]; otherwise refuses it (counted `bad_stream`).
    /// Blocks the calling handshake thread while the connection is held.
    fn offer(self: &Arc<Self>, mut stream: TcpStream) -> bool {
        let peer = stream.peer_addr().ok();
        let mut c = self.conn.lock_or_recover();
        if c.is_some() {
            if self.held.swap(true, SeqCst) {
                drop(c);
                return self.refuse(
                    peer,
                    "another connection already waits for the live one to end; refusing",
                );
            }
            info!(
                port = self.port.0,
                ?peer,
                "tcp link: a new connection while the current one is alive; holding it"
            );
            let deadline = Instant::now() + HOLD_TIMEOUT;
            loop {
                let now = Instant::now();
                if c.is_none() || self.stop.load(SeqCst) || now >= deadline {
                    break;
                }
                c = self.conn_gone.wait_timeout_or_recover(c, deadline - now).0;
            }
            self.held.store(false, SeqCst);
            if c.is_some() || self.stop.load(SeqCst) {
                drop(c);
                return self.refuse(
                    peer,
                    "the current connection is alive; refusing the new one",
                );
            }
        }
        // Greeted under the lock, so no other connection can become the link's in between.
        let greeted = stream
            .write_all(&StreamHello { vni: self.vni }.emit())
            .and_then(|_| stream.set_read_timeout(None));
        if greeted.is_err() {
            return false;
        }
        info!(port = self.port.0, ?peer, "tcp link accepted");
        self.install(&mut c, stream);
        true
    }

    /// Makes `stream` the current connection (in `c`, the locked `conn`) and starts its reader.
    fn install(self: &Arc<Self>, c: &mut Option<Conn>, stream: TcpStream) {
        if let Err(e) = set_liveness(&stream) {
            // The link still works; it only notices a dead peer as late as the kernel does.
            warn!(
                port = self.port.0,
                "tcp link: could not set keepalive/user timeout: {e}"
            );
        }
        let stream = Arc::new(stream);
        let id = self.next_conn.fetch_add(1, Relaxed);
        if let Some(old) = c.replace(Conn {
            stream: stream.clone(),
            id,
        }) {
            let _ = old.stream.shutdown(Shutdown::Both);
        }
        self.state.store(UP, Relaxed);
        self.wake.notify_all();
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tcp-rx-{}", self.port.0))
            .spawn(move || me.reader_loop(stream, id));
        if spawned.is_err() {
            warn!(port = self.port.0, "could not start a TCP reader thread");
            if let Some(old) = c.take() {
                let _ = old.stream.shutdown(Shutdown::Both);
            }
            self.state.store(self.idle_state(), Relaxed);
        }
    }

    /// The state without a connection.
    fn idle_state(&self) -> u8 {
        if matches!(self.role, TcpRole::Dial(_)) {
            CONNECTING
        } else {
            DOWN
        }
    }

    /// Forgets connection `id` if it is still the current one.
    fn retire(&self, id: u64) {
        let mut c = self.conn.lock_or_recover();
        if c.as_ref().map(|c| c.id) == Some(id) {
            if let Some(old) = c.take() {
                let _ = old.stream.shutdown(Shutdown::Both);
            }
            self.state.store(self.idle_state(), Relaxed);
        }
        drop(c);
        self.conn_gone.notify_all();
        self.wake.notify_all();
    }

    fn current(&self) -> Option<(Arc<TcpStream>, u64)> {
        self.conn
            .lock_or_recover()
            .as_ref()
            .map(|c| (c.stream.clone(), c.id))
    }

    fn writer_loop(self: Arc<Self>) {
        let mut backoff = BACKOFF_MIN;
        let mut batch: Vec<Vec<u8>> = Vec::new();
        while !self.stop.load(SeqCst) {
            let Some((stream, id)) = self.current() else {
                match self.role {
                    TcpRole::Dial(addr) => match self.dial(addr) {
                        Ok(s) => {
                            info!(port = self.port.0, %addr, "tcp link connected");
                            backoff = BACKOFF_MIN;
                            self.attach(s);
                        }
                        Err(e) => {
                            debug!(port = self.port.0, %addr, "tcp link connect failed: {e}");
                            if unanswered(&e) {
                                // Nothing answered (an underlay cut, a host down): the attempt
                                // itself waited CONNECT_TIMEOUT, so try again at once, or the
                                // backoff grown over a long cut would delay recovery by up to
                                // BACKOFF_MAX after the cut ends.
                                backoff = BACKOFF_MIN;
                                self.sleep(BACKOFF_MIN);
                            } else {
                                // Refused or a bad greeting: the peer is there but not ready.
                                self.sleep(backoff);
                                backoff = (backoff * 2).min(BACKOFF_MAX);
                            }
                        }
                    },
                    TcpRole::Accept => self.sleep(Duration::from_millis(200)),
                }
                continue;
            };
            {
                let mut q = self.queue.lock_or_recover();
                if q.is_empty() {
                    q = self
                        .wake
                        .wait_timeout_or_recover(q, Duration::from_millis(200))
                        .0;
                }
                let take = q.len().min(64);
                batch.extend(q.drain(..take));
            }
            if batch.is_empty() {
                continue;
            }
            let slices: Vec<IoSlice> = batch.iter().map(|r| IoSlice::new(r)).collect();
            if let Err(e) = write_all_vectored(&stream, slices) {
                debug!(port = self.port.0, "tcp link write failed: {e}");
                if let Some(c) = self.shared.port_counters(self.port) {
                    for _ in 0..batch.len() {
                        c.count_drop(DropReason::TxError);
                    }
                }
                self.retire(id);
            }
            batch.clear();
        }
    }

    /// Sleeps for `d` (traffic notifications do not cut it short), or until the link stops.
    fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        let mut q = self.queue.lock_or_recover();
        loop {
            let now = Instant::now();
            if self.stop.load(SeqCst) || now >= deadline || self.current().is_some() {
                return;
            }
            q = self.wake.wait_timeout_or_recover(q, deadline - now).0;
        }
    }

    fn dial(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        s.write_all(&StreamHello { vni: self.vni }.emit())?;
        let mut hello = [0u8; STREAM_HELLO_LEN];
        s.read_exact(&mut hello)?;
        match StreamHello::parse(&hello) {
            Ok(h) if h.vni == self.vni => {}
            _ => {
                self.shared.daemon.count_drop(DropReason::BadStream);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad greeting from peer",
                ));
            }
        }
        s.set_read_timeout(None)?;
        Ok(s)
    }

    fn reader_loop(self: Arc<Self>, stream: Arc<TcpStream>, id: u64) {
        let mut ctx = RxCtx::new();
        let mut dec = StreamDecoder::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut s: &TcpStream = &stream;
        let mut ranges = Vec::new();
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            dec.push(&buf[..n]);
            // Every record of this read, forwarded as one batch (one snapshot, one sendmmsg).
            ranges.clear();
            let mut broken = false;
            loop {
                match dec.next_range() {
                    Ok(Some(r)) => ranges.push(r),
                    Ok(None) => break,
                    Err(e) => {
                        warn!(port = self.port.0, "tcp link stream error: {e}; closing");
                        self.count(DropReason::BadStream);
                        broken = true;
                        break;
                    }
                }
            }
            let data = dec.buffer();
            let snap = self.shared.snapshot.load_full();
            let mut batch = TxBatch::default();
            for r in &ranges {
                match VxlanPacket::new_checked(&data[r.clone()]) {
                    Ok(p) if p.vni() == self.vni => {
                        let frame = &data[r.start + VXLAN_HEADER_LEN..r.end];
                        process(
                            &self.shared,
                            &snap,
                            &mut ctx,
                            self.port,
                            Arrival::local(VirtioNetHdr::default(), frame),
                            &mut batch,
                        );
                    }
                    Ok(_) => self.count(DropReason::UnknownVni),
                    Err(_) => self.count(DropReason::BadVxlan),
                }
            }
            batch.flush(&self.shared.offload, &self.shared.daemon, &snap.udp);
            ctx.flush(&self.shared);
            if broken {
                break;
            }
        }
        ctx.flush(&self.shared);
        if dec.pending() > 0 {
            // The peer closed mid-frame.
            self.count(DropReason::Truncated);
        }
        self.retire(id);
    }

    fn count(&self, r: DropReason) {
        if let Some(c) = self.shared.port_counters(self.port) {
            c.count_drop(r);
        }
    }
}

/// A connect attempt that got no answer in time (no SYN-ACK, or no greeting), as opposed to a
/// refusal or a bad greeting.
fn unanswered(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// Makes a dead connection fail in seconds: `TCP_USER_TIMEOUT` for unacknowledged data and
/// short keepalives for an idle connection. The reader's `read` and the writer's `writev` then
/// return an error, the connection is retired and the dialing side reconnects.
fn set_liveness(stream: &TcpStream) -> io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    sock.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT))?;
    sock.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(TCP_KEEPALIVE_IDLE)
            .with_interval(TCP_KEEPALIVE_INTERVAL)
            .with_retries(TCP_KEEPALIVE_PROBES),
    )
}

fn write_all_vectored(mut s: &TcpStream, mut slices: Vec<IoSlice>) -> io::Result<()> {
    let mut bufs: &mut [IoSlice] = &mut slices;
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A tcp link (`link add ... tcp IP:PORT` dials, `tcp accept IP` waits for a listener).
pub fn open(shared: &Arc<Shared>, id: PortId, l: &vnet_control::Link) -> io::Result<Opened> {
    let (role, accept) = match &l.kind {
        vnet_control::LinkKind::TcpDial(a) => (TcpRole::Dial(*a), None),
        vnet_control::LinkKind::TcpAccept(ip) => (TcpRole::Accept, Some(ip.to_canonical())),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a tcp link",
            ))
        }
    };
    let (link, w) = TcpLink::start(shared.clone(), id, l.vni, role)?;
    let mut o = Opened::new(link, vnet_core::PortKind::OverlayLink);
    o.workers.push(w);
    o.tcp_accept_peer = accept;
    Ok(o)
}

/// A `listen tcp` socket: greets incoming connections and hands them to their `tcp accept` link.
pub fn start_listener(shared: Arc<Shared>, addr: SocketAddr) -> io::Result<Worker> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("listen on {addr}: {e}")))?;
    listener.set_nonblocking(true)?;
    let pending = Arc::new(AtomicUsize::new(0));
    Worker::spawn(
        format!("tcp-listen-{}", addr.port()),
        move |stop: Arc<EventFd>| loop {
            match wait_readable(listener.as_raw_fd(), &stop, None) {
                Ok(Wake::Stop) | Err(_) => break,
                Ok(_) => {}
            }
            while let Ok((s, peer)) = listener.accept() {
                if pending.load(SeqCst) >= MAX_PENDING_HANDSHAKES {
                    shared.daemon.count_drop(DropReason::BadStream);
                    continue;
                }
                pending.fetch_add(1, SeqCst);
                let (sh, pend) = (shared.clone(), pending.clone());
                let r = std::thread::Builder::new()
                    .name("tcp-handshake".into())
                    .spawn(move || {
                        handshake(&sh, s, peer);
                        pend.fetch_sub(1, SeqCst);
                    });
                if r.is_err() {
                    pending.fetch_sub(1, SeqCst);
                }
            }
        },
    )
}

fn handshake(shared: &Shared, mut s: TcpStream, peer: SocketAddr) {
    let setup = s
        .set_nonblocking(false)
        .and_then(|_| s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|_| s.set_nodelay(true));
    if setup.is_err() {
        return;
    }
    let mut hello = [0u8; STREAM_HELLO_LEN];
    let Ok(h) = s
        .read_exact(&mut hello)
        .map_err(|_| ())
        .and_then(|_| StreamHello::parse(&hello).map_err(|_| ()))
    else {
        warn!(%peer, "tcp listener: bad or missing greeting; closing");
        shared.daemon.count_drop(DropReason::BadStream);
        return;
    };
    let Some(link) = shared.tcp_accept_port(peer.ip().to_canonical(), h.vni) else {
        warn!(%peer, vni = h.vni, "tcp listener: no tcp accept link for this peer; closing");
        shared.daemon.count_drop(DropReason::UnknownPeer);
        return;
    };
    // The link greets it, now or once its live connection ends, or refuses it.
    link.accept_stream(s);
}

impl Port for TcpLink {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        send_segments(tx, f, |parts| TcpLink::send(self, parts))
    }

    fn state(&self) -> LinkState {
        TcpLink::state(self)
    }

    fn accept_stream(&self, stream: TcpStream) -> bool {
        match self.me.upgrade() {
            Some(link) => link.offer(stream),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_options_are_set_on_a_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        set_liveness(&client).expect("set options");
        let sock = socket2::SockRef::from(&client);
        assert_eq!(
            sock.tcp_user_timeout().expect("get"),
            Some(TCP_USER_TIMEOUT)
        );
        assert!(sock.keepalive().expect("get"));
        assert_eq!(sock.keepalive_time().expect("get"), TCP_KEEPALIVE_IDLE);
        assert_eq!(
            sock.keepalive_interval().expect("get"),
            TCP_KEEPALIVE_INTERVAL
        );
        assert_eq!(sock.keepalive_retries().expect("get"), TCP_KEEPALIVE_PROBES);
    }

    /// What a client of an accepting link receives within `wait`: bytes, and whether the
    /// link closed the connection.
    fn received(c: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
        c.set_read_timeout(Some(wait)).expect("timeout");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return (got, true),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return (got, true),
                Err(_) => return (got, false),
            }
        }
    }

    /// A new connection for an accepting link never replaces its live one: it is held (one at
    /// a time; another is refused at once), greeted only once the live one ends, and refused
    /// if that does not happen within HOLD_TIMEOUT. Frames go to the current connection only.
    #[test]
    fn a_live_connection_is_not_replaced() {
        let sh = crate::testing::shared();
        let (link, mut worker) = TcpLink::start(sh, PortId(4), 7, TcpRole::Accept).expect("link");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let connect = || {
            let c = TcpStream::connect(addr).expect("connect");
            let (s, _) = listener.accept().expect("accept");
            (c, s)
        };
        let hello = StreamHello { vni: 7 }.emit();

        let (mut first, s) = connect();
        assert!(link.offer(s));
        let (got, _) = received(&mut first, Duration::from_millis(200));
        assert_eq!(got, hello);
        assert_eq!(link.state(), LinkState::Up);

        // A second one while the first is alive: held, ungreeted.
        let (mut second, s) = connect();
        let l2 = link.clone();
        let held = std::thread::spawn(move || l2.offer(s));
        std::thread::sleep(Duration::from_millis(100));
        // A third meanwhile: refused at once.
        let (mut third, s) = connect();
        let t0 = Instant::now();
        assert!(!link.offer(s));
        assert!(t0.elapsed() < Duration::from_millis(500));
        assert_eq!(received(&mut third, Duration::from_secs(1)), (vec![], true));
        // Frames still go to the first connection only.
        link.send(&[b"frame-1"]).expect("queued");
        let (got, closed) = received(&mut first, Duration::from_millis(300));
        assert!(!closed && got.ends_with(b"frame-1"), "{got:?}");
        assert_eq!(
            received(&mut second, Duration::from_millis(100)),
            (vec![], false)
        );

        // The first ends: the held one is greeted and becomes the link's.
        drop(first);
        assert!(held.join().expect("offer"));
        let (got, closed) = received(&mut second, Duration::from_millis(300));
        assert!(!closed && got == hello, "{got:?}");
        link.send(&[b"frame-2"]).expect("queued");
        let (got, _) = received(&mut second, Duration::from_millis(300));
        assert!(got.ends_with(b"frame-2"), "{got:?}");

        // One more while the second stays alive: refused after HOLD_TIMEOUT, nothing sent.
        let (mut fourth, s) = connect();
        let t0 = Instant::now();
        assert!(!link.offer(s));
        assert!(t0.elapsed() >= HOLD_TIMEOUT);
        assert_eq!(
            received(&mut fourth, Duration::from_secs(1)),
            (vec![], true)
        );
        link.send(&[b"frame-3"]).expect("queued");
        let (got, _) = received(&mut second, Duration::from_millis(300));
        assert!(got.ends_with(b"frame-3"), "{got:?}");
        worker.stop();
    }

    #[test]
    fn only_unanswered_attempts_skip_the_backoff() {
        assert!(unanswered(&io::ErrorKind::TimedOut.into()));
        assert!(unanswered(&io::ErrorKind::WouldBlock.into()));
        assert!(!unanswered(&io::ErrorKind::ConnectionRefused.into()));
        assert!(!unanswered(&io::ErrorKind::InvalidData.into()));
    }

    #[test]
    fn frames_sent_through_the_port_arrive_framed_on_the_stream() {
        use crate::batch::TxBatch;
        use crate::forward::{process, Arrival, FwdCtx};
        use crate::testing::*;
        let sh = shared();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let (link, mut worker) = TcpLink::start(
            sh.clone(),
            PortId(3),
            5,
            TcpRole::Dial(listener.local_addr().expect("addr")),
        )
        .expect("link");
        let mut a = TestPort::interface(1, mac(1), Arc::new(Recorder::default()));
        a.vni = 5;
        let mut l = TestPort::link(3, link.clone());
        l.vni = 5;
        let mut r = route(mac(9), 3);
        r.vni = 5;
        publish(&sh, vec![a, l], vec![r]);
        // The peer's side: greet back, then read records.
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut hello = [0u8; STREAM_HELLO_LEN];
        s.read_exact(&mut hello).expect("greeting");
        assert_eq!(StreamHello::parse(&hello).expect("hello").vni, 5);
        s.write_all(&StreamHello { vni: 5 }.emit()).unwrap();
        let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(mac(9), mac(1), 100 + i)).collect();
        let snap = sh.snapshot.load_full();
        let mut batch = TxBatch::default();
        for f in &frames {
            process(
                &sh,
                &snap,
                &mut FwdCtx::new(),
                PortId(1),
                Arrival::local(VirtioNetHdr::default(), f),
                &mut batch,
            );
        }
        let mut dec = StreamDecoder::new();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while got.len() < 3 {
            let n = s.read(&mut buf).expect("records");
            assert!(n > 0, "stream closed early");
            dec.push(&buf[..n]);
            while let Ok(Some(r)) = dec.next_range() {
                got.push(dec.buffer()[r].to_vec());
            }
        }
        for (rec, f) in got.iter().zip(&frames) {
            let p = VxlanPacket::new_checked(&rec[..]).expect("VXLAN record");
            assert_eq!(p.vni(), 5);
            assert_eq!(&rec[VXLAN_HEADER_LEN..], &f[..]);
        }
        assert_eq!(Port::state(&*link), LinkState::Up);
        worker.stop();
    }
}
