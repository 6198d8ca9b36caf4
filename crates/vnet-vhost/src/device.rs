//! The virtio-net device behind one vhost-user socket: the state the frontend sets up
//! (features, guest memory, virtqueues, eventfds) and the data path over it.
//!
//! Threads: the device's own thread reads the socket and the transmit kicks (and drains the
//! receive backlog); the engine's dispatchers deliver frames for the guest straight into its
//! receive queues ([`Dev::deliver`]). Each ring has its own lock; transmit rings are touched
//! only by the device thread, so a dispatcher writing into this guest's receive ring never
//! waits for its transmit work.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::num::Wrapping;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption};
use tracing::warn;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{
    Address, Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap,
    GuestRegionMmap, MmapRegion, VolatileSlice,
};
use vnet_core::DropReason;
use vnet_dataplane::forward::FwdCtx;
use vnet_dataplane::{GuestFrame, Ingress};
use vnet_offload::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};
use vnet_wire::MAX_FRAME_LEN;

use crate::msg::{self, proto, MemRegion, Request, F_PROTOCOL_FEATURES};
use crate::notify::{Action, Notifier, NotifyCounters, NotifyPolicy, RingView};
use crate::sigbus;

pub type Mem = GuestMemoryMmap<()>;

/// The guest's memory as one frontend shared it, with its SIGBUS guard. The guard is declared
/// first so that it is dropped first: the ranges are unregistered before they are unmapped.
pub struct GuestMem {
    guard: sigbus::Guard,
    mem: Mem,
}

impl std::ops::Deref for GuestMem {
    type Target = Mem;

    fn deref(&self) -> &Mem {
        &self.mem
    }
}

impl GuestMem {
    /// The frontend cut this memory short and vnetd faulted on it (the guard caught it): the
    /// device must stop touching it and drop the frontend.
    pub fn faulted(&self) -> bool {
        self.guard.faulted()
    }
}

/// `struct virtio_net_hdr_v1`: the 10-byte header plus `num_buffers` (VERSION_1 is required).
pub const HDR_LEN: usize = VIRTIO_NET_HDR_LEN + 2;
pub const QUEUE_SIZE: u16 = 1024;
/// Frames waiting for receive buffers, per queue; beyond this they are dropped (`queue_full`).
const RX_BACKLOG: usize = 1024;
const TX_BATCH: usize = 64;
const MAX_TX_CHAIN: usize = HDR_LEN + MAX_FRAME_LEN;
/// Descriptors we follow in one chain (the queue also bounds it by its size).
const MAX_CHAIN_DESCS: usize = 64;

const OFFLOADS_FOR_GUEST: u64 = (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6);

/// Data-path choices, set from the daemon's settings at run time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetConfig {
    /// Transmit from and receive into guest buffers without an intermediate copy.
    pub cut_through: bool,
    pub policy: NotifyPolicy,
    /// Receive density thresholds α, β of the optimistic policy, bytes per second.
    pub alpha: f64,
    pub beta: f64,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            cut_through: true,
            policy: NotifyPolicy::Optimistic,
            alpha: 12.5e6,
            beta: 1.25e9,
        }
    }
}

#[derive(Default)]
pub struct Stats {
    pub tx_cut_through: AtomicU64,
    pub tx_copied: AtomicU64,
    /// Taken from a cut-through socket into vnetd's bounce buffer, checked, and copied into
    /// the guest's buffers.
    pub rx_cut_through: AtomicU64,
    /// Datagrams on a cut-through socket that were not for this guest (ordinary path).
    pub rx_direct_fallback: AtomicU64,
    /// Written into guest buffers from the receiving thread's buffer (one copy).
    pub rx_direct: AtomicU64,
    pub rx_copied: AtomicU64,
    pub bad_chains: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Frontends dropped because they cut guest memory short under us (SIGBUS survived).
    pub memory_faults: AtomicU64,
    pub connections: AtomicU64,
    pub kicks: AtomicU64,
    pub tx_notifications: AtomicU64,
    /// Receive-side notification counters of rings that were since reset.
    pub rx_notify_done: Mutex<NotifyCounters>,
}

pub struct Ring {
    pub queue: Queue,
    pub kick: Option<File>,
    pub call: Option<File>,
    pub enabled: bool,
    pub started: bool,
    pub notifier: Notifier,
    /// Receive rings: frames waiting for buffers (or for the device thread, when copying).
    pub backlog: VecDeque<(VirtioNetHdr, Vec<u8>)>,
}

impl Ring {
    fn new(cfg: &NetConfig) -> io::Result<Ring> {
        Ok(Ring {
            queue: Queue::new(QUEUE_SIZE).map_err(|e| io::Error::other(e.to_string()))?,
            kick: None,
            call: None,
            enabled: false,
            started: false,
            notifier: Notifier::new(cfg.policy, cfg.alpha, cfg.beta),
            backlog: VecDeque::new(),
        })
    }

    pub fn live(&self) -> bool {
        self.started && self.enabled && self.queue.ready()
    }

    pub fn signal(&self) {
        if let Some(c) = &self.call {
            let _ = (&*c).write(&1u64.to_ne_bytes());
        }
    }

    pub fn view(&self, mem: &Mem) -> RingView {
        let q = &self.queue;
        let next_used = Wrapping(q.next_used());
        if q.event_idx_enabled() {
            // used_event sits right after the avail ring's entries.
            let at = q
                .avail_ring()
                .checked_add(4 + 2 * u64::from(q.size()))
                .map(GuestAddress);
            std::sync::atomic::fence(SeqCst);
            let ev = at.and_then(|a| mem.load::<u16>(a, Acquire).ok());
            RingView {
                next_used,
                // Unreadable (hostile ring): behave as if the guest always asks.
                used_event: Some(Wrapping(ev.map(u16::from_le).unwrap_or(next_used.0))),
                no_interrupt: false,
            }
        } else {
            let flags = mem
                .load::<u16>(GuestAddress(q.avail_ring()), Acquire)
                .map(u16::from_le)
                .unwrap_or(0);
            RingView {
                next_used,
                used_event: None,
                no_interrupt: flags & 1 != 0,
            }
        }
    }

    fn reset(&mut self, done: &Mutex<NotifyCounters>) {
        let c = self.notifier.counters;
        add_counters(&mut done.lock().unwrap_or_else(|p| p.into_inner()), &c);
        let cfgp = self.notifier.policy;
        let (a, b) = (self.notifier.alpha, self.notifier.beta);
        self.queue.reset();
        self.kick = None;
        self.call = None;
        self.enabled = false;
        self.started = false;
        self.notifier = Notifier::new(cfgp, a, b);
        self.backlog.clear();
    }
}

pub fn add_counters(to: &mut NotifyCounters, c: &NotifyCounters) {
    to.notifications += c.notifications;
    to.early += c.early;
    to.early_masked += c.early_masked;
    to.end_of_burst += c.end_of_burst;
    to.skipped_cold += c.skipped_cold;
    to.skipped_hot += c.skipped_hot;
    to.early_found_nothing += c.early_found_nothing;
    to.frames += c.frames;
    to.bytes += c.bytes;
}

pub struct Dev {
    pub name: String,
    pub max_frame: usize,
    pub pairs: usize,
    pub ingress: Ingress,
    pub mem: ArcSwapOption<GuestMem>,
    /// Rings 2k (receive) and 2k+1 (transmit) of queue pair k.
    pub rings: Vec<Mutex<Ring>>,
    pub acked: AtomicU64,
    pub cfg: ArcSwap<NetConfig>,
    /// Wakes the device thread: frames wait in a backlog, or it must stop.
    pub wake: vmm_sys_util::eventfd::EventFd,
    pub stop: AtomicBool,
    pub broken: AtomicBool,
    pub stats: Stats,
    pub ctx: Mutex<FwdCtx>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// The frontend's protocol state that only the device thread needs.
#[derive(Default)]
pub struct Session {
    pub acked_proto: u64,
    pub regions: Vec<MemRegion>,
    /// Kick fds changed: the thread re-registers its epoll set.
    pub kicks_changed: bool,
}

impl Dev {
    pub fn new(name: String, max_frame: usize, pairs: usize, ingress: Ingress) -> io::Result<Dev> {
        let cfg = NetConfig::default();
        let mut rings = Vec::with_capacity(2 * pairs);
        for _ in 0..2 * pairs {
            rings.push(Mutex::new(Ring::new(&cfg)?));
        }
        Ok(Dev {
            name,
            max_frame,
            pairs,
            ingress,
            mem: ArcSwapOption::empty(),
            rings,
            acked: AtomicU64::new(0),
            cfg: ArcSwap::from_pointee(cfg),
            wake: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            stats: Stats::default(),
            ctx: Mutex::new(FwdCtx::new()),
        })
    }

    pub fn features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
            | (1 << VIRTIO_NET_F_CSUM)
            | (1 << VIRTIO_NET_F_HOST_TSO4)
            | (1 << VIRTIO_NET_F_HOST_TSO6)
            | (1 << VIRTIO_NET_F_HOST_ECN)
            | OFFLOADS_FOR_GUEST
            | (1 << VIRTIO_NET_F_GUEST_ECN)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | F_PROTOCOL_FEATURES;
        if self.pairs > 1 {
            f |= 1 << VIRTIO_NET_F_MQ;
        }
        f
    }

    pub fn guest_has_offloads(&self) -> bool {
        self.acked.load(Relaxed) & OFFLOADS_FOR_GUEST == OFFLOADS_FOR_GUEST
    }

    pub fn rx_ring_lock(&self, pair: usize) -> MutexGuard<'_, Ring> {
        lock(&self.rings[2 * (pair % self.pairs)])
    }

    pub fn event_idx(&self) -> bool {
        self.acked.load(Relaxed) & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
    }

    fn ring(&self, index: u32) -> io::Result<MutexGuard<'_, Ring>> {
        self.rings
            .get(index as usize)
            .map(lock)
            .ok_or_else(|| invalid(format!("ring {index} does not exist")))
    }

    /// Applies new data-path choices (the rings' notifiers take the policy at once).
    pub fn configure(&self, cfg: NetConfig) {
        self.cfg.store(Arc::new(cfg));
        for r in &self.rings {
            let mut r = lock(r);
            r.notifier.policy = cfg.policy;
            r.notifier.alpha = cfg.alpha;
            r.notifier.beta = cfg.beta;
        }
    }

    /// The frontend went away (or misbehaved): forget its memory and rings.
    pub fn reset(&self, s: &mut Session) {
        for r in &self.rings {
            lock(r).reset(&self.stats.rx_notify_done);
        }
        self.mem.store(None);
        self.acked.store(0, SeqCst);
        self.broken.store(false, SeqCst);
        *s = Session::default();
        s.kicks_changed = true;
    }

    /// Whether the frontend cut guest memory short and vnetd faulted on it (see [`sigbus`]).
    pub fn memory_faulted(&self) -> bool {
        self.mem.load().as_ref().is_some_and(|m| m.faulted())
    }

    /// Marks the device broken: it stops moving frames until the frontend resets it.
    pub fn mark_broken(&self, why: &str) {
        if !self.broken.swap(true, SeqCst) {
            warn!(interface = %self.name, "guest or frontend broke the device ({why}); it stays stopped until the frontend reconnects or resets it");
        }
    }

    fn bad_chain(&self, why: &str) {
        let n = self.stats.bad_chains.fetch_add(1, Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            warn!(interface = %self.name, "guest offered a bad descriptor chain ({why}); dropped ({n} so far)");
        }
        self.ingress.count_drop(DropReason::BadOffload);
    }

    /// Handles one request; `Ok(Some(bytes))` is the reply to send.
    pub fn handle(
        &self,
        s: &mut Session,
        h: &msg::Header,
        req: Request,
        mut files: Vec<File>,
    ) -> io::Result<Option<Vec<u8>>> {
        let mut take_fd = || files.pop();
        let reply = match req {
            Request::GetFeatures => Some(msg::reply_u64(h, self.features())),
            Request::SetFeatures(v) => {
                if v & !self.features() != 0 {
                    return Err(invalid(format!("features {v:#x} were not offered")));
                }
                self.acked.store(v, SeqCst);
                let eidx = v & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
                for r in &self.rings {
                    let mut r = lock(r);
                    r.queue.set_event_idx(eidx);
                    if v & F_PROTOCOL_FEATURES == 0 {
                        // Without protocol features every ring is enabled at once.
                        r.enabled = true;
                    }
                }
                None
            }
            Request::SetOwner => None,
            Request::ResetOwner | Request::ResetDevice => {
                self.reset(s);
                None
            }
            Request::GetProtocolFeatures => Some(msg::reply_u64(
                h,
                proto::MQ | proto::REPLY_ACK | proto::RARP,
            )),
            Request::SetProtocolFeatures(v) => {
                if v & !(proto::MQ | proto::REPLY_ACK | proto::RARP) != 0 {
                    return Err(invalid(format!(
                        "protocol features {v:#x} were not offered"
                    )));
                }
                s.acked_proto = v;
                None
            }
            // QEMU (and DPDK) read it as queue pairs for virtio-net.
            Request::GetQueueNum => Some(msg::reply_u64(h, self.pairs as u64)),
            Request::SetMemTable(regions) => {
                if files.len() != regions.len() {
                    return Err(invalid("one file descriptor per memory region"));
                }
                let mut mapped = Vec::with_capacity(regions.len());
                // After `mapped`, so dropped before it on an error.
                let mut guard = sigbus::Guard::new();
                for (r, f) in regions.iter().zip(files.drain(..)) {
                    let sealed = check_backing(&f, r)?;
                    let page = sigbus::page_size(&f);
                    let m = MmapRegion::build(
                        Some(FileOffset::new(f, r.mmap_offset)),
                        r.size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                    )
                    .map_err(|e| invalid(format!("map guest memory: {e}")))?;
                    if let Err(e) = guard.add(m.as_ptr() as usize, m.size(), page) {
                        if !sealed {
                            return Err(invalid(format!(
                                "guest memory that the frontend can cut short, unguarded: {e}"
                            )));
                        }
                        warn!(interface = %self.name, "guest memory region not guarded against SIGBUS ({e}); it is sealed against shrinking");
                    }
                    mapped.push(
                        GuestRegionMmap::new(m, GuestAddress(r.guest_addr))
                            .ok_or_else(|| invalid("guest region overflows"))?,
                    );
                }
                let mem = GuestMemoryMmap::from_regions(mapped)
                    .map_err(|e| invalid(format!("guest memory: {e}")))?;
                self.mem.store(Some(Arc::new(GuestMem { guard, mem })));
                s.regions = regions;
                None
            }
            Request::SetVringNum { index, num } => {
                let n = u16::try_from(num).map_err(|_| invalid("ring size above 32768"))?;
                let mut r = self.ring(index)?;
                r.queue
                    .try_set_size(n)
                    .map_err(|e| invalid(format!("ring {index} size {num}: {e}")))?;
                None
            }
            Request::SetVringAddr(a) => {
                let to_gpa = |ua: u64| -> io::Result<GuestAddress> {
                    s.regions
                        .iter()
                        .find(|m| ua >= m.user_addr && ua - m.user_addr < m.size)
                        .map(|m| GuestAddress(m.guest_addr + (ua - m.user_addr)))
                        .ok_or_else(|| {
                            invalid(format!("ring address {ua:#x} outside guest memory"))
                        })
                };
                let (desc, avail, used) = (to_gpa(a.desc)?, to_gpa(a.avail)?, to_gpa(a.used)?);
                let mut r = self.ring(a.index)?;
                let q = &mut r.queue;
                q.try_set_desc_table_address(desc)
                    .and_then(|_| q.try_set_avail_ring_address(avail))
                    .and_then(|_| q.try_set_used_ring_address(used))
                    .map_err(|e| invalid(format!("ring {} address: {e}", a.index)))?;
                None
            }
            Request::SetVringBase { index, num } => {
                let n = u16::try_from(num).map_err(|_| invalid("ring base above 65535"))?;
                let mut r = self.ring(index)?;
                r.queue.set_next_avail(n);
                r.queue.set_next_used(n);
                r.notifier.reset(Wrapping(n));
                None
            }
            Request::GetVringBase { index } => {
                let mut r = self.ring(index)?;
                r.started = false;
                r.queue.set_ready(false);
                r.kick = None;
                r.backlog.clear();
                s.kicks_changed = true;
                Some(msg::reply_state(h, index, u32::from(r.queue.next_avail())))
            }
            Request::SetVringKick { index, has_fd } => {
                let mem = self.mem.load_full();
                let mut r = self.ring(index)?;
                r.kick = if has_fd { take_fd() } else { None };
                let Some(mem) = mem else {
                    return Err(invalid("ring started before the memory table"));
                };
                r.queue.set_ready(true);
                if !r.queue.is_valid(&**mem) {
                    r.queue.set_ready(false);
                    return Err(invalid(format!(
                        "ring {index} does not fit in guest memory or is misaligned"
                    )));
                }
                r.started = true;
                let next = Wrapping(r.queue.next_used());
                r.notifier.reset(next);
                s.kicks_changed = true;
                None
            }
            Request::SetVringCall { index, has_fd } => {
                let mut r = self.ring(index)?;
                r.call = if has_fd { take_fd() } else { None };
                None
            }
            Request::SetVringErr { index, .. } => {
                drop(self.ring(index)?);
                None
            }
            Request::SetVringEnable { index, enable } => {
                self.ring(index)?.enabled = enable;
                None
            }
            Request::SendRarp(mac) => {
                self.announce(mac);
                None
            }
            Request::NetSetMtu(_) => None,
        };
        Ok(reply)
    }

    /// After a migration the frontend asks us to announce the guest's MAC: a RARP broadcast
    /// from it, so switches and peers learn where it is now.
    fn announce(&self, mac: [u8; 6]) {
        let mut f = [0u8; 60];
        f[..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&0x8035u16.to_be_bytes());
        // htype 1, ptype IPv4, hlen 6, plen 4, op 3 (reverse request), sha = tha = mac.
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]);
        f[22..28].copy_from_slice(&mac);
        f[32..38].copy_from_slice(&mac);
        let mut ctx = lock(&self.ctx);
        self.ingress.forward_guest(
            &mut ctx,
            &[(VirtioNetHdr::default(), GuestFrame::Copied(&f[..]))],
        );
    }

    /// Takes every frame the guest transmitted on ring `index`, in batches, into the overlay.
    pub fn process_tx(&self, index: usize) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        if self.broken.load(Relaxed) || mem.faulted() {
            return;
        }
        let cut = self.cfg.load().cut_through;
        let Some(ring) = self.rings.get(index) else {
            return;
        };
        let mut ring = lock(ring);
        if !ring.live() {
            return;
        }
        let event_idx = self.event_idx();
        let mut items: Vec<TxItem> = Vec::with_capacity(TX_BATCH);
        let mut arena: Vec<Vec<u8>> = Vec::new();
        loop {
            items.clear();
            arena.clear();
            if event_idx {
                let _ = ring.queue.disable_notification(&**mem);
            }
            {
                let mut iter = match ring.queue.iter(&**mem) {
                    Ok(it) => it,
                    Err(e) => {
                        drop(ring);
                        return self.mark_broken(&format!("transmit ring: {e}"));
                    }
                };
                while items.len() < TX_BATCH {
                    let Some(chain) = iter.next() else { break };
                    items.push(read_tx_chain(chain, &mem, cut, &mut arena));
                }
            }
            if items.is_empty() {
                if event_idx && ring.queue.enable_notification(&**mem).unwrap_or(false) {
                    continue;
                }
                break;
            }
            self.forward_items(&items, &arena);
            for it in &items {
                if ring.queue.add_used(&**mem, it.head, 0).is_err() {
                    drop(ring);
                    return self.mark_broken("used ring outside guest memory");
                }
            }
            if ring.queue.needs_notification(&**mem).unwrap_or(true) {
                ring.signal();
                self.stats.tx_notifications.fetch_add(1, Relaxed);
            }
        }
    }

    fn forward_items(&self, items: &[TxItem<'_>], arena: &[Vec<u8>]) {
        let mut frames: Vec<(VirtioNetHdr, GuestFrame<'_>)> = Vec::with_capacity(items.len());
        let (mut cut, mut copied) = (0, 0);
        for it in items {
            match it.frame {
                // The guest's memory goes on as a volatile slice: the forwarding path copies
                // what it reads (the headers, the MACs it checks and then sends) and hands the
                // rest to the kernel, so a guest rewriting its frame meanwhile can corrupt only
                // its own frame, never spoof a checked source.
                TxFrame::Guest(vs) => {
                    frames.push((it.vh, GuestFrame::Shared(vs)));
                    cut += 1;
                }
                TxFrame::Copied(k) => {
                    frames.push((it.vh, GuestFrame::Copied(&arena[k])));
                    copied += 1;
                }
                TxFrame::Bad(why) => self.bad_chain(why),
            }
        }
        self.stats.tx_cut_through.fetch_add(cut, Relaxed);
        self.stats.tx_copied.fetch_add(copied, Relaxed);
        if !frames.is_empty() {
            let mut ctx = lock(&self.ctx);
            self.ingress.forward_guest(&mut ctx, &frames);
        }
    }

    /// Picks the receive ring for the engine's `queue`.
    fn rx_ring(&self, queue: usize) -> &Mutex<Ring> {
        let k = queue % self.pairs;
        &self.rings[2 * k]
    }

    /// A frame for the guest. Cut-through: written into its receive buffers now, from the
    /// caller's buffer. Copying: copied into the backlog for the device thread.
    pub fn deliver(
        &self,
        queue: usize,
        vh: &VirtioNetHdr,
        parts: &[&[u8]],
    ) -> Result<(), DropReason> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if vh.gso_kind() == VirtioNetHdr::GSO_NONE && len > self.max_frame {
            return Err(DropReason::Oversize);
        }
        if self.broken.load(Relaxed) {
            return Err(DropReason::TxError);
        }
        let Some(mem) = self.mem.load_full() else {
            return Err(DropReason::TxError);
        };
        if mem.faulted() {
            return Err(DropReason::TxError);
        }
        let cfg = self.cfg.load();
        let mut ring = lock(self.rx_ring(queue));
        if !ring.live() {
            return Err(DropReason::TxError);
        }
        if !cfg.cut_through || !ring.backlog.is_empty() {
            if ring.backlog.len() >= RX_BACKLOG {
                return Err(DropReason::QueueFull);
            }
            let mut f = Vec::with_capacity(len);
            for p in parts {
                f.extend_from_slice(p);
            }
            ring.backlog.push_back((*vh, f));
            drop(ring);
            let _ = self.wake.write(1);
            return Ok(());
        }
        let now = Instant::now();
        let view = ring.view(&mem);
        if ring.notifier.before_frame(&view, now) == Action::Notify {
            ring.signal();
        }
        let mrg = self.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        match write_rx(&mut ring.queue, &mem, vh, parts, mrg) {
            Ok(true) => {
                ring.notifier.after_frame(len);
                self.stats.rx_direct.fetch_add(1, Relaxed);
                Ok(())
            }
            Ok(false) => {
                // No buffers: keep it until the guest adds some (it kicks the receive queue).
                let mut f = Vec::with_capacity(len);
                for p in parts {
                    f.extend_from_slice(p);
                }
                ring.backlog.push_back((*vh, f));
                if self.event_idx() {
                    let _ = ring.queue.enable_notification(&**mem);
                }
                Ok(())
            }
            Err(RxError::Chain(why)) => {
                drop(ring);
                self.bad_chain(why);
                Err(DropReason::BadOffload)
            }
            Err(RxError::Ring(why)) => {
                drop(ring);
                self.mark_broken(why);
                Err(DropReason::TxError)
            }
        }
    }

    /// End of a burst of deliveries: the notification decision for every receive ring.
    pub fn end_of_burst(&self) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        let now = Instant::now();
        for k in 0..self.pairs {
            let mut r = lock(&self.rings[2 * k]);
            if !r.live() {
                continue;
            }
            let v = r.view(&mem);
            if r.notifier.end_of_burst(&v, now) == Action::Notify {
                r.signal();
            }
        }
    }

    /// The earliest backstop re-check any receive ring wants.
    pub fn backstop_deadline(&self) -> Option<Instant> {
        (0..self.pairs)
            .filter_map(|k| lock(&self.rings[2 * k]).notifier.backstop_deadline())
            .min()
    }

    pub fn backstop(&self) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        let now = Instant::now();
        for k in 0..self.pairs {
            let mut r = lock(&self.rings[2 * k]);
            if !r.live() {
                continue;
            }
            let v = r.view(&mem);
            if r.notifier.backstop_due(&v, now) == Action::Notify {
                r.signal();
            }
        }
    }

    /// Moves backlogged frames into the guest's receive buffers while it has some (the device
    /// thread: on a receive kick, or when the copying path queued frames).
    pub fn drain_backlog(&self) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        if self.broken.load(Relaxed) || mem.faulted() {
            return;
        }
        let mrg = self.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let now = Instant::now();
        for k in 0..self.pairs {
            let mut r = lock(&self.rings[2 * k]);
            if !r.live() || r.backlog.is_empty() {
                continue;
            }
            let view = r.view(&mem);
            if r.notifier.before_frame(&view, now) == Action::Notify {
                r.signal();
            }
            while let Some((vh, f)) = r.backlog.pop_front() {
                match write_rx(&mut r.queue, &mem, &vh, &[&f], mrg) {
                    Ok(true) => {
                        r.notifier.after_frame(f.len());
                        self.stats.rx_copied.fetch_add(1, Relaxed);
                    }
                    Ok(false) => {
                        r.backlog.push_front((vh, f));
                        if self.event_idx() {
                            let _ = r.queue.enable_notification(&**mem);
                        }
                        break;
                    }
                    Err(RxError::Chain(why)) => self.bad_chain(why),
                    Err(RxError::Ring(why)) => {
                        drop(r);
                        return self.mark_broken(why);
                    }
                }
            }
            let v = r.view(&mem);
            if r.notifier.end_of_burst(&v, Instant::now()) == Action::Notify {
                r.signal();
            }
        }
    }

    /// Queue pairs whose receive and transmit rings both run.
    pub fn pairs_started(&self) -> usize {
        (0..self.pairs)
            .filter(|k| lock(&self.rings[2 * k]).live() && lock(&self.rings[2 * k + 1]).live())
            .count()
    }

    /// Receive-side notification counters, over all rings and connections.
    pub fn notify_counters(&self) -> NotifyCounters {
        let mut c = *lock(&self.stats.rx_notify_done);
        for k in 0..self.pairs {
            add_counters(&mut c, &lock(&self.rings[2 * k]).notifier.counters);
        }
        c
    }
}

/// The file behind a memory region must hold the whole region: touching a mapping past the
/// end of its file is SIGBUS. A memfd is also sealed against shrinking where it allows it
/// (QEMU seals its memfds already), so the frontend cannot cut it short later. Returns whether
/// the file is sealed so; every region is guarded against SIGBUS anyway ([`sigbus`]).
fn check_backing(f: &File, r: &MemRegion) -> io::Result<bool> {
    let meta = f.metadata()?;
    let end = r
        .mmap_offset
        .checked_add(r.size)
        .ok_or_else(|| invalid("memory region overflows its file"))?;
    if !meta.file_type().is_file() || meta.len() < end {
        return Err(invalid(format!(
            "memory region ends at byte {end} of a file of {} bytes",
            meta.len()
        )));
    }
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own; F_GET_SEALS/F_ADD_SEALS take an int argument.
    let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        // Not a memfd (a file on /dev/shm or hugetlbfs): nothing can seal it.
        return Ok(false);
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return Ok(true);
    }
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    Ok(r == 0)
}

/// Clears a kick eventfd.
pub fn drain_eventfd(f: &File) {
    let mut b = [0u8; 8];
    let _ = (&*f).read(&mut b);
}

struct TxItem<'m> {
    head: u16,
    vh: VirtioNetHdr,
    frame: TxFrame<'m>,
}

enum TxFrame<'m> {
    /// In one piece of guest memory, which the guest may rewrite at any moment: reached only
    /// through this volatile slice, never as a Rust slice.
    Guest(VolatileSlice<'m>),
    /// Copied into the arena at this index.
    Copied(usize),
    Bad(&'static str),
}

fn read_tx_chain<'m, M>(
    chain: virtio_queue::DescriptorChain<M>,
    mem: &'m Mem,
    cut: bool,
    arena: &mut Vec<Vec<u8>>,
) -> TxItem<'m>
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let head = chain.head_index();
    let bad = |why| TxItem {
        head,
        vh: VirtioNetHdr::default(),
        frame: TxFrame::Bad(why),
    };
    let mut descs: [(GuestAddress, usize); MAX_CHAIN_DESCS] =
        [(GuestAddress(0), 0); MAX_CHAIN_DESCS];
    let mut n = 0;
    let mut total = 0usize;
    for d in chain {
        if d.is_write_only() {
            return bad("write-only descriptor in a transmit chain");
        }
        if n == MAX_CHAIN_DESCS {
            return bad("more descriptors than a frame needs");
        }
        total += d.len() as usize;
        if total > MAX_TX_CHAIN {
            return bad("more bytes than a frame can have");
        }
        descs[n] = (d.addr(), d.len() as usize);
        n += 1;
    }
    let descs = &descs[..n];
    if total < HDR_LEN + 14 {
        return bad("shorter than the virtio-net header and an Ethernet header");
    }
    // The header, gathered (it may span descriptors).
    let mut hb = [0u8; HDR_LEN];
    let mut got = 0;
    for &(a, l) in descs {
        let k = l.min(HDR_LEN - got);
        if k > 0 && mem.read_slice(&mut hb[got..got + k], a).is_err() {
            return bad("descriptor outside guest memory");
        }
        got += k;
        if got == HDR_LEN {
            break;
        }
    }
    let Ok(vh) = VirtioNetHdr::parse(&hb) else {
        return bad("bad virtio-net header");
    };
    // The frame in one piece of guest memory: one descriptor holding header and frame, or a
    // header descriptor followed by one frame descriptor.
    let whole = match descs {
        [(a, l)] => a.checked_add(HDR_LEN as u64).map(|a| (a, l - HDR_LEN)),
        [(_, HDR_LEN), (a, l)] => Some((*a, *l)),
        _ => None,
    };
    if cut {
        if let Some((a, l)) = whole {
            return match mem.get_slice(a, l) {
                Ok(vs) => TxItem {
                    head,
                    vh,
                    frame: TxFrame::Guest(vs),
                },
                Err(_) => bad("descriptor outside guest memory"),
            };
        }
    }
    let mut buf = vec![0u8; total - HDR_LEN];
    let mut skip = HDR_LEN;
    let mut at = 0;
    for &(a, l) in descs {
        let s = skip.min(l);
        skip -= s;
        if l == s {
            continue;
        }
        let Some(src) = a.checked_add(s as u64) else {
            return bad("descriptor address overflows");
        };
        if mem.read_slice(&mut buf[at..at + l - s], src).is_err() {
            return bad("descriptor outside guest memory");
        }
        at += l - s;
    }
    arena.push(buf);
    TxItem {
        head,
        vh,
        frame: TxFrame::Copied(arena.len() - 1),
    }
}

enum RxError {
    /// The frame does not fit the chain (no mergeable buffers): dropped, the chain consumed.
    Chain(&'static str),
    /// The guest's ring or buffers are unusable: the device is marked broken.
    Ring(&'static str),
}

/// Writes [virtio-net header, frame gathered from `parts`] into as many receive chains as it
/// takes (one without mergeable buffers). `Ok(false)`: not enough buffers, nothing consumed.
fn write_rx(
    queue: &mut Queue,
    mem: &Mem,
    vh: &VirtioNetHdr,
    parts: &[&[u8]],
    mrg: bool,
) -> Result<bool, RxError> {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..VIRTIO_NET_HDR_LEN].copy_from_slice(&vh.emit());
    let total = HDR_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
    // Source cursor over [hdr, parts...].
    let mut src: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
    src.push(&hdr);
    src.extend(parts.iter().copied().filter(|p| !p.is_empty()));
    let (mut si, mut so) = (0usize, 0usize);
    let saved = queue.next_avail();
    let mut used: [(u16, u32); 64] = [(0, 0); 64];
    let mut nused = 0;
    let mut written = 0usize;
    let mut first: Option<GuestAddress> = None;
    while written < total {
        let chain = match queue.iter(mem) {
            Ok(mut it) => it.next(),
            Err(_) => {
                queue.set_next_avail(saved);
                return Err(RxError::Ring("receive ring index or address is invalid"));
            }
        };
        let Some(chain) = chain else {
            queue.set_next_avail(saved);
            return Ok(false);
        };
        let head = chain.head_index();
        let mut len = 0usize;
        for desc in chain.writable() {
            let dlen = desc.len() as usize;
            if first.is_none() {
                if dlen < HDR_LEN {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring(
                        "receive buffer smaller than the virtio-net header",
                    ));
                }
                first = Some(desc.addr());
            }
            let mut off = 0usize;
            while off < dlen && written < total {
                let piece = src[si];
                let n = (piece.len() - so).min(dlen - off);
                let Some(dst) = desc.addr().checked_add(off as u64) else {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring("receive descriptor address overflows"));
                };
                if mem.write_slice(&piece[so..so + n], dst).is_err() {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring("receive descriptor outside guest memory"));
                }
                off += n;
                so += n;
                written += n;
                len += n;
                if so == piece.len() {
                    si += 1;
                    so = 0;
                }
            }
            if written == total {
                break;
            }
        }
        if len == 0 {
            queue.set_next_avail(saved);
            return Err(RxError::Ring("receive chain without writable descriptors"));
        }
        if nused == used.len() {
            queue.set_next_avail(saved);
            return Err(RxError::Ring(
                "frame needs more receive chains than we follow",
            ));
        }
        used[nused] = (head, len as u32);
        nused += 1;
        if written < total && !mrg {
            // Without mergeable buffers a frame must fit one chain: consume it and drop.
            let _ = queue.add_used(mem, head, 0);
            return Err(RxError::Chain(
                "frame larger than a receive chain (no mergeable buffers)",
            ));
        }
    }
    if let Some(a) = first {
        let nb = (nused as u16).to_le_bytes();
        let at = a
            .checked_add(VIRTIO_NET_HDR_LEN as u64)
            .ok_or(RxError::Ring("receive descriptor address overflows"))?;
        if mem.write_slice(&nb, at).is_err() {
            return Err(RxError::Ring("receive descriptor outside guest memory"));
        }
    }
    for &(h, l) in &used[..nused] {
        if queue.add_used(mem, h, l).is_err() {
            return Err(RxError::Ring("used ring outside guest memory"));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    //! The descriptor walks on a real `GuestMemoryMmap`, with rings built by `virtio-queue`'s
    //! own test helpers: what a guest (or a hostile one) can put in its rings.

    use super::*;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    const MEM: u64 = 0x10_0000;
    const BUF: u64 = 0x8_0000;

    fn mem() -> Mem {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).expect("guest memory")
    }

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    /// A transmit frame: the virtio-net header (no offloads) and an Ethernet frame.
    fn put_frame(m: &Mem, at: u64, frame: &[u8]) {
        m.write_slice(&[0u8; HDR_LEN], GuestAddress(at)).unwrap();
        m.write_slice(frame, GuestAddress(at + HDR_LEN as u64))
            .unwrap();
    }

    fn frame(len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        for (i, b) in f.iter_mut().enumerate().skip(14) {
            *b = i as u8;
        }
        f
    }

    fn walk(
        m: &Mem,
        descs: &[RawDescriptor],
        cut: bool,
    ) -> (Option<Vec<u8>>, Option<&'static str>) {
        let q = MockSplitQueue::new(m, 16);
        let chain = q.build_desc_chain(descs).expect("chain");
        let mut arena = Vec::new();
        let item = read_tx_chain(chain, m, cut, &mut arena);
        match item.frame {
            TxFrame::Guest(vs) => {
                let mut v = vec![0u8; vs.len()];
                vs.copy_to(&mut v[..]);
                (Some(v), None)
            }
            TxFrame::Copied(k) => (Some(arena[k].clone()), None),
            TxFrame::Bad(why) => (None, Some(why)),
        }
    }

    #[test]
    fn one_descriptor_frame_is_cut_through_or_copied() {
        let m = mem();
        let f = frame(1500);
        put_frame(&m, BUF, &f);
        let d = [desc(BUF, (HDR_LEN + f.len()) as u32, 0)];
        let q = MockSplitQueue::new(&m, 16);
        let chain = q.build_desc_chain(&d).unwrap();
        let mut arena = Vec::new();
        assert!(matches!(
            read_tx_chain(chain, &m, true, &mut arena).frame,
            TxFrame::Guest(_)
        ));
        assert_eq!(walk(&m, &d, true).0.as_deref(), Some(&f[..]));
        assert_eq!(walk(&m, &d, false).0.as_deref(), Some(&f[..]));
    }

    #[test]
    fn header_then_frame_is_one_piece_and_a_scattered_frame_is_gathered() {
        let m = mem();
        let f = frame(600);
        put_frame(&m, BUF, &f);
        // [header][frame]: still one piece of memory for the frame.
        let d = [
            desc(BUF, HDR_LEN as u32, 0),
            desc(BUF + HDR_LEN as u64, f.len() as u32, 0),
        ];
        assert_eq!(walk(&m, &d, true).0.as_deref(), Some(&f[..]));
        // The frame in three pieces, the header split too: gathered into a copy.
        let d = [
            desc(BUF, 4, 0),
            desc(BUF + 4, (HDR_LEN - 4 + 100) as u32, 0),
            desc(BUF + HDR_LEN as u64 + 100, (f.len() - 100) as u32, 0),
        ];
        let mut arena = Vec::new();
        let q = MockSplitQueue::new(&m, 16);
        let item = read_tx_chain(q.build_desc_chain(&d).unwrap(), &m, true, &mut arena);
        assert!(matches!(item.frame, TxFrame::Copied(0)));
        assert_eq!(arena[0], f);
    }

    #[test]
    fn hostile_chains_are_refused() {
        let m = mem();
        put_frame(&m, BUF, &frame(100));
        // A write-only descriptor in a transmit chain.
        let d = [desc(BUF, 200, VRING_DESC_F_WRITE as u16)];
        assert!(walk(&m, &d, true).1.unwrap().contains("write-only"));
        // Shorter than header + Ethernet header.
        let d = [desc(BUF, (HDR_LEN + 13) as u32, 0)];
        assert!(walk(&m, &d, true).1.is_some());
        // Outside guest memory (cut-through and copying both check).
        let d = [desc(MEM - 20, 200, 0)];
        assert!(walk(&m, &d, true).1.unwrap().contains("outside"));
        assert!(walk(&m, &d, false).1.unwrap().contains("outside"));
        // More bytes than any frame.
        let d = [desc(BUF, u32::MAX / 2, 0), desc(BUF, u32::MAX / 2, 0)];
        assert!(walk(&m, &d, true).1.unwrap().contains("more bytes"));
        // More descriptors than a frame needs (a 65-descriptor chain).
        let d: Vec<RawDescriptor> = (0..(MAX_CHAIN_DESCS as u64 + 1))
            .map(|i| desc(BUF + i * 16, 16, 0))
            .collect();
        let q = MockSplitQueue::new(&m, 128);
        let mut arena = Vec::new();
        let item = read_tx_chain(q.build_desc_chain(&d).unwrap(), &m, true, &mut arena);
        assert!(matches!(item.frame, TxFrame::Bad(w) if w.contains("more descriptors")));
    }

    #[test]
    fn a_guest_rewriting_its_frame_changes_only_what_is_read_later() {
        // The cut-through frame is a volatile view: a read after the guest rewrites its
        // memory sees the new bytes (no stale Rust slice, no assumption that they are fixed).
        let m = mem();
        let f = frame(200);
        put_frame(&m, BUF, &f);
        let d = [desc(BUF, (HDR_LEN + f.len()) as u32, 0)];
        let q = MockSplitQueue::new(&m, 16);
        let mut arena = Vec::new();
        let item = read_tx_chain(q.build_desc_chain(&d).unwrap(), &m, true, &mut arena);
        let TxFrame::Guest(vs) = item.frame else {
            panic!("not cut-through")
        };
        m.write_slice(&[0xee; 6], GuestAddress(BUF + HDR_LEN as u64 + 6))
            .unwrap();
        let mut now = [0u8; 12];
        vs.copy_to(&mut now[..]);
        assert_eq!(&now[6..12], &[0xee; 6]);
    }

    /// A receive ring of `n` single-descriptor chains of `len` bytes each.
    fn rx_queue(m: &Mem, n: u16, len: u32) -> (MockSplitQueue<'_, Mem>, Queue) {
        let q = MockSplitQueue::new(m, 16);
        let descs: Vec<RawDescriptor> = (0..n)
            .map(|i| {
                RawDescriptor::from(SplitDescriptor::new(
                    BUF + i as u64 * 0x1_0000,
                    len,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        for (i, d) in descs.iter().enumerate() {
            q.desc_table().store(i as u16, *d).unwrap();
            q.avail().ring().ref_at(i).unwrap().store(i as u16);
        }
        q.avail().idx().store(n);
        let queue: Queue = q.create_queue().unwrap();
        (q, queue)
    }

    #[test]
    fn receive_fills_one_buffer_or_merges_several() {
        let m = mem();
        let f = frame(1000);
        // One buffer large enough.
        let (_q, mut queue) = rx_queue(&m, 2, 2048);
        assert!(matches!(
            write_rx(
                &mut queue,
                &m,
                &VirtioNetHdr::default(),
                &[&f[..10], &f[10..]],
                true
            ),
            Ok(true)
        ));
        let mut got = vec![0u8; f.len()];
        m.read_slice(&mut got, GuestAddress(BUF + HDR_LEN as u64))
            .unwrap();
        assert_eq!(got, f);
        // num_buffers (the last two bytes of the header) says 1.
        let mut nb = [0u8; 2];
        m.read_slice(&mut nb, GuestAddress(BUF + VIRTIO_NET_HDR_LEN as u64))
            .unwrap();
        assert_eq!(u16::from_le_bytes(nb), 1);

        // Buffers of 512 bytes: merged over as many as it takes with MRG_RXBUF; refused
        // without.
        let (_q, mut queue) = rx_queue(&m, 4, 512);
        assert!(matches!(
            write_rx(&mut queue, &m, &VirtioNetHdr::default(), &[&f], true),
            Ok(true)
        ));
        m.read_slice(&mut nb, GuestAddress(BUF + VIRTIO_NET_HDR_LEN as u64))
            .unwrap();
        assert_eq!(
            u16::from_le_bytes(nb) as usize,
            (HDR_LEN + f.len()).div_ceil(512)
        );
        let (_q, mut queue) = rx_queue(&m, 4, 512);
        assert!(matches!(
            write_rx(&mut queue, &m, &VirtioNetHdr::default(), &[&f], false),
            Err(RxError::Chain(_))
        ));
        // Not enough buffers: nothing consumed.
        let (_q, mut queue) = rx_queue(&m, 1, 512);
        let before = queue.next_avail();
        assert!(matches!(
            write_rx(&mut queue, &m, &VirtioNetHdr::default(), &[&f], true),
            Ok(false)
        ));
        assert_eq!(queue.next_avail(), before);
    }

    #[test]
    fn receive_into_hostile_buffers_marks_the_ring() {
        let m = mem();
        let f = frame(100);
        // A buffer smaller than the virtio-net header.
        let (_q, mut queue) = rx_queue(&m, 1, 4);
        assert!(matches!(
            write_rx(&mut queue, &m, &VirtioNetHdr::default(), &[&f], true),
            Err(RxError::Ring(_))
        ));
        // A buffer outside guest memory.
        let q = MockSplitQueue::new(&m, 16);
        q.desc_table()
            .store(
                0,
                RawDescriptor::from(SplitDescriptor::new(
                    MEM - 8,
                    4096,
                    VRING_DESC_F_WRITE as u16,
                    0,
                )),
            )
            .unwrap();
        q.avail().ring().ref_at(0).unwrap().store(0);
        q.avail().idx().store(1);
        let mut queue: Queue = q.create_queue().unwrap();
        assert!(matches!(
            write_rx(&mut queue, &m, &VirtioNetHdr::default(), &[&f], true),
            Err(RxError::Ring(_))
        ));
    }
}
