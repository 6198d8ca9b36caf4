//! Raw Ethernet frames on one interface (`AF_PACKET`, `SOCK_RAW`): the forwarder's only contact
//! with the kernel. Why AF_PACKET: the forwarder must sit in the middle of an L2 segment (the
//! lab's routers keep talking ARP through it and need no new addresses or routes), frames must
//! come out exactly as they went in, and it must be fast enough with only plain syscalls:
//! `recvmmsg`/`sendmmsg` move up to 64 frames per call. (A TAP pair would need the kernel to
//! bridge, and an AF_XDP socket is more code than this lab needs.) The socket sees every frame
//! on its interface (promiscuous membership, dropped with the socket), never the frames it or
//! anything else sends there (`PACKET_IGNORE_OUTGOING`).
//!
//! Every frame comes with a `virtio_net_hdr` (`PACKET_VNET_HDR`, `VNET_HDR_LEN` bytes in front)
//! and goes out with the same one: a frame sent by a local stack through a veth usually has its
//! TCP/UDP checksum still to be done (`CHECKSUM_PARTIAL`), and the header carries that state
//! across, so the frame arrives as valid as it left without anybody computing a checksum.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Frames per `recvmmsg`/`sendmmsg`.
pub const BATCH: usize = 64;

/// The `virtio_net_hdr` in front of every frame read and sent.
pub const VNET_HDR_LEN: usize = 10;

/// Whether a frame (its header first) is a segmentation-offload super-frame.
pub fn is_gso(frame: &[u8]) -> bool {
    frame.len() > 1 && frame[1] != 0
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` is a live reference to a T of exactly the size passed; the kernel only
    // reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

pub struct PacketSocket {
    fd: OwnedFd,
    pub ifname: String,
}

impl PacketSocket {
    /// A socket bound to `ifname`, receiving every frame that arrives there.
    pub fn open(ifname: &str, rcvbuf: usize) -> io::Result<Self> {
        let cname =
            CString::new(ifname).map_err(|_| io::Error::other("interface name has a NUL"))?;
        // SAFETY: a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::other(format!("no interface {ifname}")));
        }
        // Protocol 0: nothing is queued until bind() names the interface, so no frame of
        // another interface slips in between.
        // SAFETY: plain syscall; the fd is owned right after.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1i32)?;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &1i32)?;
        // SAFETY: packet_mreq is plain data; all-zero is valid.
        let mut mreq: libc::packet_mreq = unsafe { zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)?;
        let buf = rcvbuf.min(i32::MAX as usize) as i32;
        // FORCE needs CAP_NET_ADMIN (we have it, or AF_PACKET would have failed); fall back to
        // the capped option otherwise.
        if setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buf).is_err() {
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &buf)?;
        }
        let sbuf = 4i32 << 20;
        if setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &sbuf).is_err() {
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, &sbuf)?;
        }
        Ok(PacketSocket {
            fd,
            ifname: ifname.to_string(),
        })
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Waits up to `timeout` for a frame to read; true when one is there.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask change.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(format!("{}: poll error", self.ifname)));
        }
        Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
    }

    /// Reads up to `BATCH` frames without blocking into `rx`'s buffers; the number read (0 when
    /// none is waiting).
    pub fn recv_batch(&self, rx: &mut RxBatch) -> io::Result<usize> {
        let n = rx.bufs.len().min(BATCH);
        // SAFETY: iovec and mmsghdr are plain data; all-zero is valid.
        let mut iov: [libc::iovec; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for i in 0..n {
            iov[i].iov_base = rx.bufs[i].as_mut_ptr().cast();
            iov[i].iov_len = rx.bufs[i].len();
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at buffers of the stated lengths
        // owned by `rx` and alive for the call; no addresses or control data are asked for.
        let r = unsafe {
            libc::recvmmsg(
                self.raw(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        let r = r as usize;
        for (i, m) in msgs.iter().enumerate().take(r) {
            rx.lens[i] = m.msg_len as usize;
            rx.truncated[i] = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        Ok(r)
    }

    /// Sends `frames` (at most `BATCH`); returns how many the kernel took. The first one it
    /// refuses ends the call with its error (the caller counts it and goes on after it).
    pub fn send_batch(&self, frames: &[&[u8]]) -> (usize, Option<io::Error>) {
        let n = frames.len().min(BATCH);
        if n == 0 {
            return (0, None);
        }
        // SAFETY: plain data, all-zero valid.
        let mut iov: [libc::iovec; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for i in 0..n {
            iov[i].iov_base = frames[i].as_ptr() as *mut libc::c_void;
            iov[i].iov_len = frames[i].len();
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at the callers' frames, alive
        // for the call and only read by the kernel; the socket is bound, so no address.
        let r = unsafe { libc::sendmmsg(self.raw(), msgs.as_mut_ptr(), n as libc::c_uint, 0) };
        if r < 0 {
            (0, Some(io::Error::last_os_error()))
        } else if (r as usize) < n {
            // sendmmsg stops at the first error without saying it: ask the next frame alone
            (r as usize, None)
        } else {
            (n, None)
        }
    }

    /// Frames the kernel dropped for this socket since the last call (`PACKET_STATISTICS`
    /// resets on read).
    pub fn take_kernel_drops(&self) -> io::Result<u64> {
        // SAFETY: plain data, all-zero valid.
        let mut st: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` and `len` are valid for writing and `len` is st's size.
        cvt(unsafe {
            libc::getsockopt(
                self.raw(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        })?;
        Ok(st.tp_drops as u64)
    }
}

/// Receive buffers for one `recvmmsg`.
pub struct RxBatch {
    pub bufs: Vec<Vec<u8>>,
    pub lens: [usize; BATCH],
    pub truncated: [bool; BATCH],
}

impl RxBatch {
    pub fn new(max_frame: usize) -> Self {
        RxBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; max_frame]).collect(),
            lens: [0; BATCH],
            truncated: [false; BATCH],
        }
    }
}

/// A timer slack of 1 µs for the calling thread (the default 50 µs would be added to every
/// departure's wake-up).
pub fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
}

/// Real-time scheduling (`SCHED_FIFO` at `priority`) for the calling thread: a path's delay is
/// only as exact as the forwarder's wake-ups, and on a busy machine an ordinary thread waits
/// milliseconds for a CPU. The thread blocks in `ppoll` between frames, and the kernel's
/// real-time throttling keeps 5 % of each CPU for everything else even when it is saturated.
pub fn realtime(priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param; pid 0 is the calling thread.
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) }).map(|_| ())
}
