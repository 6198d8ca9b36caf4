//! Wire formats of vnet, in the style of smoltcp's `wire` module: typed, zero-copy views over
//! byte buffers (`EthernetFrame`, `Ipv4Packet`, `TcpPacket`, `VxlanPacket`, ...) with field
//! getters and setters, plus small `Repr` structs that parse a checked view into plain values
//! and emit headers where vnet builds packets (ARP announcements, ICMP errors for guests).
//!
//! Why one crate for every layer: the data path reads Ethernet, VLAN, IP and TCP/UDP headers
//! (offloads, the cut-through receive), the control side builds ARP/RARP frames, and issue 31
//! builds ICMP "too big" errors; one set of views means one place where offsets live and where
//! hostile input is bounded. A host key's text form lives here too ([`PublicKey`]): the
//! control language and the cluster's records name peers by key without linking the crypto.
//!
//! Nothing here does I/O (but `MacAddr::random`, behind the `random` feature, which reads the
//! kernel's random source). A view made with `new_checked` has been checked to hold every
//! fixed field its getters read, so they never panic; `new_unchecked` is for buffers the
//! caller has already bounded (its getters panic on a short buffer, as slicing does).
//! Everything that parses bytes from a guest or the wire returns a [`WireError`] instead of
//! panicking, and is fuzzed (see `fuzz/`).

#![forbid(unsafe_code)]

mod arp;
pub mod checksum;
mod ethernet;
mod field;
mod icmpv4;
mod icmpv6;
mod ipv4;
mod ipv6;
mod key;
mod mac;
mod stream;
mod tcp;
mod udp;
mod virtio_net;
mod vxlan;

#[cfg(test)]
mod vectors;

pub use arp::{ArpOperation, ArpPacket, ArpRepr, ARP_ETHERNET_IPV4_LEN};
pub use ethernet::{ethertype, EthernetFrame, EthernetRepr, ETHERNET_HEADER_LEN, MAX_FRAME_LEN};
pub use icmpv4::{
    icmpv4_code, icmpv4_type, Icmpv4Packet, Icmpv4Repr, ICMPV4_ERROR_QUOTE_MAX, ICMPV4_HEADER_LEN,
};
pub use icmpv6::{
    icmpv6_code, icmpv6_type, Icmpv6Packet, Icmpv6Repr, ICMPV6_ERROR_QUOTE_MAX, ICMPV6_HEADER_LEN,
};
pub use ipv4::{Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN};
pub use ipv6::{Ipv6Packet, Ipv6Repr, IPV6_HEADER_LEN, IPV6_MIN_MTU};
pub use key::{decode_key, encode_key, KeyParseError, PublicKey, KEY_LEN};
pub use mac::{MacAddr, MacParseError};
pub use stream::{
    stream_record_prefix, StreamDecoder, StreamHello, STREAM_HELLO_LEN, STREAM_LEN_PREFIX,
};
pub use tcp::{tcp_flags, TcpPacket, TcpRepr, TCP_HEADER_LEN};
pub use udp::{UdpPacket, UdpRepr, UDP_HEADER_LEN};
pub use virtio_net::{
    VirtioNetHdr, VirtioNetHeader, VIRTIO_NET_HDR_LEN, VIRTIO_NET_HDR_MRG_RXBUF_LEN,
};
pub use vxlan::{VxlanPacket, VxlanRepr, VNI_MAX, VXLAN_HEADER_LEN, VXLAN_PORT};

/// IP protocol numbers (IANA) vnet reads or writes: IPv4's protocol field, IPv6's next header.
pub mod ip_protocol {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
}

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
    #[error("IP version {got} where {want} was expected")]
    BadIpVersion { got: u8, want: u8 },
    #[error("header length {0} below the minimum")]
    BadHeaderLen(usize),
    #[error("length field {field} does not fit the {len}-byte buffer")]
    BadLength { field: usize, len: usize },
    #[error("checksum does not verify")]
    BadChecksum,
    #[error("not supported here: {0}")]
    Unsupported(&'static str),
}

/// `Ok` when `len` bytes hold `need`.
fn need(len: usize, need: usize) -> Result<(), WireError> {
    if len < need {
        Err(WireError::Truncated { len, need })
    } else {
        Ok(())
    }
}
