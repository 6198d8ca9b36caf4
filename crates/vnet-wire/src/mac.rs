//! IEEE 802 MAC addresses: the key of every route, learned entry and traffic-matrix cell,
//! parsed from and printed to the control language's `52:54:00:12:34:56` form.

use std::fmt;
use std::str::FromStr;

/// An IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// Reads a MAC from the first six bytes of `b` (callers check the length).
    pub fn from_bytes(b: &[u8]) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&b[..6]);
        MacAddr(m)
    }

    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group addresses (broadcast included) have the I/G bit set.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// A locally administered unicast address from 6 random bytes.
    pub fn local_from_random(mut bytes: [u8; 6]) -> MacAddr {
        bytes[0] = (bytes[0] & 0xfc) | 0x02;
        MacAddr(bytes)
    }

    /// A new random locally administered unicast address (the one generator vnetd and
    /// vnet-cni use for NICs given no MAC): the kernel's random source, or should it fail
    /// (extremely unlikely), time-derived bytes.
    #[cfg(feature = "random")]
    pub fn random() -> MacAddr {
        let mut b = [0u8; 6];
        if getrandom::fill(&mut b).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            b.copy_from_slice(&t.to_le_bytes()[..6]);
        }
        MacAddr::local_from_random(b)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?} (expected six hex octets like 52:54:00:12:34:56)")]
pub struct MacParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError(s.chars().take(64).collect());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for slot in out.iter_mut() {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            *slot = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        let m: MacAddr = "52:54:00:AB:cd:0f".parse().unwrap();
        assert_eq!(m.0, [0x52, 0x54, 0x00, 0xab, 0xcd, 0x0f]);
        assert_eq!(m.to_string(), "52:54:00:ab:cd:0f");
        assert!(m.is_unicast());
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!("01:00:5e:00:00:01"
            .parse::<MacAddr>()
            .unwrap()
            .is_multicast());
    }

    #[test]
    fn rejects_bad() {
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0f:11",
            "5254:00:ab:cd:0f",
            "zz:54:00:ab:cd:0f",
            "52:54:00:ab:cd:",
            "+1:54:00:ab:cd:0f",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn random_is_local_unicast() {
        let m = MacAddr::local_from_random([0xff; 6]);
        assert!(m.is_unicast());
        assert_eq!(m.0[0] & 0x02, 0x02);
    }

    #[cfg(feature = "random")]
    #[test]
    fn random_macs_are_local_unicast_and_new_each_time() {
        let macs: Vec<MacAddr> = (0..64).map(|_| MacAddr::random()).collect();
        for m in &macs {
            assert!(m.is_unicast(), "{m}");
            assert_eq!(m.0[0] & 0x02, 0x02, "{m}");
        }
        // 46 random bits each: 64 draws collide with odds of about 2^-35.
        let distinct: std::collections::BTreeSet<_> = macs.iter().collect();
        assert_eq!(distinct.len(), macs.len());
    }

    proptest! {
        #[test]
        fn roundtrip(b in any::<[u8; 6]>()) {
            let m = MacAddr(b);
            prop_assert_eq!(m.to_string().parse::<MacAddr>().unwrap(), m);
        }

        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = s.parse::<MacAddr>();
        }
    }
}
