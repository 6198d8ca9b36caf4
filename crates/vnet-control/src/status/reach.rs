//! `show reach`: how this host is seen (its candidates, the NAT in front of it, the relays it
//! is bound to) and, per peer host, the path its links take (direct, punched, relayed) with
//! every endpoint tried; a relay's forwarding counters; reach's refusals. vnetd fills it from
//! `vnet-reach`'s machine; this crate only says how it reads.

use std::fmt::{self, Display, Formatter};

use serde::Serialize;

use super::{Col, Columns};

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReachReport {
    /// False without `--etcd` (or with reach off): the rest is empty.
    pub enabled: bool,
    /// This host relays for others (`--relay`).
    pub relay: bool,
    /// `none`, `eim`, `edm` or `unknown`.
    pub nat: String,
    /// `ENDPOINT KIND` each.
    pub candidates: Vec<String>,
    pub bound_relays: Vec<String>,
    pub peers: Vec<ReachPeer>,
    /// Every counter, by name (pings sent, refusals by reason, relay forwarding, ...).
    pub counters: Vec<(String, u64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReachPeer {
    pub host: String,
    /// `direct`, `punched`, `relayed` or `unknown`.
    pub path: String,
    /// The endpoint the links send to (a relay's, when relayed).
    pub endpoint: Option<String>,
    pub rtt_us: Option<u64>,
    /// The path's MTU (the largest outer IP packet), when known.
    pub mtu: Option<usize>,
    /// The peer's NAT as it published it.
    pub nat: String,
    /// `ENDPOINT ORIGIN trusted|-` each.
    pub endpoints: Vec<String>,
}

const PEERS: Columns = Columns(&[
    Col::Left(20),
    Col::Left(8),
    Col::Left(24),
    Col::Right(9),
    Col::Right(5),
    Col::Left(7),
    Col::Rest,
]);

impl Display for ReachReport {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if !self.enabled {
            return f.write_str("reach is off (vnetd runs without --etcd)\n");
        }
        writeln!(f, "relay: {}", if self.relay { "yes" } else { "no" })?;
        writeln!(f, "nat: {}", self.nat)?;
        writeln!(f, "candidates: {}", list(&self.candidates))?;
        writeln!(f, "bound relays: {}", list(&self.bound_relays))?;
        PEERS.row(
            f,
            &[
                &"HOST",
                &"PATH",
                &"ENDPOINT",
                &"RTT_US",
                &"NAT",
                &"ENDPOINTS",
            ],
        )?;
        for p in &self.peers {
            let rtt = p.rtt_us.map_or("-".to_string(), |r| r.to_string());
            let mtu = p.mtu.map_or("-".to_string(), |m| m.to_string());
            PEERS.row(
                f,
                &[
                    &p.host,
                    &p.path,
                    &p.endpoint.as_deref().unwrap_or("-"),
                    &rtt,
                    &mtu,
                    &p.nat,
                    &list(&p.endpoints),
                ],
            )?;
        }
        let counters: Vec<String> = self
            .counters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(f, "counters: {}", counters.join(" "))
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_and_on() {
        assert!(ReachReport::default().to_string().contains("reach is off"));
        let r = ReachReport {
            enabled: true,
            relay: false,
            nat: "eim".into(),
            candidates: vec!["203.0.113.5:4789 reflexive".into()],
            bound_relays: vec!["r".into()],
            peers: vec![ReachPeer {
                host: "b".into(),
                path: "punched".into(),
                endpoint: Some("198.51.100.7:4789".into()),
                rtt_us: Some(812),
                mtu: Some(1280),
                nat: "eim".into(),
                endpoints: vec!["198.51.100.7:4789 reflexive trusted".into()],
            }],
            counters: vec![("pings_sent".into(), 12)],
        };
        let t = r.to_string();
        assert!(t.contains("nat: eim"));
        assert!(t.contains("punched"));
        assert!(t.contains("812"));
        assert!(t.contains("1280"));
        assert!(t.contains("pings_sent=12"));
    }
}
