//! Wire formats of vnet, in the style of smoltcp's `wire` module: typed, zero-copy views over
//! byte buffers (`EthernetFrame`, `VxlanPacket`) plus small `Repr` structs that emit headers.
//!
//! Nothing here does I/O (but `MacAddr::random`, behind the `random` feature, which reads the
//! kernel's random source); everything that parses bytes from a guest or the wire returns a
//! [`WireError`] instead of panicking, and is fuzzed (see `fuzz/`).

#![forbid(unsafe_code)]

mod ethernet;
mod mac;
mod stream;
mod vxlan;

pub use ethernet::{EthernetFrame, ETHERNET_HEADER_LEN, MAX_FRAME_LEN};
pub use mac::{MacAddr, MacParseError};
pub use stream::{
    stream_record_prefix, StreamDecoder, StreamHello, STREAM_HELLO_LEN, STREAM_LEN_PREFIX,
};
pub use vxlan::{VxlanPacket, VxlanRepr, VNI_MAX, VXLAN_HEADER_LEN, VXLAN_PORT};

/// Why a buffer could not be read as the format asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("buffer too short: {len} bytes, need at least {need}")]
    Truncated { len: usize, need: usize },
    #[error("buffer too long: {len} bytes, at most {max}")]
    Oversize { len: usize, max: usize },
    #[error("VXLAN header without the VNI-valid flag (flags {0:#04x})")]
    VxlanFlags(u8),
    #[error("stream greeting is not a vnet greeting")]
    BadHello,
    #[error("stream frame length {0} out of range")]
    BadStreamLength(u32),
}
