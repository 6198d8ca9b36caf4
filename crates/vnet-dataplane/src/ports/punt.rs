//! What the two kernel-forwarded interface kinds (`veth`, `netdev`) share: the punt TAP that
//! carries a fast-path port's slow-path frames between the kernel and vnetd, the names vnetd
//! gives the devices it makes for such a port (derived from its instance and the interface's
//! name, so the next run of the same vnetd finds and adopts them after a restart or a crash,
//! and two vnetds of one network namespace never reach for the same name), and quieting the
//! host stack on those devices; and the port such an interface becomes.

use std::io;
use std::sync::Arc;

use vnet_control::{Interface, InterfaceKind};
use vnet_core::PortId;
use vnet_fastpath::Delivery;
use vnet_wire::MacAddr;

use crate::kernel::KernelAttach;
use crate::made::{Instance, MadeDevice, Owner};
use crate::netlink::Rtnl;
use crate::ports::nic::tap_port;
use crate::ports::Opened;
use crate::sys;
use crate::tap::Tap;

/// The names of the devices vnetd makes for interface `name`: the veth's host end (`vh-` +
/// 12 hex digits) and the punt TAP (`vp-` + the same digits), both 15 bytes, the most a
/// device name holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub host: String,
    pub punt: String,
}

impl Names {
    /// The names vnetd `instance` gives interface `name`'s devices (`None`: the names of a
    /// vnetd from before instances, derived from the interface's name alone).
    pub fn of(instance: Option<Instance>, interface: &str) -> Names {
        // FNV-1a, 64 bits: stable across runs and versions (a killed daemon's successor must
        // derive the same names), and 48 bits make a collision among one host's interfaces
        // negligible.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= *b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        if let Some(i) = instance {
            eat(&i.bits().to_be_bytes());
            eat(b":");
        }
        eat(interface.as_bytes());
        let tag = format!("{:012x}", h & 0xffff_ffff_ffff);
        Names {
            host: format!("vh-{tag}"),
            punt: format!("vp-{tag}"),
        }
    }

    /// The names of interface `interface`'s devices for this vnetd (`me`): its own, unless a
    /// device it may adopt is at the old names (a vnetd from before instances made it: an
    /// upgrade; the device keeps its name, renaming a guest's veth would cut it off).
    pub fn find(nl: &mut Rtnl, me: &Owner, interface: &str) -> io::Result<Names> {
        let own = Names::of(me.instance, interface);
        let old = Names::of(None, interface);
        if own == old || nl.link(&own.host)?.is_some() || nl.link(&own.punt)?.is_some() {
            return Ok(own);
        }
        for dev in [old.host.clone(), old.punt.clone()] {
            if let Some(l) = nl.link(&dev)? {
                if me.is_mine_for(
                    l.alias.as_deref(),
                    &[&MadeDevice::new(None, &dev)],
                    interface,
                ) {
                    return Ok(old);
                }
            }
        }
        Ok(own)
    }

    /// A locally administered MAC for the punt TAP (never seen by a guest).
    pub fn punt_mac(&self) -> MacAddr {
        let b = self.punt.as_bytes();
        let mut m = [0u8; 6];
        for (i, c) in b.iter().enumerate() {
            m[i % 6] ^= *c;
        }
        MacAddr::local_from_random(m)
    }
}

/// The punt TAP of a fast-path port: vnetd reads what the kernel hands over and writes what
/// the guest should get (with virtio-net headers, so large frames stay whole).
pub fn punt_tap(names: &Names, name: &str, mtu: u32) -> io::Result<Tap> {
    let spec = Interface {
        name: name.to_string(),
        kind: InterfaceKind::Tap,
        ifname: names.punt.clone(),
        mac: names.punt_mac(),
        mtu,
        netns: None,
        vni: 0,
        queues: 1,
        offload: true,
        socket: None,
        client: false,
        any_source: false,
        rate: None,
    };
    let tap = Tap::open(&spec)?;
    quiet(&names.punt);
    Ok(tap)
}

/// The port of interface `i` forwarded by the kernel on device `ifindex`: its punt TAP (opened
/// here) is what vnetd reads and writes, and the engine attaches the device to the fast path.
pub fn kernel_port(
    i: &Interface,
    names: &Names,
    id: PortId,
    ifindex: u32,
    mtu: u32,
    delivery: Delivery,
) -> io::Result<Opened> {
    let punt = Arc::new(punt_tap(names, &i.name, mtu)?);
    let punt_ifindex = sys::if_index(&names.punt)?;
    let mut o = tap_port(punt, id);
    o.kernel = Some(KernelAttach::Port {
        ifindex,
        punt_ifindex,
        mac: i.mac,
        mtu,
        delivery,
    });
    o.kernel_required = true;
    Ok(o)
}

/// Keeps the host's own stack off a device vnetd uses only as a pipe (no IPv6 autoconfiguration
/// traffic leaking to the guest or to vnetd as frames of the guest).
pub fn quiet(device: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{device}/disable_ipv6");
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::debug!(device, "IPv6 left on: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let me = Some(Instance::from_bits(0xa1));
        let a = Names::of(me, "c1");
        assert_eq!(a, Names::of(me, "c1"));
        assert_ne!(
            a,
            Names::of(Some(Instance::from_bits(0xb2)), "c1"),
            "another vnetd's"
        );
        assert_ne!(a, Names::of(None, "c1"), "the old names");
        assert_eq!(a.host.len(), 15);
        assert_eq!(a.punt.len(), 15);
        assert!(a.host.starts_with("vh-") && a.punt.starts_with("vp-"));
        assert_eq!(a.host[3..], a.punt[3..]);
        let names: std::collections::HashSet<String> = (0..10_000)
            .map(|i| Names::of(me, &format!("if{i}")).host)
            .collect();
        assert_eq!(names.len(), 10_000);
        assert!(a.punt_mac().is_unicast());
        // The old names are those vnetd gave before instances (an upgrade finds them).
        assert_eq!(Names::of(None, "c1").host, "vh-7f07b54a6859");
    }
}
