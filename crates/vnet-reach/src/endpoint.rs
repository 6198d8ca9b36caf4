//! Endpoints as one spelling: an IPv4 peer seen through an IPv6 socket (`::ffff:a.b.c.d`) is the
//! same endpoint as `a.b.c.d`, so every map keyed by endpoint uses the canonical form.

use std::net::{IpAddr, SocketAddr};

/// The endpoint with an IPv4-mapped IPv6 address turned into IPv4.
pub fn canonical(ep: SocketAddr) -> SocketAddr {
    SocketAddr::new(ep.ip().to_canonical(), ep.port())
}

/// Whether an address can be a candidate others may reach: not unspecified, loopback,
/// multicast, broadcast or link-local.
pub fn usable(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_link_local())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_addresses_are_ipv4() {
        let a: SocketAddr = "[::ffff:10.0.0.1]:4789".parse().unwrap();
        assert_eq!(canonical(a), "10.0.0.1:4789".parse().unwrap());
        let b: SocketAddr = "[2001:db8::1]:4789".parse().unwrap();
        assert_eq!(canonical(b), b);
    }

    #[test]
    fn usable_addresses() {
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "169.254.1.1",
            "224.0.0.1",
            "::1",
            "fe80::1",
            "::",
        ] {
            assert!(!usable(bad.parse().unwrap()), "{bad}");
        }
        for good in ["10.0.0.1", "203.0.113.7", "2001:db8::1", "::ffff:10.1.2.3"] {
            assert!(usable(good.parse().unwrap()), "{good}");
        }
    }
}
