//! rtnetlink messages, built and parsed as bytes (pure): the few requests the plugin makes
//! (move a device to a namespace, rename it, bring it up, add an address and a route) and the
//! replies it reads (acknowledgements, links, addresses).

use std::net::IpAddr;

pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const RTM_NEWLINK: u16 = 16;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;

pub const IFLA_ADDRESS: u16 = 1;
pub const IFLA_IFNAME: u16 = 3;
pub const IFLA_MTU: u16 = 4;
pub const IFLA_NET_NS_FD: u16 = 28;
pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const RTA_DST: u16 = 1;
pub const RTA_OIF: u16 = 4;
pub const RTA_GATEWAY: u16 = 5;

pub const IFF_UP: u32 = 0x1;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn family(ip: &IpAddr) -> u8 {
    if ip.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// A request: header, the family header, then attributes.
pub struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    pub fn new(ty: u16, flags: u16, family_header: &[u8]) -> Msg {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set by finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        buf.extend_from_slice(family_header);
        buf.resize(align4(buf.len()), 0);
        Msg { buf }
    }

    pub fn attr(mut self, ty: u16, data: &[u8]) -> Msg {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// `struct ifinfomsg`.
pub fn ifinfo(index: u32, flags: u32, change: u32) -> Vec<u8> {
    let mut h = vec![0u8, 0]; // family AF_UNSPEC, pad
    h.extend_from_slice(&0u16.to_ne_bytes()); // type
    h.extend_from_slice(&(index as i32).to_ne_bytes());
    h.extend_from_slice(&flags.to_ne_bytes());
    h.extend_from_slice(&change.to_ne_bytes());
    h
}

/// Moves device `index` into the namespace open as `ns_fd`.
pub fn move_to_netns(index: u32, ns_fd: u32) -> Msg {
    Msg::new(RTM_NEWLINK, NLM_F_ACK, &ifinfo(index, 0, 0))
        .attr(IFLA_NET_NS_FD, &ns_fd.to_ne_bytes())
}

/// Renames device `index` (it must be down).
pub fn rename(index: u32, name: &str) -> Msg {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    Msg::new(RTM_NEWLINK, NLM_F_ACK, &ifinfo(index, 0, 0)).attr(IFLA_IFNAME, &n)
}

/// Brings device `index` up.
pub fn set_up(index: u32) -> Msg {
    Msg::new(RTM_NEWLINK, NLM_F_ACK, &ifinfo(index, IFF_UP, IFF_UP))
}

/// Takes device `index` down (a device is renamed only while down).
pub fn set_down(index: u32) -> Msg {
    Msg::new(RTM_NEWLINK, NLM_F_ACK, &ifinfo(index, 0, IFF_UP))
}

/// Adds `addr/prefix` to device `index`.
pub fn add_address(index: u32, addr: IpAddr, prefix: u8) -> Msg {
    let mut h = vec![family(&addr), prefix, 0, RT_SCOPE_UNIVERSE];
    h.extend_from_slice(&index.to_ne_bytes());
    let b = ip_bytes(&addr);
    Msg::new(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &h)
        .attr(IFA_LOCAL, &b)
        .attr(IFA_ADDRESS, &b)
}

/// Adds a route to `dst/prefix` out of device `index`, through `gw` when given.
pub fn add_route(index: u32, dst: IpAddr, prefix: u8, gw: Option<IpAddr>) -> Msg {
    let scope = if gw.is_some() {
        RT_SCOPE_UNIVERSE
    } else {
        RT_SCOPE_LINK
    };
    let h = [
        family(&dst),
        prefix,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_BOOT,
        scope,
        RTN_UNICAST,
        0,
        0,
        0,
        0,
    ];
    let mut m = Msg::new(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, &h);
    if prefix > 0 {
        m = m.attr(RTA_DST, &ip_bytes(&dst));
    }
    if let Some(g) = gw {
        m = m.attr(RTA_GATEWAY, &ip_bytes(&g));
    }
    m.attr(RTA_OIF, &index.to_ne_bytes())
}

/// Asks for every address (a dump).
pub fn get_addresses() -> Msg {
    Msg::new(RTM_GETADDR, NLM_F_DUMP, &[0u8; 8])
}

/// Asks for device `index`.
pub fn get_link(index: u32) -> Msg {
    Msg::new(RTM_GETLINK, 0, &ifinfo(index, 0, 0))
}

/// One message of a reply: its type and what follows the 16-byte header.
pub fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        if len < 16 || off + len > buf.len() {
            break;
        }
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        out.push((ty, &buf[off + 16..off + len]));
        off += align4(len);
    }
    out
}

/// The errno of an NLMSG_ERROR payload (0: an acknowledgement).
pub fn error_code(payload: &[u8]) -> Option<i32> {
    payload
        .get(0..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// The attributes after a family header of `header_len` bytes.
pub fn attrs(payload: &[u8], header_len: usize) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = align4(header_len);
    while off + 4 <= payload.len() {
        let len = u16::from_ne_bytes([payload[off], payload[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([payload[off + 2], payload[off + 3]]) & 0x3fff;
        if len < 4 || off + len > payload.len() {
            break;
        }
        out.push((ty, &payload[off + 4..off + len]));
        off += align4(len);
    }
    out
}

/// A device as RTM_NEWLINK describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub flags: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
}

pub fn parse_link(payload: &[u8]) -> Option<LinkInfo> {
    if payload.len() < 16 {
        return None;
    }
    let index = i32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]) as u32;
    let flags = u32::from_ne_bytes([payload[8], payload[9], payload[10], payload[11]]);
    let mut info = LinkInfo {
        index,
        flags,
        name: String::new(),
        mac: None,
        mtu: None,
    };
    for (ty, data) in attrs(payload, 16) {
        match ty {
            IFLA_IFNAME => {
                let end = data.iter().position(|&c| c == 0).unwrap_or(data.len());
                info.name = String::from_utf8_lossy(&data[..end]).into_owned();
            }
            IFLA_ADDRESS if data.len() == 6 => {
                let mut m = [0u8; 6];
                m.copy_from_slice(data);
                info.mac = Some(m);
            }
            IFLA_MTU if data.len() == 4 => {
                info.mtu = Some(u32::from_ne_bytes([data[0], data[1], data[2], data[3]]))
            }
            _ => {}
        }
    }
    Some(info)
}

/// (device index, address, prefix length) of an RTM_NEWADDR.
pub fn parse_address(payload: &[u8]) -> Option<(u32, IpAddr, u8)> {
    if payload.len() < 8 {
        return None;
    }
    let (fam, prefix) = (payload[0], payload[1]);
    let index = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
    let attrs = attrs(payload, 8);
    let data = attrs
        .iter()
        .find(|(t, _)| *t == IFA_LOCAL)
        .or_else(|| attrs.iter().find(|(t, _)| *t == IFA_ADDRESS))?
        .1;
    let ip = match (fam, data.len()) {
        (AF_INET, 4) => IpAddr::from([data[0], data[1], data[2], data[3]]),
        (AF_INET6, 16) => {
            let mut b = [0u8; 16];
            b.copy_from_slice(data);
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some((index, ip, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_address_request() {
        let m = add_address(7, "10.1.0.5".parse().unwrap(), 24).finish(9);
        // header 16 + ifaddrmsg 8 + two 8-byte attributes
        assert_eq!(m.len(), 40);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), RTM_NEWADDR);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(&m[16..20], &[AF_INET, 24, 0, 0]);
        assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 7);
        // It reads back as the address it adds.
        let back = messages(&m);
        assert_eq!(back.len(), 1);
        assert_eq!(
            parse_address(back[0].1),
            Some((7, "10.1.0.5".parse().unwrap(), 24))
        );
    }

    #[test]
    fn a_rename_is_padded() {
        let m = rename(3, "eth0").finish(1);
        // 16 + 16 + (4 + 5 -> 12)
        assert_eq!(m.len(), 44);
        let back = messages(&m);
        let info = parse_link(back[0].1).unwrap();
        assert_eq!((info.index, info.name.as_str()), (3, "eth0"));
    }

    #[test]
    fn routes() {
        let m = add_route(
            2,
            "0.0.0.0".parse().unwrap(),
            0,
            Some("10.1.0.1".parse().unwrap()),
        )
        .finish(1);
        let a = attrs(messages(&m)[0].1, 12);
        assert_eq!(
            a.iter().map(|x| x.0).collect::<Vec<_>>(),
            [RTA_GATEWAY, RTA_OIF]
        );
        let m = add_route(2, "fd00::".parse().unwrap(), 64, None).finish(1);
        let a = attrs(messages(&m)[0].1, 12);
        assert_eq!(
            a[0],
            (
                RTA_DST,
                &[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]
            )
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            for (_, p) in messages(&bytes) {
                let _ = parse_link(p);
                let _ = parse_address(p);
                let _ = error_code(p);
            }
            let _ = attrs(&bytes, 16);
            let _ = parse_link(&bytes);
            let _ = parse_address(&bytes);
        }
    }
}
