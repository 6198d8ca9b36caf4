//! Moving a device into a named network namespace (rtnetlink), and running a small job inside
//! one (a short-lived thread that `setns`es, since namespace membership is per thread).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use crate::sys::cvt;

const IFLA_NET_NS_FD: u16 = 28;
const NLMSG_ERROR: u16 = 2;

pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Opens a namespace made by `ip netns add NAME`.
pub fn open_netns(name: &str) -> io::Result<File> {
    File::open(netns_path(name))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name:?}: {e}")))
}

/// Moves device `ifindex` (of our namespace) into the namespace `ns`.
pub fn move_to_netns(ifindex: u32, ns: &File) -> io::Result<()> {
    // SAFETY: plain socket(2); the result is a new descriptor we own.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: fd is fresh and valid.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };

    // nlmsghdr (16) + ifinfomsg (16) + rtattr header (4) + u32 fd (4)
    let mut msg = Vec::with_capacity(40);
    msg.extend_from_slice(&40u32.to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it
    msg.push(libc::AF_UNSPEC as u8);
    msg.push(0);
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ifi_change
    msg.extend_from_slice(&8u16.to_ne_bytes());
    msg.extend_from_slice(&IFLA_NET_NS_FD.to_ne_bytes());
    msg.extend_from_slice(&(ns.as_raw_fd() as u32).to_ne_bytes());

    // SAFETY: sends a live buffer of its true length on our netlink socket.
    let sent = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 1024];
    // SAFETY: receives into a live buffer of its true length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
        return Ok(());
    }
    Err(io::Error::other("unexpected netlink reply"))
}

/// Runs `job` on a thread that has joined namespace `ns`, and returns its result.
pub fn in_netns<T: Send + 'static>(
    ns: &File,
    job: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace file we hold open; it affects only this thread, which
        // ends right after the job.
        cvt(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) })?;
        job()
    })
    .join()
    .map_err(|_| io::Error::other("namespace job panicked"))?
}
