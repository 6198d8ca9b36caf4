//! The rtnetlink messages vnet builds and the answers it reads (pure): a link described, an
//! address with its prefix, the requests that add an address or a route to a device.

use std::net::IpAddr;

use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::AddressFamily;

/// What vnet reads of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDesc {
    pub index: u32,
    pub name: String,
    /// `veth`, `tun`, `vxlan`, ... (`None` for a device without a kind, such as loopback).
    pub kind: Option<String>,
    pub alias: Option<String>,
    pub mtu: Option<u32>,
    pub address: Option<[u8; 6]>,
    pub up: bool,
    /// Set when the link's other end (a veth peer) is in another network namespace.
    pub peer_netns: Option<i32>,
    /// The index of the link's other end (a veth's peer), in `peer_netns` when set.
    pub peer_index: Option<u32>,
}

/// What vnet reads of a link message.
pub fn describe(l: &LinkMessage) -> LinkDesc {
    let mut d = LinkDesc {
        index: l.header.index,
        name: String::new(),
        kind: None,
        alias: None,
        mtu: None,
        address: None,
        up: l.header.flags.contains(LinkFlags::Up),
        peer_netns: None,
        peer_index: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => d.name = n.clone(),
            LinkAttribute::IfAlias(n) => d.alias = Some(n.clone()),
            LinkAttribute::Mtu(m) => d.mtu = Some(*m),
            LinkAttribute::Address(b) if b.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(b);
                d.address = Some(mac);
            }
            LinkAttribute::LinkNetNsId(id) => d.peer_netns = Some(*id),
            LinkAttribute::Link(i) if *i != 0 => d.peer_index = Some(*i),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        d.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    d
}

/// (device index, address, prefix length) of an address message: the local address, or the
/// address when there is no local one (as `ip address` shows it).
pub fn address_of(a: &AddressMessage) -> Option<(u32, IpAddr, u8)> {
    let local = a.attributes.iter().find_map(|at| match at {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let ip = local.or_else(|| {
        a.attributes.iter().find_map(|at| match at {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })?;
    Some((a.header.index, ip, a.header.prefix_len))
}

/// The request that adds `addr/prefix` to device `index`.
pub fn new_address(index: u32, addr: IpAddr, prefix: u8) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = AddressFamily::from(addr);
    m.header.prefix_len = prefix;
    m.header.scope = AddressScope::Universe;
    m.header.index = index;
    m.attributes.push(AddressAttribute::Local(addr));
    m.attributes.push(AddressAttribute::Address(addr));
    m
}

/// The request that adds a route to `dst/prefix` out of device `index`, through `gw` when
/// given (then in the universe scope, else on the link), in the main table.
pub fn new_route(index: u32, dst: IpAddr, prefix: u8, gw: Option<IpAddr>) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = AddressFamily::from(dst);
    m.header.destination_prefix_length = prefix;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.header.protocol = RouteProtocol::Boot;
    m.header.scope = if gw.is_some() {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    m.header.kind = RouteType::Unicast;
    if prefix > 0 {
        m.attributes.push(RouteAttribute::Destination(dst.into()));
    }
    if let Some(g) = gw {
        m.attributes.push(RouteAttribute::Gateway(g.into()));
    }
    m.attributes.push(RouteAttribute::Oif(index));
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::link::InfoKind;
    use netlink_packet_route::route::RouteAddress;
    use netlink_packet_route::RouteNetlinkMessage;

    /// Through the wire format and back, as the kernel reads a request or writes an answer.
    fn through_the_wire(m: RouteNetlinkMessage) -> RouteNetlinkMessage {
        let mut nm = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(m));
        nm.finalize();
        let mut buf = vec![0u8; nm.buffer_len()];
        nm.serialize(&mut buf);
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf)
            .expect("parses")
            .payload
        {
            NetlinkPayload::InnerMessage(m) => m,
            other => panic!("not a route message: {other:?}"),
        }
    }

    #[test]
    fn a_link_message_is_described() {
        let mut m = LinkMessage::default();
        m.header.index = 7;
        m.header.flags = LinkFlags::Up;
        m.attributes = vec![
            LinkAttribute::IfName("vn-a".into()),
            LinkAttribute::IfAlias("vnet:a".into()),
            LinkAttribute::Mtu(1450),
            LinkAttribute::Address(vec![0x52, 0x54, 0, 0, 0, 1]),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth)]),
        ];
        let RouteNetlinkMessage::NewLink(l) = through_the_wire(RouteNetlinkMessage::NewLink(m))
        else {
            panic!("not a link message")
        };
        let d = describe(&l);
        assert_eq!(d.index, 7);
        assert_eq!(d.name, "vn-a");
        assert_eq!(d.alias.as_deref(), Some("vnet:a"));
        assert_eq!(d.mtu, Some(1450));
        assert_eq!(d.address, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(d.kind.as_deref(), Some("veth"));
        assert!(d.up);
    }

    #[test]
    fn an_address_request_reads_back_as_the_address_it_adds() {
        for (addr, prefix) in [("10.1.0.5", 24), ("fd00::5", 64)] {
            let addr: IpAddr = addr.parse().expect("address");
            let m = new_address(7, addr, prefix);
            let RouteNetlinkMessage::NewAddress(back) =
                through_the_wire(RouteNetlinkMessage::NewAddress(m))
            else {
                panic!("not an address message")
            };
            assert_eq!(back.header.family, AddressFamily::from(addr));
            assert_eq!(address_of(&back), Some((7, addr, prefix)));
        }
    }

    #[test]
    fn the_local_address_is_preferred_to_the_peer() {
        let mut m = AddressMessage::default();
        m.header.index = 3;
        m.header.prefix_len = 32;
        let (local, peer): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        m.attributes = vec![
            AddressAttribute::Address(peer),
            AddressAttribute::Local(local),
        ];
        assert_eq!(address_of(&m), Some((3, local, 32)));
        m.attributes = vec![AddressAttribute::Address(peer)];
        assert_eq!(address_of(&m), Some((3, peer, 32)));
        m.attributes.clear();
        assert_eq!(address_of(&m), None);
    }

    #[test]
    fn route_requests() {
        // A default route through a gateway: no destination attribute, universe scope.
        let m = new_route(
            2,
            "0.0.0.0".parse().unwrap(),
            0,
            Some("10.1.0.1".parse().unwrap()),
        );
        let RouteNetlinkMessage::NewRoute(back) =
            through_the_wire(RouteNetlinkMessage::NewRoute(m))
        else {
            panic!("not a route message")
        };
        assert_eq!(back.header.scope, RouteScope::Universe);
        assert_eq!(back.header.table, RouteHeader::RT_TABLE_MAIN);
        assert_eq!(
            back.attributes,
            [
                RouteAttribute::Gateway(RouteAddress::Inet("10.1.0.1".parse().unwrap())),
                RouteAttribute::Oif(2)
            ]
        );
        // A subnet on the link.
        let m = new_route(2, "fd00::".parse().unwrap(), 64, None);
        assert_eq!(m.header.scope, RouteScope::Link);
        assert_eq!(m.header.address_family, AddressFamily::Inet6);
        assert_eq!(
            m.attributes,
            [
                RouteAttribute::Destination(RouteAddress::Inet6("fd00::".parse().unwrap())),
                RouteAttribute::Oif(2)
            ]
        );
    }
}
