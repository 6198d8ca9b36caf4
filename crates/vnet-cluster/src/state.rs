//! The decoded snapshot of an overlay's keys, kept up to date from watch events.

use std::collections::BTreeMap;

use vnet_wire::MacAddr;

use crate::schema::{
    parse_entry, parse_key, ClusterEntry, ClusterKey, HostId, HostRecord, InterfaceRecord,
    OperatorRoute, OverlayName, Policy, RouteId, SchemaError,
};

/// Everything the store says about one overlay. Ordered maps, so iteration (and therefore
/// derivation) does not depend on the order events arrived in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterState {
    overlay: OverlayName,
    hosts: BTreeMap<HostId, HostRecord>,
    interfaces: BTreeMap<(u32, MacAddr), InterfaceRecord>,
    routes: BTreeMap<RouteId, OperatorRoute>,
    policy: Option<Policy>,
}

impl ClusterState {
    pub fn new(overlay: OverlayName) -> Self {
        ClusterState {
            overlay,
            hosts: BTreeMap::new(),
            interfaces: BTreeMap::new(),
            routes: BTreeMap::new(),
            policy: None,
        }
    }

    /// Builds the state from a full read of the overlay's prefix (at start and after every
    /// reconnection). Bad entries are returned with their keys and left out.
    pub fn from_entries<'a>(
        overlay: OverlayName,
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> (Self, Vec<(String, SchemaError)>) {
        let mut s = ClusterState::new(overlay);
        let mut bad = Vec::new();
        for (k, v) in entries {
            if let Err(e) = s.apply_put(k, v) {
                bad.push((k.to_string(), e));
            }
        }
        (s, bad)
    }

    pub fn overlay(&self) -> &OverlayName {
        &self.overlay
    }

    pub fn hosts(&self) -> &BTreeMap<HostId, HostRecord> {
        &self.hosts
    }

    pub fn host(&self, id: &HostId) -> Option<&HostRecord> {
        self.hosts.get(id)
    }

    /// Placements, by (VNI, MAC).
    pub fn interfaces(&self) -> &BTreeMap<(u32, MacAddr), InterfaceRecord> {
        &self.interfaces
    }

    pub fn placement(&self, vni: u32, mac: MacAddr) -> Option<&InterfaceRecord> {
        self.interfaces.get(&(vni, mac))
    }

    pub fn routes(&self) -> &BTreeMap<RouteId, OperatorRoute> {
        &self.routes
    }

    /// The policy in force (`mesh` when none is stored).
    pub fn policy(&self) -> Policy {
        self.policy.clone().unwrap_or_default()
    }

    /// Whether a policy key is stored at all.
    pub fn has_policy(&self) -> bool {
        self.policy.is_some()
    }

    /// A watch's put event. Returns whether the state changed; a bad key or value is an error
    /// and leaves the state as it was (the previous record under that key, if any, stays:
    /// the last good knowledge is kept rather than a hole made).
    pub fn apply_put(&mut self, key: &str, value: &[u8]) -> Result<bool, SchemaError> {
        let entry = parse_entry(&self.overlay, key, value)?;
        Ok(self.insert(entry))
    }

    /// A watch's delete event (also a lease expiring). Returns whether the state changed.
    pub fn apply_delete(&mut self, key: &str) -> Result<bool, SchemaError> {
        Ok(self.remove(&parse_key(&self.overlay, key)?))
    }

    /// Inserts a decoded entry under its own key. Returns whether the state changed.
    pub fn insert(&mut self, entry: ClusterEntry) -> bool {
        fn put<K: Ord, V: PartialEq>(map: &mut BTreeMap<K, V>, k: K, v: V) -> bool {
            if map.get(&k) == Some(&v) {
                return false;
            }
            map.insert(k, v);
            true
        }
        match entry {
            ClusterEntry::Host(h) => put(&mut self.hosts, h.host_id.clone(), h),
            ClusterEntry::Interface(i) => put(&mut self.interfaces, (i.vni, i.mac), i),
            ClusterEntry::Route(r) => put(&mut self.routes, r.id.clone(), r),
            ClusterEntry::Policy(p) => {
                let changed = self.policy.as_ref() != Some(&p);
                self.policy = Some(p);
                changed
            }
        }
    }

    /// Removes what `key` names. Returns whether the state changed.
    pub fn remove(&mut self, key: &ClusterKey) -> bool {
        match key {
            ClusterKey::Host(h) => self.hosts.remove(h).is_some(),
            ClusterKey::Interface { vni, mac } => self.interfaces.remove(&(*vni, *mac)).is_some(),
            ClusterKey::Route(id) => self.routes.remove(id).is_some(),
            ClusterKey::Policy => self.policy.take().is_some(),
        }
    }

    /// Every entry, in key order (for listing and for writing a snapshot back).
    pub fn entries(&self) -> Vec<ClusterEntry> {
        let mut v: Vec<ClusterEntry> = Vec::new();
        v.extend(self.hosts.values().cloned().map(ClusterEntry::Host));
        v.extend(
            self.interfaces
                .values()
                .cloned()
                .map(ClusterEntry::Interface),
        );
        v.extend(self.routes.values().cloned().map(ClusterEntry::Route));
        v.extend(self.policy.clone().map(ClusterEntry::Policy));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{encode, key_for_host, key_for_interface, SCHEMA_VERSION};
    use proptest::prelude::*;

    fn host(id: &str, last: u8) -> HostRecord {
        HostRecord {
            host_id: id.parse().unwrap(),
            addr: format!("10.0.0.{last}").parse().unwrap(),
            udp_port: 4789,
            tcp_port: None,
            capabilities: vec!["vxlan".into()],
            public_key: None,
            version: SCHEMA_VERSION,
            reach: Default::default(),
        }
    }

    fn state() -> ClusterState {
        ClusterState::new("lab".parse().unwrap())
    }

    #[test]
    fn put_delete_and_errors() {
        let mut s = state();
        let o = s.overlay().clone();
        let a = host("a", 1);
        let k = key_for_host(&o, &a.host_id);
        assert!(s.apply_put(&k, &encode(&a)).unwrap());
        assert!(!s.apply_put(&k, &encode(&a)).unwrap());
        assert_eq!(s.host(&a.host_id), Some(&a));
        // a bad value keeps the last good record
        let before = s.clone();
        assert!(s.apply_put(&k, b"garbage").is_err());
        assert!(s.apply_put("/vnet/lab/nope", b"{}").is_err());
        assert!(s.apply_delete("/vnet/other/hosts/a").is_err());
        assert_eq!(s, before);
        assert!(s.apply_delete(&k).unwrap());
        assert!(!s.apply_delete(&k).unwrap());
        assert!(s.hosts().is_empty());
        // policy
        assert_eq!(s.policy(), Policy::Mesh);
        assert!(s
            .apply_put("/vnet/lab/policy", br#"{"template":"explicit"}"#)
            .unwrap());
        assert_eq!(s.policy(), Policy::Explicit);
        assert!(s.has_policy());
        assert!(s.apply_delete("/vnet/lab/policy").unwrap());
        assert!(!s.has_policy());
    }

    #[test]
    fn from_entries_reports_bad_ones() {
        let o: OverlayName = "lab".parse().unwrap();
        let a = encode(&host("a", 1));
        let i = InterfaceRecord {
            mac: "52:54:00:00:00:01".parse().unwrap(),
            vni: 1,
            host_id: "a".parse().unwrap(),
            name: "vm1".into(),
            epoch: 0,
        };
        let ik = key_for_interface(&o, 1, i.mac);
        let iv = encode(&i);
        let entries: Vec<(&str, &[u8])> = vec![
            ("/vnet/lab/hosts/a", &a),
            ("/vnet/lab/hosts/b", &a),
            (&ik, &iv),
            ("/vnet/lab/routes/r", b"{}"),
        ];
        let (s, bad) = ClusterState::from_entries(o, entries);
        assert_eq!(s.hosts().len(), 1);
        assert_eq!(s.placement(1, i.mac), Some(&i));
        assert_eq!(bad.len(), 2);
        assert_eq!(bad[0].0, "/vnet/lab/hosts/b");
        assert_eq!(s.entries().len(), 2);
    }

    fn arb_entry() -> impl Strategy<Value = ClusterEntry> {
        prop_oneof![
            (0u8..4, 1u8..4).prop_map(|(h, a)| ClusterEntry::Host(host(&format!("h{h}"), a))),
            (1u32..3, 1u8..4, 0u8..4, 0u64..3).prop_map(|(vni, m, h, epoch)| {
                ClusterEntry::Interface(InterfaceRecord {
                    mac: vnet_wire::MacAddr([2, 0, 0, 0, 0, m]),
                    vni,
                    host_id: format!("h{h}").parse().unwrap(),
                    name: format!("vm{m}"),
                    epoch,
                })
            }),
            Just(ClusterEntry::Policy(Policy::Explicit)),
        ]
    }

    proptest! {
        #[test]
        fn put_then_delete_restores(
            existing in proptest::collection::vec(arb_entry(), 0..8),
            new in arb_entry(),
        ) {
            let mut s = state();
            for e in existing {
                s.insert(e);
            }
            let key = new.key();
            // only a key that was absent is restored by deleting it
            s.remove(&key);
            let before = s.clone();
            let k = key.to_key(s.overlay());
            prop_assert!(s.apply_put(&k, &new.value()).unwrap());
            prop_assert!(s.apply_delete(&k).unwrap());
            prop_assert_eq!(s, before);
        }

        #[test]
        fn bad_puts_leave_state_unchanged(
            existing in proptest::collection::vec(arb_entry(), 0..6),
            key in "/vnet/lab/[a-z/0-9:]{0,30}",
            value in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut s = state();
            for e in existing {
                s.insert(e);
            }
            let before = s.clone();
            if s.apply_put(&key, &value).is_err() {
                prop_assert_eq!(&s, &before);
            }
            let mid = s.clone();
            if s.apply_delete(&key).is_err() {
                prop_assert_eq!(&s, &mid);
            }
        }
    }
}
