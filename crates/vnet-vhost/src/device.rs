//! The virtio-net device behind one vhost-user socket, and its lifecycle: the state the
//! frontend sets up (features, guest memory, virtqueues, eventfds), its configuration, its
//! reset when the frontend goes or misbehaves, its counters. What runs over it lives beside
//! it, each adding its methods to [`Dev`]: the vhost-user requests (`protocol`), transmit
//! (`tx`) and receive (`rx`).
//!
//! Threads: the device's own thread reads the socket and the transmit kicks (and drains the
//! receive backlog); the engine's dispatchers deliver frames for the guest straight into its
//! receive queues (`Dev::deliver`). Each ring has its own lock; transmit rings are touched
//! only by the device thread, so a dispatcher writing into this guest's receive ring never
//! waits for its transmit work.

use std::fs::File;
use std::io::{self, Read, Write};
use std::num::Wrapping;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, ArcSwapOption};
use tracing::warn;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vnet_core::{DropReason, LockRecover};
use vnet_dataplane::forward::FwdCtx;
use vnet_dataplane::Ingress;
use vnet_offload::VIRTIO_NET_HDR_LEN;

use crate::msg::{MemRegion, F_PROTOCOL_FEATURES};
use crate::notify::{Notifier, NotifyCounters, NotifyPolicy, RingView};
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
    /// Guest memory `mem` behind its SIGBUS `guard` (which covers every range of it).
    pub(crate) fn new(guard: sigbus::Guard, mem: Mem) -> GuestMem {
        GuestMem { guard, mem }
    }

    /// The frontend cut this memory short and vnetd faulted on it (the guard caught it): the
    /// device must stop touching it and drop the frontend.
    pub fn faulted(&self) -> bool {
        self.guard.faulted()
    }
}

/// `struct virtio_net_hdr_v1`: the 10-byte header plus `num_buffers` (VERSION_1 is required).
pub const HDR_LEN: usize = VIRTIO_NET_HDR_LEN + 2;
pub const QUEUE_SIZE: u16 = 1024;

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
    pub backlog: crate::rx_backlog::Backlog,
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
            backlog: crate::rx_backlog::Backlog::default(),
        })
    }

    #[inline]
    pub fn live(&self) -> bool {
        self.started && self.enabled && self.queue.ready()
    }

    #[inline]
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
        add_counters(&mut done.lock_or_recover(), &c);
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

pub(crate) fn invalid(why: impl Into<String>) -> io::Error {
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
        self.rings[2 * (pair % self.pairs)].lock_or_recover()
    }

    pub fn event_idx(&self) -> bool {
        self.acked.load(Relaxed) & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
    }

    pub(crate) fn ring(&self, index: u32) -> io::Result<MutexGuard<'_, Ring>> {
        self.rings
            .get(index as usize)
            .map(|r| r.lock_or_recover())
            .ok_or_else(|| invalid(format!("ring {index} does not exist")))
    }

    /// Applies new data-path choices (the rings' notifiers take the policy at once).
    pub fn configure(&self, cfg: NetConfig) {
        self.cfg.store(Arc::new(cfg));
        for r in &self.rings {
            let mut r = r.lock_or_recover();
            r.notifier.policy = cfg.policy;
            r.notifier.alpha = cfg.alpha;
            r.notifier.beta = cfg.beta;
        }
    }

    /// The frontend went away (or misbehaved): forget its memory and rings.
    pub fn reset(&self, s: &mut Session) {
        for r in &self.rings {
            r.lock_or_recover().reset(&self.stats.rx_notify_done);
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

    pub(crate) fn bad_chain(&self, why: &str) {
        let n = self.stats.bad_chains.fetch_add(1, Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            warn!(interface = %self.name, "guest offered a bad descriptor chain ({why}); dropped ({n} so far)");
        }
        self.ingress.count_drop(DropReason::BadOffload);
    }

    /// Queue pairs whose receive and transmit rings both run.
    pub fn pairs_started(&self) -> usize {
        (0..self.pairs)
            .filter(|k| {
                self.rings[2 * k].lock_or_recover().live()
                    && self.rings[2 * k + 1].lock_or_recover().live()
            })
            .count()
    }

    /// Frames waiting for the guest's receive buffers now, over all receive rings.
    pub fn rx_backlog(&self) -> usize {
        (0..self.pairs)
            .map(|k| self.rings[2 * k].lock_or_recover().backlog.len())
            .sum()
    }

    /// Receive-side notification counters, over all rings and connections.
    pub fn notify_counters(&self) -> NotifyCounters {
        let mut c = *self.stats.rx_notify_done.lock_or_recover();
        for k in 0..self.pairs {
            add_counters(
                &mut c,
                &self.rings[2 * k].lock_or_recover().notifier.counters,
            );
        }
        c
    }
}

/// Clears a kick eventfd.
pub fn drain_eventfd(f: &File) {
    let mut b = [0u8; 8];
    let _ = (&*f).read(&mut b);
}
