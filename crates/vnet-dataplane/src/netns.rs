//! Named network namespaces: opening one, moving a device into one (rtnetlink, see
//! [`crate::netlink`]), and running a small job inside one (a short-lived thread that
//! `setns`es, since namespace membership is per thread).

use std::fs::File;
use std::io;
use std::path::PathBuf;

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
pub use vnet_netlink::in_netns;
