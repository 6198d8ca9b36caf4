//! The VXLAN/UDP socket shared by all udp links of a daemon.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};
use vnet_core::DropReason;
use vnet_wire::VXLAN_HEADER_LEN;

/// Socket buffers large enough to ride out a scheduling hiccup at 10 Gbit/s.
const SOCKET_BUFFER: usize = 4 << 20;

#[derive(Debug)]
pub struct VxlanSocket {
    sock: UdpSocket,
    local: SocketAddr,
}

impl VxlanSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<VxlanSocket> {
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            sock.set_only_v6(false)?;
        }
        // Large frames over a smaller underlay MTU are fragmented by IP (kernel VXLAN peers
        // reassemble them), so never set DF on what we send.
        let (level, opt, val) = if addr.is_ipv4() {
            (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            )
        } else {
            (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DONT,
            )
        };
        setsockopt_int(sock.as_raw_fd(), level, opt, val)?;
        // As root, the *FORCE variants exceed net.core.{r,w}mem_max; fall back quietly.
        if setsockopt_int(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            SOCKET_BUFFER as i32,
        )
        .is_err()
        {
            let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
        }
        if setsockopt_int(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            SOCKET_BUFFER as i32,
        )
        .is_err()
        {
            let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
        }
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
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Sends one VXLAN datagram: the header and the frame are gathered by the kernel, the frame
    /// is not copied here.
    pub fn send(
        &self,
        to: &SockAddr,
        header: &[u8; VXLAN_HEADER_LEN],
        frame: &[u8],
    ) -> Result<(), DropReason> {
        let parts = [IoSlice::new(header), IoSlice::new(frame)];
        loop {
            match SockRef::from(&self.sock).send_to_vectored(&parts, to) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The send buffer is full: wait for room rather than drop (back-pressure
                    // to the guest, as a NIC's full ring would give).
                    if wait_writable(self.fd()).is_err() {
                        return Err(DropReason::TxError);
                    }
                }
                Err(_) => return Err(DropReason::TxError),
            }
        }
    }

    /// Receives one datagram, or `None` when nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
        match self.sock.recv_from(buf) {
            Ok((n, from)) => Ok(Some((n, from))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
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
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    crate::sys::cvt(r).map(|_| ())
}

fn wait_writable(fd: RawFd) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one live pollfd, length 1.
    let r = unsafe { libc::poll(&mut p, 1, 1000) };
    if r <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "send buffer stayed full",
        ));
    }
    Ok(())
}
