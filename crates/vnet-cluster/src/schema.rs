//! The etcd key schema of an overlay and its typed records.
//!
//! Everything read from the store is untrusted: a key or value that does not fit the schema is a
//! [`SchemaError`] the caller counts and logs, never a panic. Keys are canonical (parsing a key
//! and rendering it again gives the same text), so one placement cannot hide under two spellings.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use vnet_control::{parse_line, Command, RouteOp, RouteSpec};
use vnet_wire::{MacAddr, VNI_MAX};

/// Every overlay lives under `/vnet/<overlay>/`.
pub const KEY_ROOT: &str = "/vnet";
/// Longest key accepted from the store.
pub const MAX_KEY_LEN: usize = 512;
/// Largest value accepted from the store (records are a few hundred bytes).
pub const MAX_VALUE_LEN: usize = 64 * 1024;
/// The record format this crate writes in `HostRecord::version`.
pub const SCHEMA_VERSION: u32 = 1;
/// Host ids are short so that a derived link name `c-<host>-v<vni>` stays a valid NAME
/// (at most 32 characters) for every VNI.
pub const MAX_HOST_ID_LEN: usize = 20;
pub const MAX_OVERLAY_NAME_LEN: usize = 32;
pub const MAX_ROUTE_ID_LEN: usize = 64;
const MAX_CAPABILITIES: usize = 32;
const MAX_CAPABILITY_LEN: usize = 32;
const MAX_PUBLIC_KEY_LEN: usize = 256;

/// The host can be reached by VXLAN over UDP on `udp_port`.
pub const CAP_VXLAN: &str = "vxlan";
/// The host accepts framed TCP links on `tcp_port`.
pub const CAP_TCP: &str = "tcp";
/// The host runs encrypted udp links with its static `public_key` (which it then must have).
pub const CAP_NOISE: &str = "noise";

/// Why a key or value from the store was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("key {0} is not under this overlay's prefix")]
    NotInOverlay(String),
    #[error("unknown or malformed key {0}")]
    BadKey(String),
    #[error("invalid {what} {value} ({rule})")]
    BadName {
        what: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("value of {len} bytes is larger than {max}")]
    ValueTooLarge { len: usize, max: usize },
    #[error("bad value: {0}")]
    BadValue(String),
    #[error("record does not match its key: {0}")]
    KeyMismatch(String),
}

/// Shortens untrusted text before quoting it back in an error.
pub(crate) fn quote(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    format!("{t:?}")
}

fn bad_value<T>(msg: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError::BadValue(msg.into()))
}

const NAME_RULE: &str = "letters, digits, _ - . only, not . or ..";

fn check_name(s: &str, what: &'static str, max: usize) -> Result<(), SchemaError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_-.".contains(&c));
    if ok {
        Ok(())
    } else {
        Err(SchemaError::BadName {
            what,
            value: quote(s),
            rule: NAME_RULE,
        })
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $t:ident, $what:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $t(String);

        impl $t {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $t {
            type Err = SchemaError;
            fn from_str(s: &str) -> Result<Self, SchemaError> {
                check_name(s, $what, $max)?;
                Ok($t(s.to_string()))
            }
        }

        impl TryFrom<String> for $t {
            type Error = SchemaError;
            fn try_from(s: String) -> Result<Self, SchemaError> {
                check_name(&s, $what, $max)?;
                Ok($t(s))
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// The name of an overlay: 1 to 32 of `A-Z a-z 0-9 _ - .`.
    OverlayName,
    "overlay name",
    MAX_OVERLAY_NAME_LEN
);
name_type!(
    /// A host's id in the overlay: 1 to 20 of `A-Z a-z 0-9 _ - .`.
    HostId,
    "host id",
    MAX_HOST_ID_LEN
);
name_type!(
    /// The id of an operator route: 1 to 64 of `A-Z a-z 0-9 _ - .`.
    RouteId,
    "route id",
    MAX_ROUTE_ID_LEN
);

/// What a key of the overlay names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClusterKey {
    Host(HostId),
    Interface { vni: u32, mac: MacAddr },
    Route(RouteId),
    Policy,
}

impl ClusterKey {
    pub fn to_key(&self, overlay: &OverlayName) -> String {
        match self {
            ClusterKey::Host(h) => key_for_host(overlay, h),
            ClusterKey::Interface { vni, mac } => key_for_interface(overlay, *vni, *mac),
            ClusterKey::Route(id) => key_for_route(overlay, id),
            ClusterKey::Policy => key_for_policy(overlay),
        }
    }
}

/// The prefix every key of the overlay starts with (what the daemon watches).
pub fn overlay_prefix(overlay: &OverlayName) -> String {
    format!("{KEY_ROOT}/{overlay}/")
}

pub fn key_for_host(overlay: &OverlayName, host: &HostId) -> String {
    format!("{KEY_ROOT}/{overlay}/hosts/{host}")
}

/// The placement key of a guest NIC: one per (VNI, MAC), so a move rewrites a single key.
pub fn key_for_interface(overlay: &OverlayName, vni: u32, mac: MacAddr) -> String {
    format!("{KEY_ROOT}/{overlay}/interfaces/{vni}/{mac}")
}

pub fn key_for_route(overlay: &OverlayName, id: &RouteId) -> String {
    format!("{KEY_ROOT}/{overlay}/routes/{id}")
}

pub fn key_for_policy(overlay: &OverlayName) -> String {
    format!("{KEY_ROOT}/{overlay}/policy")
}

/// Where a host publishes its traffic matrix (`show matrix json`'s pairs, under its lease) for
/// `vnetctl suggest`. Not part of [`ClusterKey`]: [`parse_key`] refuses these keys, so a daemon
/// that watches the whole prefix skips them before feeding its [`crate::ClusterState`].
pub fn key_for_matrix(overlay: &OverlayName, host: &HostId) -> String {
    format!("{}{host}", matrix_prefix(overlay))
}

/// The prefix of every host's traffic matrix key.
pub fn matrix_prefix(overlay: &OverlayName) -> String {
    format!("{KEY_ROOT}/{overlay}/matrix/")
}

/// Reads a key of `overlay`. Only canonical keys are accepted (those the `key_for_*` functions
/// produce): a VNI with a leading zero or a MAC in upper case is refused.
pub fn parse_key(overlay: &OverlayName, key: &str) -> Result<ClusterKey, SchemaError> {
    if key.len() > MAX_KEY_LEN {
        return Err(SchemaError::BadKey(quote(key)));
    }
    let Some(rest) = key.strip_prefix(&overlay_prefix(overlay)) else {
        return Err(SchemaError::NotInOverlay(quote(key)));
    };
    let bad = || SchemaError::BadKey(quote(key));
    let parts: Vec<&str> = rest.split('/').collect();
    let parsed = match parts.as_slice() {
        ["hosts", h] => ClusterKey::Host(h.parse()?),
        ["interfaces", vni, mac] => {
            let vni: u32 = vni.parse().map_err(|_| bad())?;
            if !(1..=VNI_MAX).contains(&vni) {
                return Err(bad());
            }
            let mac: MacAddr = mac.parse().map_err(|_| bad())?;
            ClusterKey::Interface { vni, mac }
        }
        ["routes", id] => ClusterKey::Route(id.parse()?),
        ["policy"] => ClusterKey::Policy,
        _ => return Err(bad()),
    };
    if parsed.to_key(overlay) != key {
        return Err(bad());
    }
    Ok(parsed)
}

/// A host of the overlay, written by its daemon under the daemon's lease: when the host dies
/// the lease expires and the record (with its interfaces) disappears.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub host_id: HostId,
    /// Underlay address peers send to (IPv4 or IPv6).
    pub addr: IpAddr,
    /// VXLAN port (4789 unless the daemon was given `--udp-port`).
    pub udp_port: u16,
    /// Where the host listens for framed TCP links, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_port: Option<u16>,
    /// What the host can do: [`CAP_VXLAN`], [`CAP_TCP`], [`CAP_NOISE`]; unknown ones are kept.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Base64 static public key for encrypted links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// The record format the writer used ([`SCHEMA_VERSION`]). Readers ignore fields they do
    /// not know, so a newer writer may add some.
    pub version: u32,
}

impl HostRecord {
    pub fn has_capability(&self, cap: &str) -> bool {
        self.capabilities.iter().any(|c| c == cap)
    }

    pub fn validate(&self) -> Result<(), SchemaError> {
        if self.addr.is_unspecified() || self.addr.is_multicast() {
            return bad_value(format!(
                "host {}: address {} is unspecified or multicast",
                self.host_id, self.addr
            ));
        }
        if self.udp_port == 0 || self.tcp_port == Some(0) {
            return bad_value(format!("host {}: port 0", self.host_id));
        }
        if self.has_capability(CAP_TCP) && self.tcp_port.is_none() {
            return bad_value(format!(
                "host {}: capability tcp without tcp_port",
                self.host_id
            ));
        }
        if self.capabilities.len() > MAX_CAPABILITIES {
            return bad_value(format!(
                "host {}: more than {MAX_CAPABILITIES} capabilities",
                self.host_id
            ));
        }
        for c in &self.capabilities {
            let ok = !c.is_empty()
                && c.len() <= MAX_CAPABILITY_LEN
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return bad_value(format!(
                    "host {}: invalid capability {}",
                    self.host_id,
                    quote(c)
                ));
            }
        }
        if let Some(k) = &self.public_key {
            if !is_base64(k) {
                return bad_value(format!(
                    "host {}: public key is not base64 of at most {MAX_PUBLIC_KEY_LEN} characters",
                    self.host_id
                ));
            }
        }
        if self.has_capability(CAP_NOISE) && self.noise_key().is_none() {
            return bad_value(format!(
                "host {}: capability noise without a valid public_key (32 bytes, base64)",
                self.host_id
            ));
        }
        Ok(())
    }

    /// The key encrypted links to this host use: its `public_key`, when it has capability
    /// `noise` and the key is a valid X25519 public key.
    pub fn noise_key(&self) -> Option<vnet_crypto::PublicKey> {
        if !self.has_capability(CAP_NOISE) {
            return None;
        }
        vnet_crypto::PublicKey::parse(self.public_key.as_deref()?).ok()
    }
}

/// Standard base64 with padding; the key itself is checked by whoever uses it.
// `usize::is_multiple_of` is newer than the workspace's rust-version.
#[allow(clippy::manual_is_multiple_of)]
fn is_base64(s: &str) -> bool {
    let body = s.trim_end_matches('=');
    !s.is_empty()
        && s.len() <= MAX_PUBLIC_KEY_LEN
        && s.len() % 4 == 0
        && s.len() - body.len() <= 2
        && body
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
}

pub(crate) mod mac_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use vnet_wire::MacAddr;

    pub fn serialize<S: Serializer>(m: &MacAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(m)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a guest NIC lives: the value of `/vnet/O/interfaces/<vni>/<mac>`, written under the
/// lease of the host it names. `epoch` grows by one on every move, so a stale writer loses the
/// compare-and-swap of [`InterfaceMove`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceRecord {
    #[serde(with = "mac_text")]
    pub mac: MacAddr,
    pub vni: u32,
    pub host_id: HostId,
    /// The interface's NAME on its host (for display; routes use the MAC).
    pub name: String,
    pub epoch: u64,
}

impl InterfaceRecord {
    pub fn key(&self) -> ClusterKey {
        ClusterKey::Interface {
            vni: self.vni,
            mac: self.mac,
        }
    }

    pub fn validate(&self) -> Result<(), SchemaError> {
        if !self.mac.is_unicast() || self.mac == MacAddr::ZERO {
            return bad_value(format!(
                "interface MAC {} must be a non-zero unicast address",
                self.mac
            ));
        }
        if !(1..=VNI_MAX).contains(&self.vni) {
            return bad_value(format!("interface VNI {} out of range", self.vni));
        }
        if !is_control_name(&self.name) {
            return bad_value(format!("invalid interface name {}", quote(&self.name)));
        }
        Ok(())
    }

    /// The record after moving to `host` as `name`: one epoch later.
    pub fn moved_to(&self, host: HostId, name: String) -> Result<InterfaceRecord, SchemaError> {
        let epoch = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| SchemaError::BadValue("interface epoch exhausted".into()))?;
        let next = InterfaceRecord {
            host_id: host,
            name,
            epoch,
            ..self.clone()
        };
        next.validate()?;
        Ok(next)
    }
}

/// A NAME of the control language, by the parser's own rule (so the two cannot drift).
pub(crate) fn is_control_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(|c: char| c.is_whitespace() || c == '#')
        && matches!(parse_line(&format!("link del {name}")), Ok(Some(Command::LinkDel(n))) if n == name)
}

/// The compare-and-swap of one migration: the placement key is rewritten only if it still
/// names `expected_host` at `expected_epoch`.
///
/// In etcd this is one transaction: `If(value(key) == expected_value) Then(Put(key,
/// new_value, lease of the new host's record))`; or, when the caller read the key itself,
/// compare its `mod_revision` instead, after checking [`InterfaceMove::holds`] on what it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceMove {
    pub key: String,
    pub expected_host: HostId,
    pub expected_epoch: u64,
    /// The current record exactly as this crate encodes it (for a compare on the value).
    pub expected_value: Vec<u8>,
    pub new_record: InterfaceRecord,
    pub new_value: Vec<u8>,
}

impl InterfaceMove {
    /// Whether the condition holds for what the store holds now.
    pub fn holds(&self, current: Option<&InterfaceRecord>) -> bool {
        current.is_some_and(|c| {
            c.host_id == self.expected_host
                && c.epoch == self.expected_epoch
                && c.key() == self.new_record.key()
        })
    }
}

/// Plans the move of the interface placed by `current` to host `to`, named `name` there.
pub fn plan_move(
    overlay: &OverlayName,
    current: &InterfaceRecord,
    to: &HostId,
    name: &str,
) -> Result<InterfaceMove, SchemaError> {
    let new_record = current.moved_to(to.clone(), name.to_string())?;
    Ok(InterfaceMove {
        key: key_for_interface(overlay, current.vni, current.mac),
        expected_host: current.host_id.clone(),
        expected_epoch: current.epoch,
        expected_value: encode(current),
        new_value: encode(&new_record),
        new_record,
    })
}

/// The value of `/vnet/O/routes/<id>`: a `route add` line of the control language, for every
/// host or only for `host_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRecord {
    pub line: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<HostId>,
}

/// A decoded, validated operator route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorRoute {
    pub id: RouteId,
    pub host_id: Option<HostId>,
    pub spec: RouteSpec,
}

impl OperatorRoute {
    pub fn from_record(id: RouteId, rec: RouteRecord) -> Result<OperatorRoute, SchemaError> {
        match parse_line(&rec.line) {
            Ok(Some(Command::Route(RouteOp::Add, spec))) => Ok(OperatorRoute {
                id,
                host_id: rec.host_id,
                spec,
            }),
            Ok(_) => bad_value(format!(
                "route {id}: {} is not a route add line",
                quote(&rec.line)
            )),
            Err(e) => bad_value(format!("route {id}: {e}")),
        }
    }

    pub fn to_record(&self) -> RouteRecord {
        RouteRecord {
            line: format!("route add {}", self.spec),
            host_id: self.host_id.clone(),
        }
    }

    /// Whether the route is meant for `host`.
    pub fn applies_to(&self, host: &HostId) -> bool {
        // (`Option::is_none_or` is newer than the workspace's rust-version)
        match &self.host_id {
            None => true,
            Some(h) => h == host,
        }
    }
}

/// The overlay's topology template, the value of `/vnet/O/policy`; absent means `mesh`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "template", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Policy {
    /// Every pair of hosts that serve a common VNI is linked directly.
    #[default]
    Mesh,
    /// Every host links only to `proxy`, which links to all and relays between them.
    Star { proxy: HostId },
    /// Nothing is derived: links come from each host's local configuration, routes from it and
    /// from the operator routes.
    Explicit,
}

/// One decoded entry of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEntry {
    Host(HostRecord),
    Interface(InterfaceRecord),
    Route(OperatorRoute),
    Policy(Policy),
}

impl ClusterEntry {
    pub fn key(&self) -> ClusterKey {
        match self {
            ClusterEntry::Host(h) => ClusterKey::Host(h.host_id.clone()),
            ClusterEntry::Interface(i) => i.key(),
            ClusterEntry::Route(r) => ClusterKey::Route(r.id.clone()),
            ClusterEntry::Policy(_) => ClusterKey::Policy,
        }
    }

    /// The value to store under [`ClusterEntry::key`].
    pub fn value(&self) -> Vec<u8> {
        match self {
            ClusterEntry::Host(h) => encode(h),
            ClusterEntry::Interface(i) => encode(i),
            ClusterEntry::Route(r) => encode(&r.to_record()),
            ClusterEntry::Policy(p) => encode(p),
        }
    }
}

/// The canonical encoding of a record: compact JSON, fields in declaration order.
pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Serializing these plain structs to a Vec cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

fn decode<'a, T: Deserialize<'a>>(value: &'a [u8]) -> Result<T, SchemaError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(SchemaError::ValueTooLarge {
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    serde_json::from_slice(value).map_err(|e| {
        let mut msg = e.to_string();
        msg.truncate(200);
        SchemaError::BadValue(msg)
    })
}

/// Decodes and validates one key/value pair of the store.
pub fn parse_entry(
    overlay: &OverlayName,
    key: &str,
    value: &[u8],
) -> Result<ClusterEntry, SchemaError> {
    let k = parse_key(overlay, key)?;
    let entry = match &k {
        ClusterKey::Host(id) => {
            let h: HostRecord = decode(value)?;
            h.validate()?;
            if &h.host_id != id {
                return Err(SchemaError::KeyMismatch(format!(
                    "host record of {} under key of {id}",
                    h.host_id
                )));
            }
            ClusterEntry::Host(h)
        }
        ClusterKey::Interface { .. } => {
            let i: InterfaceRecord = decode(value)?;
            i.validate()?;
            if i.key() != k {
                return Err(SchemaError::KeyMismatch(format!(
                    "interface {} in VNI {} under key {}",
                    i.mac,
                    i.vni,
                    quote(key)
                )));
            }
            ClusterEntry::Interface(i)
        }
        ClusterKey::Route(id) => {
            let r: RouteRecord = decode(value)?;
            ClusterEntry::Route(OperatorRoute::from_record(id.clone(), r)?)
        }
        ClusterKey::Policy => ClusterEntry::Policy(decode(value)?),
    };
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn o() -> OverlayName {
        "lab".parse().unwrap()
    }

    fn h(s: &str) -> HostId {
        s.parse().unwrap()
    }

    fn mac(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    fn host(id: &str) -> HostRecord {
        HostRecord {
            host_id: h(id),
            addr: "10.0.0.1".parse().unwrap(),
            udp_port: 4789,
            tcp_port: Some(7000),
            capabilities: vec!["vxlan".into(), "tcp".into()],
            public_key: Some("q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=".into()),
            version: SCHEMA_VERSION,
        }
    }

    fn iface() -> InterfaceRecord {
        InterfaceRecord {
            mac: mac("52:54:00:00:0a:01"),
            vni: 7,
            host_id: h("a"),
            name: "vm-a1".into(),
            epoch: 3,
        }
    }

    #[test]
    fn names() {
        assert!("host-1.dc_2".parse::<HostId>().is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ä", &"x".repeat(21)] {
            assert!(bad.parse::<HostId>().is_err(), "{bad}");
        }
        assert!("x".repeat(32).parse::<OverlayName>().is_ok());
        assert!("x".repeat(33).parse::<OverlayName>().is_err());
        assert!(serde_json::from_str::<HostId>("\"a/b\"").is_err());
        assert_eq!(serde_json::to_string(&h("a")).unwrap(), "\"a\"");
    }

    #[test]
    fn keys_round_trip() {
        let o = o();
        assert_eq!(overlay_prefix(&o), "/vnet/lab/");
        let m = mac("52:54:00:00:0a:01");
        for k in [
            ClusterKey::Host(h("a")),
            ClusterKey::Interface { vni: 7, mac: m },
            ClusterKey::Route("r1".parse().unwrap()),
            ClusterKey::Policy,
        ] {
            assert_eq!(parse_key(&o, &k.to_key(&o)).unwrap(), k);
        }
        assert_eq!(
            key_for_interface(&o, 7, m),
            "/vnet/lab/interfaces/7/52:54:00:00:0a:01"
        );
        assert_eq!(key_for_host(&o, &h("a")), "/vnet/lab/hosts/a");
        assert_eq!(key_for_policy(&o), "/vnet/lab/policy");
    }

    #[test]
    fn bad_keys() {
        let o = o();
        assert!(matches!(
            parse_key(&o, "/vnet/other/hosts/a"),
            Err(SchemaError::NotInOverlay(_))
        ));
        for k in [
            "/vnet/lab/",
            "/vnet/lab/hosts",
            "/vnet/lab/hosts/",
            "/vnet/lab/hosts/a/b",
            "/vnet/lab/interfaces/7",
            "/vnet/lab/interfaces/07/52:54:00:00:0a:01",
            "/vnet/lab/interfaces/0/52:54:00:00:0a:01",
            "/vnet/lab/interfaces/16777216/52:54:00:00:0a:01",
            "/vnet/lab/interfaces/7/52:54:00:00:0A:01",
            "/vnet/lab/interfaces/7/52-54-00-00-0a-01",
            "/vnet/lab/interfaces/x/52:54:00:00:0a:01",
            "/vnet/lab/policy/x",
            "/vnet/lab/routes/a b",
            "/vnet/lab/leases/a",
        ] {
            assert!(parse_key(&o, k).is_err(), "{k}");
        }
        assert!(parse_key(&o, &format!("/vnet/lab/hosts/{}", "a".repeat(600))).is_err());
    }

    #[test]
    fn host_records() {
        let o = o();
        let r = host("a");
        let v = encode(&r);
        assert_eq!(
            parse_entry(&o, "/vnet/lab/hosts/a", &v).unwrap(),
            ClusterEntry::Host(r.clone())
        );
        // unknown fields are ignored (a newer writer), missing optional ones default
        let newer = br#"{"host_id":"a","addr":"fd00::1","udp_port":4789,"version":2,"extra":[1]}"#;
        let ClusterEntry::Host(n) = parse_entry(&o, "/vnet/lab/hosts/a", newer).unwrap() else {
            panic!()
        };
        assert!(n.capabilities.is_empty() && n.tcp_port.is_none());
        assert!(matches!(
            parse_entry(&o, "/vnet/lab/hosts/b", &v),
            Err(SchemaError::KeyMismatch(_))
        ));
        let refuse = |f: &dyn Fn(&mut HostRecord)| {
            let mut r = host("a");
            f(&mut r);
            parse_entry(&o, "/vnet/lab/hosts/a", &encode(&r)).unwrap_err()
        };
        refuse(&|r| r.addr = "0.0.0.0".parse().unwrap());
        refuse(&|r| r.addr = "239.0.0.1".parse().unwrap());
        refuse(&|r| r.udp_port = 0);
        refuse(&|r| r.tcp_port = None);
        refuse(&|r| r.capabilities.push("Bad Cap".into()));
        refuse(&|r| r.public_key = Some("abc".into()));
        refuse(&|r| r.public_key = Some("ab=c".into()));
        assert!(parse_entry(&o, "/vnet/lab/hosts/a", b"{").is_err());
        assert!(parse_entry(&o, "/vnet/lab/hosts/a", b"null").is_err());
        assert!(matches!(
            parse_entry(&o, "/vnet/lab/hosts/a", &vec![b' '; MAX_VALUE_LEN + 1]),
            Err(SchemaError::ValueTooLarge { .. })
        ));
    }

    #[test]
    fn interface_records() {
        let o = o();
        let r = iface();
        let key = key_for_interface(&o, 7, r.mac);
        assert_eq!(
            std::str::from_utf8(&encode(&r)).unwrap(),
            r#"{"mac":"52:54:00:00:0a:01","vni":7,"host_id":"a","name":"vm-a1","epoch":3}"#
        );
        assert_eq!(
            parse_entry(&o, &key, &encode(&r)).unwrap(),
            ClusterEntry::Interface(r.clone())
        );
        let other = key_for_interface(&o, 8, r.mac);
        assert!(matches!(
            parse_entry(&o, &other, &encode(&r)),
            Err(SchemaError::KeyMismatch(_))
        ));
        for f in [
            |r: &mut InterfaceRecord| r.mac = MacAddr::BROADCAST,
            |r: &mut InterfaceRecord| r.mac = MacAddr::ZERO,
            |r: &mut InterfaceRecord| r.name = "any".into(),
            |r: &mut InterfaceRecord| r.name = "a b".into(),
            |r: &mut InterfaceRecord| r.name = "a#".into(),
        ] {
            let mut bad = iface();
            f(&mut bad);
            let key = key_for_interface(&o, bad.vni, bad.mac);
            assert!(parse_entry(&o, &key, &encode(&bad)).is_err(), "{bad:?}");
        }
        let bad_mac = br#"{"mac":"zz","vni":7,"host_id":"a","name":"x","epoch":0}"#;
        assert!(parse_entry(&o, &key, bad_mac).is_err());
    }

    #[test]
    fn migration_condition() {
        let o = o();
        let cur = iface();
        let mv = plan_move(&o, &cur, &h("b"), "vm-a1").unwrap();
        assert_eq!(mv.key, "/vnet/lab/interfaces/7/52:54:00:00:0a:01");
        assert_eq!(
            (mv.new_record.host_id.as_str(), mv.new_record.epoch),
            ("b", 4)
        );
        assert_eq!(mv.expected_value, encode(&cur));
        assert_eq!(mv.new_value, encode(&mv.new_record));
        assert!(mv.holds(Some(&cur)));
        assert!(!mv.holds(None));
        assert!(!mv.holds(Some(&mv.new_record)));
        let raced = InterfaceRecord {
            epoch: 4,
            ..cur.clone()
        };
        assert!(!mv.holds(Some(&raced)));
        let spent = InterfaceRecord {
            epoch: u64::MAX,
            ..cur.clone()
        };
        assert!(plan_move(&o, &spent, &h("b"), "x").is_err());
        assert!(plan_move(&o, &cur, &h("b"), "not a name").is_err());
    }

    #[test]
    fn routes_and_policy() {
        let o = o();
        let v = br#"{"line":"route add any 52:54:00:00:0b:01 link c-b-v1","host_id":"a"}"#;
        let ClusterEntry::Route(r) = parse_entry(&o, "/vnet/lab/routes/r1", v).unwrap() else {
            panic!()
        };
        assert!(r.applies_to(&h("a")) && !r.applies_to(&h("b")));
        let again = parse_entry(
            &o,
            "/vnet/lab/routes/r1",
            &ClusterEntry::Route(r.clone()).value(),
        );
        assert_eq!(again.unwrap(), ClusterEntry::Route(r));
        for bad in [
            r#"{"line":"route del any any link x"}"#,
            r#"{"line":"link add x udp 10.0.0.1"}"#,
            r#"{"line":"route add any any link"}"#,
            r#"{"line":""}"#,
            r#"{"line":"route add any any link x","host_id":"a/b"}"#,
        ] {
            assert!(
                parse_entry(&o, "/vnet/lab/routes/r1", bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let p = |s: &str| parse_entry(&o, "/vnet/lab/policy", s.as_bytes());
        assert_eq!(
            p(r#"{"template":"mesh"}"#).unwrap(),
            ClusterEntry::Policy(Policy::Mesh)
        );
        assert_eq!(
            p(r#"{"template":"star","proxy":"hub"}"#).unwrap(),
            ClusterEntry::Policy(Policy::Star { proxy: h("hub") })
        );
        assert_eq!(
            p(r#"{"template":"explicit"}"#).unwrap(),
            ClusterEntry::Policy(Policy::Explicit)
        );
        assert!(p(r#"{"template":"ring"}"#).is_err());
        assert!(p(r#"{"template":"star"}"#).is_err());
        assert_eq!(
            encode(&Policy::Star { proxy: h("hub") }),
            br#"{"template":"star","proxy":"hub"}"#
        );
    }

    proptest! {
        #[test]
        fn parse_key_never_panics(k in ".{0,80}", tail in "[a-z0-9:/._-]{0,40}") {
            let o = o();
            let _ = parse_key(&o, &k);
            let _ = parse_key(&o, &format!("/vnet/lab/{tail}"));
            let _ = parse_key(&o, &format!("/vnet/lab/interfaces/{tail}"));
        }

        #[test]
        fn parse_entry_never_panics(
            which in 0usize..4,
            value in proptest::collection::vec(any::<u8>(), 0..200),
            text in ".{0,120}",
        ) {
            let o = o();
            let key = [
                "/vnet/lab/hosts/a",
                "/vnet/lab/interfaces/7/52:54:00:00:0a:01",
                "/vnet/lab/routes/r1",
                "/vnet/lab/policy",
            ][which];
            let _ = parse_entry(&o, key, &value);
            let _ = parse_entry(&o, key, text.as_bytes());
            let line = serde_json::json!({ "line": text }).to_string();
            let _ = parse_entry(&o, "/vnet/lab/routes/r1", line.as_bytes());
        }
    }
}
