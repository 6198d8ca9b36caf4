//! vhost-user messages a frontend (the VMM) sends to this backend: decoding and replies.
//!
//! Pure: bytes in, typed [`Request`] out, every length and count checked against the
//! message's declared size (a frontend is as untrusted as a guest). The request codes and
//! layouts are those of the vhost-user specification (QEMU's `docs/interop/vhost-user.rst`);
//! only what a virtio-net backend needs is decoded, anything else is
//! [`MsgError::Unsupported`].

use thiserror::Error;

/// Header: request (u32), flags (u32), payload size (u32), little endian.
pub const HEADER_LEN: usize = 12;
/// Largest payload we accept; the largest we use (a memory table of 8 regions) is 264 bytes.
pub const MAX_PAYLOAD: usize = 4096;
/// Most memory regions (and so file descriptors) in one SET_MEM_TABLE.
pub const MAX_REGIONS: usize = 8;

const VERSION: u32 = 0x1;
const VERSION_MASK: u32 = 0x3;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// Bit 8 of a SET_VRING_KICK/CALL/ERR payload: no file descriptor follows.
const VRING_NOFD: u64 = 0x100;
const VRING_INDEX_MASK: u64 = 0xff;

pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SEND_RARP: u32 = 19;
    pub const NET_SET_MTU: u32 = 20;
    pub const RESET_DEVICE: u32 = 34;
}

/// `VHOST_USER_F_PROTOCOL_FEATURES`, a virtio feature bit that only the vhost-user layer uses.
pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
pub mod proto {
    pub const MQ: u64 = 1 << 0;
    pub const RARP: u64 = 1 << 2;
    pub const REPLY_ACK: u64 = 1 << 3;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MsgError {
    #[error("message header: version {0:#x}, expected 1")]
    BadVersion(u32),
    #[error("payload of {0} bytes is larger than {MAX_PAYLOAD}")]
    TooLarge(u32),
    #[error("request {request}: payload of {got} bytes, expected {want}")]
    BadSize {
        request: u32,
        got: usize,
        want: usize,
    },
    #[error("request {request}: {got} file descriptors, expected {want}")]
    BadFds {
        request: u32,
        got: usize,
        want: usize,
    },
    #[error("memory table: {0}")]
    BadMemTable(&'static str),
    #[error("request {0} is not supported by this backend")]
    Unsupported(u32),
    #[error("bad value {value} in request {request}")]
    BadValue { request: u32, value: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub request: u32,
    pub flags: u32,
    pub size: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, MsgError> {
        let h = Header {
            request: le32(&b[0..4]),
            flags: le32(&b[4..8]),
            size: le32(&b[8..12]),
        };
        if h.flags & VERSION_MASK != VERSION {
            return Err(MsgError::BadVersion(h.flags & VERSION_MASK));
        }
        if h.size as usize > MAX_PAYLOAD {
            return Err(MsgError::TooLarge(h.size));
        }
        Ok(h)
    }

    pub fn need_reply(&self) -> bool {
        self.flags & FLAG_NEED_REPLY != 0
    }
}

/// One region of a memory table: guest physical address, size, the frontend's own virtual
/// address (ring addresses are given in that space), and the offset into the region's fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRegion {
    pub guest_addr: u64,
    pub size: u64,
    pub user_addr: u64,
    pub mmap_offset: u64,
}

/// SET_VRING_ADDR: addresses in the frontend's virtual address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringAddr {
    pub index: u32,
    pub flags: u32,
    pub desc: u64,
    pub used: u64,
    pub avail: u64,
    pub log: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    GetFeatures,
    SetFeatures(u64),
    SetOwner,
    ResetOwner,
    ResetDevice,
    SetMemTable(Vec<MemRegion>),
    SetVringNum {
        index: u32,
        num: u32,
    },
    SetVringAddr(VringAddr),
    SetVringBase {
        index: u32,
        num: u32,
    },
    GetVringBase {
        index: u32,
    },
    /// `has_fd`: false when the frontend says it will not kick (polling) or call.
    SetVringKick {
        index: u32,
        has_fd: bool,
    },
    SetVringCall {
        index: u32,
        has_fd: bool,
    },
    SetVringErr {
        index: u32,
        has_fd: bool,
    },
    GetProtocolFeatures,
    SetProtocolFeatures(u64),
    GetQueueNum,
    SetVringEnable {
        index: u32,
        enable: bool,
    },
    SendRarp([u8; 6]),
    NetSetMtu(u64),
}

impl Request {
    /// Whether the request has a reply of its own (others are acknowledged only with
    /// REPLY_ACK and NEED_REPLY).
    pub fn has_reply(&self) -> bool {
        matches!(
            self,
            Request::GetFeatures
                | Request::GetProtocolFeatures
                | Request::GetQueueNum
                | Request::GetVringBase { .. }
        )
    }
}

/// Decodes a request's payload; `fds` is how many file descriptors came with it.
pub fn parse(h: &Header, body: &[u8], fds: usize) -> Result<Request, MsgError> {
    let r = h.request;
    let want_fds = |n: usize| {
        if fds == n {
            Ok(())
        } else {
            Err(MsgError::BadFds {
                request: r,
                got: fds,
                want: n,
            })
        }
    };
    let size = |n: usize| {
        if body.len() == n {
            Ok(())
        } else {
            Err(MsgError::BadSize {
                request: r,
                got: body.len(),
                want: n,
            })
        }
    };
    // Requests without a payload may still carry one of 0 bytes only; a u64 is 8 bytes; a
    // vring state (index, num) 8 bytes; a vring address 40 bytes.
    let u64_body = || -> Result<u64, MsgError> {
        size(8)?;
        Ok(le64(&body[0..8]))
    };
    let state = || -> Result<(u32, u32), MsgError> {
        size(8)?;
        Ok((le32(&body[0..4]), le32(&body[4..8])))
    };
    if r != code::SET_MEM_TABLE && !matches!(r, code::SET_VRING_KICK..=code::SET_VRING_ERR) {
        want_fds(0)?;
    }
    use code::*;
    Ok(match r {
        GET_FEATURES => Request::GetFeatures,
        SET_FEATURES => Request::SetFeatures(u64_body()?),
        SET_OWNER => Request::SetOwner,
        RESET_OWNER => Request::ResetOwner,
        RESET_DEVICE => Request::ResetDevice,
        GET_PROTOCOL_FEATURES => Request::GetProtocolFeatures,
        SET_PROTOCOL_FEATURES => Request::SetProtocolFeatures(u64_body()?),
        GET_QUEUE_NUM => Request::GetQueueNum,
        SET_MEM_TABLE => {
            if body.len() < 8 {
                return Err(MsgError::BadMemTable("shorter than its count"));
            }
            let n = le32(&body[0..4]) as usize;
            if n == 0 || n > MAX_REGIONS {
                return Err(MsgError::BadMemTable("region count not in 1..=8"));
            }
            size(8 + 32 * n)?;
            want_fds(n)?;
            let mut regions = Vec::with_capacity(n);
            for k in 0..n {
                let b = &body[8 + 32 * k..8 + 32 * (k + 1)];
                let m = MemRegion {
                    guest_addr: le64(&b[0..8]),
                    size: le64(&b[8..16]),
                    user_addr: le64(&b[16..24]),
                    mmap_offset: le64(&b[24..32]),
                };
                check_region(&m)?;
                regions.push(m);
            }
            check_overlaps(&regions)?;
            Request::SetMemTable(regions)
        }
        SET_VRING_NUM => {
            let (index, num) = state()?;
            Request::SetVringNum { index, num }
        }
        SET_VRING_BASE => {
            let (index, num) = state()?;
            Request::SetVringBase { index, num }
        }
        GET_VRING_BASE => {
            let (index, _) = state()?;
            Request::GetVringBase { index }
        }
        SET_VRING_ENABLE => {
            let (index, num) = state()?;
            let enable = match num {
                0 => false,
                1 => true,
                v => {
                    return Err(MsgError::BadValue {
                        request: r,
                        value: v as u64,
                    })
                }
            };
            Request::SetVringEnable { index, enable }
        }
        SET_VRING_ADDR => {
            size(40)?;
            Request::SetVringAddr(VringAddr {
                index: le32(&body[0..4]),
                flags: le32(&body[4..8]),
                desc: le64(&body[8..16]),
                used: le64(&body[16..24]),
                avail: le64(&body[24..32]),
                log: le64(&body[32..40]),
            })
        }
        SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
            let v = u64_body()?;
            let has_fd = v & VRING_NOFD == 0;
            want_fds(usize::from(has_fd))?;
            if v & !(VRING_NOFD | VRING_INDEX_MASK) != 0 {
                return Err(MsgError::BadValue {
                    request: r,
                    value: v,
                });
            }
            let index = (v & VRING_INDEX_MASK) as u32;
            match r {
                SET_VRING_KICK => Request::SetVringKick { index, has_fd },
                SET_VRING_CALL => Request::SetVringCall { index, has_fd },
                _ => Request::SetVringErr { index, has_fd },
            }
        }
        SEND_RARP => {
            let v = u64_body()?;
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&v.to_le_bytes()[..6]);
            Request::SendRarp(mac)
        }
        NET_SET_MTU => Request::NetSetMtu(u64_body()?),
        SET_LOG_BASE | SET_LOG_FD => return Err(MsgError::Unsupported(r)),
        other => return Err(MsgError::Unsupported(other)),
    })
}

fn check_region(m: &MemRegion) -> Result<(), MsgError> {
    if m.size == 0 {
        return Err(MsgError::BadMemTable("region of size 0"));
    }
    // Each address space must hold the whole region, and the mapping must fit in a usize.
    if m.guest_addr.checked_add(m.size).is_none()
        || m.user_addr.checked_add(m.size).is_none()
        || m.mmap_offset.checked_add(m.size).is_none()
        || usize::try_from(m.size).is_err()
        || m.size > (1 << 46)
    {
        return Err(MsgError::BadMemTable("region overflows its address space"));
    }
    Ok(())
}

fn check_overlaps(r: &[MemRegion]) -> Result<(), MsgError> {
    for (i, a) in r.iter().enumerate() {
        for b in &r[i + 1..] {
            let g = a.guest_addr < b.guest_addr + b.size && b.guest_addr < a.guest_addr + a.size;
            let u = a.user_addr < b.user_addr + b.size && b.user_addr < a.user_addr + a.size;
            if g || u {
                return Err(MsgError::BadMemTable("regions overlap"));
            }
        }
    }
    Ok(())
}

/// A reply to `h` carrying `payload`.
pub fn reply(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&h.request.to_le_bytes());
    v.extend_from_slice(&(VERSION | FLAG_REPLY).to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

pub fn reply_u64(h: &Header, value: u64) -> Vec<u8> {
    reply(h, &value.to_le_bytes())
}

pub fn reply_state(h: &Header, index: u32, num: u32) -> Vec<u8> {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&index.to_le_bytes());
    p[4..].copy_from_slice(&num.to_le_bytes());
    reply(h, &p)
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hdr(request: u32, size: usize) -> Header {
        Header {
            request,
            flags: 1,
            size: size as u32,
        }
    }

    #[test]
    fn header_checks_version_and_size() {
        let mut b = [0u8; 12];
        b[0] = 1;
        b[4] = 1;
        assert!(Header::parse(&b).is_ok());
        b[4] = 2;
        assert_eq!(Header::parse(&b), Err(MsgError::BadVersion(2)));
        b[4] = 1 | 8;
        b[8..12].copy_from_slice(&5000u32.to_le_bytes());
        assert_eq!(Header::parse(&b), Err(MsgError::TooLarge(5000)));
    }

    #[test]
    fn vring_fd_messages() {
        let body = 0x101u64.to_le_bytes();
        let h = hdr(code::SET_VRING_KICK, 8);
        assert_eq!(
            parse(&h, &body, 0),
            Ok(Request::SetVringKick {
                index: 1,
                has_fd: false
            })
        );
        assert!(parse(&h, &body, 1).is_err());
        let body = 3u64.to_le_bytes();
        assert_eq!(
            parse(&hdr(code::SET_VRING_CALL, 8), &body, 1),
            Ok(Request::SetVringCall {
                index: 3,
                has_fd: true
            })
        );
        let body = 0x1003u64.to_le_bytes();
        assert!(parse(&hdr(code::SET_VRING_CALL, 8), &body, 1).is_err());
    }

    fn table(regions: &[(u64, u64, u64, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(regions.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        for r in regions {
            for v in [r.0, r.1, r.2, r.3] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn mem_table_is_validated() {
        let ok = table(&[(0, 1 << 20, 0x7f00_0000_0000, 0)]);
        let h = hdr(code::SET_MEM_TABLE, ok.len());
        assert!(matches!(parse(&h, &ok, 1), Ok(Request::SetMemTable(r)) if r.len() == 1));
        assert!(parse(&h, &ok, 0).is_err(), "one fd per region");
        let zero = table(&[(0, 0, 0x1000, 0)]);
        assert!(parse(&h, &zero, 1).is_err());
        let wrap = table(&[(u64::MAX - 10, 100, 0x1000, 0)]);
        assert!(parse(&h, &wrap, 1).is_err());
        let overlap = table(&[(0, 0x2000, 0x10000, 0), (0x1000, 0x2000, 0x20000, 0)]);
        assert!(parse(&h, &overlap, 2).is_err());
        let mut lying = table(&[(0, 0x1000, 0x1000, 0)]);
        lying[0] = 9;
        assert!(parse(&h, &lying, 9).is_err());
    }

    #[test]
    fn replies_have_reply_flag() {
        let h = hdr(code::GET_FEATURES, 0);
        let r = reply_u64(&h, 7);
        assert_eq!(r.len(), 20);
        assert_eq!(le32(&r[4..8]), 5);
        assert_eq!(le32(&r[8..12]), 8);
        assert_eq!(le64(&r[12..20]), 7);
    }

    proptest! {
        #[test]
        fn parse_never_panics(request in 0u32..64, body in proptest::collection::vec(any::<u8>(), 0..400), fds in 0usize..10) {
            let h = hdr(request, body.len());
            let _ = parse(&h, &body, fds);
        }
    }
}
