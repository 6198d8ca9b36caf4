//! Cut-through receive (VNET/P+ section 4.4): VXLAN datagrams from a UDP link land straight
//! in the guest's receive buffers, the 8-byte VXLAN header in a scratch buffer, with no copy
//! in user space.
//!
//! Each UDP link of the interface's VNI gets a socket bound to the daemon's VXLAN port and
//! connected to the link's peer (`SO_REUSEPORT`): the kernel hands a connected socket its
//! peer's datagrams, so everything the peer sends arrives here and not on the shared socket
//! (kernel VXLAN peers pick their source port per flow and keep using the shared socket).
//! The device thread waits on these sockets; when one is readable it notifies the guest
//! early (optimistic policy), gives `recvmmsg` iovecs of [scratch, guest buffer] for as many
//! receive buffers as the guest offers, then checks each frame with the route table: a frame
//! for this interface is completed with its virtio-net header and published; any other
//! (transit, broadcast for elsewhere, no route) is copied out to the ordinary path and its
//! buffer is kept for the next datagram. Used only when this interface is the only one in its
//! VNI on this host, learning is off, and the guest uses mergeable receive buffers.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::*;
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};
use vnet_core::DropReason;
use vnet_dataplane::sys::{MmsgReceiver, Msg};
use vnet_dataplane::DirectLink;
use vnet_wire::{MacAddr, VXLAN_HEADER_LEN};

use crate::device::{Dev, HDR_LEN};
use crate::notify::Action;

const BATCH: usize = 32;
const SOCKET_BUFFER: usize = 4 << 20;

/// A connected socket for one UDP link, with its `recvmmsg` scratch.
pub struct DirectSock {
    pub fd: OwnedFd,
    pub link: DirectLink,
    rx: MmsgReceiver,
    msgs: Vec<Msg>,
}

impl DirectSock {
    pub fn open(link: DirectLink) -> io::Result<DirectSock> {
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
        Ok(DirectSock {
            fd: sock.into(),
            link,
            rx: MmsgReceiver::new(BATCH),
            msgs: Vec::with_capacity(BATCH),
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

pub enum Received {
    /// Datagrams were taken; `full`: a whole batch, so more may wait.
    Frames { full: bool },
    /// The guest offers no (suitable) receive buffers: wait for its kick.
    NoBuffers,
    /// Direct receive does not apply now: the caller takes the datagrams the ordinary way.
    Off,
}

/// Gives the last `n` popped chains back to the avail ring.
fn rewind(q: &mut virtio_queue::Queue, n: usize) {
    let next = q.next_avail().wrapping_sub(n as u16);
    q.set_next_avail(next);
}

fn vxlan_ok(h: &[u8; VXLAN_HEADER_LEN], vni: u32) -> bool {
    h[0] & 0x08 != 0 && u32::from_be_bytes([0, h[4], h[5], h[6]]) == vni
}

impl Dev {
    /// Receives what `d`'s peer sent straight into the guest's receive buffers.
    pub fn direct_receive(&self, d: &mut DirectSock) -> io::Result<Received> {
        let Some(mem) = self.mem.load_full() else {
            return Ok(Received::Off);
        };
        if !self.cfg.load().cut_through
            || self.broken.load(Relaxed)
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
        let mut bufs: Vec<(u16, GuestAddress, usize)> = Vec::with_capacity(BATCH);
        while bufs.len() < BATCH {
            let chain = match ring.queue.iter(&*mem) {
                Ok(mut it) => it.next(),
                Err(e) => {
                    rewind(&mut ring.queue, bufs.len());
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
                    bufs.push((head, dsc.addr(), dsc.len() as usize));
                }
                _ => {
                    // Not a buffer we can receive into whole: leave it for the ordinary path.
                    rewind(&mut ring.queue, 1);
                    break;
                }
            }
        }
        if bufs.is_empty() {
            if self.event_idx() {
                let _ = ring.queue.enable_notification(&*mem);
            }
            return Ok(Received::NoBuffers);
        }
        let now = Instant::now();
        let view = ring.view(&mem);
        if ring.notifier.before_frame(&view, now) == Action::Notify {
            ring.signal();
        }
        // iovecs: [scratch VXLAN header, guest buffer after the virtio-net header].
        let n = bufs.len();
        let mut scratch = [[0u8; VXLAN_HEADER_LEN]; BATCH];
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2 * BATCH];
        for (k, &(_, addr, len)) in bufs.iter().enumerate() {
            let Some(a) = addr.checked_add(HDR_LEN as u64) else {
                rewind(&mut ring.queue, bufs.len());
                drop(ring);
                self.mark_broken("receive buffer address overflows");
                return Ok(Received::Off);
            };
            let slice = match mem.get_slice(a, len - HDR_LEN) {
                Ok(s) => s,
                Err(_) => {
                    rewind(&mut ring.queue, bufs.len());
                    drop(ring);
                    self.mark_broken("receive buffer outside guest memory");
                    return Ok(Received::Off);
                }
            };
            iovs[2 * k] = libc::iovec {
                iov_base: scratch[k].as_mut_ptr().cast(),
                iov_len: VXLAN_HEADER_LEN,
            };
            iovs[2 * k + 1] = libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            };
        }
        // SAFETY: `iovs[..2n]` cover `scratch` (ours) and guest receive buffers inside regions
        // mapped by `mem`, which we hold for the whole call; the kernel writes at most iov_len
        // bytes to each.
        let r = unsafe { d.rx.recv(d.raw(), &mut iovs[..2 * n], 2, &mut d.msgs) };
        if let Err(e) = r {
            rewind(&mut ring.queue, bufs.len());
            return Err(e);
        }
        let got = d.msgs.len();
        let mut fallback: Vec<Vec<u8>> = Vec::new();
        let mut used: Vec<(u16, u32)> = Vec::with_capacity(got);
        let mut ctx = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
        // `w`: the next buffer to publish. A datagram that is not for the guest leaves its
        // buffer unpublished; a later frame is then moved down into it (rare), so buffers are
        // still used in ring order.
        let mut w = 0;
        for (k, m) in d.msgs.iter().enumerate().take(got) {
            let (len, trunc) = (m.len, m.truncated);
            if trunc || len < VXLAN_HEADER_LEN + 14 || !vxlan_ok(&scratch[k], d.link.vni) {
                let r = if trunc {
                    DropReason::Oversize
                } else {
                    DropReason::BadVxlan
                };
                self.ingress.count_link_drop(d.link.port, len, r);
                continue;
            }
            let flen = len - VXLAN_HEADER_LEN;
            let at = |b: usize| GuestAddress(bufs[b].1 .0 + HDR_LEN as u64);
            let mut eth = [0u8; 12];
            if mem.read_slice(&mut eth, at(k)).is_err() {
                continue;
            }
            let mut dst = [0u8; 6];
            let mut src = [0u8; 6];
            dst.copy_from_slice(&eth[..6]);
            src.copy_from_slice(&eth[6..12]);
            if !self
                .ingress
                .accept_direct(&mut ctx, d.link.port, MacAddr(dst), MacAddr(src), flen)
            {
                let mut f = vec![0u8; flen];
                if mem.read_slice(&mut f, at(k)).is_ok() {
                    fallback.push(f);
                }
                continue;
            }
            if w != k {
                let mut f = vec![0u8; flen];
                if mem.read_slice(&mut f, at(k)).is_err() || mem.write_slice(&f, at(w)).is_err() {
                    continue;
                }
                self.stats.rx_moved.fetch_add(1, Relaxed);
            }
            // virtio_net_hdr_v1: no offload flags (the guest checks the checksum), one buffer.
            let mut h = [0u8; HDR_LEN];
            h[HDR_LEN - 2] = 1;
            if mem.write_slice(&h, bufs[w].1).is_err() {
                continue;
            }
            used.push((bufs[w].0, (HDR_LEN + flen) as u32));
            w += 1;
        }
        rewind(&mut ring.queue, n - w);
        for &(h, l) in &used {
            if ring.queue.add_used(&*mem, h, l).is_err() {
                drop(ring);
                drop(ctx);
                self.mark_broken("used ring outside guest memory");
                return Ok(Received::Off);
            }
            ring.notifier.after_frame(l as usize - HDR_LEN);
        }
        self.stats
            .rx_cut_through
            .fetch_add(used.len() as u64, Relaxed);
        let v = ring.view(&mem);
        if ring.notifier.end_of_burst(&v, Instant::now()) == Action::Notify {
            ring.signal();
        }
        drop(ring);
        if !fallback.is_empty() {
            self.stats
                .rx_direct_fallback
                .fetch_add(fallback.len() as u64, Relaxed);
            self.ingress.forward_from(&mut ctx, d.link.port, &fallback);
        }
        Ok(Received::Frames { full: got == n })
    }

    /// Takes the datagrams on `d` the ordinary way (copied, through the route table).
    pub fn plain_receive(&self, d: &DirectSock) -> io::Result<usize> {
        let mut buf = vec![0u8; 65536];
        let mut frames: Vec<Vec<u8>> = Vec::new();
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
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let len = r as usize;
            total += 1;
            let mut h = [0u8; VXLAN_HEADER_LEN];
            if len < VXLAN_HEADER_LEN + 14 {
                self.ingress
                    .count_link_drop(d.link.port, len, DropReason::Truncated);
                continue;
            }
            h.copy_from_slice(&buf[..VXLAN_HEADER_LEN]);
            if !vxlan_ok(&h, d.link.vni) {
                self.ingress
                    .count_link_drop(d.link.port, len, DropReason::BadVxlan);
                continue;
            }
            frames.push(buf[VXLAN_HEADER_LEN..len].to_vec());
            if frames.len() >= BATCH {
                break;
            }
        }
        if !frames.is_empty() {
            let mut ctx = self.ctx.lock().unwrap_or_else(|p| p.into_inner());
            self.ingress.forward_from(&mut ctx, d.link.port, &frames);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_vxlan_of_the_links_vni_is_taken_in_place() {
        let h = vnet_wire::VxlanRepr { vni: 7 }.header();
        assert!(vxlan_ok(&h, 7));
        assert!(!vxlan_ok(&h, 8));
        // The I flag missing: not VXLAN (an encrypted link's message starts with 1..3).
        let mut bad = h;
        bad[0] = 3;
        assert!(!vxlan_ok(&bad, 7));
    }
}
