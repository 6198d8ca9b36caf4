//! The value of each key: host, interface placement (and its move), operator route, policy;
//! each with the checks a value read from the store must pass.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use vnet_control::{parse_line, Command, RouteOp, RouteSpec};
use vnet_wire::{MacAddr, VNI_MAX};

use super::keys::{key_for_interface, ClusterKey};
use super::names::{HostId, OverlayName, RouteId};
use crate::schema::{
    bad_value, encode, quote, SchemaError, CAP_NOISE, CAP_TCP, MAX_CANDIDATE_RECORDS,
    MAX_CAPABILITIES, MAX_CAPABILITY_LEN, MAX_PUBLIC_KEY_LEN, MAX_RELAY_RECORDS,
};

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
    /// How others reach the host wherever it is (behind a NAT: docs/design/reach.md).
    #[serde(flatten)]
    pub reach: HostReach,
}

/// The reach part of a host record: absent in records of hosts from before it, which are
/// linked to as before (their address, no probes).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostReach {
    /// Base64 X25519 key that authenticates the host's probes and relay bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_key: Option<String>,
    /// Endpoints where the host's VXLAN socket may be reached, best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<CandidateRecord>,
    /// What observers say of a NAT in front of the host: `none`, `eim` (endpoint-independent
    /// mapping), `edm` (a symmetric NAT); absent while unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat: Option<String>,
    /// The relays (hosts with capability `relay`) the host is bound to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relays: Vec<HostId>,
}

/// One endpoint of a host: `kind` is `advertised`, `reflexive` or `local` (others are kept
/// and read as reflexive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateRecord {
    pub addr: IpAddr,
    pub port: u16,
    pub kind: String,
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
        self.validate_reach()?;
        if self.has_capability(CAP_NOISE) && self.noise_key().is_none() {
            return bad_value(format!(
                "host {}: capability noise without a valid public_key (32 bytes, base64)",
                self.host_id
            ));
        }
        Ok(())
    }

    fn validate_reach(&self) -> Result<(), SchemaError> {
        let r = &self.reach;
        let id = &self.host_id;
        if let Some(k) = &r.probe_key {
            if vnet_crypto::PublicKey::parse(k).is_err() {
                return bad_value(format!("host {id}: probe key is not 32 bytes of base64"));
            }
        }
        if r.candidates.len() > MAX_CANDIDATE_RECORDS {
            return bad_value(format!(
                "host {id}: more than {MAX_CANDIDATE_RECORDS} candidates"
            ));
        }
        for c in &r.candidates {
            if c.addr.is_unspecified() || c.addr.is_multicast() || c.port == 0 {
                return bad_value(format!("host {id}: candidate {}:{}", c.addr, c.port));
            }
            let ok = !c.kind.is_empty()
                && c.kind.len() <= MAX_CAPABILITY_LEN
                && c.kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
            if !ok {
                return bad_value(format!("host {id}: candidate kind {}", quote(&c.kind)));
            }
        }
        if let Some(n) = &r.nat {
            if n.len() > MAX_CAPABILITY_LEN || !n.bytes().all(|b| b.is_ascii_lowercase()) {
                return bad_value(format!("host {id}: nat {}", quote(n)));
            }
        }
        if r.relays.len() > MAX_RELAY_RECORDS {
            return bad_value(format!("host {id}: more than {MAX_RELAY_RECORDS} relays"));
        }
        Ok(())
    }

    /// The key this host's probes are authenticated with, when it published a valid one.
    pub fn probe_key(&self) -> Option<vnet_crypto::PublicKey> {
        vnet_crypto::PublicKey::parse(self.reach.probe_key.as_deref()?).ok()
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
