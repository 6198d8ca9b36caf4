//! The route-netlink socket: one request at a time in the calling thread's namespace, every
//! answer checked (an error reply becomes an `io::Error`), and a receive timeout so that a
//! kernel that never answers cannot hang the caller.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::message::{self, describe, LinkDesc};

/// How long an answer may take.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);

/// A route-netlink socket in the calling thread's network namespace.
pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> io::Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        socket2::SockRef::from(&sock).set_read_timeout(Some(RECV_TIMEOUT))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Sends one request and collects the answers (a dump's messages, or nothing but the ACK).
    pub fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        let mut rx: Vec<u8> = Vec::with_capacity(65536);
        loop {
            rx.clear();
            self.sock.recv(&mut rx, 0)?;
            let mut off = 0;
            while off < rx.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "empty netlink reply",
                    ));
                }
                off += len;
                if reply.header.sequence_number != self.seq {
                    continue; // an answer to an earlier request that timed out on our side
                }
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out), // the ACK
                            Some(_) => Err(e.to_io()),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !dump {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The answers to dump request `req` that `pick` takes.
    fn dump<T>(
        &mut self,
        req: RouteNetlinkMessage,
        pick: impl FnMut(RouteNetlinkMessage) -> Option<T>,
    ) -> io::Result<Vec<T>> {
        Ok(self
            .request(req, NLM_F_DUMP)?
            .into_iter()
            .filter_map(pick)
            .collect())
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> io::Result<Vec<LinkDesc>> {
        self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            |m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(describe(&l)),
                _ => None,
            },
        )
    }

    /// The link called `name`, if there is one.
    pub fn link(&mut self, name: &str) -> io::Result<Option<LinkDesc>> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(m)
    }

    /// The link with index `index`, if there is one.
    pub fn link_by_index(&mut self, index: u32) -> io::Result<Option<LinkDesc>> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.get_link(m)
    }

    /// The one link `m` selects, if there is one.
    fn get_link(&mut self, m: LinkMessage) -> io::Result<Option<LinkDesc>> {
        match self.request(RouteNetlinkMessage::GetLink(m), 0) {
            Ok(a) => Ok(a.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(describe(&l)),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every (link index, address) of the namespace.
    pub fn addresses(&mut self) -> io::Result<Vec<(u32, IpAddr)>> {
        let mut out = Vec::new();
        for a in self.address_messages()? {
            for at in &a.attributes {
                if let AddressAttribute::Local(ip) | AddressAttribute::Address(ip) = at {
                    if !out.contains(&(a.header.index, *ip)) {
                        out.push((a.header.index, *ip));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The addresses of link `index`, with their prefix lengths.
    pub fn addresses_of(&mut self, index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
        Ok(self
            .address_messages()?
            .iter()
            .filter_map(message::address_of)
            .filter(|(i, _, _)| *i == index)
            .map(|(_, a, p)| (a, p))
            .collect())
    }

    fn address_messages(&mut self) -> io::Result<Vec<AddressMessage>> {
        self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            |m| match m {
                RouteNetlinkMessage::NewAddress(a) => Some(a),
                _ => None,
            },
        )
    }

    /// Adds `addr/prefix` to link `index`.
    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::NewAddress(message::new_address(index, addr, prefix)),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Adds a route to `dst/prefix` out of link `index`, through `gw` when given.
    pub fn add_route(
        &mut self,
        index: u32,
        dst: IpAddr,
        prefix: u8,
        gw: Option<IpAddr>,
    ) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(message::new_route(index, dst, prefix, gw)),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Renames link `index` (it must be down).
    pub fn set_name(&mut self, index: u32, name: &str) -> io::Result<()> {
        self.set_link(index, LinkAttribute::IfName(name.to_string()))
    }

    /// The device the kernel routes packets to `dst` out of (`lo` for an address of this
    /// host); `None` when no route leads there.
    pub fn route_oif(&mut self, dst: std::net::Ipv4Addr) -> io::Result<Option<u32>> {
        let mut m = RouteMessage::default();
        m.header.address_family = AddressFamily::Inet;
        m.header.destination_prefix_length = 32;
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
        let answers = match self.request(RouteNetlinkMessage::GetRoute(m), 0) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::ENETUNREACH) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(answers.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// Sets link `index`'s MTU.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        self.set_link(index, LinkAttribute::Mtu(mtu))
    }

    /// Sets link `index`'s MAC address.
    pub fn set_address(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        self.set_link(index, LinkAttribute::Address(mac.to_vec()))
    }

    /// Moves link `index` into the namespace open as `ns`.
    pub fn move_to_netns(&mut self, index: u32, ns: &impl AsRawFd) -> io::Result<()> {
        self.set_link(index, LinkAttribute::NetNsFd(ns.as_raw_fd() as RawFd))
    }

    /// Changes one attribute of link `index`.
    fn set_link(&mut self, index: u32, attribute: LinkAttribute) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(attribute);
        self.request(RouteNetlinkMessage::SetLink(m), NLM_F_ACK)
            .map(drop)
    }

    /// Sets link `index` up (or down).
    pub fn set_up(&mut self, index: u32, up: bool) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = if up {
            LinkFlags::Up
        } else {
            LinkFlags::empty()
        };
        m.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(m), NLM_F_ACK)
            .map(drop)
    }

    /// Sets link `index`'s alias (vnet marks what it created with one).
    pub fn set_alias(&mut self, index: u32, alias: &str) -> io::Result<()> {
        self.set_link(index, LinkAttribute::IfAlias(alias.to_string()))
    }

    /// Creates a veth pair `name` <-> `peer`; the peer end goes straight into `peer_ns` when
    /// one is given.
    pub fn add_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: Option<&impl AsRawFd>,
    ) -> io::Result<()> {
        let mut p = LinkMessage::default();
        p.attributes.push(LinkAttribute::IfName(peer.to_string()));
        if let Some(ns) = peer_ns {
            p.attributes
                .push(LinkAttribute::NetNsFd(ns.as_raw_fd() as RawFd));
        }
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(netlink_packet_route::link::InfoData::Veth(
                netlink_packet_route::link::InfoVeth::Peer(p),
            )),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Deletes link `index` (a veth pair goes with both its ends).
    pub fn del_link(&mut self, index: u32) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.request(RouteNetlinkMessage::DelLink(m), NLM_F_ACK)
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_link_is_found_without_privilege() {
        // Reading links needs no privilege; every namespace has `lo`.
        let mut nl = Rtnl::open().expect("netlink socket");
        let lo = nl.link("lo").expect("request").expect("lo exists");
        assert_eq!(lo.index, 1);
        assert!(nl.links().expect("dump").iter().any(|l| l.name == "lo"));
        assert_eq!(nl.link("vn-nosuchdev").expect("request"), None);
        let addrs = nl.addresses().expect("addresses");
        assert!(
            addrs.iter().any(|(i, a)| *i == 1 && a.is_loopback()),
            "{addrs:?}"
        );
        // With their prefixes (lo's IPv4 address is 127.0.0.1/8).
        let lo_addrs = nl.addresses_of(1).expect("addresses of lo");
        assert!(
            lo_addrs.contains(&(IpAddr::from([127, 0, 0, 1]), 8)),
            "{lo_addrs:?}"
        );
        // This host's own address is routed over lo.
        assert_eq!(
            nl.route_oif(std::net::Ipv4Addr::LOCALHOST).expect("route"),
            Some(1)
        );
    }
}
