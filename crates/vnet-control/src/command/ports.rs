//! `interface add|set` and `link add|set`: a port, its options, and its run-time policy (the
//! `rate` and `any-source` options both share).

use vnet_wire::VXLAN_PORT;

use super::words::{
    err, ifname, ip, mac, mtu, name, netns, number, on_off, quote, set_once, socket_addr,
    socket_path, unknown, vni, Words,
};
use crate::command::{
    InterfaceKind, InterfaceSpec, LinkKind, LinkSpec, ParseError, PolicyUpdate, RateLimit,
};

pub(super) fn parse_interface(w: &mut Words) -> Result<InterfaceSpec, ParseError> {
    let name = name(w.next("interface name")?)?;
    let (kind, vhost_socket, device) =
        match w.next("interface type (tap, vhost-user, veth, netdev)")? {
            "tap" => (InterfaceKind::Tap, None, None),
            "vhost-user" => (
                InterfaceKind::VhostUser,
                Some(socket_path(w.next("socket path")?)?),
                None,
            ),
            "veth" => (InterfaceKind::Veth, None, None),
            "netdev" => (
                InterfaceKind::Netdev,
                None,
                Some(ifname(w.next("host device")?)?),
            ),
            o => return unknown("interface type", o, "tap, vhost-user, veth, netdev"),
        };
    let vhost = vhost_socket.is_some();
    let mut spec = InterfaceSpec {
        name,
        kind,
        ifname: device,
        mac: None,
        mtu: None,
        netns: None,
        vni: None,
        queues: None,
        offload: None,
        vhost_socket,
        client: false,
        any_source: false,
        rate: None,
    };
    while let Some(opt) = w.peek() {
        w.pos += 1;
        match opt {
            "ifname" | "netns" | "offload" if vhost => {
                return err(format!("option {opt} is for tap interfaces"))
            }
            "queues" | "offload" if kind == InterfaceKind::Veth => {
                return err(format!("option {opt} is for tap and vhost-user interfaces"))
            }
            "ifname" | "netns" | "offload" | "queues" | "mtu" if kind == InterfaceKind::Netdev => {
                return err(format!(
                    "option {opt} is not for netdev interfaces (the device's owner sets it)"
                ))
            }
            "client" if vhost => spec.client = true,
            "ifname" => set_once(&mut spec.ifname, ifname(w.next("device name")?)?, opt)?,
            "mac" => set_once(&mut spec.mac, mac(w.next("MAC")?)?, opt)?,
            "mtu" => set_once(&mut spec.mtu, mtu(w.next("MTU")?)?, opt)?,
            "netns" => set_once(&mut spec.netns, netns(w.next("namespace name")?)?, opt)?,
            "vni" => set_once(&mut spec.vni, vni(w.next("VNI")?)?, opt)?,
            "queues" => set_once(
                &mut spec.queues,
                number(w.next("queue count")?, "queue count", 1, 16)?,
                opt,
            )?,
            "offload" => set_once(&mut spec.offload, on_off(w.next("on or off")?)?, opt)?,
            "any-source" => {
                if spec.any_source {
                    return err(format!("option {opt} given twice"));
                }
                spec.any_source = true;
            }
            "rate" => set_once(&mut spec.rate, rate_limit(w)?, opt)?,
            o => return unknown("interface option", o, "ifname, mac, mtu, netns, vni, queues, offload, any-source, rate; vhost-user: mac, mtu, vni, queues, client, any-source, rate; veth: ifname, mac, mtu, netns, vni, any-source, rate; netdev: mac, vni, any-source, rate"),
        }
    }
    Ok(spec)
}

pub(super) fn parse_link(w: &mut Words) -> Result<LinkSpec, ParseError> {
    let name = name(w.next("link name")?)?;
    let kind = match w.next("link type (udp, tcp, direct)")? {
        "udp" => LinkKind::Udp(socket_addr(w.next("IP[:PORT]")?, Some(VXLAN_PORT))?),
        "tcp" => match w.next("IP:PORT or accept")? {
            "accept" => LinkKind::TcpAccept(ip(w.next("peer IP")?)?),
            a => LinkKind::TcpDial(socket_addr(a, None)?),
        },
        "direct" => LinkKind::Direct(ifname(w.next("host device")?)?),
        o => return unknown("link type", o, "udp, tcp, direct"),
    };
    let mut v = None;
    let mut encrypt = None;
    let mut reach = None;
    let mut rate = None;
    while let Some(opt) = w.peek() {
        w.pos += 1;
        match opt {
            "vni" => set_once(&mut v, vni(w.next("VNI")?)?, opt)?,
            "encrypt" => {
                if !matches!(kind, LinkKind::Udp(_)) {
                    return err("option encrypt is for udp links only".to_string());
                }
                let k = w.next("the peer's public key (base64)")?;
                let key = vnet_wire::PublicKey::parse(k)
                    .map_err(|e| ParseError(format!("encrypt {}: {e}", quote(k))))?;
                set_once(&mut encrypt, key, opt)?
            }
            "reach" => {
                if !matches!(kind, LinkKind::Udp(_)) {
                    return err("option reach is for udp links only".to_string());
                }
                let k = w.next("the peer's probe key (base64)")?;
                let key = vnet_wire::PublicKey::parse(k)
                    .map_err(|e| ParseError(format!("reach {}: {e}", quote(k))))?;
                set_once(&mut reach, key, opt)?
            }
            "rate" => set_once(&mut rate, rate_limit(w)?, opt)?,
            o => return unknown("link option", o, "vni, encrypt, reach, rate"),
        }
    }
    Ok(LinkSpec {
        name,
        kind,
        vni: v,
        encrypt,
        reach,
        rate,
    })
}

/// After `rate`: `MBIT [burst KB]`.
fn rate_limit(w: &mut Words) -> Result<RateLimit, ParseError> {
    let mbit = number(w.next("Mbit/s")?, "rate (Mbit/s)", 1, RateLimit::MAX_MBIT)?;
    let burst_kb = if w.peek() == Some("burst") {
        w.pos += 1;
        number(w.next("KB")?, "burst (KB)", 1, RateLimit::MAX_BURST_KB)?
    } else {
        RateLimit::default_burst_kb(mbit)
    };
    Ok(RateLimit { mbit, burst_kb })
}

/// The options of `interface set` (`any-source on|off`, `rate MBIT [burst KB] | rate off`) and
/// `link set` (`rate` only); at least one.
pub(super) fn parse_policy_update(
    w: &mut Words,
    interface: bool,
) -> Result<PolicyUpdate, ParseError> {
    let mut u = PolicyUpdate::default();
    let options = if interface {
        "any-source, rate"
    } else {
        "rate"
    };
    while let Some(opt) = w.peek() {
        w.pos += 1;
        match opt {
            "any-source" if interface => {
                set_once(&mut u.any_source, on_off(w.next("on or off")?)?, opt)?
            }
            "rate" => {
                let r = if w.peek() == Some("off") {
                    w.pos += 1;
                    None
                } else {
                    Some(rate_limit(w)?)
                };
                set_once(&mut u.rate, r, opt)?
            }
            o => return unknown("option", o, options),
        }
    }
    if u == PolicyUpdate::default() {
        return err(format!("missing what to set ({options})"));
    }
    Ok(u)
}
