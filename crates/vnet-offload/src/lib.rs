//! Software offloads, as in wireguard-go's Linux offload code: guests hand vnet 64 KB TCP
//! segments with a partial checksum (TSO through the TAP's virtio-net header); vnet cuts them
//! into wire-sized segments with complete checksums only where a frame leaves for a network
//! that needs them ([`segment`]), and on receive merges consecutive segments of a TCP flow back
//! into one large frame for the guest ([`Coalescer`]), so both guests' stacks see 64 KB at a time.
//!
//! The headers are read and rewritten through `vnet-wire`'s views (IPv4, IPv6, TCP, UDP, the
//! virtio-net header); the Internet checksum and the virtio-net header live there too and are
//! re-exported here, where the data path has always found them.
//!
//! Pure: no I/O. Every parser treats its input as hostile and returns an [`OffloadError`].

#![forbid(unsafe_code)]

mod gro;
mod gso;
mod headers;

#[cfg(any(test, feature = "test-frames"))]
pub mod test_frames;

pub use gro::{
    l4_checksum_ok, left_partial, partial_checksum_hint, Coalescer, GroOutput, Offered, PayloadRef,
    MAX_GRO_PAYLOAD,
};
pub use gso::{
    as_partial_gso, complete_checksum, gso_header, segment, segment_with, L4Checksum, Segment,
    SegmentList,
};
pub use headers::{claimed_frame_len, parse_l3l4, Layout, L3, L4};
pub use vnet_wire::checksum::{checksum, fold, sum};
pub use vnet_wire::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("frame too short for its headers")]
    Truncated,
    #[error("not an IPv4/IPv6 TCP or UDP frame")]
    Unsupported,
    #[error("virtio-net header fields out of range")]
    BadHeader,
}
