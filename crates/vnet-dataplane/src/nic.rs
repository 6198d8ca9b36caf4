//! What the forwarding path needs of a guest's NIC, whatever carries it: a TAP device, or a
//! virtio-net device served over vhost-user (crate `vnet-vhost`).

use vnet_core::DropReason;
use vnet_offload::VirtioNetHdr;

pub trait GuestNic: Send + Sync {
    /// Delivers a frame, gathered from `parts`, to the guest on queue `queue` (any number;
    /// the NIC picks one of its queues). `vh` must be plain unless [`Self::has_vnet_hdr`].
    fn write(&self, queue: usize, vh: &VirtioNetHdr, parts: &[&[u8]]) -> Result<(), DropReason>;

    /// Whether the guest takes frames with a virtio-net header: large (GSO) frames and
    /// partial checksums.
    fn has_vnet_hdr(&self) -> bool;

    /// The largest ordinary frame the guest takes: MTU, Ethernet header and a VLAN tag.
    fn max_frame(&self) -> usize;
}
