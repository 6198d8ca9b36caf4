//! Cut-through receive (after VNET/P+ section 4.4): VXLAN datagrams from a UDP link are read
//! in batches by the interface's own thread and land in the guest's receive buffers with one
//! copy, bypassing the dispatchers and the route table's ordinary path.
//!
//! Each UDP link of the interface's VNI gets a socket bound to the daemon's VXLAN port and
//! connected to the link's peer (`SO_REUSEPORT`): the kernel hands a connected socket its
//! peer's datagrams, so everything the peer sends arrives here and not on the shared socket
//! (kernel VXLAN peers pick their source port per flow and keep using the shared socket).
//! That is *all* the peer sends: any VNI, any inner destination. So `recvmmsg` writes into a
//! bounce buffer of vnetd's own ([`Bounce`], one per device, reused), never into guest memory:
//! nothing reaches the guest's memory before it is known to be for this guest, and nothing
//! for another guest is ever read back from memory the guest can rewrite. The device thread
//! waits on these sockets; when one is readable it notifies the guest early (optimistic
//! policy), takes as many datagrams as the guest offers receive buffers, and checks each
//! (`vnet-wire`'s VXLAN view): a frame of the link's VNI gets the one forwarding decision
//! every ingress gets (`Ingress::cut_through`: counters, the link's guard, learning, traffic
//! matrix, route cache); one the decision sends to this interface alone is copied with its
//! virtio-net header into the next receive buffer and published; any other (transit,
//! broadcast for elsewhere) is handed on with its verdict from the bounce buffer once the
//! receive ring is released, and a frame of another VNI goes to the ordinary path. Used only
//! when this interface is the only one in its VNI on this host, learning is off, and the
//! guest uses mergeable receive buffers.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::*;
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vnet_core::{DropReason, LockRecover};
use vnet_dataplane::forward::FwdCtx;
use vnet_dataplane::sys::{MmsgReceiver, Msg};
use vnet_dataplane::{CutThrough, CutThroughLink, DecidedFrames};
use vnet_wire::{VirtioNetHdr, VxlanPacket, VXLAN_HEADER_LEN};

use crate::device::{Dev, HDR_LEN};
use crate::notify::Action;
use crate::rx::arm_rx_kick;

const BATCH: usize = 32;
const SOCKET_BUFFER: usize = 4 << 20;
/// Bytes before the VXLAN header in a bounce slot: the VXLAN header ends where the
/// virtio-net header would, so a frame for the guest goes out as one piece, [virtio-net
/// header written over the VXLAN header, frame].
const PAD: usize = HDR_LEN - VXLAN_HEADER_LEN;
/// The smallest frame a bounce slot holds: a jumbo frame, so that transit frames and other
/// VNIs' frames from the peer (which may be larger than this guest's) are not cut short.
const SLOT_FRAME_MIN: usize = 9216 + 18;

/// A connected socket for one UDP link.
pub struct CutThroughSock {
    pub fd: OwnedFd,
    pub link: CutThroughLink,
}

impl CutThroughSock {
    pub fn open(link: CutThroughLink) -> io::Result<CutThroughSock> {
        let sock = Socket::new(
            Domain::for_address(link.local),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        if link.local.is_ipv6() {
            sock.set_only_v6(false)?;
        }
        sock.set_reuse_port(true)?;
        let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        sock.bind(&SockAddr::from(link.local))?;
        let peer = match (link.local, link.peer) {
            (SocketAddr::V6(_), SocketAddr::V4(p)) => {
                SocketAddr::new(p.ip().to_ipv6_mapped().into(), p.port())
            }
            _ => link.peer,
        };
        sock.connect(&SockAddr::from(peer))?;
        sock.set_nonblocking(true)?;
        Ok(CutThroughSock {
            fd: sock.into(),
            link,
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Where cut-through receive lands: `BATCH` slots of vnetd's own memory, each
/// [`PAD` bytes, VXLAN header, frame], with the `recvmmsg` state and the per-batch lists.
/// Made once per device session and reused, so the receive path allocates nothing.
pub struct Bounce {
    buf: Vec<u8>,
    /// Bytes from one slot to the next.
    stride: usize,
    rx: MmsgReceiver,
    msgs: Vec<Msg>,
    /// The guest's receive buffers of this batch: (head, address, length), in ring order.
    bufs: Vec<(u16, GuestAddress, usize)>,
    used: Vec<(u16, u32)>,
    /// Datagrams of another VNI, for the ordinary path: (VNI, slot, frame length).
    others: Vec<(u32, usize, usize)>,
    /// Frames of the link's VNI decided on but not for this guest alone (keyed by slot), to
    /// hand on once the receive ring is released.
    later: DecidedFrames,
}

impl Bounce {
    pub fn new(max_frame: usize) -> Bounce {
        let stride = (PAD + VXLAN_HEADER_LEN + max_frame.max(SLOT_FRAME_MIN)).next_multiple_of(64);
        Bounce {
            buf: vec![0u8; stride * BATCH],
            stride,
            rx: MmsgReceiver::new(BATCH),
            msgs: Vec::with_capacity(BATCH),
            bufs: Vec::with_capacity(BATCH),
            used: Vec::with_capacity(BATCH),
            others: Vec::with_capacity(BATCH),
            later: DecidedFrames::default(),
        }
    }

    fn slot(&self, k: usize) -> &[u8] {
        &self.buf[k * self.stride..(k + 1) * self.stride]
    }

    /// The frame of length `len` in slot `k`.
    fn frame(&self, k: usize, len: usize) -> &[u8] {
        &self.slot(k)[HDR_LEN..HDR_LEN + len]
    }
}

pub enum Received {
    /// Datagrams were taken; `full`: a whole batch, so more may wait.
    Frames { full: bool },
    /// The guest offers no receive buffers: its kick is armed, wait for it.
    NoBuffers,
    /// Direct receive does not apply now: the caller takes the datagrams the ordinary way.
    Off,
}

/// Gives the last `n` popped chains back to the avail ring.
fn rewind(q: &mut virtio_queue::Queue, n: usize) {
    let next = q.next_avail().wrapping_sub(n as u16);
    q.set_next_avail(next);
}

/// An error a connected UDP socket reports for an ICMP message about a datagram the shared
/// socket *sent* to the peer (same addresses), e.g. port unreachable while the peer's vnetd
/// restarts: nothing to read, and the next read goes on. Not a reason to drop the frontend.
fn is_icmp_report(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNREFUSED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::ENOPROTOOPT
                | libc::EACCES
        )
    )
}

impl Dev {
    /// Receives what `d`'s peer sent into `b`, then this guest's frames into its receive
    /// buffers (one copy each); see the module header.
    pub fn cut_through_receive(&self, d: &CutThroughSock, b: &mut Bounce) -> io::Result<Received> {
        let Some(mem) = self.mem.load_full() else {
            return Ok(Received::Off);
        };
        if !self.cfg.load().cut_through
            || self.broken.load(Relaxed)
            || mem.faulted()
            || self.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) == 0
        {
            return Ok(Received::Off);
        }
        let mut ring = self.rx_ring_lock(0);
        if !ring.live() || !ring.backlog.is_empty() {
            return Ok(Received::Off);
        }
        // Fresh buffers from the avail ring, used strictly in order (a frontend that loses
        // us recovers from the used index, which assumes in-order use): buffers left over at
        // the end go back to the ring.
        let need = HDR_LEN + self.max_frame;
        b.bufs.clear();
        let mut unsuitable = false;
        loop {
            while b.bufs.len() < BATCH {
                let chain = match ring.queue.iter(&**mem) {
                    Ok(mut it) => it.next(),
                    Err(e) => {
                        rewind(&mut ring.queue, b.bufs.len());
                        drop(ring);
                        self.mark_broken(&format!("receive ring: {e}"));
                        return Ok(Received::Off);
                    }
                };
                let Some(chain) = chain else { break };
                let head = chain.head_index();
                let mut descs = chain;
                let first = descs.next();
                let single = descs.next().is_none();
                match first {
                    Some(dsc) if single && dsc.is_write_only() && dsc.len() as usize >= need => {
                        if !mem.check_range(dsc.addr(), dsc.len() as usize) {
                            rewind(&mut ring.queue, b.bufs.len() + 1);
                            drop(ring);
                            self.mark_broken("receive buffer outside guest memory");
                            return Ok(Received::Off);
                        }
                        b.bufs.push((head, dsc.addr(), dsc.len() as usize));
                    }
                    _ => {
                        // Not a buffer we can receive into whole: left for the ordinary path.
                        rewind(&mut ring.queue, 1);
                        unsuitable = true;
                        break;
                    }
                }
            }
            if !b.bufs.is_empty() {
                break;
            }
            if unsuitable {
                // The next buffer is one only the ordinary path fills (it merges frames over
                // chains of any shape): it takes these datagrams.
                return Ok(Received::Off);
            }
            if !arm_rx_kick(&mut ring.queue, &mem) {
                return Ok(Received::NoBuffers);
            }
            // The guest added buffers while we armed its kick, and will not kick for them.
        }
        let now = Instant::now();
        let view = ring.view(&mem);
        if ring.notifier.before_frame(&view, now) == Action::Notify {
            ring.signal();
        }
        // At most one datagram per receive buffer the guest offers: the rest wait in the
        // socket until it offers more.
        let n = b.bufs.len();
        let stride = b.stride;
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        for (k, iov) in iovs[..n].iter_mut().enumerate() {
            *iov = libc::iovec {
                iov_base: b.buf[k * stride + PAD..].as_mut_ptr().cast(),
                iov_len: stride - PAD,
            };
        }
        // SAFETY: each of `iovs[..n]` covers the tail of one slot of `b.buf`, memory of ours
        // that nothing else touches during the call; the kernel writes at most iov_len bytes.
        let r = unsafe { b.rx.recv(d.raw(), &mut iovs[..n], 1, &mut b.msgs) };
        if let Err(e) = r {
            rewind(&mut ring.queue, n);
            if is_icmp_report(&e) {
                return Ok(Received::Frames { full: true });
            }
            return Err(e);
        }
        let got = b.msgs.len();
        b.used.clear();
        b.others.clear();
        b.later.clear();
        // Datagrams of a valid VXLAN header not written into the guest's buffers.
        let mut fallback = 0u64;
        let mut ctx = self.ctx.lock_or_recover();
        // `w`: the next buffer to fill. Only frames for the guest take one, so buffers are
        // still used in ring order.
        let mut w = 0;
        for k in 0..got {
            let Msg { len, truncated, .. } = b.msgs[k];
            let at = k * stride;
            if truncated || len < VXLAN_HEADER_LEN + 14 {
                let r = if truncated {
                    DropReason::Oversize
                } else {
                    DropReason::Truncated
                };
                self.ingress.count_link_drop(d.link.port, len, r);
                continue;
            }
            let Ok(vxlan) = VxlanPacket::new_checked(&b.buf[at + PAD..at + HDR_LEN]) else {
                self.ingress
                    .count_link_drop(d.link.port, len, DropReason::BadVxlan);
                continue;
            };
            let vni = vxlan.vni();
            let flen = len - VXLAN_HEADER_LEN;
            if vni != d.link.vni {
                fallback += 1;
                b.others.push((vni, k, flen));
                continue;
            }
            let frame = &b.buf[at + HDR_LEN..at + HDR_LEN + flen];
            let fits = flen <= self.max_frame;
            match self
                .ingress
                .cut_through(&mut ctx, d.link.port, frame, fits, k, &mut b.later)
            {
                CutThrough::Guest => {}
                CutThrough::Elsewhere | CutThrough::Dropped => {
                    fallback += 1;
                    continue;
                }
            }
            // virtio_net_hdr_v1 over the VXLAN header: no offload flags (the guest checks
            // the checksum), one buffer; then header and frame in one copy.
            let s = &mut b.buf[at..at + HDR_LEN + flen];
            s[..HDR_LEN].copy_from_slice(&VirtioNetHdr::default().emit_mrg_rxbuf(1));
            if mem.write_slice(s, b.bufs[w].1).is_err() {
                continue;
            }
            b.used.push((b.bufs[w].0, (HDR_LEN + flen) as u32));
            w += 1;
        }
        rewind(&mut ring.queue, n - w);
        for &(h, l) in &b.used {
            if ring.queue.add_used(&**mem, h, l).is_err() {
                drop(ring);
                drop(ctx);
                self.mark_broken("used ring outside guest memory");
                return Ok(Received::Off);
            }
            ring.notifier.after_frame(l as usize - HDR_LEN);
        }
        self.stats
            .rx_cut_through
            .fetch_add(b.used.len() as u64, Relaxed);
        let v = ring.view(&mem);
        if ring.notifier.end_of_burst(&v, Instant::now()) == Action::Notify {
            ring.signal();
        }
        drop(ring);
        if fallback > 0 {
            self.stats.rx_direct_fallback.fetch_add(fallback, Relaxed);
        }
        self.forward_others(&mut ctx, d, b);
        Ok(Received::Frames { full: got == n })
    }

    /// The datagrams of a batch that were not for this guest, from the bounce buffer: those
    /// of the link's VNI to the ports their verdicts name, the others from the link of their
    /// VNI to that peer.
    fn forward_others(&self, ctx: &mut FwdCtx, d: &CutThroughSock, b: &mut Bounce) {
        if !b.later.is_empty() {
            let (buf, msgs, stride) = (&b.buf, &b.msgs, b.stride);
            self.ingress.forward_decided(ctx, &mut b.later, |k| {
                let at = k * stride + HDR_LEN;
                &buf[at..at + msgs[k].len - VXLAN_HEADER_LEN]
            });
        }
        if !b.others.is_empty() {
            let other: Vec<(u32, &[u8])> = b
                .others
                .iter()
                .map(|&(v, k, l)| (v, b.frame(k, l)))
                .collect();
            self.ingress
                .forward_other_vni(ctx, d.link.peer.ip(), &other);
        }
    }

    /// Takes the datagrams on `d` the ordinary way (copied, through the route table).
    pub fn plain_receive(&self, d: &CutThroughSock) -> io::Result<usize> {
        let mut buf = vec![0u8; 65536];
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let mut others: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut total = 0;
        loop {
            // SAFETY: `buf` is ours and valid for its length.
            let r = unsafe {
                libc::recv(
                    d.raw(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    break;
                }
                if e.kind() == io::ErrorKind::Interrupted || is_icmp_report(&e) {
                    continue;
                }
                return Err(e);
            }
            let len = r as usize;
            total += 1;
            if len < VXLAN_HEADER_LEN + 14 {
                self.ingress
                    .count_link_drop(d.link.port, len, DropReason::Truncated);
                continue;
            }
            let Ok(vxlan) = VxlanPacket::new_checked(&buf[..len]) else {
                self.ingress
                    .count_link_drop(d.link.port, len, DropReason::BadVxlan);
                continue;
            };
            let (vni, f) = (vxlan.vni(), vxlan.payload().to_vec());
            if vni == d.link.vni {
                frames.push(f);
            } else {
                others.push((vni, f));
            }
            if frames.len() + others.len() >= BATCH {
                break;
            }
        }
        if !frames.is_empty() || !others.is_empty() {
            let mut ctx = self.ctx.lock_or_recover();
            if !frames.is_empty() {
                self.ingress.forward_from(&mut ctx, d.link.port, &frames);
            }
            if !others.is_empty() {
                let o: Vec<(u32, &[u8])> = others.iter().map(|(v, f)| (*v, &f[..])).collect();
                self.ingress
                    .forward_other_vni(&mut ctx, d.link.peer.ip(), &o);
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_icmp_error_for_the_shared_sockets_datagram_is_not_fatal() {
        // The shared socket sends to the peer's port, which is closed: the ICMP error lands on
        // the connected socket of the same addresses as a read error.
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = peer.local_addr().unwrap();
        drop(peer);
        let d = CutThroughSock::open(CutThroughLink {
            port: vnet_core::PortId(1),
            peer: to,
            local: "127.0.0.1:0".parse().unwrap(),
            vni: 1,
        })
        .unwrap();
        let local = socket2::SockRef::from(&d.fd).local_addr().unwrap();
        let shared = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        shared.set_reuse_port(true).unwrap();
        shared.bind(&local).unwrap();
        shared.send_to(b"x", &SockAddr::from(to)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut b = [0u8; 16];
        // SAFETY: `b` is ours and valid for its length.
        let r = unsafe { libc::recv(d.raw(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        assert_eq!(r, -1);
        let e = io::Error::last_os_error();
        assert!(is_icmp_report(&e), "{e}");
        assert!(!is_icmp_report(&io::Error::from_raw_os_error(libc::EBADF)));
    }

    #[test]
    fn a_bounce_slot_holds_a_jumbo_frame_and_ends_its_vxlan_header_where_the_virtio_header_does() {
        let b = Bounce::new(1518);
        assert!(b.stride - PAD >= VXLAN_HEADER_LEN + SLOT_FRAME_MIN);
        assert_eq!(b.stride % 64, 0);
        assert_eq!(b.buf.len(), b.stride * BATCH);
        assert_eq!(PAD + VXLAN_HEADER_LEN, HDR_LEN);
        // A guest with a larger MTU gets larger slots.
        let big = Bounce::new(65535 + 18);
        assert!(big.stride - PAD >= VXLAN_HEADER_LEN + 65535 + 18);
    }
}
