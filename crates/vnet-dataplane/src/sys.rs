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

/// The epoll set of the dispatchers and of the vhost-user threads: `vmm-sys-util`'s.
pub use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
/// An eventfd that wakes a thread out of `poll`/`epoll_wait` (non-blocking, close-on-exec):
/// `vmm-sys-util`'s, the one every part of vnet uses.
pub use vmm_sys_util::eventfd::EventFd;

/// A new eventfd for waking threads.
pub fn eventfd() -> io::Result<EventFd> {
    EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
}

/// Wakes whoever polls `e` (a full counter already means "awake", so an error is harmless).
pub fn signal(e: &EventFd) {
    let _ = e.write(1);
}

/// Waits for events on `ep`, retrying when a signal interrupts the wait; returns how many.
pub fn epoll_wait(ep: &Epoll, timeout_ms: i32, events: &mut [EpollEvent]) -> io::Result<usize> {
    loop {
        match ep.wait(timeout_ms, events) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Adds `fd` to `ep`, readable, with `token` (level-triggered).
pub fn epoll_add(ep: &Epoll, fd: RawFd, token: u64) -> io::Result<()> {
    ep.ctl(
        ControlOperation::Add,
        fd,
        EpollEvent::new(EventSet::IN, token),
    )
}

/// Removes `fd` from `ep`.
pub fn epoll_del(ep: &Epoll, fd: RawFd) -> io::Result<()> {
    ep.ctl(ControlOperation::Delete, fd, EpollEvent::default())
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
            fd: stop.as_raw_fd(),
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

/// Waits up to `ms` milliseconds (-1: forever) for `events` (`POLLIN`, `POLLOUT`) on `fd`;
/// true when they came.
pub fn poll_one(fd: RawFd, events: libc::c_short, ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one live pollfd, and we pass the count 1.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0)
}

/// How many CPUs a `cpu_set_t` can name (1024). `libc::CPU_SET` with a larger number indexes
/// out of bounds inside an `extern "C"` function, a panic that cannot unwind: the process
/// aborts. So every CPU number is checked against this first.
pub const CPU_SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// The CPUs this process may run on: the main thread's affinity mask (`sched_getaffinity` of
/// the process id), which holds only CPUs that exist and are online.
pub fn allowed_cpus() -> io::Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data, valid zeroed; sched_getaffinity writes at most the size
    // we pass into it; CPU_ISSET reads it with numbers below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        cvt(libc::sched_getaffinity(
            libc::getpid(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        ))?;
        Ok((0..CPU_SETSIZE)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .map(|c| c as u32)
            .collect())
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin_thread(cpu: u32) -> io::Result<()> {
    let c = cpu as usize;
    if c >= CPU_SETSIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond the {CPU_SETSIZE} a CPU set can name"),
        ));
    }
    // SAFETY: cpu_set_t is plain data, valid zeroed; CPU_SET writes within it (c was checked
    // against CPU_SETSIZE above); sched_setaffinity reads the size we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(c, &mut set);
        cvt(libc::sched_setaffinity(
            0,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ))?;
    }
    Ok(())
}

/// `read(2)` into a buffer.
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a live, writable slice and we pass its true length.
    cvt_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

/// One piece of a datagram or frame for a system call that reads it (an `iovec`): ordinary
/// memory, or a guest's shared memory that vnet never reads itself, only hands to the kernel.
#[derive(Clone, Copy)]
pub struct IoPart<'a> {
    iov: libc::iovec,
    _borrow: std::marker::PhantomData<&'a [u8]>,
}

// SAFETY: an IoPart is a read-only view (a pointer and a length) of bytes borrowed for 'a,
// like a `&'a [u8]` or a `VolatileSlice<'a>`, both of which may be shared between threads.
unsafe impl Send for IoPart<'_> {}
// SAFETY: as above; nothing is ever written through it.
unsafe impl Sync for IoPart<'_> {}

impl<'a> From<&'a [u8]> for IoPart<'a> {
    fn from(b: &'a [u8]) -> Self {
        IoPart {
            iov: libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            },
            _borrow: std::marker::PhantomData,
        }
    }
}

impl<'a> IoPart<'a> {
    /// Guest memory by its volatile slice: the kernel reads it; vnet does not.
    pub fn from_volatile(s: &vm_memory::VolatileSlice<'a>) -> Self {
        IoPart {
            iov: libc::iovec {
                iov_base: s.ptr_guard().as_ptr() as *mut libc::c_void,
                iov_len: s.len(),
            },
            _borrow: std::marker::PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.iov.iov_len
    }

    pub fn is_empty(&self) -> bool {
        self.iov.iov_len == 0
    }

    pub fn iovec(&self) -> libc::iovec {
        self.iov
    }
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

/// One message of a `recvmmsg` batch.
#[derive(Debug, Clone, Copy)]
pub struct Msg {
    /// Bytes received (the full datagram's length when it was truncated).
    pub len: usize,
    /// The datagram was larger than the iovecs given for it (`MSG_TRUNC`).
    pub truncated: bool,
    /// The `UDP_GRO` segment size, when the kernel merged several datagrams into this one.
    pub gro_segment: Option<usize>,
    /// The sender (for unconnected sockets).
    pub from: Option<std::net::SocketAddr>,
}

const UDP_GRO_CMSG: libc::c_int = 104;

/// `recvmmsg(2)` without blocking, with the headers, addresses and control buffers kept
/// between calls: the UDP dispatcher's batched receive and vhost-user's cut-through receive
/// both use it.
pub struct MmsgReceiver {
    hdrs: Vec<libc::mmsghdr>,
    addrs: Vec<libc::sockaddr_storage>,
    cbufs: Vec<[u64; 8]>,
}

// SAFETY: the raw pointers inside the headers are rewritten before every call and never
// dereferenced by us; the struct is only scratch space owned by one thread at a time.
unsafe impl Send for MmsgReceiver {}

impl MmsgReceiver {
    pub fn new(batch: usize) -> MmsgReceiver {
        MmsgReceiver {
            // SAFETY: mmsghdr and sockaddr_storage are plain data; zeroed is a valid value.
            hdrs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            // SAFETY: as above.
            addrs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            cbufs: vec![[0; 8]; batch],
        }
    }

    /// Receives up to `iovs.len() / per` messages on `fd`, message k into
    /// `iovs[k * per..(k + 1) * per]`, and appends what each got to `out` (cleared first).
    /// An empty socket is `Ok` with nothing received.
    ///
    /// # Safety
    /// Every iovec must point at memory that is valid for writes of its length for the
    /// duration of the call (the kernel writes there).
    pub unsafe fn recv(
        &mut self,
        fd: RawFd,
        iovs: &mut [libc::iovec],
        per: usize,
        out: &mut Vec<Msg>,
    ) -> io::Result<()> {
        out.clear();
        let n = (iovs.len() / per.max(1)).min(self.hdrs.len());
        for k in 0..n {
            let h = &mut self.hdrs[k].msg_hdr;
            h.msg_name = (&mut self.addrs[k] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = iovs[k * per..].as_mut_ptr();
            h.msg_iovlen = per;
            h.msg_control = self.cbufs[k].as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of::<[u64; 8]>();
            h.msg_flags = 0;
            self.hdrs[k].msg_len = 0;
        }
        // SAFETY: every header points at a live address, control area (ours, of the sizes
        // given) and iovecs that the caller guarantees writable; the kernel writes only there.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                _ => Err(e),
            };
        }
        for k in 0..r as usize {
            let h = &self.hdrs[k];
            let mut gro_segment = None;
            // SAFETY: walks the control messages the kernel wrote into cbufs[k], within
            // msg_controllen, reading the c_int payload of a UDP_GRO message.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO_CMSG {
                        let g = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        if g > 0 {
                            gro_segment = Some(g as usize);
                        }
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            out.push(Msg {
                len: h.msg_len as usize,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                gro_segment,
                from: (h.msg_hdr.msg_namelen > 0)
                    .then(|| sockaddr_to_std(&self.addrs[k]))
                    .flatten(),
            });
        }
        Ok(())
    }
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    // SAFETY: the storage was filled by the kernel for the socket's family; SockAddr::new takes
    // a copy of it with its full size.
    let sa = unsafe {
        socket2::SockAddr::new(
            *ss,
            std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        )
    };
    sa.as_socket()
}

/// Runs `work` with the calling thread under `SCHED_IDLE` for at most `limit`, then under
/// `SCHED_OTHER` until it is done, and leaves the thread under `SCHED_OTHER`: for work that
/// should take no core from the daemon's own threads, only what they leave, but must not wait
/// for them without end (vnetd's HTTP listener renders a `/metrics` scrape so,
/// `vnet_http::Source::background`: a `show links` waiting behind a scrape for a core is what
/// the control port's tail latency is made of, and a scrape that waits out a whole route storm
/// on a saturated host is a second or more). Any other thread that wakes takes the core at once
/// while the work is idle. A watcher thread, started before the policy drops (a thread inherits
/// its creator's policy, and an idle watcher would be starved as well), moves the worker back at
/// `limit`. Only pure work belongs here: no lock that anything else waits for may be held by a
/// thread everything preempts. Where the kernel refuses the policy or no watcher can be
/// started, `work` runs as it is.
pub fn run_idle_at_most<T>(limit: Duration, work: impl FnOnce() -> T) -> T {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let (done, finished) = channel::<()>();
    let watcher = std::thread::Builder::new()
        .name("idle-limit".into())
        .spawn(move || {
            if finished.recv_timeout(limit) == Err(RecvTimeoutError::Timeout) {
                // The worker may be done by now; then this only repeats what it does.
                let _ = set_sched_policy_of(tid, libc::SCHED_OTHER);
            }
        });
    let Ok(watcher) = watcher else {
        return work();
    };
    let lowered = set_sched_policy_of(0, libc::SCHED_IDLE).is_ok();
    let out = work();
    if lowered {
        // Back to normal for whatever the thread does next; a refusal here leaves it idle,
        // which costs it only speed.
        let _ = set_sched_policy_of(0, libc::SCHED_OTHER);
    }
    drop(done);
    let _ = watcher.join();
    out
}

/// Thread `tid`'s scheduling policy (0: the calling thread) becomes `policy` (priority 0:
/// `SCHED_OTHER`, `SCHED_BATCH`, `SCHED_IDLE`).
fn set_sched_policy_of(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `tid` names a thread of this process (or 0, the calling thread); `param` is a
    // valid sched_param that outlives the call, and the kernel only reads it.
    cvt(unsafe { libc::sched_setscheduler(tid, policy, &param) }).map(|_| ())
}

#[cfg(test)]
mod sched_tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread; nothing is passed.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn idle_work_runs_idle_and_the_thread_comes_back() {
        std::thread::spawn(|| {
            assert_eq!(policy(), libc::SCHED_OTHER);
            let inside = run_idle_at_most(Duration::from_secs(60), policy);
            // A sandbox may refuse the change; then nothing moved either.
            assert!(inside == libc::SCHED_IDLE || inside == libc::SCHED_OTHER);
            if running_as_root() {
                assert_eq!(inside, libc::SCHED_IDLE);
            }
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn idle_work_that_outlasts_its_limit_goes_on_at_normal_priority() {
        if !running_as_root() {
            return;
        }
        std::thread::spawn(|| {
            let (early, late) = run_idle_at_most(Duration::from_millis(20), || {
                let early = policy();
                // Waits on the clock, not the CPU: the watcher moves it back meanwhile.
                let t = std::time::Instant::now();
                let mut late = policy();
                while late == libc::SCHED_IDLE && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(5));
                    late = policy();
                }
                (early, late)
            });
            assert_eq!(early, libc::SCHED_IDLE);
            assert_eq!(
                late,
                libc::SCHED_OTHER,
                "still idle 10 s after a 20 ms limit"
            );
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    /// Root may always switch to and from SCHED_IDLE (the suite runs as root).
    fn running_as_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        euid == 0
    }
}
