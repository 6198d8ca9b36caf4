//! An existing netdev someone else owns (`interface add NAME netdev DEV ...`): a QEMU or
//! libvirt VM's TAP with kernel vhost-net, or a container runtime's veth. vnetd attaches the
//! kernel fast path to it (frames the guest sends arrive on DEV; frames for the guest leave by
//! DEV, or straight into a veth peer's namespace) and a punt TAP for the slow path, and never
//! changes or deletes DEV itself. Without the kernel fast path it reads and writes DEV with a
//! packet socket, like a direct link.

use std::io;
use std::sync::Arc;

use vnet_control::Interface;
use vnet_core::{PortId, PortKind};
use vnet_fastpath::Delivery;

use crate::ingress::packet::PacketReader;
use crate::ingress::Source;
use crate::netlink::Rtnl;
use crate::packet::PacketSocket;
use crate::ports::punt::{kernel_port, Names};
use crate::ports::Opened;

pub fn open(i: &Interface, id: PortId, kernel: bool) -> io::Result<Opened> {
    let mut nl = Rtnl::open()?;
    let dev = nl.link(&i.ifname)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no device {} in vnetd's network namespace", i.ifname),
        )
    })?;
    if !kernel {
        let sock = Arc::new(PacketSocket::open(&i.ifname)?);
        let mut o = Opened::new(sock.clone(), PortKind::Interface);
        o.sources.push(Arc::new(Source::new(Box::new(PacketReader {
            sock,
            port: id,
        }))));
        return Ok(o);
    }
    let mtu = dev.mtu.unwrap_or(1500);
    let names = Names::find(&mut nl, &crate::made::owner(), &i.name)?;
    let delivery = if dev.kind.as_deref() == Some("veth") && dev.peer_netns.is_some() {
        Delivery::Peer
    } else {
        Delivery::Egress
    };
    kernel_port(i, &names, id, dev.index, mtu, delivery)
}
