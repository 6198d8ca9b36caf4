//! The vhost-user socket: one message at a time, with the file descriptors passed along.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;

use crate::msg::{Header, HEADER_LEN, MAX_REGIONS};

/// A received message: header, payload, and the descriptors that came with it (closed when
/// dropped, so a frontend's extra descriptors never leak).
pub struct Message {
    pub header: Header,
    pub body: Vec<u8>,
    pub files: Vec<File>,
}

pub enum Recv {
    Message(Message),
    /// The frontend closed the connection.
    Closed,
}

/// Reads one message. A malformed header is an error (the connection is then dropped).
pub fn recv(sock: &mut UnixStream) -> io::Result<Recv> {
    let mut hbuf = [0u8; HEADER_LEN];
    let (n, files) = recv_with_fds(sock, &mut hbuf)?;
    if n == 0 {
        return Ok(Recv::Closed);
    }
    if n < HEADER_LEN {
        sock.read_exact(&mut hbuf[n..])?;
    }
    let header = Header::parse(&hbuf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0u8; header.size as usize];
    sock.read_exact(&mut body)?;
    Ok(Recv::Message(Message {
        header,
        body,
        files,
    }))
}

pub fn send(sock: &mut UnixStream, bytes: &[u8]) -> io::Result<()> {
    sock.write_all(bytes)
}

/// `recvmsg` into `buf`, taking at most `MAX_REGIONS` descriptors (more are closed).
fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<File>)> {
    const FD_SPACE: usize = MAX_REGIONS * std::mem::size_of::<RawFd>();
    // Room for one SCM_RIGHTS header and MAX_REGIONS descriptors, aligned as cmsghdr wants.
    let mut cbuf = [0u64; 32];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    mh.msg_controllen =
        (unsafe { libc::CMSG_SPACE(FD_SPACE as u32) } as usize).min(std::mem::size_of_val(&cbuf));
    let n = loop {
        // SAFETY: `mh` points at `iov` (into `buf`) and `cbuf`, both valid for the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut files = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc macros, which stay
    // inside msg_controllen; each SCM_RIGHTS payload holds whole RawFds that are now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for k in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.add(k));
                    files.push(File::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more file descriptors than a request can carry",
        ));
    }
    Ok((n, files))
}
