//! The VXLAN/UDP socket shared by all udp links of a daemon: batched receive (`recvmmsg`,
//! with `UDP_GRO` so one message can hold tens of datagrams) and send (`sendmmsg` for small
//! frames, `UDP_SEGMENT` so one `sendmsg` carries all the segments of a 64 KB frame, each
//! assembled by the kernel from an iovec of [VXLAN header, inner headers, payload]).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tracing::warn;
use vnet_core::DropReason;

use crate::sys::{cvt, IoPart, MmsgReceiver, Msg};

/// Socket buffers large enough to ride out a scheduling hiccup at 10 Gbit/s.
const SOCKET_BUFFER: usize = 8 << 20;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Segments per `UDP_SEGMENT` send; the kernel allows 64 on older versions.
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Bytes per `UDP_SEGMENT` send (the UDP length field is 16 bits).
pub const GSO_MAX_BYTES: usize = 65000;

#[derive(Debug)]
pub struct VxlanSocket {
    sock: UdpSocket,
    local: SocketAddr,
    gro: bool,
    /// Cleared (once, with a log line) when the kernel refuses UDP_SEGMENT.
    gso: AtomicBool,
}

/// One received message: `len` bytes from `from`, made of datagrams of `seg` bytes (the last
/// may be shorter); `seg == len` without GRO.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Which of the caller's buffers holds it.
    pub buf: usize,
    pub len: usize,
    pub seg: usize,
    pub from: SocketAddr,
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its true size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    cvt(r).map(|_| ())
}

impl VxlanSocket {
    /// The daemon's VXLAN socket. Large frames over a smaller underlay MTU are fragmented by
    /// IP (kernel VXLAN peers reassemble them), so it never sets DF on what it sends.
    pub fn bind(addr: SocketAddr) -> io::Result<VxlanSocket> {
        Self::bind_with(addr, false)
    }

    /// A second socket on `first`'s address and port that sets DF on everything it sends and
    /// takes the path MTU the kernel learned (`IP_PMTUDISC_DO`: a datagram larger fails with
    /// `EMSGSIZE` instead of leaving as fragments a NAT or firewall may drop). Reach links send
    /// on it (issue #31). The kernel spreads arriving datagrams over the two sockets (one
    /// `SO_REUSEPORT` group), so both are read.
    pub fn bind_df(first: &VxlanSocket) -> io::Result<VxlanSocket> {
        Self::bind_with(first.local_addr(), true)
    }

    fn bind_with(addr: SocketAddr, df: bool) -> io::Result<VxlanSocket> {
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(false)?;
        }
        let fd = sock.as_raw_fd();
        let (level, opt, val) = match (addr.is_ipv4(), df) {
            (true, false) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            ),
            (true, true) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            ),
            (false, false) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DONT,
            ),
            (false, true) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            ),
        };
        setsockopt_int(fd, level, opt, val)?;
        // As root, the *FORCE variants exceed net.core.{r,w}mem_max; fall back quietly.
        if setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            SOCKET_BUFFER as i32,
        )
        .is_err()
        {
            let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        }
        if setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            SOCKET_BUFFER as i32,
        )
        .is_err()
        {
            let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        }
        let gro = setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        if !gro {
            warn!("UDP_GRO is not available; receiving one datagram per message");
        }
        // vhost-user cut-through receive binds connected sockets to this same port (the
        // kernel gives a connected socket its peer's datagrams), which takes SO_REUSEPORT. So
        // that a second daemon cannot then silently share the port, first make sure nobody
        // holds it.
        if addr.port() != 0 && !df {
            let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
            if addr.is_ipv6() {
                probe.set_only_v6(false)?;
            }
            probe
                .bind(&SockAddr::from(addr))
                .map_err(|e| io::Error::new(e.kind(), format!("bind UDP {addr}: {e}")))?;
        }
        sock.set_reuse_port(true)?;
        sock.bind(&SockAddr::from(addr))
            .map_err(|e| io::Error::new(e.kind(), format!("bind UDP {addr}: {e}")))?;
        sock.set_nonblocking(true)?;
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("UDP socket has no address"))?;
        Ok(VxlanSocket {
            sock: sock.into(),
            local,
            gro,
            gso: AtomicBool::new(true),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    pub fn gso_enabled(&self) -> bool {
        self.gso.load(Relaxed)
    }

    pub fn gro_enabled(&self) -> bool {
        self.gro
    }

    /// Sends one datagram, or with `gso_size` a run of datagrams of that size cut by the kernel,
    /// gathered from `parts`. Returns `Err(None)` when the kernel refused segmentation (the
    /// caller sends the segments one by one), `Err(Some(reason))` for other failures.
    pub fn send_parts(
        &self,
        to: &SockAddr,
        parts: &[IoPart<'_>],
        gso_size: Option<u16>,
    ) -> Result<(), Option<DropReason>> {
        let iov: Vec<libc::iovec> = parts.iter().map(IoPart::iovec).collect();
        // Room for one cmsg carrying a u16 (CMSG_SPACE(2) is 24 on 64-bit Linux).
        let mut cbuf = [0u64; 4];
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = to.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = to.len();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len();
        if let Some(g) = gso_size {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE only computes a size.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            // SAFETY: msg_control points at cbuf, which is large enough for one cmsg with a u16
            // (checked by the size computation above); CMSG_FIRSTHDR/CMSG_DATA stay inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, g);
            }
        }
        loop {
            // SAFETY: msg points at live iovecs (borrowing `parts`), a live address and a live
            // control buffer, all outliving the call; the kernel only reads them.
            let r = unsafe { libc::sendmsg(self.fd(), &msg, 0) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    // The send buffer is full: wait for room rather than drop (back-pressure to
                    // the guest, as a NIC's full ring would give).
                    if wait_writable(self.fd()).is_err() {
                        return Err(Some(DropReason::TxError));
                    }
                }
                // Segments larger than the path MTU: this run must go as IP fragments.
                Some(libc::EMSGSIZE) if gso_size.is_some() => return Err(None),
                Some(libc::EINVAL) | Some(libc::EIO) if gso_size.is_some() => {
                    if self.gso.swap(false, Relaxed) {
                        warn!("UDP segmentation offload refused ({e}); sending segments one by one from now on");
                    }
                    return Err(None);
                }
                _ => return Err(Some(DropReason::TxError)),
            }
        }
    }

    /// Sends several datagrams, each gathered from its parts, in one `sendmmsg`; returns how
    /// many were sent.
    pub fn send_many<const P: usize>(&self, msgs: &[(&SockAddr, [IoPart<'_>; P])]) -> usize {
        if msgs.is_empty() {
            return 0;
        }
        let mut iovs: Vec<libc::iovec> = Vec::with_capacity(msgs.len() * P);
        for (_, parts) in msgs {
            iovs.extend(parts.iter().map(IoPart::iovec));
        }
        let mut hdrs: Vec<libc::mmsghdr> = msgs
            .iter()
            .enumerate()
            .map(|(i, (to, _))| {
                // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
                let mut m: libc::mmsghdr = unsafe { zeroed() };
                m.msg_hdr.msg_name = to.as_ptr() as *mut libc::c_void;
                m.msg_hdr.msg_namelen = to.len();
                m.msg_hdr.msg_iov = iovs[i * P..].as_ptr() as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = P;
                m
            })
            .collect();
        let mut sent = 0;
        while sent < hdrs.len() {
            let rest = &mut hdrs[sent..];
            // SAFETY: every mmsghdr points at live iovecs and addresses borrowed from `msgs`
            // and `iovs`, which outlive the call; we pass the true count.
            let r = unsafe { libc::sendmmsg(self.fd(), rest.as_mut_ptr(), rest.len() as u32, 0) };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if wait_writable(self.fd()).is_ok() => continue,
                // Skip the datagram the kernel refused and go on with the rest.
                _ => return sent,
            }
        }
        sent
    }

    /// Receives up to `bufs.len()` messages without blocking; fills `out` (cleared first).
    pub fn recv_batch(
        &self,
        rx: &mut MmsgReceiver,
        bufs: &mut [Vec<u8>],
        msgs: &mut Vec<Msg>,
        out: &mut Vec<Received>,
    ) -> io::Result<()> {
        out.clear();
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec covers one of our own buffers, borrowed mutably for the call.
        unsafe { rx.recv(self.fd(), &mut iovs, 1, msgs)? };
        for (buf, m) in msgs.iter().enumerate() {
            if m.truncated {
                continue; // larger than our buffer: cannot be a valid VXLAN datagram of ours
            }
            let Some(from) = m.from else { continue };
            out.push(Received {
                buf,
                len: m.len,
                seg: m.gro_segment.unwrap_or(m.len).max(1),
                from,
            });
        }
        Ok(())
    }
}

fn wait_writable(fd: RawFd) -> io::Result<()> {
    if crate::sys::poll_one(fd, libc::POLLOUT, 1000)? {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "send buffer stayed full",
        ))
    }
}

/// The path MTU the kernel knows to `to` (the route's, or what an ICMP "fragmentation needed"
/// taught it since: a DF datagram that was too big): asked of a UDP socket connected to it,
/// which sends nothing.
pub fn path_mtu(to: SocketAddr) -> io::Result<usize> {
    let sock = Socket::new(Domain::for_address(to), Type::DGRAM, Some(Protocol::UDP))?;
    sock.connect(&SockAddr::from(to))?;
    let (level, opt) = match to {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU),
    };
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: passes a pointer to a live c_int and its true size; the kernel writes at most
    // that many bytes and the length.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    cvt(r).map(|_| val.max(0) as usize)
}
