//! Moving a guest: its interface arriving on the destination, the move transaction as
//! `vnetctl --etcd move` makes it (planned again when the store changed meanwhile), and the
//! probes saying when every agent of the VNI has applied it.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use vnet_cluster::{key_for_host, plan_move, ClusterState};
use vnet_control::DestKind;
use vnet_etcd::{Compare, CompareTarget, TxnOp};
use vnet_wire::MacAddr;

use crate::harness::*;
use crate::recorder::Probe;

impl Harness {
    /// Adds an interface for `mac` on host `to` (the VM arriving there) without moving it yet.
    pub(crate) fn arrive(&self, to: usize, name: &str, mac: MacAddr, vni: u32) -> Result<()> {
        self.hosts[to]
            .recorder
            .change_local(&interface_add(name, mac, vni)?)
    }

    /// The move transaction, as `vnetctl --etcd move` makes it. Refused because the store
    /// changed meanwhile (the destination re-registered under a new lease, say), it is planned
    /// again from a fresh read, as an orchestrator would, up to three times. Returns when the
    /// transaction that succeeded was sent.
    pub(crate) fn move_txn(
        &self,
        state: &ClusterState,
        mac: MacAddr,
        vni: u32,
        to: usize,
        name: &str,
    ) -> Result<Instant> {
        let mut current = state
            .placement(vni, mac)
            .with_context(|| format!("no placement of {mac}"))?
            .clone();
        let to_id = &self.hosts[to].id;
        let host_key = key_for_host(&self.overlay, to_id);
        for _attempt in 0..3 {
            let host_kv = self.client.range(host_key.as_bytes(), None)?;
            let host_kv = host_kv.kvs.first().context("destination not registered")?;
            let plan = plan_move(&self.overlay, &current, to_id, name)?;
            let sent = Instant::now();
            let ok = self.client.txn(
                &[
                    Compare {
                        key: plan.key.clone().into_bytes(),
                        target: CompareTarget::Value(plan.expected_value.clone()),
                    },
                    Compare {
                        key: host_key.clone().into_bytes(),
                        target: CompareTarget::ModRevision(host_kv.mod_revision),
                    },
                ],
                &[TxnOp::Put {
                    key: plan.key.clone().into_bytes(),
                    value: plan.new_value,
                    lease: host_kv.lease,
                }],
                &[],
            )?;
            if ok {
                return Ok(sent);
            }
            let now = self.client.range(plan.key.as_bytes(), None)?;
            let kv = now.kvs.first().with_context(|| format!("{mac} is gone"))?;
            match vnet_cluster::parse_entry(&self.overlay, &plan.key, &kv.value) {
                Ok(vnet_cluster::ClusterEntry::Interface(rec)) => current = rec,
                _ => bail!("{mac}: bad placement in the store"),
            }
        }
        bail!("move of {mac} refused three times (store changed)")
    }

    /// The probes of a set of moves (mac, vni, from, to, name) for every alive agent of the VNI.
    pub(crate) fn move_probes(
        &self,
        moves: &[(MacAddr, u32, usize, usize, String)],
        t0: Instant,
        tags: &mut MoveTags,
    ) -> Vec<usize> {
        let mut probed = Vec::new();
        for (i, h) in self.hosts.iter().enumerate().filter(|(_, h)| h.alive) {
            let mut want = Vec::new();
            let mut gone = Vec::new();
            let (mut want_tags, mut gone_tags) = (Vec::new(), Vec::new());
            for (m, (mac, vni, from, to, name)) in moves.iter().enumerate() {
                if h.vni != *vni {
                    continue;
                }
                let old = &self.hosts[*from].id;
                let new = &self.hosts[*to].id;
                if i == *to {
                    want.push(route_to(*mac, DestKind::Interface, name.clone()));
                } else {
                    want.push(via_link(*mac, new, *vni));
                }
                want_tags.push(m);
                if i == *from {
                    let g = u16::from_be_bytes([mac.0[4], mac.0[5]]);
                    gone.push(route_to(*mac, DestKind::Interface, format!("g{g}")));
                    gone_tags.push(m);
                } else if i != *to {
                    gone.push(via_link(*mac, old, *vni));
                    gone_tags.push(m);
                }
            }
            if !want.is_empty() {
                h.recorder.set_probe(Probe::new(t0, want, gone));
                tags.insert(i, (want_tags, gone_tags));
                probed.push(i);
            }
        }
        probed
    }
}
