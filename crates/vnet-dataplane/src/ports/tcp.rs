//! TCP links: a framed stream (see `vnet_wire::StreamDecoder`) for networks that block UDP.
//!
//! A link owns a bounded queue of outgoing records and one writer thread. The dialing side's
//! writer also (re)connects with exponential backoff; the accepting side's writer waits for a
//! listener to hand it a connection. Each connection gets a reader thread that feeds the
//! forwarding engine and, on end of stream or a protocol error, retires the connection.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use vnet_control::status::LinkState;

use tracing::{debug, info, warn};
use vnet_core::{DropReason, PortId};
use vnet_offload::VirtioNetHdr;
use vnet_wire::{
    stream_record_prefix, StreamDecoder, StreamHello, VxlanPacket, VxlanRepr, STREAM_HELLO_LEN,
    VXLAN_HEADER_LEN,
};

use crate::batch::TxBatch;
use crate::forward::{process, Arrival, FwdCtx as RxCtx};
use crate::port::{Frame, Port, Tx};
use crate::ports::{each_segment, Opened};
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
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
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
        if let Some(c) = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.wake.notify_all();
    }

    /// Hands an accepted, greeted connection to this link, replacing any older one.
    pub fn attach(self: &Arc<Self>, stream: TcpStream) {
        if let Err(e) = set_liveness(&stream) {
            // The link still works; it only notices a dead peer as late as the kernel does.
            warn!(
                port = self.port.0,
                "tcp link: could not set keepalive/user timeout: {e}"
            );
        }
        let stream = Arc::new(stream);
        let id = self.next_conn.fetch_add(1, Relaxed);
        {
            let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(old) = c.replace(Conn {
                stream: stream.clone(),
                id,
            }) {
                let _ = old.stream.shutdown(Shutdown::Both);
            }
        }
        self.state.store(UP, Relaxed);
        self.wake.notify_all();
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tcp-rx-{}", self.port.0))
            .spawn(move || me.reader_loop(stream, id));
        if spawned.is_err() {
            warn!(port = self.port.0, "could not start a TCP reader thread");
            self.retire(id);
        }
    }

    /// Forgets connection `id` if it is still the current one.
    fn retire(&self, id: u64) {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if c.as_ref().map(|c| c.id) == Some(id) {
            if let Some(old) = c.take() {
                let _ = old.stream.shutdown(Shutdown::Both);
            }
            self.state.store(
                if matches!(self.role, TcpRole::Dial(_)) {
                    CONNECTING
                } else {
                    DOWN
                },
                Relaxed,
            );
        }
        drop(c);
        self.wake.notify_all();
    }

    fn current(&self) -> Option<(Arc<TcpStream>, u64)> {
        self.conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.is_empty() {
                    q = self
                        .wake
                        .wait_timeout(q, Duration::from_millis(200))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
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
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            if self.stop.load(SeqCst) || now >= deadline || self.current().is_some() {
                return;
            }
            q = match self.wake.wait_timeout(q, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
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
    if s.write_all(&StreamHello { vni: h.vni }.emit()).is_err() || s.set_read_timeout(None).is_err()
    {
        return;
    }
    info!(%peer, "tcp link accepted");
    link.accept_stream(s);
}

impl Port for TcpLink {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        let frame = match f.whole() {
            Some(b) => b,
            None => f.copy_into(tx.scratch),
        };
        each_segment(tx.offload, frame, &f.vh, tx.seg, &f.macs, |parts| {
            TcpLink::send(self, parts)
        })
    }

    fn state(&self) -> LinkState {
        TcpLink::state(self)
    }

    fn accept_stream(&self, stream: TcpStream) -> bool {
        match self.me.upgrade() {
            Some(link) => {
                link.attach(stream);
                true
            }
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
