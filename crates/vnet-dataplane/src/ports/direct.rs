//! The direct link's way out: each wire frame written to the host NIC's packet socket.

use std::sync::Arc;

use vnet_core::{DropReason, PortId, PortKind};

use crate::ingress::packet::PacketReader;
use crate::ingress::Source;
use crate::packet::PacketSocket;
use crate::port::{Frame, Port, Tx};
use crate::ports::{send_segments, Opened};

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
        send_segments(tx, f, |parts| PacketSocket::send(self, parts))
    }
}
