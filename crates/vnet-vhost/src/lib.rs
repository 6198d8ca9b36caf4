//! vhost-user-net backend: a VM's virtio-net device served by vnetd.
//!
//! The VMM (QEMU, Cloud Hypervisor, ...) shares the guest's memory and virtqueues over a
//! vhost-user socket. This crate speaks the vhost-user protocol itself ([`msg`], [`conn`]) and
//! runs the device on the rust-vmm crates: `vm-memory` maps and bounds-checks guest memory,
//! `virtio-queue` walks the split rings. (The `vhost` crate's request handler refuses the
//! `SET_VRING_ENABLE` that QEMU 7.2 sends before `SET_FEATURES`, hence our own handler.)
//!
//! Data path (VNET/P+, dissertation sections 4.3 and 4.4):
//! - **cut-through** (`set cut-through on`, the default): a frame the guest transmits is
//!   handed to the overlay as a slice of guest memory, so a UDP link sends it with `sendmmsg`
//!   from an iovec [VXLAN header, guest buffer] and nothing copies it in user space; a frame
//!   for the guest is written into its receive descriptors by the thread that received it,
//!   with one copy: by the dispatcher from its receive buffer, or by the device's own thread
//!   from a bounce buffer its UDP links' datagrams are read into and checked in ([`cut_through`]),
//!   so nothing enters guest memory that is not for this guest. The copying path (`off`)
//!   gathers transmitted frames into buffers and queues received ones for the device thread,
//!   and also serves what cut-through cannot: a frame spread over several descriptors, or one
//!   whose checksum we must complete.
//! - **notification policy** (`set notify batch|optimistic`), see [`notify`].
//!
//! The device (`device`: its state and lifecycle) is driven by the vhost-user requests
//! (`protocol`), its transmit rings (`tx`) and its receive rings (`rx`, and `cut_through` for
//! cut-through receive).
//!
//! Every descriptor and every request is hostile until checked: rings and memory tables are
//! validated, chains are bounded, every guest access goes through `vm-memory`'s checked
//! accessors (nothing outside the guest's regions is touched); a bad transmit chain is dropped
//! and counted, a broken ring marks the device broken until the frontend resets it, a bad
//! request drops the connection (the device is reset and waits for the frontend again), and
//! a frontend that cuts guest memory short is survived and dropped ([`sigbus`]).

pub mod conn;
mod cut_through;
mod device;
pub mod msg;
pub mod notify;
mod protocol;
mod rx;
mod rx_backlog;
mod sigbus;
#[cfg(test)]
mod testing;
mod tx;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use vnet_control::status::{NicStatus, VhostUserStatus};
use vnet_control::{DataPathSettings, Interface, NotifyMode};
use vnet_core::LockRecover;
use vnet_dataplane::sys::{self, ControlOperation, Epoll, EpollEvent, EventSet};
use vnet_dataplane::{GuestNic, Ingress, NicFactory};
use vnet_offload::VirtioNetHdr;

use cut_through::{Bounce, CutThroughSock};
use device::{drain_eventfd, Dev, NetConfig, Session};
pub use notify::NotifyPolicy;
use vnet_dataplane::CutThroughLink;

/// Most queue pairs a vhost-user interface offers.
pub const MAX_QUEUE_PAIRS: usize = 16;

const TOKEN_SOCKET: u64 = 0;
const TOKEN_WAKE: u64 = 1;
const TOKEN_RING: u64 = 16;
const TOKEN_CUT_THROUGH: u64 = 1024;
/// Batches one readable cut-through socket gets before the others have their turn.
const CUT_THROUGH_ROUNDS: usize = 8;

/// The overlay's side of a vhost-user interface.
pub struct VhostNic {
    dev: Arc<Dev>,
    socket: PathBuf,
    client: bool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl GuestNic for VhostNic {
    fn write(
        &self,
        queue: usize,
        vh: &VirtioNetHdr,
        parts: &[&[u8]],
    ) -> Result<(), vnet_core::DropReason> {
        self.dev.deliver(queue, vh, parts)
    }

    fn has_vnet_hdr(&self) -> bool {
        self.dev.guest_has_offloads()
    }

    fn max_frame(&self) -> usize {
        self.dev.max_frame
    }

    fn end_of_burst(&self) {
        self.dev.end_of_burst();
    }

    fn configure(&self, s: &DataPathSettings) {
        self.dev.configure(net_config(s));
    }

    fn stats(&self) -> Option<NicStatus> {
        let s = &self.dev.stats;
        let n = self.dev.notify_counters();
        let mb = n.bytes as f64 / 1e6;
        Some(NicStatus::VhostUser(VhostUserStatus {
            socket: self.socket.display().to_string(),
            connected: self.dev.mem.load().is_some(),
            broken: self.dev.broken.load(Relaxed),
            connections: s.connections.load(Relaxed),
            queue_pairs: self.dev.pairs,
            queue_pairs_started: self.dev.pairs_started(),
            protocol_errors: s.protocol_errors.load(Relaxed),
            memory_faults: s.memory_faults.load(Relaxed),
            bad_chains: s.bad_chains.load(Relaxed),
            tx_cut_through: s.tx_cut_through.load(Relaxed),
            tx_copied: s.tx_copied.load(Relaxed),
            rx_cut_through: s.rx_cut_through.load(Relaxed),
            rx_direct_fallback: s.rx_direct_fallback.load(Relaxed),
            rx_direct: s.rx_direct.load(Relaxed),
            rx_copied: s.rx_copied.load(Relaxed),
            rx_backlog: self.dev.rx_backlog(),
            kicks: s.kicks.load(Relaxed),
            tx_notifications: s.tx_notifications.load(Relaxed),
            rx_notifications: n.notifications,
            rx_early: n.early,
            rx_early_masked: n.early_masked,
            rx_end_of_burst: n.end_of_burst,
            rx_skipped_cold: n.skipped_cold,
            rx_skipped_hot: n.skipped_hot,
            rx_early_found_nothing: n.early_found_nothing,
            rx_frames: n.frames,
            rx_frames_per_notification: if n.notifications > 0 {
                n.frames as f64 / n.notifications as f64
            } else {
                0.0
            },
            rx_notifications_per_mb: if mb > 0.0 {
                n.notifications as f64 / mb
            } else {
                0.0
            },
        }))
    }
}

fn net_config(s: &DataPathSettings) -> NetConfig {
    NetConfig {
        cut_through: s.cut_through,
        policy: match s.notify {
            NotifyMode::Batch => NotifyPolicy::Batch,
            NotifyMode::Optimistic => NotifyPolicy::Optimistic,
        },
        alpha: s.notify_alpha_mbps as f64 * 1e6 / 8.0,
        beta: s.notify_beta_mbps as f64 * 1e6 / 8.0,
    }
}

impl Drop for VhostNic {
    fn drop(&mut self) {
        self.dev.stop.store(true, SeqCst);
        let _ = self.dev.wake.write(1);
        if let Some(t) = self.thread.lock_or_recover().take() {
            let _ = t.join();
        }
        if !self.client {
            let _ = std::fs::remove_file(&self.socket);
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
        let pairs = (iface.queues.max(1) as usize).min(MAX_QUEUE_PAIRS);
        let dev = Arc::new(Dev::new(
            iface.name.clone(),
            iface.mtu as usize + 18,
            pairs,
            ingress,
        )?);
        // Bind before returning, so a bad path is an error of the command.
        let listener = if iface.client {
            None
        } else {
            if socket.exists() {
                // A socket left by an earlier run; anything else is not ours to remove.
                let meta = std::fs::symlink_metadata(&socket)?;
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(io::Error::other(format!(
                        "{} exists and is not a socket",
                        socket.display()
                    )));
                }
                std::fs::remove_file(&socket)?;
            }
            let l = UnixListener::bind(&socket)
                .map_err(|e| io::Error::other(format!("listen on {}: {e}", socket.display())))?;
            l.set_nonblocking(true)?;
            Some(l)
        };
        let (d, s) = (dev.clone(), socket.clone());
        let client = iface.client;
        let thread = std::thread::Builder::new()
            .name(format!("vhost-{}", iface.name))
            .spawn(move || serve(d, s, client, listener))?;
        Ok(Arc::new(VhostNic {
            dev,
            socket,
            client,
            thread: Mutex::new(Some(thread)),
        }))
    }
}

/// Waits up to `ms` for `fd` to be readable.
fn wait_readable(fd: RawFd, ms: i32) -> bool {
    sys::poll_one(fd, libc::POLLIN, ms).unwrap_or(false)
}

fn connect(
    dev: &Dev,
    socket: &Path,
    client: bool,
    listener: Option<&UnixListener>,
) -> Option<UnixStream> {
    let mut backoff = Duration::from_millis(100);
    while !dev.stop.load(SeqCst) {
        if client {
            match UnixStream::connect(socket) {
                Ok(s) => return Some(s),
                Err(e) => debug!(interface = %dev.name, "connect {}: {e}", socket.display()),
            }
            // Sleep in steps, so a stop is seen soon.
            let until = Instant::now() + backoff;
            while Instant::now() < until && !dev.stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        } else {
            let l = listener?;
            if wait_readable(l.as_raw_fd(), 100) {
                match l.accept() {
                    Ok((s, _)) => return Some(s),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => warn!(interface = %dev.name, "accept: {e}"),
                }
            }
        }
    }
    None
}

fn serve(dev: Arc<Dev>, socket: PathBuf, client: bool, listener: Option<UnixListener>) {
    while let Some(mut stream) = connect(&dev, &socket, client, listener.as_ref()) {
        if stream.set_nonblocking(false).is_err()
            || stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .is_err()
        {
            continue;
        }
        dev.stats.connections.fetch_add(1, Relaxed);
        info!(interface = %dev.name, "vhost-user frontend connected");
        let mut session = Session::default();
        match run_session(&dev, &mut stream, &mut session) {
            Ok(()) => {
                info!(interface = %dev.name, "vhost-user frontend disconnected; waiting for the next")
            }
            Err(e) => {
                dev.stats.protocol_errors.fetch_add(1, Relaxed);
                warn!(interface = %dev.name, "vhost-user connection dropped: {e}; device reset, waiting for the frontend");
            }
        }
        dev.reset(&mut session);
    }
}

/// One frontend connection: its requests, the transmit and receive kicks, the backlog and
/// notification backstop, until it closes or misbehaves.
fn run_session(dev: &Dev, stream: &mut UnixStream, s: &mut Session) -> io::Result<()> {
    let mut epoll = EpollSet::new()?;
    epoll.add(stream.as_raw_fd(), TOKEN_SOCKET)?;
    epoll.add(dev.wake.as_raw_fd(), TOKEN_WAKE)?;
    let mut ring_fds: Vec<Option<RawFd>> = vec![None; dev.rings.len()];
    let mut cut_socks: Vec<CutThroughSock> = Vec::new();
    // Where cut-through receive lands before the check; made with the first socket.
    let mut bounce: Option<Bounce> = None;
    let mut cut_key: Option<(u64, bool)> = None;
    // Cut-through sockets left unarmed because the guest had no receive buffers.
    let mut cut_waiting = false;
    loop {
        if dev.stop.load(SeqCst) {
            return Ok(());
        }
        if dev.memory_faulted() {
            dev.stats.memory_faults.fetch_add(1, Relaxed);
            return Err(io::Error::other(
                "the frontend cut guest memory short under us (SIGBUS survived)",
            ));
        }
        let key = (dev.ingress.generation(), dev.cfg.load().cut_through);
        if cut_key != Some(key) {
            cut_key = Some(key);
            let want = if key.1 {
                dev.ingress.cut_through_links()
            } else {
                Vec::new()
            };
            let have: Vec<CutThroughLink> = cut_socks.iter().map(|d| d.link).collect();
            if want != have {
                for d in cut_socks.drain(..) {
                    let _ = epoll.del(d.raw());
                    let _ = dev.plain_receive(&d);
                }
                for (i, l) in want.into_iter().enumerate() {
                    match CutThroughSock::open(l) {
                        Ok(d) => {
                            epoll.add_oneshot(d.raw(), TOKEN_CUT_THROUGH + i as u64)?;
                            cut_socks.push(d);
                        }
                        Err(e) => {
                            warn!(interface = %dev.name, peer = %l.peer, "cut-through receive socket: {e}; that link uses the ordinary path");
                        }
                    }
                }
                debug!(interface = %dev.name, sockets = cut_socks.len(), "cut-through receive sockets");
            }
        }
        if s.kicks_changed {
            s.kicks_changed = false;
            for (i, r) in dev.rings.iter().enumerate() {
                let fd = r.lock_or_recover().kick.as_ref().map(|f| f.as_raw_fd());
                if fd != ring_fds[i] {
                    if let Some(old) = ring_fds[i] {
                        let _ = epoll.del(old);
                    }
                    if let Some(new) = fd {
                        epoll.add(new, TOKEN_RING + i as u64)?;
                    }
                    ring_fds[i] = fd;
                }
            }
            // Frames may already wait on a ring that just started.
            for i in (1..dev.rings.len()).step_by(2) {
                dev.process_tx(i);
            }
            dev.drain_backlog();
        }
        let timeout = match dev.backstop_deadline() {
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, 200) as i32,
            None => 200,
        };
        let events = epoll.wait(timeout)?;
        for token in events {
            match token {
                TOKEN_SOCKET => match conn::recv(stream)? {
                    conn::Recv::Closed => return Ok(()),
                    conn::Recv::Message(m) => handle_message(dev, stream, s, m)?,
                },
                TOKEN_WAKE => {
                    let _ = dev.wake.read();
                    dev.drain_backlog();
                }
                t if t >= TOKEN_CUT_THROUGH => {
                    let i = (t - TOKEN_CUT_THROUGH) as usize;
                    let Some(d) = cut_socks.get(i) else { continue };
                    let b = bounce.get_or_insert_with(|| Bounce::new(dev.max_frame));
                    let mut rearm = true;
                    for _ in 0..CUT_THROUGH_ROUNDS {
                        match dev.cut_through_receive(d, b)? {
                            cut_through::Received::Frames { full: true } => continue,
                            cut_through::Received::Frames { full: false } => break,
                            cut_through::Received::NoBuffers => {
                                rearm = false;
                                cut_waiting = true;
                                break;
                            }
                            cut_through::Received::Off => {
                                dev.plain_receive(d)?;
                                break;
                            }
                        }
                    }
                    if rearm {
                        epoll.rearm(d.raw(), t)?;
                    }
                }
                t => {
                    let i = (t - TOKEN_RING) as usize;
                    if let Some(r) = dev.rings.get(i) {
                        if let Some(k) = r.lock_or_recover().kick.as_ref() {
                            drain_eventfd(k);
                        }
                    }
                    dev.stats.kicks.fetch_add(1, Relaxed);
                    if i % 2 == 1 {
                        dev.process_tx(i);
                    } else {
                        dev.drain_backlog();
                        if cut_waiting {
                            cut_waiting = false;
                            for (k, d) in cut_socks.iter().enumerate() {
                                epoll.rearm(d.raw(), TOKEN_CUT_THROUGH + k as u64)?;
                            }
                        }
                    }
                }
            }
        }
        dev.backstop();
    }
}

fn handle_message(
    dev: &Dev,
    stream: &mut UnixStream,
    s: &mut Session,
    m: conn::Message,
) -> io::Result<()> {
    let h = m.header;
    let req = msg::parse(&h, &m.body, m.files.len())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    debug!(interface = %dev.name, ?req, "vhost-user request");
    let has_reply = req.has_reply();
    let reply = dev.handle(s, &h, req, m.files)?;
    if let Some(r) = reply {
        conn::send(stream, &r)?;
    } else if !has_reply && h.need_reply() && s.acked_proto & msg::proto::REPLY_ACK != 0 {
        conn::send(stream, &msg::reply_u64(&h, 0))?;
    }
    Ok(())
}

/// The session's epoll set (the dataplane's, `vmm-sys-util`'s): file descriptors with
/// tokens, level-triggered, or one-shot for the cut-through sockets.
struct EpollSet {
    ep: Epoll,
    events: Vec<EpollEvent>,
}

impl EpollSet {
    fn new() -> io::Result<EpollSet> {
        Ok(EpollSet {
            ep: Epoll::new()?,
            events: vec![EpollEvent::default(); 16],
        })
    }

    fn add(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        sys::epoll_add(&self.ep, fd, token)
    }

    /// Added disarmed after each event: [`Self::rearm`] when ready for more.
    fn add_oneshot(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let ev = EpollEvent::new(EventSet::IN | EventSet::ONE_SHOT, token);
        self.ep.ctl(ControlOperation::Add, fd, ev)
    }

    fn rearm(&mut self, fd: RawFd, token: u64) -> io::Result<()> {
        let ev = EpollEvent::new(EventSet::IN | EventSet::ONE_SHOT, token);
        self.ep.ctl(ControlOperation::Modify, fd, ev)
    }

    fn del(&mut self, fd: RawFd) -> io::Result<()> {
        sys::epoll_del(&self.ep, fd)
    }

    fn wait(&mut self, timeout_ms: i32) -> io::Result<Vec<u64>> {
        let n = sys::epoll_wait(&self.ep, timeout_ms, &mut self.events)?;
        Ok(self.events[..n].iter().map(|e| e.data()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_epoll_set_reports_tokens_and_one_shots_need_rearming() {
        let mut ep = EpollSet::new().unwrap();
        let a = sys::eventfd().unwrap();
        let b = sys::eventfd().unwrap();
        ep.add(a.as_raw_fd(), 5).unwrap();
        ep.add_oneshot(b.as_raw_fd(), 9).unwrap();
        assert!(ep.wait(0).unwrap().is_empty());
        sys::signal(&a);
        sys::signal(&b);
        let mut got = ep.wait(100).unwrap();
        got.sort();
        assert_eq!(got, vec![5, 9]);
        // Still readable: the level-triggered one reports again, the one-shot does not...
        assert_eq!(ep.wait(0).unwrap(), vec![5]);
        // ...until rearmed.
        ep.rearm(b.as_raw_fd(), 9).unwrap();
        let mut got = ep.wait(0).unwrap();
        got.sort();
        assert_eq!(got, vec![5, 9]);
        ep.del(a.as_raw_fd()).unwrap();
        let _ = b.read();
        ep.rearm(b.as_raw_fd(), 9).unwrap();
        assert!(ep.wait(0).unwrap().is_empty());
    }
}
