//! The kernel side: an rtnetlink socket, and jobs run inside the container's network
//! namespace (a short-lived thread that `setns`es into it, since namespace membership is per
//! thread). The messages themselves are built and parsed in [`crate::nl`].

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::nl::{self, LinkInfo};

/// An rtnetlink socket with a receive timeout (a kernel that never answers cannot hang us).
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    pub fn open() -> io::Result<Netlink> {
        // SAFETY: plain socket(2); the result is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a pointer to a live timeval and its true size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Netlink { fd, seq: 0 })
    }

    fn send(&mut self, msg: nl::Msg) -> io::Result<()> {
        self.seq += 1;
        let bytes = msg.finish(self.seq);
        // SAFETY: sends a live buffer of its true length on our socket.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; 65536];
        // SAFETY: receives into a live buffer of its true length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Sends a request that the kernel acknowledges, and waits for the answer.
    pub fn request(&mut self, msg: nl::Msg) -> io::Result<()> {
        self.send(msg)?;
        loop {
            let buf = self.recv()?;
            for (ty, payload) in nl::messages(&buf) {
                if ty == nl::NLMSG_ERROR {
                    return match nl::error_code(payload) {
                        Some(0) => Ok(()),
                        Some(e) => Err(io::Error::from_raw_os_error(-e)),
                        None => Err(io::Error::other("short netlink error message")),
                    };
                }
            }
        }
    }

    /// Sends a request and collects the replies of type `want` until the dump ends (or the
    /// single answer came).
    pub fn collect(&mut self, msg: nl::Msg, want: u16) -> io::Result<Vec<Vec<u8>>> {
        self.send(msg)?;
        let mut out = Vec::new();
        loop {
            let buf = self.recv()?;
            let mut done = false;
            for (ty, payload) in nl::messages(&buf) {
                match ty {
                    nl::NLMSG_DONE => done = true,
                    nl::NLMSG_ERROR => match nl::error_code(payload) {
                        Some(0) | None => done = true,
                        Some(e) => return Err(io::Error::from_raw_os_error(-e)),
                    },
                    t if t == want => out.push(payload.to_vec()),
                    _ => {}
                }
            }
            if done || (!out.is_empty() && want == nl::RTM_NEWLINK) {
                return Ok(out);
            }
        }
    }

    pub fn link(&mut self, index: u32) -> io::Result<LinkInfo> {
        let r = self.collect(nl::get_link(index), nl::RTM_NEWLINK)?;
        r.first()
            .and_then(|p| nl::parse_link(p))
            .ok_or_else(|| io::Error::other("no answer for the device"))
    }

    pub fn addresses(&mut self, index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
        let r = self.collect(nl::get_addresses(), nl::RTM_NEWADDR)?;
        Ok(r.iter()
            .filter_map(|p| nl::parse_address(p))
            .filter(|(i, _, _)| *i == index)
            .map(|(_, a, p)| (a, p))
            .collect())
    }
}

/// The index of device `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::other("device name with a NUL"))?;
    // SAFETY: if_nametoindex reads a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no device {name}"),
        ));
    }
    Ok(i)
}

/// Runs `job` on a thread inside the namespace at `netns` (a path such as
/// `/var/run/netns/x` or `/proc/PID/ns/net`).
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    job: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = File::open(netns).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {}: {e}", netns.display()),
        )
    })?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace file we hold open; it affects only this thread, which
        // ends right after the job.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        job()
    })
    .join()
    .map_err(|_| io::Error::other("namespace job panicked"))?
}

/// Moves device `dev` of our namespace into the namespace at `netns`.
pub fn move_to_netns(dev: &str, netns: &Path) -> io::Result<()> {
    let index = ifindex(dev)?;
    let ns = File::open(netns).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {}: {e}", netns.display()),
        )
    })?;
    Netlink::open()?.request(nl::move_to_netns(index, ns.as_raw_fd() as u32))
}

/// The name of the namespace at `netns` when it is a named one (`/run/netns/NAME` or
/// `/var/run/netns/NAME`, as `ip netns`, containerd, CRI-O and podman make them): vnetd can
/// then put the device there itself.
pub fn netns_name(netns: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let parent = netns.parent()?;
    if parent != Path::new("/run/netns") && parent != Path::new("/var/run/netns") {
        return None;
    }
    let name = netns.file_name()?.to_str()?.to_string();
    // The same file under /run/netns, where vnetd looks for it.
    let named = Path::new("/run/netns").join(&name);
    let (a, b) = (
        std::fs::metadata(netns).ok()?,
        std::fs::metadata(&named).ok()?,
    );
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some(name)
}

/// What to set up on the container's interface.
#[derive(Debug, Clone)]
pub struct Setup {
    pub dev: String,
    pub ifname: String,
    pub addresses: Vec<(IpAddr, u8)>,
    /// (destination, prefix length, gateway)
    pub routes: Vec<(IpAddr, u8, Option<IpAddr>)>,
}

/// Inside the container: renames the device, brings it up, adds addresses and routes.
/// Returns the device as it ends up.
pub fn configure(netns: &Path, s: Setup) -> io::Result<LinkInfo> {
    in_netns(netns, move || {
        let mut nlk = Netlink::open()?;
        let index = ifindex(&s.dev)?;
        if s.ifname != s.dev {
            // vnetd may have brought it up in the namespace already.
            nlk.request(nl::set_down(index))?;
            nlk.request(nl::rename(index, &s.ifname)).map_err(|e| {
                io::Error::new(e.kind(), format!("renaming {} to {}: {e}", s.dev, s.ifname))
            })?;
        }
        nlk.request(nl::set_up(index))?;
        for (a, p) in &s.addresses {
            nlk.request(nl::add_address(index, *a, *p))
                .map_err(|e| io::Error::new(e.kind(), format!("address {a}/{p}: {e}")))?;
        }
        for (dst, p, gw) in &s.routes {
            match nlk.request(nl::add_route(index, *dst, *p, *gw)) {
                Ok(()) => {}
                // The kernel made it already (the address's own subnet).
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => {
                    return Err(io::Error::new(e.kind(), format!("route {dst}/{p}: {e}")));
                }
            }
        }
        nlk.link(index)
    })
}

/// Inside the container: the device `ifname` and its addresses (CHECK).
pub fn inspect(netns: &Path, ifname: &str) -> io::Result<(LinkInfo, Vec<(IpAddr, u8)>)> {
    let ifname = ifname.to_string();
    in_netns(netns, move || {
        let mut nlk = Netlink::open()?;
        let index = ifindex(&ifname)?;
        let info = nlk.link(index)?;
        let addrs = nlk.addresses(index)?;
        Ok((info, addrs))
    })
}
