//! The key layout under `/vnet/<overlay>/`: rendering each key, and reading one back (only its
//! canonical spelling).

use vnet_wire::{MacAddr, VNI_MAX};

use super::names::{HostId, OverlayName, RouteId};
use crate::schema::{quote, SchemaError, KEY_ROOT, MAX_KEY_LEN};

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

/// The prefix of every host record (what a starting agent counts to see registrations settle).
pub fn hosts_prefix(overlay: &OverlayName) -> String {
    format!("{KEY_ROOT}/{overlay}/hosts/")
}

pub fn key_for_host(overlay: &OverlayName, host: &HostId) -> String {
    format!("{}{host}", hosts_prefix(overlay))
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
