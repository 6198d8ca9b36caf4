//! Dispatcher threads (VNET/P sections 4.5-4.6): each reads a share of the descriptors (TAP
//! queues, the VXLAN socket, packet sockets) and forwards what it reads.
//!
//! - guest-driven: block in `epoll_wait` until a descriptor is ready;
//! - polling: read every descriptor in turn without blocking; a pass that found nothing yields
//!   the core as the yield strategy says (immediate `sched_yield`, timed sleep, or adaptive:
//!   immediate until idle for T_nowork, then timed);
//! - adaptive: measure the frame rate over a window ω and switch with hysteresis, to polling
//!   above α_u and back below α_l.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tracing::{info, warn};
use vnet_control::status::DispatcherStatus;
use vnet_control::{DataPathSettings, DispatchMode, YieldStrategy};
use vnet_core::{DropReason, PortId};
use vnet_offload::{
    claimed_frame_len, complete_checksum, gso_header, PayloadRef, VirtioNetHdr, VIRTIO_NET_HDR_LEN,
};
use vnet_wire::{VxlanPacket, MAX_FRAME_LEN, VXLAN_HEADER_LEN};

use vnet_crypto::wire::is_crypto;
use vnet_crypto::{Message, DATA_HEADER_LEN};

use crate::crypto::{self, LinkCrypto};
use crate::engine::{PortTx, Shared, Snapshot};
use crate::forward::{flush_coalescers, process, FwdCtx, Origin, TxBatch, IDLE_TICK};
use crate::nic::GuestNic;
use crate::packet::PacketSocket;
use crate::sys::{self, cvt, EventFd};
use crate::tap::Tap;
use crate::udp::{Received, VxlanSocket};

/// Frames (or UDP messages) read from one descriptor per pass.
const BATCH: usize = 32;
const RX_BUF: usize = VIRTIO_NET_HDR_LEN + MAX_FRAME_LEN + 64;
const WAKE_TOKEN: u64 = u64::MAX;

static NEXT_SOURCE: AtomicU64 = AtomicU64::new(1);

pub enum SourceKind {
    Tap { tap: Arc<Tap>, queue: usize },
    Udp(Arc<VxlanSocket>),
    Direct(Arc<PacketSocket>),
}

/// A descriptor a dispatcher reads, and the port its frames enter by (none for the shared
/// UDP socket: each datagram's port is found from its source address and VNI).
pub struct Source {
    id: u64,
    port: Option<PortId>,
    kind: SourceKind,
}

impl Source {
    pub fn new(port: Option<PortId>, kind: SourceKind) -> Source {
        Source {
            id: NEXT_SOURCE.fetch_add(1, Relaxed),
            port,
            kind,
        }
    }

    fn fd(&self) -> RawFd {
        match &self.kind {
            SourceKind::Tap { tap, queue } => tap.queue_fd(*queue),
            SourceKind::Udp(s) => s.fd(),
            SourceKind::Direct(p) => p.fd(),
        }
    }
}

/// One dispatcher's shared state: its sources, and counters for `show stats`.
struct DState {
    index: usize,
    epoll: OwnedFd,
    wake: EventFd,
    stop: AtomicBool,
    sources: Mutex<Vec<Arc<Source>>>,
    gen: AtomicU64,
    seen: AtomicU64,
    polling: AtomicBool,
    switches: AtomicU64,
    wakeups: AtomicU64,
    frames: AtomicU64,
}

fn epoll_ctl(ep: RawFd, op: libc::c_int, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: epoll_ctl with a live epoll_event; for EPOLL_CTL_DEL the event is ignored.
    cvt(unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) }).map(|_| ())
}

impl DState {
    fn new(index: usize) -> io::Result<DState> {
        // SAFETY: epoll_create1 takes no pointers; the result is a new descriptor we own.
        let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: ep is fresh and valid.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        let wake = EventFd::new()?;
        epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            wake.fd(),
            WAKE_TOKEN,
        )?;
        Ok(DState {
            index,
            epoll,
            wake,
            stop: AtomicBool::new(false),
            sources: Mutex::new(Vec::new()),
            gen: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            switches: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            frames: AtomicU64::new(0),
        })
    }

    fn count(&self) -> usize {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn add(&self, s: Arc<Source>) {
        if let Err(e) = epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, s.fd(), s.id) {
            warn!(dispatcher = self.index, "epoll add: {e}");
        }
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
        self.gen.fetch_add(1, SeqCst);
        self.wake.signal();
    }

    /// Removes a source and waits (up to 2 s) until the thread no longer uses it.
    fn remove(&self, s: &Arc<Source>) -> bool {
        let mut v = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pos) = v.iter().position(|x| x.id == s.id) else {
            return false;
        };
        v.remove(pos);
        drop(v);
        let _ = epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, s.fd(), 0);
        let g = self.gen.fetch_add(1, SeqCst) + 1;
        self.wake.signal();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.seen.load(SeqCst) < g && Instant::now() < deadline && !self.stop.load(SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

struct Slot {
    state: Arc<DState>,
    thread: Option<JoinHandle<()>>,
}

/// The dispatcher threads, and which sources each reads.
pub struct DispatcherSet {
    shared: Arc<Shared>,
    settings: Arc<ArcSwap<DataPathSettings>>,
    slots: Vec<Slot>,
    sources: Vec<Arc<Source>>,
}

impl DispatcherSet {
    pub fn new(shared: Arc<Shared>, settings: DataPathSettings) -> io::Result<DispatcherSet> {
        let mut d = DispatcherSet {
            shared,
            settings: Arc::new(ArcSwap::from_pointee(settings)),
            slots: Vec::new(),
            sources: Vec::new(),
        };
        d.start()?;
        Ok(d)
    }

    fn start(&mut self) -> io::Result<()> {
        let n = self.settings.load().dispatchers.max(1) as usize;
        for i in 0..n {
            let state = Arc::new(DState::new(i)?);
            let (st, sh, se) = (state.clone(), self.shared.clone(), self.settings.clone());
            let thread = std::thread::Builder::new()
                .name(format!("dispatch-{i}"))
                .spawn(move || run(st, sh, se))?;
            self.slots.push(Slot {
                state,
                thread: Some(thread),
            });
        }
        let sources = std::mem::take(&mut self.sources);
        for s in sources {
            self.add(s);
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        for s in &self.slots {
            s.state.stop.store(true, SeqCst);
            s.state.wake.signal();
        }
        for s in self.slots.iter_mut() {
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
        self.slots.clear();
    }

    /// Gives a source to the dispatcher with the fewest.
    pub fn add(&mut self, s: Arc<Source>) {
        if let Some(slot) = self
            .slots
            .iter()
            .min_by_key(|sl| (sl.state.count(), sl.state.index))
        {
            slot.state.add(s.clone());
        }
        self.sources.push(s);
    }

    pub fn remove(&mut self, s: &Arc<Source>) {
        self.sources.retain(|x| x.id != s.id);
        for slot in &self.slots {
            if slot.state.remove(s) {
                break;
            }
        }
    }

    pub fn contains(&self, s: &Arc<Source>) -> bool {
        self.sources.iter().any(|x| x.id == s.id)
    }

    pub fn settings(&self) -> DataPathSettings {
        (**self.settings.load()).clone()
    }

    /// Applies new settings; the number of dispatchers and their CPUs take a restart of the
    /// threads (a few milliseconds without forwarding), everything else applies at once.
    pub fn configure(&mut self, new: DataPathSettings) -> io::Result<()> {
        let old = self.settings.load_full();
        let restart = old.dispatchers != new.dispatchers || old.cpus != new.cpus;
        self.settings.store(Arc::new(new));
        if restart {
            info!("restarting dispatchers");
            self.stop();
            self.start()?;
        } else {
            // Wake dispatchers blocked in epoll_wait so a new mode applies at once.
            for sl in &self.slots {
                sl.state.wake.signal();
            }
        }
        Ok(())
    }

    pub fn status(&self) -> Vec<DispatcherStatus> {
        self.slots
            .iter()
            .map(|s| {
                let st = &s.state;
                let (w, f) = (st.wakeups.load(Relaxed), st.frames.load(Relaxed));
                DispatcherStatus {
                    index: st.index,
                    mode: if st.polling.load(Relaxed) {
                        "polling"
                    } else {
                        "guest-driven"
                    },
                    switches: st.switches.load(Relaxed),
                    wakeups: w,
                    frames: f,
                    frames_per_wakeup: if w > 0 {
                        (f as f64 / w as f64 * 100.0).round() / 100.0
                    } else {
                        0.0
                    },
                    sources: st.count(),
                }
            })
            .collect()
    }
}

impl Drop for DispatcherSet {
    fn drop(&mut self) {
        self.stop();
    }
}

fn pin_to_cpu(cpu: u32) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            warn!(
                cpu,
                "could not pin dispatcher: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Per-thread buffers and forwarding state.
struct Work {
    bufs: Vec<Vec<u8>>,
    recvd: Vec<Received>,
    /// Datagrams of the current receive batch, after decryption (see `drain_udp`).
    plan: Vec<RxItem>,
    /// Decryption output before it is copied back over the ciphertext.
    scratch: Vec<u8>,
    ctx: FwdCtx,
    read_errors: u64,
}

fn run(st: Arc<DState>, shared: Arc<Shared>, settings: Arc<ArcSwap<DataPathSettings>>) {
    let first = settings.load_full();
    if !first.cpus.is_empty() {
        pin_to_cpu(first.cpus[st.index % first.cpus.len()]);
    }
    let mut w = Work {
        bufs: (0..BATCH).map(|_| vec![0u8; RX_BUF]).collect(),
        recvd: Vec::with_capacity(BATCH),
        plan: Vec::with_capacity(BATCH),
        scratch: Vec::new(),
        ctx: FwdCtx::with_queue(st.index),
        read_errors: 0,
    };
    let mut local: Vec<Arc<Source>> = Vec::new();
    let mut local_gen = u64::MAX;
    // SAFETY: epoll_event is plain data.
    let mut events: Vec<libc::epoll_event> =
        (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut polling = first.mode == DispatchMode::Polling;
    let mut window_start = Instant::now();
    let mut window_frames = 0u64;
    let mut idle_since = Instant::now();
    let mut last_expire = Instant::now();
    while !st.stop.load(Relaxed) {
        let g = st.gen.load(SeqCst);
        if g != local_gen {
            local = st.sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
            local_gen = g;
            st.seen.store(g, SeqCst);
        }
        let s = settings.load();
        match s.mode {
            DispatchMode::GuestDriven => polling = false,
            DispatchMode::Polling => polling = true,
            DispatchMode::Adaptive => {}
        }
        let mut n = 0u64;
        if polling {
            for src in &local {
                n += w.drain(&shared, src) as u64;
            }
            if n > 0 {
                st.wakeups.fetch_add(1, Relaxed);
                idle_since = Instant::now();
            } else {
                let sleep = Duration::from_micros(s.yield_sleep_us as u64);
                match s.yield_strategy {
                    YieldStrategy::Immediate => std::thread::yield_now(),
                    YieldStrategy::Timed => std::thread::sleep(sleep),
                    YieldStrategy::Adaptive => {
                        if idle_since.elapsed() < Duration::from_micros(s.yield_nowork_us as u64) {
                            std::thread::yield_now()
                        } else {
                            std::thread::sleep(sleep)
                        }
                    }
                }
            }
        } else {
            let timeout = if s.mode == DispatchMode::Adaptive {
                s.adaptive_window_ms as i32
            } else {
                IDLE_TICK.as_millis() as i32
            };
            // SAFETY: events is a live array of epoll_event and we pass its true length.
            let k = unsafe {
                libc::epoll_wait(
                    st.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout,
                )
            };
            if k > 0 {
                for ev in &events[..k as usize] {
                    let token = ev.u64;
                    if token == WAKE_TOKEN {
                        let mut b = [0u8; 8];
                        let _ = sys::read(st.wake.fd(), &mut b);
                        continue;
                    }
                    if let Some(src) = local.iter().find(|x| x.id == token) {
                        n += w.drain(&shared, src) as u64;
                    }
                }
                if n > 0 {
                    st.wakeups.fetch_add(1, Relaxed);
                }
            }
        }
        st.frames.fetch_add(n, Relaxed);
        window_frames += n;
        if s.mode == DispatchMode::Adaptive {
            let el = window_start.elapsed();
            if el >= Duration::from_millis(s.adaptive_window_ms as u64) {
                let rate = window_frames as f64 / el.as_secs_f64();
                if !polling && rate > s.adaptive_high as f64 {
                    polling = true;
                    st.switches.fetch_add(1, Relaxed);
                } else if polling && rate < s.adaptive_low as f64 {
                    polling = false;
                    st.switches.fetch_add(1, Relaxed);
                }
                window_start = Instant::now();
                window_frames = 0;
            }
        }
        st.polling.store(polling, Relaxed);
        // Publish this pass's traffic-matrix counts (a short uncontended lock per pass with
        // work, so `show matrix` lags by one pass at most).
        if n > 0 {
            w.ctx.flush(&shared);
        }
        if st.index == 0 && last_expire.elapsed() >= Duration::from_secs(10) {
            last_expire = Instant::now();
            shared.expire_learned();
        }
    }
    w.ctx.flush(&shared);
}

impl Work {
    /// Reads and forwards what one source has waiting; returns frames handled.
    fn drain(&mut self, shared: &Shared, src: &Source) -> usize {
        let snap = shared.snapshot.load_full();
        let r = match (&src.kind, src.port) {
            (SourceKind::Tap { tap, queue }, Some(port)) => {
                self.drain_tap(shared, &snap, tap, *queue, port)
            }
            (SourceKind::Direct(p), Some(port)) => self.drain_direct(shared, &snap, p, port),
            (SourceKind::Udp(sock), _) => self.drain_udp(shared, &snap, sock),
            _ => Ok(0),
        };
        match r {
            Ok(n) => n,
            Err(e) => {
                self.read_errors += 1;
                if self.read_errors == 1 || self.read_errors.is_multiple_of(1000) {
                    warn!("read: {e} ({} errors)", self.read_errors);
                }
                // Back off so a descriptor that errors persistently cannot spin a core.
                std::thread::sleep(Duration::from_millis(1));
                0
            }
        }
    }

    fn drain_tap(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        tap: &Tap,
        q: usize,
        port: PortId,
    ) -> io::Result<usize> {
        let fd = tap.queue_fd(q);
        let hl = if tap.has_vnet_hdr() {
            VIRTIO_NET_HDR_LEN
        } else {
            0
        };
        let mut lens = [0usize; BATCH];
        let (n, err) = read_batch(&mut self.bufs, &mut lens, |buf| match sys::read(fd, buf) {
            Ok(len) => Ok(Some(len)),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        });
        // The guest leaves checksums of ordinary frames partial (checksum offload); complete
        // them here, in place, so every port downstream gets an honest frame.
        let mut frames: [Result<VirtioNetHdr, DropReason>; BATCH] =
            [Ok(VirtioNetHdr::default()); BATCH];
        for i in 0..n {
            frames[i] = if lens[i] < hl {
                Err(DropReason::Truncated)
            } else if hl == 0 {
                Ok(VirtioNetHdr::default())
            } else {
                ingress_header(shared, &mut self.bufs[i][..lens[i]])
            };
        }
        self.forward_read(shared, snap, port, hl, &lens[..n], &frames[..n]);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    fn drain_direct(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        p: &PacketSocket,
        port: PortId,
    ) -> io::Result<usize> {
        let mut lens = [0usize; BATCH];
        let (n, err) = read_batch(&mut self.bufs, &mut lens, |buf| p.recv(buf));
        let mut frames: [Result<VirtioNetHdr, DropReason>; BATCH] =
            [Ok(VirtioNetHdr::default()); BATCH];
        for i in 0..n {
            if lens[i] > self.bufs[i].len() {
                // MSG_TRUNC: the frame was larger than anything vnet carries.
                frames[i] = Err(DropReason::Oversize);
            }
        }
        self.forward_read(shared, snap, port, 0, &lens[..n], &frames[..n]);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Forwards frames read into `self.bufs` (after `hl` header bytes), one batch.
    fn forward_read(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        port: PortId,
        hl: usize,
        lens: &[usize],
        frames: &[Result<VirtioNetHdr, DropReason>],
    ) {
        let bufs: &[Vec<u8>] = &self.bufs;
        let mut batch = TxBatch::default();
        for (i, f) in frames.iter().enumerate() {
            match f {
                Ok(vh) => process(
                    shared,
                    snap,
                    &mut self.ctx,
                    port,
                    *vh,
                    &bufs[i][hl..lens[i]],
                    Origin::Local,
                    &mut batch,
                ),
                Err(reason) => snap.count_rx_drop(port, lens[i], *reason),
            }
        }
        batch.flush(shared, &snap.udp);
        snap.end_of_burst();
    }

    fn drain_udp(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        sock: &VxlanSocket,
    ) -> io::Result<usize> {
        sock.recv_batch(&mut self.bufs, &mut self.recvd)?;
        // First pass: answer handshake messages and decrypt the data of encrypted links in
        // place (the plaintext overwrites its ciphertext), so that the second pass forwards
        // every frame from the receive buffers, coalescing as for plaintext VXLAN.
        self.plan.clear();
        let mut frames = 0;
        for (i, m) in self.recvd.iter().enumerate() {
            let buf = &mut self.bufs[i][..m.len];
            if m.seg < m.len && !is_crypto(buf) && is_tunnel_gso(buf, m.seg) {
                // One VXLAN datagram whose inner frame a local kernel sender never segmented.
                frames += 1;
                self.plan.push(RxItem::Vxlan {
                    i,
                    off: 0,
                    end: m.len,
                    mss: Some(m.seg),
                    from: m.from,
                });
                continue;
            }
            // Datagrams of `seg` bytes, the last shorter; an empty datagram is one too.
            let mut off = 0;
            loop {
                let end = (off + m.seg).min(m.len);
                frames += 1;
                if is_crypto(&buf[off..end]) {
                    if let Some((start, stop, port)) =
                        open_datagram(shared, snap, &mut self.scratch, buf, (off, end), m.from)
                    {
                        self.plan.push(RxItem::Decrypted {
                            i,
                            start,
                            end: stop,
                            port,
                        });
                    }
                } else {
                    self.plan.push(RxItem::Vxlan {
                        i,
                        off,
                        end,
                        mss: None,
                        from: m.from,
                    });
                }
                off = end;
                if off >= m.len {
                    break;
                }
            }
        }
        let bufs: &[Vec<u8>] = &self.bufs;
        let mut batch = TxBatch::default();
        for item in &self.plan {
            match *item {
                RxItem::Vxlan {
                    i,
                    off,
                    end,
                    mss,
                    from,
                } => receive_datagram(
                    shared,
                    snap,
                    &mut self.ctx,
                    bufs,
                    i,
                    (off, end),
                    from,
                    mss,
                    &mut batch,
                ),
                RxItem::Decrypted {
                    i,
                    start,
                    end,
                    port,
                } => receive_decrypted(
                    shared,
                    snap,
                    &mut self.ctx,
                    bufs,
                    i,
                    (start, end),
                    port,
                    &mut batch,
                ),
            }
        }
        flush_coalescers(shared, snap, &mut self.ctx, bufs);
        batch.flush(shared, &snap.udp);
        snap.end_of_burst();
        Ok(frames)
    }
}

/// Reads up to `BATCH` frames, one per buffer, until `recv` has nothing (`Ok(None)`) or fails;
/// returns how many were read, and the error that stopped it, if any.
fn read_batch(
    bufs: &mut [Vec<u8>],
    lens: &mut [usize; BATCH],
    mut recv: impl FnMut(&mut [u8]) -> io::Result<Option<usize>>,
) -> (usize, Option<io::Error>) {
    let mut n = 0;
    for buf in bufs.iter_mut().take(BATCH) {
        match recv(buf) {
            Ok(Some(len)) => {
                lens[n] = len;
                n += 1;
            }
            Ok(None) => break,
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// Reads the virtio-net header in front of a frame from a TAP and completes a partial checksum
/// of an ordinary (non-GSO) frame in place.
fn ingress_header(shared: &Shared, buf: &mut [u8]) -> Result<VirtioNetHdr, DropReason> {
    let mut vh = VirtioNetHdr::parse(buf).map_err(|_| DropReason::Truncated)?;
    if vh.gso_kind() == VirtioNetHdr::GSO_NONE && vh.needs_csum() {
        complete_checksum(&mut buf[VIRTIO_NET_HDR_LEN..], &vh)
            .map_err(|_| DropReason::BadOffload)?;
        shared.offload.csum_completed.fetch_add(1, Relaxed);
        vh.flags = VirtioNetHdr::F_DATA_VALID;
    }
    Ok(vh)
}

/// One VXLAN datagram: only from a link's peer, only with a VNI that peer has a link for.
#[allow(clippy::too_many_arguments)]
fn receive_datagram<'a>(
    shared: &Shared,
    snap: &'a Snapshot,
    ctx: &mut FwdCtx,
    bufs: &'a [Vec<u8>],
    i: usize,
    (off, end): (usize, usize),
    from: std::net::SocketAddr,
    tunnel_mss: Option<usize>,
    batch: &mut TxBatch<'a>,
) {
    let data = &bufs[i][off..end];
    shared.daemon.rx(data.len());
    let ip = from.ip().to_canonical();
    if !snap.udp_ips.contains(&ip) {
        return shared.daemon.count_drop(DropReason::UnknownPeer);
    }
    let pkt = match VxlanPacket::new_checked(data) {
        Ok(p) => p,
        Err(_) => return shared.daemon.count_drop(DropReason::BadVxlan),
    };
    let Some(&port) = snap.udp_peers.get(&(ip, pkt.vni())) else {
        return shared.daemon.count_drop(DropReason::UnknownVni);
    };
    if link_crypto(snap, port).is_some() {
        // Plaintext claiming to come from an encrypted link's peer: unauthenticated.
        return snap.count_rx_drop(port, data.len(), DropReason::BadAuth);
    }
    let at = PayloadRef {
        buf: i as u32,
        start: (off + VXLAN_HEADER_LEN) as u32,
        end: end as u32,
    };
    let frame = &data[VXLAN_HEADER_LEN..];
    if let Some(mss) = tunnel_mss {
        // A large frame with a partial checksum: forward it as a guest's TSO frame would go.
        let Some(vh) = gso_header(frame, mss.min(u16::MAX as usize) as u16) else {
            return snap.count_rx_drop(port, frame.len(), DropReason::BadOffload);
        };
        shared.offload.tunnel_gso.fetch_add(1, Relaxed);
        return process(shared, snap, ctx, port, vh, frame, Origin::Local, batch);
    }
    process(
        shared,
        snap,
        ctx,
        port,
        VirtioNetHdr::default(),
        frame,
        Origin::Wire { at, bufs },
        batch,
    );
}

/// A datagram of a receive batch, ready to forward.
#[derive(Clone, Copy)]
enum RxItem {
    /// Plaintext VXLAN at `off..end` of buffer `i`.
    Vxlan {
        i: usize,
        off: usize,
        end: usize,
        mss: Option<usize>,
        from: std::net::SocketAddr,
    },
    /// A decrypted VXLAN datagram at `start..end` of buffer `i`, from encrypted link `port`.
    Decrypted {
        i: usize,
        start: usize,
        end: usize,
        port: PortId,
    },
}

fn link_crypto(snap: &Snapshot, port: PortId) -> Option<&Arc<LinkCrypto>> {
    match snap.ports.get(&port).map(|p| &*p.tx) {
        Some(PortTx::Udp(l)) => l.crypto.as_ref(),
        _ => None,
    }
}

/// An encrypted-link message at `off..end` of `buf`: a handshake message is answered; a data
/// message is authenticated and decrypted, its plaintext (a VXLAN datagram) written over the
/// ciphertext. Returns where the plaintext is and the link's port; every refusal is counted.
fn open_datagram(
    shared: &Shared,
    snap: &Snapshot,
    scratch: &mut Vec<u8>,
    buf: &mut [u8],
    (off, end): (usize, usize),
    from: std::net::SocketAddr,
) -> Option<(usize, usize, PortId)> {
    let len = end - off;
    shared.daemon.rx(len);
    let ip = from.ip().to_canonical();
    if !snap.udp_ips.contains(&ip) {
        shared.daemon.count_drop(DropReason::UnknownPeer);
        return None;
    }
    let msg = match Message::parse(&buf[off..end]) {
        Ok(m) => m,
        Err(e) => {
            shared.daemon.count_drop(crypto::drop_reason(e));
            return None;
        }
    };
    let Some(&port) = snap.udp_peers.get(&(ip, msg.vni())) else {
        shared.daemon.count_drop(DropReason::UnknownVni);
        return None;
    };
    let counters = &snap.ports.get(&port)?.counters;
    let Some(c) = link_crypto(snap, port) else {
        // An encrypted-link message for a plaintext link.
        let r = match msg {
            Message::Data { .. } => DropReason::NoSession,
            _ => DropReason::BadHandshake,
        };
        snap.count_rx_drop(port, len, r);
        return None;
    };
    let Message::Data {
        receiver,
        counter,
        ciphertext,
        ..
    } = msg
    else {
        c.handshake(&msg, counters);
        return None;
    };
    scratch.clear();
    scratch.resize(ciphertext.len(), 0);
    match c.open(receiver, counter, ciphertext, scratch) {
        Ok(0) => None, // a keepalive: it only confirmed the session
        Ok(n) => {
            let start = off + DATA_HEADER_LEN;
            buf[start..start + n].copy_from_slice(&scratch[..n]);
            Some((start, start + n, port))
        }
        Err(e) => {
            snap.count_rx_drop(port, len, crypto::drop_reason(e));
            None
        }
    }
}

/// A datagram of encrypted link `port`, decrypted: VXLAN whose VNI must be the link's.
#[allow(clippy::too_many_arguments)]
fn receive_decrypted<'a>(
    shared: &Shared,
    snap: &'a Snapshot,
    ctx: &mut FwdCtx,
    bufs: &'a [Vec<u8>],
    i: usize,
    (start, end): (usize, usize),
    port: PortId,
    batch: &mut TxBatch<'a>,
) {
    let data = &bufs[i][start..end];
    let Some(entry) = snap.ports.get(&port) else {
        return;
    };
    match VxlanPacket::new_checked(data) {
        Ok(p) if p.vni() == entry.info.vni => {}
        _ => return snap.count_rx_drop(port, data.len(), DropReason::BadVxlan),
    }
    let at = PayloadRef {
        buf: i as u32,
        start: (start + VXLAN_HEADER_LEN) as u32,
        end: end as u32,
    };
    process(
        shared,
        snap,
        ctx,
        port,
        VirtioNetHdr::default(),
        &data[VXLAN_HEADER_LEN..],
        Origin::Wire { at, bufs },
        batch,
    );
}

/// Whether a received message with a GRO segment size is really one VXLAN datagram carrying
/// an unsegmented large frame (a kernel sender on a veth underlay hands over its tunnel GSO
/// packet whole; the "segment size" is then the inner MSS). A batch of real datagrams has a
/// first inner frame that ends exactly at the segment boundary.
fn is_tunnel_gso(msg: &[u8], seg: usize) -> bool {
    match msg.get(VXLAN_HEADER_LEN..).and_then(claimed_frame_len) {
        Some(n) => VXLAN_HEADER_LEN + n > seg,
        None => false,
    }
}
