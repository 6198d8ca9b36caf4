//! vhost-user wire format: request codes, header flags, feature bits and payload encoders.
//!
//! Every message is a 12-byte header (request, flags, payload size; little endian) followed by
//! `size` payload bytes; file descriptors travel as SCM_RIGHTS ancillary data.

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// Request codes (frontend to backend) used by this program.
pub mod req {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;

    /// Human-readable name of a request code (for reports).
    pub fn name(code: u32) -> String {
        match code {
            GET_FEATURES => "GET_FEATURES".into(),
            SET_FEATURES => "SET_FEATURES".into(),
            SET_OWNER => "SET_OWNER".into(),
            SET_MEM_TABLE => "SET_MEM_TABLE".into(),
            SET_VRING_NUM => "SET_VRING_NUM".into(),
            SET_VRING_ADDR => "SET_VRING_ADDR".into(),
            SET_VRING_BASE => "SET_VRING_BASE".into(),
            GET_VRING_BASE => "GET_VRING_BASE".into(),
            SET_VRING_KICK => "SET_VRING_KICK".into(),
            SET_VRING_CALL => "SET_VRING_CALL".into(),
            GET_PROTOCOL_FEATURES => "GET_PROTOCOL_FEATURES".into(),
            SET_PROTOCOL_FEATURES => "SET_PROTOCOL_FEATURES".into(),
            GET_QUEUE_NUM => "GET_QUEUE_NUM".into(),
            SET_VRING_ENABLE => "SET_VRING_ENABLE".into(),
            other => format!("REQ_{other}"),
        }
    }

    /// Requests whose reply is part of the request itself (NEED_REPLY must not be set on them).
    pub fn has_reply(code: u32) -> bool {
        matches!(
            code,
            GET_FEATURES | GET_PROTOCOL_FEATURES | GET_QUEUE_NUM | GET_VRING_BASE
        )
    }
}

/// Header flags: protocol version 1 in the low two bits, REPLY, NEED_REPLY.
pub const FLAG_VERSION_1: u32 = 0x1;
pub const FLAG_VERSION_MASK: u32 = 0x3;
pub const FLAG_REPLY: u32 = 0x4;
pub const FLAG_NEED_REPLY: u32 = 0x8;

pub const HEADER_LEN: usize = 12;
/// Largest payload a backend has to accept (the usual implementation limit).
pub const MAX_PAYLOAD: usize = 0x1000;
/// Bit 8 of the u64 payload of SET_VRING_KICK/CALL: no file descriptor attached.
pub const VRING_NOFD_MASK: u64 = 0x100;

/// Device feature bits.
pub const F_CSUM: u64 = 1 << VIRTIO_NET_F_CSUM;
pub const F_GUEST_CSUM: u64 = 1 << VIRTIO_NET_F_GUEST_CSUM;
pub const F_GUEST_TSO4: u64 = 1 << VIRTIO_NET_F_GUEST_TSO4;
pub const F_HOST_TSO4: u64 = 1 << VIRTIO_NET_F_HOST_TSO4;
pub const F_MRG_RXBUF: u64 = 1 << VIRTIO_NET_F_MRG_RXBUF;
pub const F_MQ: u64 = 1 << VIRTIO_NET_F_MQ;
pub const F_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;
pub const F_VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;

/// Protocol feature bits.
pub const PF_MQ: u64 = 1 << 0;
pub const PF_REPLY_ACK: u64 = 1 << 3;
pub const PF_CONFIGURE_MEM_SLOTS: u64 = 1 << 15;

/// The names of the bits of `f` that `known` names.
fn names_of(f: u64, known: &[(u64, &'static str)]) -> Vec<&'static str> {
    known
        .iter()
        .filter(|(bit, _)| f & bit != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Names of the device feature bits this program knows about, for reports.
pub fn feature_names(f: u64) -> Vec<&'static str> {
    let known: [(u64, &str); 9] = [
        (F_CSUM, "CSUM"),
        (F_GUEST_CSUM, "GUEST_CSUM"),
        (F_GUEST_TSO4, "GUEST_TSO4"),
        (F_HOST_TSO4, "HOST_TSO4"),
        (F_MRG_RXBUF, "MRG_RXBUF"),
        (F_MQ, "MQ"),
        (F_EVENT_IDX, "EVENT_IDX"),
        (F_PROTOCOL_FEATURES, "PROTOCOL_FEATURES"),
        (F_VERSION_1, "VERSION_1"),
    ];
    names_of(f, &known)
}

/// Names of the protocol feature bits this program knows about.
pub fn protocol_feature_names(f: u64) -> Vec<&'static str> {
    let known: [(u64, &str); 3] = [
        (PF_MQ, "MQ"),
        (PF_REPLY_ACK, "REPLY_ACK"),
        (PF_CONFIGURE_MEM_SLOTS, "CONFIGURE_MEM_SLOTS"),
    ];
    names_of(f, &known)
}

/// A message header.
pub fn header(request: u32, flags: u32, size: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&request.to_le_bytes());
    h[4..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

/// Parses a header: (request, flags, size).
pub fn parse_header(h: &[u8; HEADER_LEN]) -> (u32, u32, u32) {
    let r = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    (r(0), r(4), r(8))
}

/// Payload of a u64 message.
pub fn u64_payload(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Payload of a vring state message (index, num): SET_VRING_NUM/BASE/ENABLE, GET_VRING_BASE.
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(8);
    p.extend_from_slice(&index.to_le_bytes());
    p.extend_from_slice(&num.to_le_bytes());
    p
}

/// Payload of SET_VRING_ADDR: ring addresses are in the frontend's (our) address space.
pub fn vring_addr(index: u32, flags: u32, desc: u64, used: u64, avail: u64, log: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(40);
    p.extend_from_slice(&index.to_le_bytes());
    p.extend_from_slice(&flags.to_le_bytes());
    for v in [desc, used, avail, log] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

/// One memory region of SET_MEM_TABLE.
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    pub guest_phys_addr: u64,
    pub memory_size: u64,
    pub userspace_addr: u64,
    pub mmap_offset: u64,
}

/// Payload of SET_MEM_TABLE with `nregions` as the declared count (normally `regions.len()`).
pub fn mem_table(nregions: u32, regions: &[MemRegion]) -> Vec<u8> {
    let mut p = Vec::with_capacity(8 + 32 * regions.len());
    p.extend_from_slice(&nregions.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    for r in regions {
        for v in [
            r.guest_phys_addr,
            r.memory_size,
            r.userspace_addr,
            r.mmap_offset,
        ] {
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures};

    #[test]
    fn codes_match_the_vhost_crate() {
        assert_eq!(req::GET_FEATURES, FrontendReq::GET_FEATURES as u32);
        assert_eq!(req::SET_FEATURES, FrontendReq::SET_FEATURES as u32);
        assert_eq!(req::SET_OWNER, FrontendReq::SET_OWNER as u32);
        assert_eq!(req::SET_MEM_TABLE, FrontendReq::SET_MEM_TABLE as u32);
        assert_eq!(req::SET_VRING_NUM, FrontendReq::SET_VRING_NUM as u32);
        assert_eq!(req::SET_VRING_ADDR, FrontendReq::SET_VRING_ADDR as u32);
        assert_eq!(req::SET_VRING_BASE, FrontendReq::SET_VRING_BASE as u32);
        assert_eq!(req::GET_VRING_BASE, FrontendReq::GET_VRING_BASE as u32);
        assert_eq!(req::SET_VRING_KICK, FrontendReq::SET_VRING_KICK as u32);
        assert_eq!(req::SET_VRING_CALL, FrontendReq::SET_VRING_CALL as u32);
        assert_eq!(
            req::GET_PROTOCOL_FEATURES,
            FrontendReq::GET_PROTOCOL_FEATURES as u32
        );
        assert_eq!(
            req::SET_PROTOCOL_FEATURES,
            FrontendReq::SET_PROTOCOL_FEATURES as u32
        );
        assert_eq!(req::GET_QUEUE_NUM, FrontendReq::GET_QUEUE_NUM as u32);
        assert_eq!(req::SET_VRING_ENABLE, FrontendReq::SET_VRING_ENABLE as u32);
        assert_eq!(FLAG_REPLY, VhostUserHeaderFlag::REPLY.bits());
        assert_eq!(FLAG_NEED_REPLY, VhostUserHeaderFlag::NEED_REPLY.bits());
        assert_eq!(PF_MQ, VhostUserProtocolFeatures::MQ.bits());
        assert_eq!(PF_REPLY_ACK, VhostUserProtocolFeatures::REPLY_ACK.bits());
        assert_eq!(
            PF_CONFIGURE_MEM_SLOTS,
            VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS.bits()
        );
    }

    #[test]
    fn payload_layouts() {
        let h = header(req::SET_VRING_NUM, FLAG_VERSION_1 | FLAG_NEED_REPLY, 8);
        assert_eq!(parse_header(&h), (8, 9, 8));
        assert_eq!(vring_state(3, 256), [3, 0, 0, 0, 0, 1, 0, 0]);
        let a = vring_addr(1, 0, 0x1000, 0x3000, 0x2000, 0);
        assert_eq!(a.len(), 40);
        assert_eq!(&a[8..16], &0x1000u64.to_le_bytes());
        assert_eq!(&a[16..24], &0x3000u64.to_le_bytes()); // used before avail on the wire
        assert_eq!(&a[24..32], &0x2000u64.to_le_bytes());
        let m = mem_table(
            1,
            &[MemRegion {
                guest_phys_addr: 0,
                memory_size: 1 << 20,
                userspace_addr: 0x7f00_0000_0000,
                mmap_offset: 0,
            }],
        );
        assert_eq!(m.len(), 8 + 32);
        assert_eq!(&m[16..24], &(1u64 << 20).to_le_bytes());
        assert_eq!(
            feature_names(F_VERSION_1 | F_MRG_RXBUF),
            ["MRG_RXBUF", "VERSION_1"]
        );
    }
}
