//! A veth pair for a guest (`interface add NAME veth [ifname DEV] [netns NS] ...`): vnetd makes
//! it, moves the guest's end DEV into NS with the interface's MAC and MTU, and hands the host end
//! to the kernel fast path, which forwards the guest's known unicast itself and passes the rest
//! to vnetd through the port's punt TAP. For vnetd the port is that TAP (its ordinary TAP
//! code). Without the kernel fast path (not loaded, or refused), the guest gets a TAP named DEV
//! instead, served by vnetd like any `tap` interface: the same device name, MAC and MTU.
//!
//! The veth outlives vnetd ([`crate::made`]): the next run of the same vnetd finds the host end
//! by its name and its alias and adopts the pair as it is (the guest keeps its device and
//! addresses); a host end with another vnetd's alias is never touched. Only when the port goes
//! for good (`interface del`, a teardown) is it deleted, both ends.

use std::fs::File;
use std::io;

use vnet_control::{Interface, InterfaceKind};
use vnet_core::PortId;
use vnet_fastpath::Delivery;

use crate::made::{self, Made, MadeDevice, Owner};
use crate::netlink::{LinkDesc, Rtnl};
use crate::netns;
use crate::ports::nic::open_tap;
use crate::ports::punt::{kernel_port, quiet, Names};
use crate::ports::Opened;

/// The veth vnetd made (named by its host end): deleted, both ends, when the port goes.
struct VethPair {
    host: String,
}

impl Made for VethPair {
    fn remove(&mut self) {
        if let Err(e) = delete(&self.host) {
            tracing::warn!(device = %self.host, "could not remove the veth: {e}");
        }
    }

    fn devices(&self) -> Vec<MadeDevice> {
        vec![MadeDevice {
            netns: None,
            ifname: self.host.clone(),
        }]
    }
}

fn delete(host: &str) -> io::Result<()> {
    let mut nl = Rtnl::open()?;
    match nl.link(host)? {
        Some(l) => nl.del_link(l.index),
        None => Ok(()),
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// What an earlier run of this vnetd left at the host end's name.
enum Earlier {
    Nothing,
    /// A pair whose guest end is where the interface wants it: adopted (with the guest end's
    /// index in its namespace, when that is known).
    Adoptable(LinkDesc, Option<u32>),
    /// This vnetd's, but not as the interface wants it now: deleted and made anew.
    Stale(LinkDesc),
}

fn earlier(
    nl: &mut Rtnl,
    me: &Owner,
    names: &Names,
    i: &Interface,
    ns: Option<&File>,
) -> io::Result<Earlier> {
    let Some(host) = nl.link(&names.host)? else {
        return Ok(Earlier::Nothing);
    };
    let whose = me.whose(
        host.alias.as_deref(),
        &[&MadeDevice::new(None, &names.host)],
    );
    if whose.mine() != Some(i.name.as_str()) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("device {} exists and is {}", names.host, whose.describe()),
        ));
    }
    if host.kind.as_deref() != Some("veth") {
        return Ok(Earlier::Stale(host));
    }
    // The guest's end must be in the interface's namespace, the host end's peer (found by its
    // index: a CNI plugin renames it to the container's eth0). Without a namespace in the
    // configuration the guest's end may be anywhere (a CNI plugin moves it into a container's
    // namespace by path): any peer will do.
    let Some(ns) = ns else {
        return Ok(Earlier::Adoptable(host, None));
    };
    let Some(peer) = host.peer_index else {
        return Ok(Earlier::Stale(host));
    };
    let guest = netns::in_netns(ns, move || Rtnl::open()?.link_by_index(peer))?;
    Ok(match guest {
        Some(g) if g.kind.as_deref() == Some("veth") && g.peer_index == Some(host.index) => {
            Earlier::Adoptable(host, Some(g.index))
        }
        _ => Earlier::Stale(host),
    })
}

/// Which device is the guest's end: by name (one just made) or by index (an adopted one,
/// which its guest may have renamed).
enum GuestEnd {
    Named(String),
    Index(u32),
}

/// Sets the guest's end's MAC and MTU where they differ (in its namespace when it has one);
/// brings it up when `up`.
fn guest_end(end: GuestEnd, mac: [u8; 6], mtu: u32, up: bool, ns: Option<&File>) -> io::Result<()> {
    let job = move || -> io::Result<()> {
        let mut nl = Rtnl::open()?;
        let found = match &end {
            GuestEnd::Named(n) => nl.link(n)?,
            GuestEnd::Index(i) => nl.link_by_index(*i)?,
        };
        let l = found.ok_or_else(|| io::Error::other("the guest's end of the veth is gone"))?;
        if l.address != Some(mac) {
            nl.set_address(l.index, mac)
                .map_err(|e| ctx(e, "set MAC"))?;
        }
        if l.mtu != Some(mtu) {
            nl.set_mtu(l.index, mtu).map_err(|e| ctx(e, "set MTU"))?;
        }
        if up {
            nl.set_up(l.index, true)?;
        }
        Ok(())
    };
    match ns {
        Some(ns) => netns::in_netns(ns, job),
        None => job(),
    }
}

pub fn open(i: &Interface, id: PortId, kernel: bool) -> io::Result<Opened> {
    let me = made::owner();
    let mut nl = Rtnl::open()?;
    let names = Names::find(&mut nl, &me, &i.name)?;
    if !kernel {
        // A veth an earlier run made with the kernel path goes: the guest gets a TAP.
        if let Some(l) = nl.link(&names.host)? {
            let at = MadeDevice::new(None, &names.host);
            if me.is_mine_for(l.alias.as_deref(), &[&at], &i.name) {
                nl.del_link(l.index)?;
            }
        }
        let tap = Interface {
            kind: InterfaceKind::Tap,
            ..i.clone()
        };
        return open_tap(&tap, id);
    }
    let ns = i.netns.as_deref().map(netns::open_netns).transpose()?;
    let (host, adopted) = match earlier(&mut nl, &me, &names, i, ns.as_ref())? {
        Earlier::Adoptable(host, guest) => (host, Some(guest)),
        found => {
            if let Earlier::Stale(old) = found {
                tracing::info!(
                    device = %names.host,
                    "replacing the veth an earlier run made for interface {}", i.name
                );
                nl.del_link(old.index)?;
            }
            nl.add_veth(&names.host, &i.ifname, ns.as_ref())
                .map_err(|e| ctx(e, &format!("create veth {} <-> {}", names.host, i.ifname)))?;
            let host = nl
                .link(&names.host)?
                .ok_or_else(|| io::Error::other("the veth vanished"))?;
            (host, None)
        }
    };
    let mut pair = VethPair {
        host: names.host.clone(),
    };
    let r = finish(&mut nl, &me, &names, i, id, &host, adopted, ns.as_ref());
    match r {
        Ok(mut o) => {
            if adopted.is_some() {
                tracing::info!(device = %names.host, guest = %i.ifname, "veth adopted (made by an earlier run of this vnetd)");
            }
            o.owned.push(Box::new(pair));
            Ok(o)
        }
        Err(e) => {
            // A pair made now goes again; an adopted one stays for the next attempt.
            if adopted.is_none() {
                pair.remove();
            }
            Err(e)
        }
    }
}

/// Sets the pair up (only what differs, for an adopted one: `adopted` holds the guest end's
/// index when known; one marked in the old format is marked as this vnetd's) and opens the
/// punt TAP.
#[allow(clippy::too_many_arguments)]
fn finish(
    nl: &mut Rtnl,
    me: &Owner,
    names: &Names,
    i: &Interface,
    id: PortId,
    host: &LinkDesc,
    adopted: Option<Option<u32>>,
    ns: Option<&File>,
) -> io::Result<Opened> {
    if adopted.is_none() || me.needs_mark(host.alias.as_deref(), &i.name) {
        nl.set_alias(host.index, &me.alias(&i.name))?;
    }
    if host.mtu != Some(i.mtu) {
        nl.set_mtu(host.index, i.mtu)
            .map_err(|e| ctx(e, "set MTU of the host end"))?;
    }
    quiet(&names.host);
    if !host.up {
        nl.set_up(host.index, true)?;
    }
    // The guest's end: the interface's MAC and MTU; a new one is brought up, an adopted one
    // keeps the state (and the name) its guest gave it. Without a namespace, an adopted guest
    // end may be in a namespace vnetd cannot name: it is left as it is.
    match adopted {
        None => guest_end(GuestEnd::Named(i.ifname.clone()), i.mac.0, i.mtu, true, ns)?,
        Some(Some(index)) => guest_end(GuestEnd::Index(index), i.mac.0, i.mtu, false, ns)?,
        Some(None) if host.peer_netns.is_none() => {
            if let Some(index) = host.peer_index {
                guest_end(GuestEnd::Index(index), i.mac.0, i.mtu, false, None)?;
            }
        }
        Some(None) => {}
    }
    // Straight into the guest's namespace when its end is in another one.
    let delivery = if ns.is_some() || host.peer_netns.is_some() {
        Delivery::Peer
    } else {
        Delivery::Egress
    };
    kernel_port(i, names, id, host.index, i.mtu, delivery)
}
