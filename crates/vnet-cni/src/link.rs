//! The container's side of its NIC, over rtnetlink (`vnet-netlink`, the data path's library):
//! jobs run inside the container's network namespace move, rename and bring up the device and
//! give it its addresses and routes, or read them back (CHECK).

use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::path::Path;

use vnet_netlink::{in_netns, LinkDesc, Rtnl};

/// Opens the namespace at `netns` (a path such as `/var/run/netns/x` or `/proc/PID/ns/net`).
fn open_netns(netns: &Path) -> io::Result<File> {
    File::open(netns).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {}: {e}", netns.display()),
        )
    })
}

/// The index of device `name` in the calling thread's namespace.
fn ifindex(nl: &mut Rtnl, name: &str) -> io::Result<u32> {
    match nl.link(name)? {
        Some(l) => Ok(l.index),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no device {name}"),
        )),
    }
}

/// Moves device `dev` of our namespace into the namespace at `netns`.
pub fn move_to_netns(dev: &str, netns: &Path) -> io::Result<()> {
    let ns = open_netns(netns)?;
    let mut nl = Rtnl::open()?;
    let index = ifindex(&mut nl, dev)?;
    nl.move_to_netns(index, &ns)
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

/// The device at `index`, as it is now.
fn describe(nl: &mut Rtnl, index: u32) -> io::Result<LinkDesc> {
    nl.link_by_index(index)?
        .ok_or_else(|| io::Error::other("no answer for the device"))
}

/// Inside the container: renames the device, brings it up, adds addresses and routes.
/// Returns the device as it ends up.
pub fn configure(netns: &Path, s: Setup) -> io::Result<LinkDesc> {
    in_netns(&open_netns(netns)?, move || {
        let mut nl = Rtnl::open()?;
        let index = ifindex(&mut nl, &s.dev)?;
        if s.ifname != s.dev {
            // vnetd may have brought it up in the namespace already.
            nl.set_up(index, false)?;
            nl.set_name(index, &s.ifname).map_err(|e| {
                io::Error::new(e.kind(), format!("renaming {} to {}: {e}", s.dev, s.ifname))
            })?;
        }
        nl.set_up(index, true)?;
        for (a, p) in &s.addresses {
            nl.add_address(index, *a, *p)
                .map_err(|e| io::Error::new(e.kind(), format!("address {a}/{p}: {e}")))?;
        }
        for (dst, p, gw) in &s.routes {
            match nl.add_route(index, *dst, *p, *gw) {
                Ok(()) => {}
                // The kernel made it already (the address's own subnet).
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => {
                    return Err(io::Error::new(e.kind(), format!("route {dst}/{p}: {e}")));
                }
            }
        }
        describe(&mut nl, index)
    })
}

/// Whether `peer` is the host end vnetd made for its interface `interface`: vnetd marks the
/// devices it makes with the alias `vnet:INSTANCE:NAME` (INSTANCE: 16 hex digits, the daemon's
/// identity; vnet-dataplane's `made.rs`), or `vnet:NAME` from before instances.
pub fn is_host_end_of(peer: &LinkDesc, interface: &str) -> bool {
    let Some(rest) = peer.alias.as_deref().and_then(|a| a.strip_prefix("vnet:")) else {
        return false;
    };
    let named = rest == interface
        || rest
            .strip_suffix(interface)
            .and_then(|p| p.strip_suffix(':'))
            .is_some_and(|i| {
                i.len() == 16 && i.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
            });
    peer.kind.as_deref() == Some("veth") && named
}

/// The host's end of the container's NIC `container` (as `configure` returned it) when that
/// NIC is a veth vnetd made for `interface`: the device in our (the runtime's, vnetd's)
/// namespace at its peer index. `None` for a TAP.
pub fn host_end(container: &LinkDesc, interface: &str) -> io::Result<Option<LinkDesc>> {
    let (Some("veth"), Some(peer)) = (container.kind.as_deref(), container.peer_index) else {
        return Ok(None);
    };
    let mut nl = Rtnl::open()?;
    Ok(nl
        .link_by_index(peer)?
        .filter(|l| is_host_end_of(l, interface)))
}

/// Inside the container: the device `ifname` and its addresses (CHECK).
pub fn inspect(netns: &Path, ifname: &str) -> io::Result<(LinkDesc, Vec<(IpAddr, u8)>)> {
    let ifname = ifname.to_string();
    in_netns(&open_netns(netns)?, move || {
        let mut nl = Rtnl::open()?;
        let index = ifindex(&mut nl, &ifname)?;
        let info = describe(&mut nl, index)?;
        let addrs = nl.addresses_of(index)?;
        Ok((info, addrs))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(kind: &str, alias: Option<&str>) -> LinkDesc {
        LinkDesc {
            index: 7,
            name: "vh-0123456789ab".into(),
            kind: Some(kind.into()),
            alias: alias.map(String::from),
            mtu: Some(1400),
            address: Some([0x52, 0x54, 0, 0, 0, 2]),
            up: true,
            peer_netns: Some(1),
            peer_index: Some(2),
        }
    }

    #[test]
    fn only_vnetds_own_veth_end_is_the_host_end() {
        assert!(is_host_end_of(&desc("veth", Some("vnet:cni-1")), "cni-1"));
        assert!(is_host_end_of(
            &desc("veth", Some("vnet:00000000000000b2:cni-1")),
            "cni-1"
        ));
        assert!(!is_host_end_of(
            &desc("veth", Some("vnet:00000000000000b2:cni-2")),
            "cni-1"
        ));
        assert!(!is_host_end_of(
            &desc("veth", Some("vnet:xyz:cni-1")),
            "cni-1"
        ));
        assert!(!is_host_end_of(
            &desc("veth", Some("vnet:0000000000000b2:cni-1")),
            "cni-1"
        ));
        // Another interface's, a device nobody marked, a device of another kind.
        assert!(!is_host_end_of(&desc("veth", Some("vnet:cni-2")), "cni-1"));
        assert!(!is_host_end_of(&desc("veth", None), "cni-1"));
        assert!(!is_host_end_of(&desc("tun", Some("vnet:cni-1")), "cni-1"));
    }
}
