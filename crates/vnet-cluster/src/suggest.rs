//! Direct links suggested by the traffic matrix (the paper's topology inference, in its
//! simplest form): host pairs that exchange a lot and reach each other only through a proxy.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use vnet_core::MatrixEntry;

use crate::derive::transport;
use crate::schema::{HostId, Policy};
use crate::state::ClusterState;

/// Suggested links are named `d-<host>-v<vni>`, apart from the derived `c-` ones: they are
/// local objects, and so win over derived routes to the same MACs.
pub const SUGGESTED_LINK_PREFIX: &str = "d-";

pub fn suggested_link_name(host: &HostId, vni: u32) -> String {
    format!("{SUGGESTED_LINK_PREFIX}{host}-v{vni}")
}

/// A pair of hosts worth linking directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuggestedLink {
    /// The pair, the smaller host id first.
    pub hosts: (HostId, HostId),
    /// The VNIs their traffic was seen in.
    pub vnis: Vec<u32>,
    /// Both directions, all those VNIs.
    pub bytes: u64,
    pub frames: u64,
}

impl fmt::Display for SuggestedLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vnis: Vec<String> = self.vnis.iter().map(|v| v.to_string()).collect();
        write!(
            f,
            "{} {} bytes {} frames {} vni {}",
            self.hosts.0,
            self.hosts.1,
            self.bytes,
            self.frames,
            vnis.join(",")
        )
    }
}

/// Whether the template already links the two hosts directly for their common VNIs.
fn directly_linked(policy: &Policy, a: &HostId, b: &HostId) -> bool {
    match policy {
        Policy::Mesh => true,
        Policy::Star { proxy } => a == proxy || b == proxy,
        // Links are the operators' own; the store cannot tell.
        Policy::Explicit => false,
    }
}

/// The host pairs whose traffic in `entries` exceeds `threshold_bytes`, that the template does
/// not link directly and that share a transport, ranked by bytes (most first).
///
/// `entries` is one host's traffic matrix (`show matrix json`); under a star the proxy's sees
/// every pair. Merged matrices of several hosts count a frame once per host it crossed, which
/// scales a pair's total but keeps the ranking meaningful.
pub fn suggest(
    entries: &[MatrixEntry],
    state: &ClusterState,
    threshold_bytes: u64,
) -> Vec<SuggestedLink> {
    let policy = state.policy();
    let mut pairs: BTreeMap<(&HostId, &HostId), (BTreeSet<u32>, u64, u64)> = BTreeMap::new();
    for e in entries {
        let (Some(s), Some(d)) = (state.placement(e.vni, e.src), state.placement(e.vni, e.dst))
        else {
            continue;
        };
        let (a, b) = if s.host_id <= d.host_id {
            (&s.host_id, &d.host_id)
        } else {
            (&d.host_id, &s.host_id)
        };
        if a == b {
            continue;
        }
        let p = pairs.entry((a, b)).or_default();
        p.0.insert(e.vni);
        p.1 = p.1.saturating_add(e.bytes);
        p.2 = p.2.saturating_add(e.frames);
    }
    let mut out: Vec<SuggestedLink> = pairs
        .into_iter()
        .filter(|((a, b), (_, bytes, _))| {
            *bytes > threshold_bytes && !directly_linked(&policy, a, b)
        })
        .filter(|((a, b), _)| match (state.host(a), state.host(b)) {
            (Some(ra), Some(rb)) => transport(a, Some(ra), rb).is_some(),
            _ => false,
        })
        .map(|((a, b), (vnis, bytes, frames))| SuggestedLink {
            hosts: (a.clone(), b.clone()),
            vnis: vnis.into_iter().collect(),
            bytes,
            frames,
        })
        .collect();
    out.sort_by(|x, y| y.bytes.cmp(&x.bytes).then_with(|| x.hosts.cmp(&y.hosts)));
    out
}

impl SuggestedLink {
    /// The control-language lines that make the link on `host` (one of the pair): per VNI, a
    /// link to the other host and a route over it for each of the other host's MACs. Both
    /// hosts need their lines (a host accepts VXLAN only from its links' addresses).
    pub fn lines_for(&self, host: &HostId, state: &ClusterState) -> Vec<String> {
        let peer = if *host == self.hosts.0 {
            &self.hosts.1
        } else if *host == self.hosts.1 {
            &self.hosts.0
        } else {
            return Vec::new();
        };
        let (Some(rec), Some(peer_rec)) = (state.host(host), state.host(peer)) else {
            return Vec::new();
        };
        let Some(kind) = transport(host, Some(rec), peer_rec) else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        for v in &self.vnis {
            let name = suggested_link_name(peer, *v);
            lines.push(format!("link add {name} {kind} vni {v}"));
            for p in state.interfaces().values() {
                if &p.host_id == peer && p.vni == *v {
                    lines.push(format!("route add any {} link {name}", p.mac));
                }
            }
        }
        lines
    }

    /// The lines for both hosts of the pair.
    pub fn script(&self, state: &ClusterState) -> Vec<(HostId, Vec<String>)> {
        [&self.hosts.0, &self.hosts.1]
            .into_iter()
            .map(|h| (h.clone(), self.lines_for(h, state)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{ClusterEntry, HostRecord, InterfaceRecord, SCHEMA_VERSION};
    use vnet_control::{parse_line, Command};
    use vnet_wire::MacAddr;

    fn mac(h: u8, i: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, h, i])
    }

    fn state(policy: Policy) -> ClusterState {
        let mut s = ClusterState::new("lab".parse().unwrap());
        for (n, id) in ["hub", "a", "b", "c"].iter().enumerate() {
            s.insert(ClusterEntry::Host(HostRecord {
                host_id: id.parse().unwrap(),
                addr: format!("10.0.0.{}", n + 1).parse().unwrap(),
                udp_port: 4789,
                tcp_port: None,
                capabilities: vec!["vxlan".into()],
                public_key: None,
                version: SCHEMA_VERSION,
                reach: Default::default(),
            }));
            for i in 1..=2 {
                s.insert(ClusterEntry::Interface(InterfaceRecord {
                    mac: mac(n as u8, i),
                    vni: 1,
                    host_id: id.parse().unwrap(),
                    name: format!("vm{i}"),
                    epoch: 0,
                }));
            }
        }
        s.insert(ClusterEntry::Policy(policy));
        s
    }

    fn entry(src: MacAddr, dst: MacAddr, bytes: u64) -> MatrixEntry {
        MatrixEntry {
            vni: 1,
            src,
            dst,
            frames: bytes / 1000,
            bytes,
        }
    }

    fn h(s: &str) -> HostId {
        s.parse().unwrap()
    }

    #[test]
    fn ranks_pairs_behind_the_proxy() {
        let s = state(Policy::Star { proxy: h("hub") });
        let m = [
            entry(mac(1, 1), mac(2, 1), 5_000_000),
            entry(mac(2, 2), mac(1, 2), 1_000_000),
            entry(mac(1, 1), mac(3, 1), 9_000_000),
            entry(mac(2, 1), mac(3, 1), 10), // under the threshold
            entry(mac(0, 1), mac(1, 1), 50_000_000), // with the proxy: already direct
            entry(mac(1, 1), mac(1, 2), 50_000_000), // same host
            entry(mac(9, 1), mac(1, 2), 50_000_000), // unknown MAC
        ];
        let sug = suggest(&m, &s, 1000);
        assert_eq!(sug.len(), 2);
        assert_eq!(sug[0].hosts, (h("a"), h("c")));
        assert_eq!(sug[0].bytes, 9_000_000);
        assert_eq!(sug[1].hosts, (h("a"), h("b")));
        assert_eq!((sug[1].bytes, sug[1].frames), (6_000_000, 6000));
        assert_eq!(sug[1].to_string(), "a b bytes 6000000 frames 6000 vni 1");
        assert!(suggest(&m, &s, 9_000_000).is_empty());
        // a mesh links everyone already; explicit cannot know, so the hub pair counts too
        assert!(suggest(&m, &state(Policy::Mesh), 0).is_empty());
        let explicit = suggest(&m, &state(Policy::Explicit), 1000);
        assert_eq!(explicit.len(), 3);
        assert_eq!(explicit[0].hosts, (h("a"), h("hub")));
    }

    #[test]
    fn lines_are_valid_control_language() {
        let s = state(Policy::Star { proxy: h("hub") });
        let sug = &suggest(&[entry(mac(1, 1), mac(2, 1), 5_000_000)], &s, 0)[0];
        let script = sug.script(&s);
        assert_eq!(script[0].0, h("a"));
        assert_eq!(
            script[0].1,
            [
                "link add d-b-v1 udp 10.0.0.3:4789 vni 1",
                "route add any 52:54:00:00:02:01 link d-b-v1",
                "route add any 52:54:00:00:02:02 link d-b-v1",
            ]
        );
        assert_eq!(script[1].1[0], "link add d-a-v1 udp 10.0.0.2:4789 vni 1");
        for line in script.iter().flat_map(|(_, l)| l) {
            assert!(
                matches!(
                    parse_line(line),
                    Ok(Some(Command::LinkAdd(_) | Command::Route(..)))
                ),
                "{line}"
            );
        }
        assert!(sug.lines_for(&h("c"), &s).is_empty());
    }
}
