//! A veth pair for a guest (`interface add NAME veth [ifname DEV] [netns NS] ...`): vnetd makes
//! it, moves the guest's end DEV into NS with the interface's MAC and MTU, and hands the host end
//! to the kernel fast path, which forwards the guest's known unicast itself and passes the rest
//! to vnetd through the port's punt TAP. For vnetd the port is that TAP (its ordinary TAP
//! code). Without the kernel fast path (not loaded, or refused), the guest gets a TAP named DEV
//! instead, served by vnetd like any `tap` interface: the same device name, MAC and MTU.
//!
//! When the port goes, its veth goes (both ends); a veth a killed vnetd left behind is found by
//! its name and alias and replaced.

use std::io;

use vnet_control::{Interface, InterfaceKind};
use vnet_core::PortId;
use vnet_fastpath::Delivery;

use crate::kernel::KernelAttach;
use crate::netlink::Rtnl;
use crate::netns;
use crate::ports::nic::{open_tap, tap_port};
use crate::ports::punt::{alias, clear_leftover, punt_tap, quiet, Names};
use crate::ports::Opened;
use crate::sys;

/// Deletes the veth (both ends) when the port goes, or when opening it fails half-way.
struct VethGuard {
    host: String,
}

impl Drop for VethGuard {
    fn drop(&mut self) {
        let r = Rtnl::open().and_then(|mut nl| match nl.link(&self.host)? {
            Some(l) => nl.del_link(l.index),
            None => Ok(()),
        });
        if let Err(e) = r {
            tracing::warn!(device = %self.host, "could not remove the veth: {e}");
        }
    }
}

fn ctx(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub fn open(i: &Interface, id: PortId, kernel: bool) -> io::Result<Opened> {
    if !kernel {
        let tap = Interface {
            kind: InterfaceKind::Tap,
            ..i.clone()
        };
        return open_tap(&tap, id);
    }
    let names = Names::of(&i.name);
    let mut nl = Rtnl::open()?;
    clear_leftover(&mut nl, &names.host, &i.name)?;
    let ns = i.netns.as_deref().map(netns::open_netns).transpose()?;
    nl.add_veth(&names.host, &i.ifname, ns.as_ref())
        .map_err(|e| ctx(e, &format!("create veth {} <-> {}", names.host, i.ifname)))?;
    let guard = VethGuard {
        host: names.host.clone(),
    };
    let host = nl
        .link(&names.host)?
        .ok_or_else(|| io::Error::other("the veth vanished"))?;
    nl.set_alias(host.index, &alias(&i.name))?;
    nl.set_mtu(host.index, i.mtu)
        .map_err(|e| ctx(e, "set MTU of the host end"))?;
    quiet(&names.host);
    nl.set_up(host.index, true)?;
    // The guest's end, in its namespace: the interface's MAC and MTU, up.
    let (dev, mac, mtu) = (i.ifname.clone(), i.mac.0, i.mtu);
    let guest_end = move || -> io::Result<()> {
        let mut nl = Rtnl::open()?;
        let l = nl
            .link(&dev)?
            .ok_or_else(|| io::Error::other(format!("{dev} did not arrive")))?;
        nl.set_address(l.index, mac)
            .map_err(|e| ctx(e, "set MAC"))?;
        nl.set_mtu(l.index, mtu).map_err(|e| ctx(e, "set MTU"))?;
        nl.set_up(l.index, true)
    };
    match &ns {
        Some(ns) => netns::in_netns(ns, guest_end)?,
        None => guest_end()?,
    }
    let punt = std::sync::Arc::new(punt_tap(&names, &i.name, i.mtu)?);
    let punt_ifindex = sys::if_index(&names.punt)?;
    let mut o = tap_port(punt, id);
    o.kernel = Some(KernelAttach::Port {
        ifindex: host.index,
        punt_ifindex,
        mac: i.mac,
        mtu: i.mtu,
        // Straight into the guest's namespace when its end is in another one.
        delivery: if ns.is_some() {
            Delivery::Peer
        } else {
            Delivery::Egress
        },
    });
    o.kernel_required = true;
    o.owned.push(Box::new(guard));
    Ok(o)
}
