use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{info, warn};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vnet_control::Interface;
use vnet_core::DropReason;
use vnet_dataplane::forward::FwdCtx;
use vnet_dataplane::{GuestNic, Ingress, NicFactory};
use vnet_offload::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};
use vnet_wire::MAX_FRAME_LEN;

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// `struct virtio_net_hdr_v1`: the 10-byte header plus `num_buffers`.
const HDR_LEN: usize = VIRTIO_NET_HDR_LEN + 2;
const RX_QUEUE: u16 = 0;
const TX_QUEUE: u16 = 1;
const NUM_QUEUES: usize = 2;
/// Our own epoll event for "frames wait for the guest" (0..=NUM_QUEUES are the library's).
const RX_EVENT: u64 = NUM_QUEUES as u64 + 1;
const QUEUE_SIZE: usize = 1024;
/// Frames waiting for receive buffers; beyond this they are dropped (`queue_full`).
const RX_BACKLOG: usize = 1024;
const TX_BATCH: usize = 64;
const MAX_TX_CHAIN: usize = HDR_LEN + MAX_FRAME_LEN;

const OFFLOADS_FOR_GUEST: u64 = (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6);

struct Inner {
    name: String,
    max_frame: usize,
    mem: Mutex<Option<Mem>>,
    ingress: Ingress,
    ctx: Mutex<FwdCtx>,
    rx: Mutex<VecDeque<(VirtioNetHdr, Vec<u8>)>>,
    rx_event: EventFd,
    acked: AtomicU64,
    event_idx: AtomicBool,
    stop: AtomicBool,
    /// Bad descriptor chains seen (for the log: the first one, then every 1000th).
    bad_chains: AtomicU64,
}

#[derive(Clone)]
struct NetBackend(Arc<Inner>);

impl NetBackend {
    fn mem(&self) -> Option<Mem> {
        self.0.mem.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn bad_chain(&self, why: &str) {
        let n = self.0.bad_chains.fetch_add(1, Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            warn!(interface = %self.0.name, "guest offered a bad descriptor chain ({why}); dropped ({n} so far)");
        }
        self.0.ingress.count_drop(DropReason::BadOffload);
    }

    /// Takes every frame the guest transmitted, in batches, into the overlay.
    fn process_tx(&self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = self.mem() else {
            return Ok(());
        };
        let mem = atomic.memory();
        let event_idx = self.0.event_idx.load(Relaxed);
        let mut frames: Vec<(VirtioNetHdr, Vec<u8>)> = Vec::with_capacity(TX_BATCH);
        let mut used_any = false;
        loop {
            if event_idx {
                let _ = vring.disable_notification();
            }
            loop {
                let chain = vring
                    .get_mut()
                    .get_queue_mut()
                    .pop_descriptor_chain(mem.clone());
                let Some(chain) = chain else { break };
                let head = chain.head_index();
                let mut buf: Vec<u8> = Vec::new();
                let mut bad = None;
                for desc in chain {
                    if desc.is_write_only() {
                        bad = Some("write-only descriptor in a transmit chain");
                        break;
                    }
                    let len = desc.len() as usize;
                    if buf.len() + len > MAX_TX_CHAIN {
                        bad = Some("more bytes than a frame can have");
                        break;
                    }
                    let start = buf.len();
                    buf.resize(start + len, 0);
                    if mem.read_slice(&mut buf[start..], desc.addr()).is_err() {
                        bad = Some("descriptor outside guest memory");
                        break;
                    }
                }
                if vring.add_used(head, 0).is_err() {
                    bad = bad.or(Some("used ring outside guest memory"));
                }
                used_any = true;
                match bad {
                    Some(why) => self.bad_chain(why),
                    None if buf.len() < HDR_LEN => {
                        self.bad_chain("shorter than the virtio-net header")
                    }
                    None => match VirtioNetHdr::parse(&buf) {
                        Ok(vh) => {
                            buf.drain(..HDR_LEN);
                            frames.push((vh, buf));
                        }
                        Err(_) => self.bad_chain("bad virtio-net header"),
                    },
                }
                if frames.len() >= TX_BATCH {
                    self.forward(&mut frames);
                }
            }
            if !event_idx || !vring.enable_notification().unwrap_or(false) {
                break;
            }
        }
        self.forward(&mut frames);
        if used_any && vring.needs_notification().unwrap_or(true) {
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    fn forward(&self, frames: &mut Vec<(VirtioNetHdr, Vec<u8>)>) {
        if frames.is_empty() {
            return;
        }
        let mut ctx = self.0.ctx.lock().unwrap_or_else(|p| p.into_inner());
        self.0.ingress.forward(&mut ctx, frames);
        frames.clear();
    }

    /// Writes waiting frames into the guest's receive buffers while it has some.
    fn process_rx(&self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = self.mem() else {
            return Ok(());
        };
        let mem = atomic.memory();
        let mrg = self.0.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let mut delivered = 0;
        loop {
            let mut q = self.0.rx.lock().unwrap_or_else(|p| p.into_inner());
            let Some((vh, frame)) = q.front() else { break };
            match write_frame(vring, &mem, vh, frame, mrg) {
                Ok(true) => {
                    q.pop_front();
                    delivered += 1;
                }
                Ok(false) => {
                    tracing::trace!(interface = %self.0.name, "no receive buffers");
                    // No buffers: ask the guest to kick us when it adds some.
                    drop(q);
                    if self.0.event_idx.load(Relaxed)
                        && vring.enable_notification().unwrap_or(false)
                    {
                        continue;
                    }
                    break;
                }
                Err(why) => {
                    q.pop_front();
                    drop(q);
                    self.bad_chain(why);
                }
            }
        }
        if delivered > 0 && vring.needs_notification().unwrap_or(true) {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

/// Writes [header, frame] into as many receive chains as it takes (one without mergeable
/// buffers). `Ok(false)`: not enough buffers, nothing consumed.
fn write_frame(
    vring: &VringRwLock,
    mem: &GuestMemoryMmap,
    vh: &VirtioNetHdr,
    frame: &[u8],
    mrg: bool,
) -> Result<bool, &'static str> {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..VIRTIO_NET_HDR_LEN].copy_from_slice(&vh.emit());
    let total = HDR_LEN + frame.len();
    let byte_src = |off: usize, n: usize| -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        for k in off..off + n {
            v.push(if k < HDR_LEN {
                hdr[k]
            } else {
                frame[k - HDR_LEN]
            });
        }
        v
    };
    let mut state = vring.get_mut();
    let queue = state.get_queue_mut();
    let saved = queue.next_avail();
    let mut used: Vec<(u16, u32)> = Vec::new();
    let mut written = 0usize;
    let mut first: Option<GuestAddress> = None;
    while written < total {
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            queue.set_next_avail(saved);
            return Ok(false);
        };
        let head = chain.head_index();
        let mut len = 0usize;
        for desc in chain.writable() {
            let n = (desc.len() as usize).min(total - written);
            if first.is_none() {
                if (desc.len() as usize) < HDR_LEN {
                    queue.set_next_avail(saved);
                    return Err("receive buffer smaller than the virtio-net header");
                }
                first = Some(desc.addr());
            }
            // Header bytes are few; frame bytes are written straight from the frame.
            let res = if written >= HDR_LEN {
                mem.write_slice(
                    &frame[written - HDR_LEN..written - HDR_LEN + n],
                    desc.addr(),
                )
            } else {
                mem.write_slice(&byte_src(written, n), desc.addr())
            };
            if res.is_err() {
                queue.set_next_avail(saved);
                return Err("receive descriptor outside guest memory");
            }
            written += n;
            len += n;
            if written == total {
                break;
            }
        }
        used.push((head, len as u32));
        if written < total && !mrg {
            // Without mergeable buffers a frame must fit one chain: consume it and drop.
            for (h, l) in &used {
                let _ = queue.add_used(mem, *h, *l);
            }
            return Err("frame larger than a receive chain (no mergeable buffers)");
        }
        if used.len() > QUEUE_SIZE {
            queue.set_next_avail(saved);
            return Err("frame needs more receive chains than the queue has");
        }
    }
    if let Some(a) = first {
        let nb = (used.len() as u16).to_le_bytes();
        let at = a
            .checked_add(VIRTIO_NET_HDR_LEN as u64)
            .ok_or("receive descriptor address overflows")?;
        if mem.write_slice(&nb, at).is_err() {
            return Err("receive descriptor outside guest memory");
        }
    }
    for (h, l) in used {
        if queue.add_used(mem, h, l).is_err() {
            return Err("used ring outside guest memory");
        }
    }
    Ok(true)
}

impl VhostUserBackend for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
            | (1 << VIRTIO_NET_F_CSUM)
            | (1 << VIRTIO_NET_F_HOST_TSO4)
            | (1 << VIRTIO_NET_F_HOST_TSO6)
            | (1 << VIRTIO_NET_F_HOST_ECN)
            | OFFLOADS_FOR_GUEST
            | (1 << VIRTIO_NET_F_GUEST_ECN)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
        // Not VHOST_USER_F_PROTOCOL_FEATURES yet: QEMU 7.2 then sends SET_VRING_ENABLE before
        // SET_FEATURES, which vhost-user-backend refuses; with one queue pair nothing needs it
        // (all rings start enabled at SET_FEATURES).
    }

    fn acked_features(&self, features: u64) {
        self.0.acked.store(features, Relaxed);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // No MQ yet: one queue pair (QEMU would also disable rings before SET_FEATURES).
        VhostUserProtocolFeatures::REPLY_ACK
    }

    fn set_event_idx(&self, enabled: bool) {
        self.0.event_idx.store(enabled, Relaxed);
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        *self.0.mem.lock().unwrap_or_else(|p| p.into_inner()) = Some(mem);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread: usize,
    ) -> io::Result<()> {
        match device_event {
            RX_QUEUE => self.process_rx(&vrings[RX_QUEUE as usize]),
            TX_QUEUE => self.process_tx(&vrings[TX_QUEUE as usize]),
            e if e as u64 == RX_EVENT => {
                let _ = self.0.rx_event.read();
                self.process_rx(&vrings[RX_QUEUE as usize])
            }
            _ => Ok(()),
        }
    }
}

/// The overlay's side of a vhost-user interface: frames for the guest queue here and the
/// backend thread writes them into the guest's receive buffers.
pub struct VhostNic {
    inner: Arc<Inner>,
    socket: PathBuf,
    client: bool,
    thread: Mutex<Option<JoinHandle<()>>>,
    shutdown: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
}

impl GuestNic for VhostNic {
    fn write(&self, _queue: usize, vh: &VirtioNetHdr, parts: &[&[u8]]) -> Result<(), DropReason> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if vh.gso_kind() == VirtioNetHdr::GSO_NONE && len > self.inner.max_frame {
            return Err(DropReason::Oversize);
        }
        let mut q = self.inner.rx.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= RX_BACKLOG {
            return Err(DropReason::QueueFull);
        }
        let mut f = Vec::with_capacity(len);
        for p in parts {
            f.extend_from_slice(p);
        }
        q.push_back((*vh, f));
        drop(q);
        self.inner
            .rx_event
            .write(1)
            .map_err(|_| DropReason::TxError)
    }

    fn has_vnet_hdr(&self) -> bool {
        self.inner.acked.load(Relaxed) & OFFLOADS_FOR_GUEST == OFFLOADS_FOR_GUEST
    }

    fn max_frame(&self) -> usize {
        self.inner.max_frame
    }
}

impl Drop for VhostNic {
    fn drop(&mut self) {
        self.inner.stop.store(true, SeqCst);
        if let Some(h) = self
            .shutdown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.shutdown();
        }
        if !self.client {
            // Wake a listener blocked in accept().
            let _ = UnixStream::connect(&self.socket);
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        if !self.client {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn serve(
    backend: NetBackend,
    socket: PathBuf,
    client: bool,
    shutdown: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    mut listener: Option<Listener>,
) {
    let inner = backend.0.clone();
    let mem: Mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = match VhostUserDaemon::new(format!("vhost-{}", inner.name), backend, mem) {
        Ok(d) => d,
        Err(e) => {
            warn!(interface = %inner.name, "vhost-user daemon: {e}");
            return;
        }
    };
    for h in daemon.get_epoll_handlers() {
        if let Err(e) = h.register_listener(inner.rx_event.as_raw_fd(), EventSet::IN, RX_EVENT) {
            warn!(interface = %inner.name, "register receive event: {e}");
        }
    }
    let mut backoff = Duration::from_millis(100);
    while !inner.stop.load(SeqCst) {
        let started = if client {
            daemon.start_client(&socket.to_string_lossy())
        } else {
            match listener.as_mut() {
                Some(l) => daemon.start(l),
                None => return,
            }
        };
        if let Err(e) = started {
            if inner.stop.load(SeqCst) {
                break;
            }
            tracing::debug!(interface = %inner.name, "vhost-user connection: {e}");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        backoff = Duration::from_millis(100);
        *shutdown.lock().unwrap_or_else(|p| p.into_inner()) = daemon.shutdown_handle();
        if !inner.stop.load(SeqCst) {
            info!(interface = %inner.name, "vhost-user frontend connected");
        }
        if let Err(e) = daemon.wait() {
            tracing::debug!(interface = %inner.name, "vhost-user connection ended: {e}");
        }
        *shutdown.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // The next frontend brings its own memory and rings; frames for the old one are moot.
        inner.rx.lock().unwrap_or_else(|p| p.into_inner()).clear();
        *inner.mem.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if !inner.stop.load(SeqCst) {
            info!(interface = %inner.name, "vhost-user frontend disconnected; waiting for the next");
        }
    }
}

/// Makes vhost-user interfaces for the engine.
pub struct VhostFactory;

impl NicFactory for VhostFactory {
    fn create(&self, iface: &Interface, ingress: Ingress) -> io::Result<Arc<dyn GuestNic>> {
        let socket = PathBuf::from(
            iface
                .socket
                .clone()
                .ok_or_else(|| io::Error::other("vhost-user interface without a socket"))?,
        );
        if iface.queues > 1 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "vhost-user interfaces have one queue pair for now",
            ));
        }
        let inner = Arc::new(Inner {
            name: iface.name.clone(),
            max_frame: iface.mtu as usize + 18,
            mem: Mutex::new(None),
            ingress,
            ctx: Mutex::new(FwdCtx::new()),
            rx: Mutex::new(VecDeque::new()),
            rx_event: EventFd::new(EFD_NONBLOCK)?,
            acked: AtomicU64::new(0),
            event_idx: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            bad_chains: AtomicU64::new(0),
        });
        // Bind before returning, so a bad path is an error of the command.
        let listener =
            if iface.client {
                None
            } else {
                Some(Listener::new(&socket, true).map_err(|e| {
                    io::Error::other(format!("listen on {}: {e}", socket.display()))
                })?)
            };
        let shutdown = Arc::new(Mutex::new(None));
        let (b, s, sh) = (NetBackend(inner.clone()), socket.clone(), shutdown.clone());
        let client = iface.client;
        let thread = std::thread::Builder::new()
            .name(format!("vhost-{}", iface.name))
            .spawn(move || serve(b, s, client, sh, listener))?;
        Ok(Arc::new(VhostNic {
            inner,
            socket,
            client,
            thread: Mutex::new(Some(thread)),
            shutdown,
        }))
    }
}
