//! The direct link: raw Ethernet on a host NIC through an AF_PACKET socket, in promiscuous mode.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vnet_core::DropReason;

use crate::sys::{self, cvt, cvt_size};

const PACKET_OUTGOING: u8 = 4;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    dev: String,
}

impl PacketSocket {
    pub fn open(dev: &str) -> io::Result<PacketSocket> {
        let ifindex = sys::if_index(dev)
            .map_err(|e| io::Error::new(e.kind(), format!("device {dev}: {e}")))?;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); the result is a new descriptor we own.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto as i32,
            )
        })?;
        // SAFETY: raw is fresh and valid.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: zeroed sockaddr_ll is a valid value (all-integer struct).
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: binds with a pointer to a live sockaddr_ll and its true size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        // SAFETY: zeroed packet_mreq is valid; passed by pointer with its true size.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        // SAFETY: as above, a live packet_mreq of its true size.
        cvt(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&mreq as *const libc::packet_mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as u32,
            )
        })?;
        let one: libc::c_int = 1;
        // Not seeing our own transmissions saves work; older kernels lack the option, and the
        // receive path also checks the packet type.
        // SAFETY: a live c_int of its true size.
        let _ = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_IGNORE_OUTGOING,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        sys::set_nonblocking(fd.as_raw_fd())?;
        Ok(PacketSocket {
            fd,
            dev: dev.to_string(),
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// Receives one frame that arrived on the device; `Ok(None)` when nothing is waiting.
    /// Frames this host sent are skipped (`Ok(Some(0))` is never returned for them; the loop
    /// simply reads on).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: zeroed sockaddr_ll is valid; recvfrom writes at most `len` bytes into it.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: buf and sll are live and writable, with their true sizes passed.
            let r = unsafe {
                libc::recvfrom(
                    self.fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            match cvt_size(r) {
                Ok(_) if sll.sll_pkttype == PACKET_OUTGOING => continue,
                // MSG_TRUNC reports the real length; a frame larger than the buffer is cut.
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one frame gathered from `parts`.
    pub fn send(&self, parts: &[&[u8]]) -> Result<(), DropReason> {
        sys::writev(self.fd(), parts)
            .map(|_| ())
            .map_err(|_| DropReason::TxError)
    }
}
