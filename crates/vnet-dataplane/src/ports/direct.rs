//! The direct link's way out: each wire frame written to the host NIC's packet socket.

use vnet_core::DropReason;

use crate::packet::PacketSocket;
use crate::port::{Frame, Port, Tx};
use crate::ports::each_segment;

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
