//! The etcd key schema of an overlay and its typed records.
//!
//! Everything read from the store is untrusted: a key or value that does not fit the schema is a
//! [`SchemaError`] the caller counts and logs, never a panic. Keys are canonical (parsing a key
//! and rendering it again gives the same text), so one placement cannot hide under two spellings.
//!
//! This file holds the limits, the error, and a store entry as a whole (decode, validate,
//! encode); `names` the checked names, `keys` the key layout, `records` each value's type.

use serde::{Deserialize, Serialize};

mod keys;
mod names;
mod records;
#[cfg(test)]
mod tests;

pub use keys::{
    hosts_prefix, key_for_host, key_for_interface, key_for_matrix, key_for_policy, key_for_route,
    matrix_prefix, overlay_prefix, parse_key, ClusterKey,
};
pub use names::{HostId, OverlayName, RouteId};
pub(crate) use records::mac_text;
pub use records::{
    plan_move, CandidateRecord, HostReach, HostRecord, InterfaceMove, InterfaceRecord,
    OperatorRoute, Policy, RouteRecord,
};

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
pub(crate) const MAX_CAPABILITIES: usize = 32;
pub(crate) const MAX_CAPABILITY_LEN: usize = 32;
pub(crate) const MAX_PUBLIC_KEY_LEN: usize = 256;
/// Candidates accepted in a host record (vnetd publishes at most 8).
pub(crate) const MAX_CANDIDATE_RECORDS: usize = 16;
/// Relays a host record may name.
pub(crate) const MAX_RELAY_RECORDS: usize = 8;

/// The host can be reached by VXLAN over UDP on `udp_port`.
pub const CAP_VXLAN: &str = "vxlan";
/// The host accepts framed TCP links on `tcp_port`.
pub const CAP_TCP: &str = "tcp";
/// The host runs encrypted udp links with its static `public_key` (which it then must have).
pub const CAP_NOISE: &str = "noise";
/// The host relays datagrams between other hosts that cannot reach each other (`--relay`).
pub const CAP_RELAY: &str = "relay";

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

pub(crate) fn bad_value<T>(msg: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError::BadValue(msg.into()))
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
