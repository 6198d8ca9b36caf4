//! A relay's pairs in the kernel (`relay_fwd`): vnetd admits a pair of members in user space
//! (`vnet_reach::RelayTable`) and then hands it here, so the pair's datagrams are rewritten and
//! sent on by `underlay_ingress` without reaching vnetd (decisions in user space, the bulk in
//! the kernel, as ovs-vswitchd and the OVS datapath share the work). Each entry carries the
//! pair's own token bucket and counts; datagrams of pairs not here go to vnetd as before.

use crate::error::Error;
use crate::fastpath::FastPath;
use crate::layout::{RateVal, RelayFwdKey, RelayVal};
use crate::spec::{RelayCounts, RelayPair};

impl FastPath {
    /// Forwards `pair` in the kernel from now on, with a full bucket and zero counts (an entry
    /// there before, for the same source and destination tag, is replaced).
    pub fn set_relay_pair(&mut self, pair: &RelayPair) -> Result<(), Error> {
        let bucket = RateVal::full(pair.rate_bps, pair.burst_bytes, FastPath::now_ns());
        let val = RelayVal {
            rate_bps: bucket.rate_bps,
            cap: bucket.cap,
            fill_ns: bucket.fill_ns,
            tokens: bucket.tokens,
            last_ns: bucket.last_ns,
            dst_be: crate::layout::ip_be(*pair.to.ip()),
            dst_port_be: pair.to.port().to_be(),
            src_tag: pair.src_tag,
            local_be: crate::layout::ip_be(pair.local),
            ifindex: pair.ifindex,
            ..RelayVal::default()
        };
        self.maps.relay_fwd.update(&key(pair), &val)
    }

    /// What the kernel forwarded and refused of `pair` since it was set (None: not there).
    pub fn relay_pair_counts(&self, pair: &RelayPair) -> Result<Option<RelayCounts>, Error> {
        Ok(self
            .maps
            .relay_fwd
            .lookup(&key(pair))?
            .map(|v| RelayCounts {
                frames: v.frames,
                bytes: v.bytes,
                rate_limited: v.rate_limited,
            }))
    }

    /// Stops forwarding `pair` in the kernel (its datagrams go to vnetd).
    pub fn del_relay_pair(&mut self, pair: &RelayPair) -> Result<(), Error> {
        self.maps.relay_fwd.delete(&key(pair))
    }

    /// Removes every pair but those `keep` says to keep (what an earlier vnetd left, or a
    /// relay that stopped relaying).
    pub fn retain_relay_pairs(&mut self, keep: impl Fn(&RelayFwdKey) -> bool) {
        let gone: Vec<RelayFwdKey> = self.maps.relay_fwd.keys().filter(|k| !keep(k)).collect();
        for k in gone {
            let _ = self.maps.relay_fwd.delete(&k);
        }
    }
}

/// The map key of `pair`.
pub fn key(pair: &RelayPair) -> RelayFwdKey {
    RelayFwdKey::new(*pair.from.ip(), pair.from.port(), pair.dst_tag)
}
