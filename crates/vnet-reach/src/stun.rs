//! STUN Binding (RFC 8489) as a client: how an operator-named STUN server sees this host's
//! VXLAN socket. Plain STUN is not authenticated, so its answer only ever suggests a candidate
//! (`candidates`); no path is used before an authenticated ping through it was answered.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::ReachError;

pub const MAGIC_COOKIE: u32 = 0x2112_A442;
pub const HEADER_LEN: usize = 20;
pub const TXID_LEN: usize = 12;
const BINDING_REQUEST: u16 = 0x0001;
const BINDING_SUCCESS: u16 = 0x0101;
const ATTR_MAPPED_ADDRESS: u16 = 0x0001;
const ATTR_XOR_MAPPED_ADDRESS: u16 = 0x0020;
/// Larger answers are not STUN servers' Binding answers (they are a few dozen bytes).
const MAX_MESSAGE: usize = 1024;

/// Whether a datagram is a STUN message: the two top bits zero, the magic cookie at offset 4,
/// a length that is a multiple of 4 and matches. (VXLAN's first byte is 0x08 and its bytes 4-7
/// are a VNI and a zero byte; an encrypted link's message has no cookie.)
pub fn is_stun(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN
        && buf[0] & 0xc0 == 0
        && u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]) == MAGIC_COOKIE
        && u16::from_be_bytes([buf[2], buf[3]]) as usize == buf.len() - HEADER_LEN
        && buf.len().is_multiple_of(4)
}

/// A Binding request with this transaction id.
pub fn binding_request(txid: [u8; TXID_LEN]) -> [u8; HEADER_LEN] {
    let mut m = [0u8; HEADER_LEN];
    m[0..2].copy_from_slice(&BINDING_REQUEST.to_be_bytes());
    m[4..8].copy_from_slice(&MAGIC_COOKIE.to_be_bytes());
    m[8..20].copy_from_slice(&txid);
    m
}

/// A Binding success answer's transaction id and mapped address (XOR-MAPPED-ADDRESS, else
/// MAPPED-ADDRESS).
pub fn parse_binding_success(buf: &[u8]) -> Result<([u8; TXID_LEN], SocketAddr), ReachError> {
    if buf.len() > MAX_MESSAGE {
        return Err(ReachError::TooLong);
    }
    if !is_stun(buf) {
        return Err(ReachError::NotReach);
    }
    if u16::from_be_bytes([buf[0], buf[1]]) != BINDING_SUCCESS {
        return Err(ReachError::Malformed);
    }
    let mut txid = [0u8; TXID_LEN];
    txid.copy_from_slice(&buf[8..20]);
    let mut at = HEADER_LEN;
    let mut plain = None;
    while at + 4 <= buf.len() {
        let ty = u16::from_be_bytes([buf[at], buf[at + 1]]);
        let len = u16::from_be_bytes([buf[at + 2], buf[at + 3]]) as usize;
        let value = buf.get(at + 4..at + 4 + len).ok_or(ReachError::Malformed)?;
        match ty {
            ATTR_XOR_MAPPED_ADDRESS => return Ok((txid, address(value, Some(&txid))?)),
            ATTR_MAPPED_ADDRESS => plain = Some(address(value, None)?),
            _ => {}
        }
        at += 4 + len.div_ceil(4) * 4;
    }
    plain.map(|a| (txid, a)).ok_or(ReachError::Malformed)
}

/// A (XOR-)MAPPED-ADDRESS value; `xor` carries the transaction id when it is XORed.
fn address(v: &[u8], xor: Option<&[u8; TXID_LEN]>) -> Result<SocketAddr, ReachError> {
    if v.len() < 4 {
        return Err(ReachError::Malformed);
    }
    let cookie = MAGIC_COOKIE.to_be_bytes();
    let mut port = u16::from_be_bytes([v[2], v[3]]);
    if xor.is_some() {
        port ^= (MAGIC_COOKIE >> 16) as u16;
    }
    let ip = match (v[1], v.len()) {
        (0x01, 8) => {
            let mut a = [v[4], v[5], v[6], v[7]];
            if xor.is_some() {
                for (b, c) in a.iter_mut().zip(cookie) {
                    *b ^= c;
                }
            }
            IpAddr::V4(Ipv4Addr::from(a))
        }
        (0x02, 20) => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&v[4..20]);
            if let Some(txid) = xor {
                let key: Vec<u8> = cookie.iter().chain(txid.iter()).copied().collect();
                for (b, k) in a.iter_mut().zip(key) {
                    *b ^= k;
                }
            }
            IpAddr::V6(Ipv6Addr::from(a))
        }
        _ => return Err(ReachError::Malformed),
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A success answer as a server builds it (XOR-MAPPED-ADDRESS for IPv4).
    fn answer(txid: [u8; 12], ep: SocketAddr) -> Vec<u8> {
        let mut m = vec![0x01, 0x01, 0, 12];
        m.extend_from_slice(&MAGIC_COOKIE.to_be_bytes());
        m.extend_from_slice(&txid);
        m.extend_from_slice(&[0x00, 0x20, 0, 8, 0, 0x01]);
        m.extend_from_slice(&(ep.port() ^ 0x2112).to_be_bytes());
        let IpAddr::V4(a) = ep.ip() else { panic!() };
        for (b, c) in a.octets().iter().zip(MAGIC_COOKIE.to_be_bytes()) {
            m.push(b ^ c);
        }
        m
    }

    #[test]
    fn request_is_stun() {
        let r = binding_request([1; 12]);
        assert!(is_stun(&r));
        assert_eq!(&r[..2], &[0, 1]);
        assert!(!is_stun(&[0x08, 0, 0, 0, 0, 0, 1, 0]));
    }

    #[test]
    fn rfc5769_ipv4_response() {
        // RFC 5769 section 2.2 (sample IPv4 response), its XOR-MAPPED-ADDRESS only (the
        // SOFTWARE, MESSAGE-INTEGRITY and FINGERPRINT attributes are skipped by a reader).
        let txid = [
            0xb7, 0xe7, 0xa7, 0x01, 0xbc, 0x34, 0xd6, 0x86, 0xfa, 0x87, 0xdf, 0xae,
        ];
        let mut m = vec![0x01, 0x01, 0x00, 0x0c, 0x21, 0x12, 0xa4, 0x42];
        m.extend_from_slice(&txid);
        m.extend_from_slice(&[
            0x00, 0x20, 0x00, 0x08, 0x00, 0x01, 0xa1, 0x47, 0xe1, 0x12, 0xa6, 0x43,
        ]);
        let (t, a) = parse_binding_success(&m).unwrap();
        assert_eq!(t, txid);
        assert_eq!(a, "192.0.2.1:32853".parse().unwrap());
    }

    #[test]
    fn round_trip_and_refusals() {
        let ep: SocketAddr = "198.51.100.4:40123".parse().unwrap();
        let m = answer([7; 12], ep);
        assert_eq!(parse_binding_success(&m), Ok(([7; 12], ep)));
        // A request is not an answer; a cut attribute is malformed.
        assert!(parse_binding_success(&binding_request([7; 12])).is_err());
        // An attribute claiming more bytes than the message has, before the address.
        let mut cut = m[..20].to_vec();
        cut[3] = 20;
        cut.extend_from_slice(&[0x80, 0x22, 0, 40, 1, 2, 3, 4]);
        cut.extend_from_slice(&m[20..]);
        assert_eq!(parse_binding_success(&cut), Err(ReachError::Malformed));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..120)) {
            let _ = parse_binding_success(&data);
            let _ = is_stun(&data);
        }
    }
}
