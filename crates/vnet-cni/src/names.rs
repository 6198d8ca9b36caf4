//! Names of an attachment (pure): the vnetd interface and the device a container's NIC starts
//! as, derived from the network's name, the container id and the interface name, so that
//! DEL, CHECK and GC find them again without any state of the plugin's own.
//!
//! vnetd interface: `cni-<network tag>-<attachment hash>` (29 characters; NAMEs allow 32), so
//! GC can tell this network's interfaces from another's on the same vnetd. Device:
//! `vc<12 hex>` (14 characters; IFNAMSIZ allows 15), unique in the host's namespace until the
//! plugin moves it into the container and renames it.

/// The prefix of every interface the plugin creates in vnetd.
pub const PREFIX: &str = "cni-";

/// FNV-1a, 64 bits: stable across builds and machines (unlike std's hasher).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A separator no part can contain (device names and ids are text).
            h ^= 0;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The part of an interface name that says which network it belongs to: `cni-<8 hex>-`.
pub fn network_prefix(network: &str) -> String {
    format!("{PREFIX}{:08x}-", fnv1a(&[network]) as u32)
}

/// The vnetd interface of one attachment.
pub fn interface_name(network: &str, container_id: &str, ifname: &str) -> String {
    format!(
        "{}{:016x}",
        network_prefix(network),
        fnv1a(&[network, container_id, ifname])
    )
}

/// The device's name until it is moved into the container.
pub fn device_name(network: &str, container_id: &str, ifname: &str) -> String {
    let h = fnv1a(&[network, container_id, ifname, "dev"]);
    format!("vc{:012x}", h & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_within_limits() {
        let n = interface_name("ov", "0123abcd", "eth0");
        assert_eq!(n, interface_name("ov", "0123abcd", "eth0"));
        assert_eq!(n.len(), 29);
        assert!(n.starts_with(&network_prefix("ov")));
        assert!(n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'));
        assert_ne!(n, interface_name("ov", "0123abcd", "eth1"));
        assert_ne!(n, interface_name("ov2", "0123abcd", "eth0"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(
            interface_name("n", "ab", "c"),
            interface_name("n", "a", "bc")
        );
        let d = device_name("ov", "0123abcd", "eth0");
        assert_eq!(d.len(), 14);
        assert!(d.starts_with("vc"));
        // A known value: the names must not change between releases (DEL after an upgrade).
        assert_eq!(fnv1a(&["a"]), 0xaf63dc4c8601ec8c);
    }
}
