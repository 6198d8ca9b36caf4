//! What vnetd makes on the host outlives vnetd (issue #17): a guest's TAP, a veth pair, the
//! punt TAP of a fast-path port stay when the daemon stops, crashes or is upgraded, so the
//! guest keeps its NIC and its addresses, and the next vnetd adopts them. Every device vnetd
//! makes carries the alias `vnet:NAME` (NAME: the interface), which is how the next vnetd
//! tells its own devices from anyone else's. Only an explicit removal (`interface del`, a
//! teardown) deletes them: [`Made::remove`]; dropping a [`Made`] leaves the device.

use std::io;

use crate::netlink::Rtnl;
use crate::netns;

/// The alias vnetd puts on a device it made for interface `name`.
pub fn alias(name: &str) -> String {
    format!("{ALIAS_PREFIX}{name}")
}

pub const ALIAS_PREFIX: &str = "vnet:";

/// The interface a device was made for, from its alias (`None`: not vnet's).
pub fn owner(alias: Option<&str>) -> Option<&str> {
    alias?.strip_prefix(ALIAS_PREFIX)
}

/// A device vnetd made: where it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MadeDevice {
    /// The named network namespace it is in (`None`: vnetd's own).
    pub netns: Option<String>,
    pub ifname: String,
}

/// Something vnetd made for a port that outlives the process unless removed.
pub trait Made: Send + Sync {
    /// Deletes it (the port is gone for good).
    fn remove(&mut self);
    /// The devices it stands for.
    fn devices(&self) -> Vec<MadeDevice>;
}

/// Deletes `dev` if it is still there and still vnet's (its alias says so): a device an
/// earlier vnetd made for a port the configuration no longer has. Returns whether it did.
pub fn remove_leftover(dev: &MadeDevice) -> io::Result<bool> {
    let name = dev.ifname.clone();
    let job = move || -> io::Result<bool> {
        let mut nl = Rtnl::open()?;
        match nl.link(&name)? {
            Some(l) if owner(l.alias.as_deref()).is_some() => {
                nl.del_link(l.index)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    match &dev.netns {
        None => job(),
        Some(ns) => match netns::open_netns(ns) {
            Ok(f) => netns::in_netns(&f, job),
            // Its namespace is gone, and the device with it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        },
    }
}

/// The devices of vnetd's own namespace that carry a vnet alias.
pub fn marked_here() -> io::Result<Vec<MadeDevice>> {
    Ok(Rtnl::open()?
        .links()?
        .into_iter()
        .filter(|l| owner(l.alias.as_deref()).is_some())
        .map(|l| MadeDevice {
            netns: None,
            ifname: l.name,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_name_their_interface() {
        assert_eq!(alias("c1"), "vnet:c1");
        assert_eq!(owner(Some("vnet:c1")), Some("c1"));
        assert_eq!(owner(Some("someone else's")), None);
        assert_eq!(owner(None), None);
    }
}
