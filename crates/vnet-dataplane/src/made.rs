//! What vnetd makes on the host outlives vnetd (issue #17): a guest's TAP, a veth pair, the
//! punt TAP of a fast-path port stay when the daemon stops, crashes or is upgraded, so the
//! guest keeps its NIC and its addresses, and the next vnetd adopts them. Only an explicit
//! removal (`interface del`, a teardown) deletes them: [`Made::remove`]; dropping a [`Made`]
//! leaves the device.
//!
//! Whose a device is (issue #32): several vnetds may share a network namespace (each with its
//! own state directory, control and UDP ports), so "vnet made it" is not enough to adopt or
//! remove a device. Every device a vnetd makes carries the alias `vnet:INSTANCE:NAME`:
//! INSTANCE is the daemon's [`Instance`] (made once per state directory, kept in it), NAME the
//! interface. A vnetd adopts and removes only devices of its own instance. Devices made before
//! instances existed carry `vnet:NAME`: a vnetd adopts (and re-marks) such a device only when
//! its state directory recorded it as made (`host.json`, [`Owner::recorded`]), which is what
//! carries an upgrade across; any other one is an earlier version's of another state
//! directory, and is left alone. The decision ([`Owner::whose`]) is pure and tested here.
//!
//! The owner is the process's ([`set_owner`]): vnetd sets it once, from its state directory,
//! before any port opens; a process that sets none (tests, tools) marks devices in the old
//! format and counts every vnet device as its own, as vnetd did before instances.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::RwLock;

use vnet_core::RwLockRecover;

use crate::netlink::Rtnl;
use crate::netns;

pub const ALIAS_PREFIX: &str = "vnet:";

/// A vnetd's identity: 64 random bits, made at the first start of a state directory and kept
/// in it, written as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance(u64);

impl Instance {
    pub fn from_bits(bits: u64) -> Instance {
        Instance(bits)
    }

    pub fn bits(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Not 16 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInstance;

impl fmt::Display for BadInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an instance is 16 lowercase hex digits")
    }
}

impl std::error::Error for BadInstance {}

impl FromStr for Instance {
    type Err = BadInstance;
    fn from_str(s: &str) -> Result<Instance, BadInstance> {
        let ok = s.len() == 16 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if !ok {
            return Err(BadInstance);
        }
        u64::from_str_radix(s, 16)
            .map(Instance)
            .map_err(|_| BadInstance)
    }
}

/// A vnet alias, read: the instance that made the device (`None`: the old format, from before
/// instances) and the interface it was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias<'a> {
    pub instance: Option<&'a str>,
    pub interface: &'a str,
}

/// Reads a device's alias (`None`: not vnet's). Interface names hold no `:` (the control
/// language's names are `A-Z a-z 0-9 _ - .`), so the two formats cannot be confused.
pub fn parse_alias(alias: Option<&str>) -> Option<Alias<'_>> {
    let rest = alias?.strip_prefix(ALIAS_PREFIX)?;
    if rest.is_empty() {
        return None;
    }
    Some(match rest.split_once(':') {
        Some((instance, interface)) => Alias {
            instance: Some(instance),
            interface,
        },
        None => Alias {
            instance: None,
            interface: rest,
        },
    })
}

/// A device vnetd made: where it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MadeDevice {
    /// The named network namespace it is in (`None`: vnetd's own).
    pub netns: Option<String>,
    pub ifname: String,
}

impl MadeDevice {
    pub fn new(netns: Option<&str>, ifname: &str) -> MadeDevice {
        MadeDevice {
            netns: netns.map(str::to_string),
            ifname: ifname.to_string(),
        }
    }
}

/// Whose a device is, as [`Owner::whose`] reads its alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose<'a> {
    /// Not vnet's (no vnet alias): someone else's device.
    NotVnet,
    /// This vnetd's, made for the interface named.
    Mine(&'a str),
    /// Marked in the old format and recorded as made by this state directory: this vnetd's
    /// (an upgrade), to be marked anew when adopted.
    Recorded(&'a str),
    /// Marked in the old format and not recorded here: an earlier version's vnetd of another
    /// state directory. Left alone.
    Unrecorded(&'a str),
    /// Another vnetd's (its instance, the interface).
    Other(&'a str, &'a str),
}

impl Whose<'_> {
    /// The interface the device was made for, when it is this vnetd's.
    pub fn mine(&self) -> Option<&str> {
        match self {
            Whose::Mine(n) | Whose::Recorded(n) => Some(n),
            _ => None,
        }
    }

    /// Says whose it is, for an error message.
    pub fn describe(&self) -> String {
        match self {
            Whose::NotVnet => "not vnet's".into(),
            Whose::Mine(n) | Whose::Recorded(n) => format!("this vnetd's, for interface {n}"),
            Whose::Unrecorded(n) => format!(
                "made by a vnetd of an earlier version for interface {n}, not recorded in this state directory"
            ),
            Whose::Other(i, n) => format!("another vnetd's (instance {i}, interface {n})"),
        }
    }
}

/// Who this process is when it looks at a device: its instance, and what an earlier vnetd of
/// its state directory recorded as made (old-format devices it may adopt).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    /// `None`: no identity (a process that is not vnetd): the old format, every vnet device
    /// counted as its own.
    pub instance: Option<Instance>,
    /// Devices the state directory's `host.json` lists as made (in this network namespace).
    pub recorded: BTreeSet<MadeDevice>,
}

impl Owner {
    pub fn new(instance: Instance, recorded: impl IntoIterator<Item = MadeDevice>) -> Owner {
        Owner {
            instance: Some(instance),
            recorded: recorded.into_iter().collect(),
        }
    }

    /// The alias this vnetd puts on a device it makes for interface `name`.
    pub fn alias(&self, name: &str) -> String {
        match self.instance {
            Some(i) => format!("{ALIAS_PREFIX}{i}:{name}"),
            None => format!("{ALIAS_PREFIX}{name}"),
        }
    }

    /// Whose a device with `alias` is, found at `places` (its place now, and, for a device
    /// looked for by its alias, the place the interface asks for: a guest may have renamed
    /// it since it was recorded).
    pub fn whose<'a>(&self, alias: Option<&'a str>, places: &[&MadeDevice]) -> Whose<'a> {
        let Some(a) = parse_alias(alias) else {
            return Whose::NotVnet;
        };
        let Some(me) = self.instance else {
            return Whose::Mine(a.interface);
        };
        match a.instance {
            Some(i) if i.parse::<Instance>() == Ok(me) => Whose::Mine(a.interface),
            Some(i) => Whose::Other(i, a.interface),
            None if places.iter().any(|p| self.recorded.contains(*p)) => {
                Whose::Recorded(a.interface)
            }
            None => Whose::Unrecorded(a.interface),
        }
    }

    /// Whether a device with `alias` at `places` is this vnetd's, made for `interface`.
    pub fn is_mine_for(
        &self,
        alias: Option<&str>,
        places: &[&MadeDevice],
        interface: &str,
    ) -> bool {
        self.whose(alias, places).mine() == Some(interface)
    }

    /// Whether a device this vnetd adopts needs its alias written anew (an old-format one).
    pub fn needs_mark(&self, alias: Option<&str>, interface: &str) -> bool {
        alias != Some(self.alias(interface).as_str())
    }
}

static OWNER: RwLock<Owner> = RwLock::new(Owner {
    instance: None,
    recorded: BTreeSet::new(),
});

/// Sets who this process is (vnetd: once, before any port opens).
pub fn set_owner(o: Owner) {
    *OWNER.write_or_recover() = o;
}

/// Who this process is.
pub fn owner() -> Owner {
    OWNER.read_or_recover().clone()
}

/// The alias this process puts on a device it makes for interface `name`.
pub fn alias(name: &str) -> String {
    owner().alias(name)
}

/// Something vnetd made for a port that outlives the process unless removed.
pub trait Made: Send + Sync {
    /// Deletes it (the port is gone for good).
    fn remove(&mut self);
    /// The devices it stands for.
    fn devices(&self) -> Vec<MadeDevice>;
}

/// Deletes `dev` if it is still there and still this vnetd's (its alias says so): a device an
/// earlier vnetd of this state directory made for a port the configuration no longer has.
/// Returns whether it did.
pub fn remove_leftover(dev: &MadeDevice) -> io::Result<bool> {
    let place = dev.clone();
    let me = owner();
    let job = move || -> io::Result<bool> {
        let mut nl = Rtnl::open()?;
        match nl.link(&place.ifname)? {
            Some(l) if me.whose(l.alias.as_deref(), &[&place]).mine().is_some() => {
                nl.del_link(l.index)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    };
    match &dev.netns {
        None => job(),
        Some(ns) => match netns::open_netns(ns) {
            Ok(f) => netns::in_netns(&f, job),
            // Its namespace is gone, and the device with it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        },
    }
}

/// The devices of vnetd's own namespace that are this vnetd's (by their alias).
pub fn marked_here() -> io::Result<Vec<MadeDevice>> {
    let me = owner();
    Ok(Rtnl::open()?
        .links()?
        .into_iter()
        .map(|l| (MadeDevice::new(None, &l.name), l.alias))
        .filter(|(d, alias)| me.whose(alias.as_deref(), &[d]).mine().is_some())
        .map(|(d, _)| d)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "00000000000000a1";

    fn me() -> Owner {
        Owner::new(
            ME.parse().unwrap(),
            [
                MadeDevice::new(None, "vh-1"),
                MadeDevice::new(Some("g"), "tap1"),
            ],
        )
    }

    #[test]
    fn instances_are_16_hex_digits() {
        let i: Instance = "0123456789abcdef".parse().unwrap();
        assert_eq!(i.to_string(), "0123456789abcdef");
        assert_eq!(Instance::from_bits(0xa1).to_string(), ME);
        for bad in [
            "",
            "0123",
            "0123456789ABCDEF",
            "0123456789abcdeg",
            "+123456789abcdef",
        ] {
            assert_eq!(bad.parse::<Instance>(), Err(BadInstance), "{bad}");
        }
    }

    #[test]
    fn aliases_name_their_instance_and_interface() {
        assert_eq!(me().alias("c1"), format!("vnet:{ME}:c1"));
        assert_eq!(Owner::default().alias("c1"), "vnet:c1");
        assert_eq!(
            parse_alias(Some(&format!("vnet:{ME}:c1"))),
            Some(Alias {
                instance: Some(ME),
                interface: "c1"
            })
        );
        assert_eq!(
            parse_alias(Some("vnet:c1")),
            Some(Alias {
                instance: None,
                interface: "c1"
            })
        );
        assert_eq!(parse_alias(Some("someone else's")), None);
        assert_eq!(parse_alias(Some("vnet:")), None);
        assert_eq!(parse_alias(None), None);
    }

    #[test]
    fn a_vnetd_owns_only_its_own_devices() {
        let o = me();
        let here = MadeDevice::new(None, "vh-1");
        let elsewhere = MadeDevice::new(None, "vh-2");
        let mine = format!("vnet:{ME}:c1");
        assert_eq!(o.whose(Some(&mine), &[&elsewhere]), Whose::Mine("c1"));
        assert_eq!(
            o.whose(Some("vnet:00000000000000b2:c1"), &[&here]),
            Whose::Other("00000000000000b2", "c1"),
            "another daemon's, even where this one recorded a device"
        );
        // The old format: this state directory's only where host.json recorded it.
        assert_eq!(o.whose(Some("vnet:c1"), &[&here]), Whose::Recorded("c1"));
        assert_eq!(
            o.whose(Some("vnet:c1"), &[&elsewhere]),
            Whose::Unrecorded("c1")
        );
        // A renamed guest NIC: recorded under the name the interface asks for.
        let renamed = MadeDevice::new(Some("g"), "eth0");
        let asked = MadeDevice::new(Some("g"), "tap1");
        assert_eq!(
            o.whose(Some("vnet:c1"), &[&renamed, &asked]),
            Whose::Recorded("c1")
        );
        assert_eq!(
            o.whose(Some("vnet:c1"), &[&renamed]),
            Whose::Unrecorded("c1")
        );
        assert_eq!(o.whose(Some("bridge"), &[&here]), Whose::NotVnet);
        assert_eq!(o.whose(None, &[&here]), Whose::NotVnet);
        assert!(o.is_mine_for(Some(&mine), &[&here], "c1"));
        assert!(!o.is_mine_for(Some(&mine), &[&here], "c2"));
        // A damaged instance is not this one.
        assert!(o.whose(Some("vnet:XYZ:c1"), &[&here]).mine().is_none());
    }

    #[test]
    fn without_an_identity_every_vnet_device_is_its_own() {
        let o = Owner::default();
        let d = MadeDevice::new(None, "x");
        assert_eq!(o.whose(Some("vnet:c1"), &[&d]), Whose::Mine("c1"));
        assert_eq!(
            o.whose(Some(&format!("vnet:{ME}:c1")), &[&d]),
            Whose::Mine("c1")
        );
        assert_eq!(o.whose(Some("other"), &[&d]), Whose::NotVnet);
    }

    #[test]
    fn old_format_devices_are_marked_anew() {
        let o = me();
        assert!(o.needs_mark(Some("vnet:c1"), "c1"));
        assert!(!o.needs_mark(Some(&format!("vnet:{ME}:c1")), "c1"));
    }
}
