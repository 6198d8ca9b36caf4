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

    /// The end of a burst of [`Self::write`]s (one forwarding batch): a NIC that notifies its
    /// guest per burst decides now.
    fn end_of_burst(&self) {}

    /// The data-path settings changed (and once when the NIC is added).
    fn configure(&self, _settings: &vnet_control::DataPathSettings) {}

    /// NIC-specific state and counters for `show stats`.
    fn stats(&self) -> Option<vnet_control::status::NicStatus> {
        None
    }
}
