//! Named network namespaces: opening one, moving a device into one (rtnetlink, see
//! [`crate::netlink`]), and running a small job inside one (a short-lived thread that
//! `setns`es, since namespace membership is per thread).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::sys::cvt;

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
    crate::netlink::Rtnl::open()?.move_to_netns(ifindex, ns)
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
