//! One module per port kind, each implementing [`crate::port::Port`]: how a frame leaves.
//!
//! - [`nic`]: a guest's NIC (a TAP, or a vhost-user device through [`crate::GuestNic`]);
//! - [`udp`]: a udp link (VXLAN datagrams, batched, `UDP_SEGMENT` for large frames,
//!   optionally sealed);
//! - [`tcp`]: a tcp link (a framed stream with a bounded queue, and its reader);
//! - [`direct`]: a direct link (raw Ethernet on a host NIC).
//!
//! Adding a kind: a new module here implementing `Port`, and the line in
//! [`crate::Engine`] that opens it for its interface or link kind.

pub mod direct;
pub mod nic;
pub mod tcp;
pub mod udp;

use vnet_core::DropReason;
use vnet_offload::{segment, SegmentList, VirtioNetHdr};

use crate::shared::OffloadCounters;

/// Calls `send` with the parts of each wire frame of `frame` (the frame itself when it needs
/// no segmentation and no checksum), its MACs taken from `macs`, the checked copy: for ports
/// that carry only ordinary Ethernet frames (TCP and direct links, a TAP without offloads).
pub(crate) fn each_segment(
    offload: &OffloadCounters,
    frame: &[u8],
    vh: &VirtioNetHdr,
    seg: &mut SegmentList,
    macs: &[u8; 12],
    mut send: impl FnMut(&[&[u8]]) -> Result<(), DropReason>,
) -> Result<(), DropReason> {
    if vh.is_plain() || (vh.gso_kind() == VirtioNetHdr::GSO_NONE && !vh.needs_csum()) {
        return send(&[macs, &frame[12..]]);
    }
    segment(frame, vh, seg).map_err(|_| DropReason::BadOffload)?;
    seg.pin_macs(macs);
    if seg.len() > 1 {
        offload.gso(seg.len());
    }
    for i in 0..seg.len() {
        send(&seg.parts(frame, i))?;
    }
    Ok(())
}
