//! This host's underlay address when `--advertise-addr` is not given: the source address of
//! its route to the first etcd endpoint it can reach (Calico's "can-reach" method), as flannel,
//! Calico and Cilium find theirs.
//!
//! The endpoints are tried in order with a short TCP connect; the first that answers gives the
//! address (the socket's local address, which the kernel chose by route). If none answers now,
//! the kernel's route to each (a UDP `connect`, which sends nothing) still names the address
//! the host would use. Refused, with a message that says so, only when no endpoint has a route
//! or the route leaves from an address other hosts cannot use (loopback, link-local).

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use anyhow::{bail, Result};

/// etcd's client port, when an endpoint names none.
const ETCD_PORT: u16 = 2379;

/// `host` and `port` of an endpoint (`host:port`, `http(s)://host:port[/]`, `[v6]:port`, or a
/// bare host), or None when it is not one.
pub fn endpoint_host_port(e: &str) -> Option<(String, u16)> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .unwrap_or(e)
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', ' ', '?', '#', '@']) {
        return None;
    }
    if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => ETCD_PORT,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match rest.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address.
        Some((h, _)) if h.contains(':') => Some((rest.to_string(), ETCD_PORT)),
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((rest.to_string(), ETCD_PORT)),
    }
}

/// Why an address cannot be advertised to other hosts, if it cannot.
pub fn unusable(addr: IpAddr) -> Option<&'static str> {
    let link_local = match addr {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    };
    if addr.is_unspecified() || addr.is_multicast() {
        Some("not a unicast address")
    } else if addr.is_loopback() {
        Some("a loopback address, which other hosts cannot reach")
    } else if link_local {
        Some("a link-local address, which needs an interface to be reached")
    } else {
        None
    }
}

/// The address chosen and the sentence that says how (for the log).
pub struct Detected {
    pub addr: IpAddr,
    pub how: String,
}

fn resolve(e: &str) -> Vec<SocketAddr> {
    endpoint_host_port(e)
        .and_then(|(h, p)| (h.as_str(), p).to_socket_addrs().ok())
        .map(|a| a.collect())
        .unwrap_or_default()
}

fn route_source(to: SocketAddr) -> std::io::Result<IpAddr> {
    let any = if to.is_ipv4() {
        SocketAddr::from(([0u8; 4], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let s = UdpSocket::bind(any)?;
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
}

/// The underlay address to advertise, from the etcd endpoints.
pub fn from_etcd_endpoints(endpoints: &[String], timeout: Duration) -> Result<Detected> {
    let mut tried = Vec::new();
    for e in endpoints {
        for to in resolve(e) {
            if let Ok(s) = TcpStream::connect_timeout(&to, timeout) {
                if let Ok(local) = s.local_addr() {
                    let addr = local.ip();
                    if let Some(why) = unusable(addr) {
                        bail!(
                            "cannot tell this host's underlay address: the route to etcd endpoint \
                             {e} ({to}) leaves from {addr}, {why}; give --advertise-addr"
                        );
                    }
                    return Ok(Detected {
                        addr,
                        how: format!(
                            "source address of the connection to etcd endpoint {e} ({to})"
                        ),
                    });
                }
            }
            tried.push(to);
        }
    }
    // Nothing answers now (etcd may start later): the kernel's routes still tell.
    for e in endpoints {
        for to in resolve(e) {
            match route_source(to) {
                Ok(addr) if unusable(addr).is_none() => {
                    return Ok(Detected {
                        addr,
                        how: format!(
                            "source address of the route to etcd endpoint {e} ({to}), which does \
                             not answer yet"
                        ),
                    })
                }
                Ok(addr) => bail!(
                    "cannot tell this host's underlay address: the route to etcd endpoint {e} \
                     ({to}) leaves from {addr}, {}; give --advertise-addr",
                    unusable(addr).unwrap_or("unusable")
                ),
                Err(_) => {}
            }
        }
    }
    if tried.is_empty() {
        bail!(
            "cannot tell this host's underlay address: no etcd endpoint resolves ({}); give \
             --advertise-addr",
            endpoints.join(",")
        );
    }
    bail!(
        "cannot tell this host's underlay address: no route to any etcd endpoint ({}); give \
         --advertise-addr",
        endpoints.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let hp = |e: &str| endpoint_host_port(e);
        assert_eq!(hp("10.0.0.1:2379"), Some(("10.0.0.1".into(), 2379)));
        assert_eq!(hp("http://etcd.lab:4001/"), Some(("etcd.lab".into(), 4001)));
        assert_eq!(hp("https://[fd00::1]:2379"), Some(("fd00::1".into(), 2379)));
        assert_eq!(hp("[fd00::1]"), Some(("fd00::1".into(), 2379)));
        assert_eq!(hp("fd00::1"), Some(("fd00::1".into(), 2379)));
        assert_eq!(hp("etcd"), Some(("etcd".into(), 2379)));
        for bad in [
            "",
            "http://",
            "a:b",
            "[fd00::1",
            "[::1]x",
            "http://a/b",
            "u@h:1",
        ] {
            assert_eq!(hp(bad), None, "{bad}");
        }
    }

    #[test]
    fn usable_addresses() {
        let u = |s: &str| unusable(s.parse().unwrap());
        assert!(u("10.0.0.1").is_none());
        assert!(u("2001:db8::1").is_none());
        assert!(u("127.0.0.1").is_some());
        assert!(u("::1").is_some());
        assert!(u("169.254.1.1").is_some());
        assert!(u("fe80::1").is_some());
        assert!(u("0.0.0.0").is_some());
        assert!(u("224.0.0.1").is_some());
    }

    #[test]
    fn a_loopback_route_is_refused() {
        // A listener on loopback: reachable, but its route names no address for other hosts.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = vec![l.local_addr().unwrap().to_string()];
        let err = from_etcd_endpoints(&e, Duration::from_millis(500))
            .err()
            .expect("refused");
        assert!(err.to_string().contains("loopback"), "{err}");
    }
}
