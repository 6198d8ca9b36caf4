//! A guest's NIC as a port (a TAP, or a vhost-user device, both behind [`GuestNic`]).
//!
//! From a guest with offloads, a 64 KB TCP segment stays whole on its way to another local
//! guest. Frames from the wire to a guest with offloads go through the thread's
//! [`Coalescer`] for that NIC, which verifies each TCP segment's checksums and merges
//! consecutive segments of a flow (segments an encrypted link authenticated with their
//! checksums left partial are merged unverified); at the end of the receive batch
//! (`gro_to_guest::flush_coalescers`) each run goes to the guest as one frame with a GSO virtio-net
//! header. A guest without offloads gets ordinary frames with complete checksums.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vnet_control::status::NicStatus;
use vnet_control::DataPathSettings;
use vnet_core::DropReason;
use vnet_offload::{GroOutput, Offered, VirtioNetHdr};

use crate::gro_to_guest::emit;
use crate::ingress::tap::TapReader;
use crate::ingress::Source;
use crate::made::{Made, MadeDevice};
use crate::nic::GuestNic;
use crate::port::{Frame, Origin, Port, Tx};
use crate::ports::{each_segment, Opened};
use crate::tap::Tap;

/// A guest NIC as a port.
pub struct NicPort(pub Arc<dyn GuestNic>);

/// A TAP vnetd reads and writes (`interface add ... tap`): one dispatcher source per queue.
pub fn open_tap(i: &vnet_control::Interface, id: vnet_core::PortId) -> std::io::Result<Opened> {
    let tap = Arc::new(Tap::open(i)?);
    Ok(tap_port(tap, id))
}

/// Removes a TAP vnetd made when its port goes for good.
struct TapRemoval(Arc<Tap>);

impl Made for TapRemoval {
    fn remove(&mut self) {
        self.0.remove();
    }

    fn devices(&self) -> Vec<MadeDevice> {
        vec![self.0.device()]
    }
}

/// The port of an open TAP: writes go to it, its queues are read by the dispatchers.
pub fn tap_port(tap: Arc<Tap>, id: vnet_core::PortId) -> Opened {
    let mut o = Opened::new(
        Arc::new(NicPort(tap.clone())),
        vnet_core::PortKind::Interface,
    );
    if tap.made() {
        o.owned.push(Box::new(TapRemoval(tap.clone())));
    }
    o.sources = (0..tap.queues())
        .map(|queue| {
            Arc::new(Source::new(Box::new(TapReader {
                tap: tap.clone(),
                queue,
                port: id,
            })))
        })
        .collect();
    o
}

impl Port for NicPort {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        let nic = &*self.0;
        let Some(frame) = f.whole() else {
            // From another guest's shared memory: the NIC reads every byte, so copy it first.
            let mut buf = std::mem::take(tx.scratch);
            let frame = f.copy_into(&mut buf);
            let r = from_local(tx, nic, f, frame);
            *tx.scratch = buf;
            return r;
        };
        match f.origin {
            Origin::Wire { at, bufs } if nic.has_vnet_hdr() && f.sole => {
                let c = tx.coalescers.entry(tx.port).or_default();
                let (offload, counters, queue) = (tx.offload, tx.counters, tx.queue);
                let mut emit = |g: GroOutput<'_>| emit(offload, nic, queue, counters, g, bufs);
                match c.offer(frame, at, f.vh.needs_csum(), &mut emit) {
                    Offered::Held => Ok(()),
                    Offered::Plain => wire_to_nic(tx, nic, frame, None),
                    Offered::Partial(p) => wire_to_nic(tx, nic, frame, Some(p)),
                }
            }
            Origin::Wire { .. } => {
                let hint = match f.vh.needs_csum() {
                    true => Some(f.vh),
                    false => vnet_offload::partial_checksum_hint(frame),
                };
                wire_to_nic(tx, nic, frame, hint)
            }
            Origin::Local => from_local(tx, nic, f, frame),
        }
    }

    fn end_of_burst(&self) {
        self.0.end_of_burst();
    }

    fn configure(&self, settings: &DataPathSettings) {
        self.0.configure(settings);
    }

    fn as_nic(&self) -> Option<&dyn GuestNic> {
        Some(&*self.0)
    }

    fn nic_status(&self) -> Option<NicStatus> {
        self.0.stats()
    }
}

/// A frame from a local port (a guest, a TCP or direct link): whole to a NIC with offloads,
/// cut into wire frames for one without.
fn from_local(
    tx: &mut Tx<'_, '_>,
    nic: &dyn GuestNic,
    f: &Frame<'_>,
    frame: &[u8],
) -> Result<(), DropReason> {
    if nic.has_vnet_hdr() || f.vh.is_plain() {
        nic.write(tx.queue, &f.vh, &[&f.macs, &frame[12..]])
    } else {
        let queue = tx.queue;
        each_segment(tx.offload, frame, &f.vh, tx.seg, &f.macs, |parts| {
            nic.write(queue, &VirtioNetHdr::default(), parts)
        })
    }
}

/// A frame from the wire that no coalescer took, to a guest. `partial` says its checksum was
/// left partial by a local sender.
fn wire_to_nic(
    tx: &mut Tx<'_, '_>,
    nic: &dyn GuestNic,
    frame: &[u8],
    partial: Option<VirtioNetHdr>,
) -> Result<(), DropReason> {
    let queue = tx.queue;
    match partial {
        Some(p) if !nic.has_vnet_hdr() => {
            // Without a virtio-net header the guest needs complete checksums.
            let scratch = &mut *tx.scratch;
            scratch.clear();
            scratch.extend_from_slice(frame);
            vnet_offload::complete_checksum(scratch, &p).map_err(|_| DropReason::BadOffload)?;
            tx.offload.csum_completed.fetch_add(1, Relaxed);
            nic.write(queue, &VirtioNetHdr::default(), &[scratch])
        }
        Some(p) => {
            tx.offload.partial_csum.fetch_add(1, Relaxed);
            nic.write(queue, &partial_for_nic(nic, frame, p), &[frame])
        }
        None if frame.len() > nic.max_frame()
            && nic.has_vnet_hdr()
            && vnet_offload::l4_checksum_ok(frame) =>
        {
            // An unsegmented frame a kernel sender did checksum in full (say one carrying FIN):
            // the guest takes a frame above its MTU only as a GSO frame.
            let Ok(l) = vnet_offload::parse_l3l4(frame) else {
                return nic.write(queue, &VirtioNetHdr::default(), &[frame]);
            };
            let hl = l.hdr_len();
            let mut h = [0u8; 128];
            if hl > h.len() {
                return Err(DropReason::Oversize);
            }
            h[..hl].copy_from_slice(&frame[..hl]);
            let mss = nic
                .max_frame()
                .saturating_sub(18 + l.l3_len + l.l4_len)
                .max(536) as u16;
            match vnet_offload::as_partial_gso(&mut h[..hl], frame.len(), mss) {
                Some(vh) => nic.write(queue, &vh, &[&h[..hl], &frame[hl..]]),
                None => Err(DropReason::Oversize),
            }
        }
        None => nic.write(queue, &VirtioNetHdr::default(), &[frame]),
    }
}

/// A frame with a partial checksum larger than the guest's MTU is a kernel sender's
/// unsegmented GSO frame (a veth underlay passes those whole): describe it to the guest as
/// one, with segments that fit its MTU.
fn partial_for_nic(nic: &dyn GuestNic, frame: &[u8], partial: VirtioNetHdr) -> VirtioNetHdr {
    if frame.len() <= nic.max_frame() {
        return partial;
    }
    let Ok(l) = vnet_offload::parse_l3l4(frame) else {
        return partial;
    };
    let mss = nic
        .max_frame()
        .saturating_sub(18 + l.l3_len + l.l4_len)
        .max(536);
    vnet_offload::gso_header(frame, mss as u16).unwrap_or(partial)
}

#[cfg(test)]
mod tests;
