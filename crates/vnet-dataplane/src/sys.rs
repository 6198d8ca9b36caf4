//! Thin, checked wrappers over the few Linux calls the data path needs. Every `unsafe` block in
//! the crate that is not about a specific device lives here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Turns a -1 return into the errno as an `io::Error`.
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take no pointers.
    unsafe {
        let fl = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        cvt(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK))?;
    }
    Ok(())
}

/// An eventfd used to wake a worker thread out of `poll` when it must stop.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: fd is a fresh, valid descriptor owned by nobody else.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// What `wait_readable` saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    Readable,
    Stop,
    Timeout,
}

/// Blocks until `fd` is readable, `stop` is signalled, or the timeout passes.
pub fn wait_readable(fd: RawFd, stop: &EventFd, timeout: Option<Duration>) -> io::Result<Wake> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout
        .map(|d| d.as_millis().min(i32::MAX as u128) as i32)
        .unwrap_or(-1);
    loop {
        // SAFETY: fds is a live array of two pollfd structs, and we pass its true length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(Wake::Timeout);
        }
        if fds[1].revents != 0 {
            return Ok(Wake::Stop);
        }
        return Ok(Wake::Readable);
    }
}

/// `read(2)` into a buffer.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a live, writable slice and we pass its true length.
    cvt_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

/// The iovecs of `parts`, for system calls that only read them (the kernel never writes
/// through these pointers, hence the `*mut` cast is sound).
pub fn iovecs(parts: &[&[u8]]) -> Vec<libc::iovec> {
    let mut v = Vec::with_capacity(parts.len());
    push_iovecs(&mut v, parts);
    v
}

/// Appends the iovecs of `parts` to `out` (see [`iovecs`]).
pub fn push_iovecs(out: &mut Vec<libc::iovec>, parts: &[&[u8]]) {
    out.extend(parts.iter().map(|p| libc::iovec {
        iov_base: p.as_ptr() as *mut libc::c_void,
        iov_len: p.len(),
    }));
}

/// `writev(2)` of several slices as one frame.
pub fn writev(fd: RawFd, parts: &[&[u8]]) -> io::Result<usize> {
    let iov = iovecs(parts);
    // SAFETY: every iovec points into a slice borrowed for the duration of the call; the kernel
    // only reads from them.
    cvt_size(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int) })
}

/// The `struct ifreq` of the SIOC* ioctls: a name and a 24-byte union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IfReq {
    pub name: [u8; libc::IFNAMSIZ],
    pub data: [u8; 24],
}

impl IfReq {
    pub fn new(name: &str) -> io::Result<IfReq> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad device name",
            ));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        r.name[..b.len()].copy_from_slice(b);
        Ok(r)
    }

    /// Issues `req` on `fd` with this ifreq as its argument.
    pub fn ioctl(&mut self, fd: RawFd, req: libc::c_ulong) -> io::Result<()> {
        // SAFETY: IfReq has the size and layout of struct ifreq (16-byte name, 24-byte union)
        // and lives for the whole call; the ioctls used here read and write only within it.
        cvt(unsafe { libc::ioctl(fd, req as _, self as *mut IfReq) })?;
        Ok(())
    }
}

/// A datagram socket to issue interface ioctls on, in the calling thread's network namespace.
pub fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is a new descriptor we own.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is fresh and valid.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn if_index(name: &str) -> io::Result<u32> {
    let s = ioctl_socket()?;
    let mut r = IfReq::new(name)?;
    r.ioctl(s.as_raw_fd(), libc::SIOCGIFINDEX)?;
    Ok(i32::from_ne_bytes([r.data[0], r.data[1], r.data[2], r.data[3]]) as u32)
}

pub fn set_mac(name: &str, mac: [u8; 6]) -> io::Result<()> {
    let s = ioctl_socket()?;
    let mut r = IfReq::new(name)?;
    r.data[..2].copy_from_slice(&(libc::ARPHRD_ETHER).to_ne_bytes());
    r.data[2..8].copy_from_slice(&mac);
    r.ioctl(s.as_raw_fd(), libc::SIOCSIFHWADDR)
}

pub fn set_mtu(name: &str, mtu: u32) -> io::Result<()> {
    let s = ioctl_socket()?;
    let mut r = IfReq::new(name)?;
    r.data[..4].copy_from_slice(&(mtu as i32).to_ne_bytes());
    r.ioctl(s.as_raw_fd(), libc::SIOCSIFMTU)
}

pub fn set_up(name: &str) -> io::Result<()> {
    let s = ioctl_socket()?;
    let mut r = IfReq::new(name)?;
    r.ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS)?;
    let flags = i16::from_ne_bytes([r.data[0], r.data[1]]) | libc::IFF_UP as i16;
    r.data[..2].copy_from_slice(&flags.to_ne_bytes());
    r.ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS)
}
