//! The direct link's way out: each wire frame written to the host NIC's packet socket.

use std::sync::Arc;

use vnet_core::{DropReason, PortId, PortKind};

use crate::ingress::packet::PacketReader;
use crate::ingress::Source;
use crate::packet::PacketSocket;
use crate::port::{Frame, Port, Tx};
use crate::ports::{each_segment, Opened};

/// A direct link (`link add ... direct DEV`): raw Ethernet on a host NIC.
pub fn open(dev: &str, id: PortId) -> std::io::Result<Opened> {
    let sock = Arc::new(PacketSocket::open(dev)?);
    let mut o = Opened::new(sock.clone(), PortKind::DirectLink);
    o.sources.push(Arc::new(Source::new(Box::new(PacketReader {
        sock,
        port: id,
    }))));
    Ok(o)
}

impl Port for PacketSocket {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        let frame = match f.whole() {
            Some(b) => b,
            None => f.copy_into(tx.scratch),
        };
        each_segment(tx.offload, frame, &f.vh, tx.seg, &f.macs, |parts| {
            PacketSocket::send(self, parts)
        })
    }
}
