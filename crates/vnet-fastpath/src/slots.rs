//! Ports and links in their slots: each port and link has a slot (an index of its map entry,
//! its counters and its token bucket), a free one for a new port or link, or the one an earlier
//! vnetd gave the same device or (remote, VNI), so its counters, bucket and forwarding
//! entries carry on across a takeover. Writes their entries, policies and rates.

use std::collections::BTreeSet;

use vnet_core::PortId;

use crate::attach::link_pin_name;
use crate::error::Error;
use crate::fastpath::{FastPath, LinkState, PortState};
use crate::layout::{self, LinkKey, LinkVal, PortVal, RateVal, RelayRxKey};
use crate::spec::{Delivery, LinkSpec, PortPolicy, PortSpec, Program, Rate};
use crate::sysctl::{enable_forwarding, restore_forwarding};

impl FastPath {
    fn free_slot(
        used: impl Iterator<Item = u32>,
        max: u32,
        what: &'static str,
    ) -> Result<u32, Error> {
        let used: BTreeSet<u32> = used.collect();
        (0..max)
            .find(|s| !used.contains(s))
            .ok_or(Error::Full(what, max))
    }

    fn port_val(&self, spec: &PortSpec, slot: u32) -> PortVal {
        let mut flags = 0;
        if spec.policy.any_source {
            flags |= layout::PORT_ANY_SOURCE;
        }
        if spec.delivery == Delivery::Peer {
            flags |= layout::PORT_DELIVER_PEER;
        }
        if spec.policy.rate.is_some() {
            flags |= layout::PORT_RATE;
        }
        PortVal {
            slot,
            vni: spec.vni,
            mtu: spec.mtu,
            flags,
            ifindex: spec.ifindex,
            punt_ifindex: spec.punt_ifindex,
            mac: spec.mac.0,
            pad: 0,
        }
    }

    pub(crate) fn now_ns() -> u64 {
        // bpf_ktime_get_ns is CLOCK_MONOTONIC.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes only into the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn write_rate(&self, idx: u32, rate: Option<Rate>) -> Result<(), Error> {
        let v = match rate {
            Some(r) => RateVal::full(r.bits_per_sec, r.burst_bytes, Self::now_ns()),
            None => RateVal::default(),
        };
        // Under the bucket's spin lock, as the programs update it (BPF_F_LOCK).
        self.maps.rates.update_locked(&idx, &v)
    }

    /// Attaches a fast-path port: its policy and rate go into the maps, `port_ingress` onto
    /// its netdev and `punt_ingress` onto its punt TAP, and the forwarding table is re-applied
    /// so that rules to it now run in the kernel.
    pub fn attach_port(&mut self, spec: &PortSpec) -> Result<(), Error> {
        if self.ports.contains_key(&spec.id) {
            return Err(Error::PortExists(spec.id));
        }
        if spec.ifindex == 0 || spec.punt_ifindex == 0 || spec.ifindex == spec.punt_ifindex {
            return Err(Error::Invalid(format!(
                "port {:?}: ifindex {} and punt ifindex {} must be two devices",
                spec.id, spec.ifindex, spec.punt_ifindex
            )));
        }
        if !(68..=65535).contains(&spec.mtu) || spec.vni > 0x00ff_ffff {
            return Err(Error::Invalid(format!(
                "port {:?}: mtu {} / vni {} out of range",
                spec.id, spec.mtu, spec.vni
            )));
        }
        let taken = self.attached_ifindexes();
        for i in [spec.ifindex, spec.punt_ifindex] {
            if taken.contains(&i) {
                return Err(Error::AlreadyAttached(i));
            }
        }
        // The slot an earlier vnetd gave this device's port, if any: its counters, bucket and
        // forwarding entries carry on.
        let earlier = self
            .pins
            .as_mut()
            .and_then(|p| p.earlier.ports.remove(&spec.ifindex));
        let slot = match earlier {
            Some(e) => e.slot,
            None => Self::free_slot(
                self.ports
                    .values()
                    .map(|p| p.slot)
                    .chain(self.unclaimed_port_slots()),
                self.cfg.max_ports,
                "port",
            )?,
        };
        let val = self.port_val(spec, slot);
        if earlier.is_none() {
            self.maps.counters.zero_percpu(&slot)?;
        }
        if earlier.is_none() || !self.rate_is(slot, spec.policy.rate) {
            self.write_rate(slot, spec.policy.rate)?;
        }
        self.maps.port_slots.update(&slot, &val)?;
        self.maps.ports.update(&spec.ifindex, &val)?;
        self.maps.punts.update(&spec.punt_ifindex, &slot)?;
        let original = enable_forwarding(spec.ifindex);
        let attached = match self.attach(Program::PortIngress, spec.ifindex) {
            Ok(a) => match self.attach(Program::PuntIngress, spec.punt_ifindex) {
                Ok(b) => Ok([a, b]),
                Err(e) => {
                    match (earlier.is_some(), &mut self.pins) {
                        // An earlier vnetd's attachment goes back to be claimed later.
                        (true, Some(p)) => {
                            p.held
                                .insert(link_pin_name(Program::PortIngress, spec.ifindex), a);
                        }
                        _ => self.release_link(Program::PortIngress, spec.ifindex, a),
                    }
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let links = match attached {
            Ok(l) => l,
            Err(e) => {
                if earlier.is_some() {
                    // An earlier vnetd's port stays as it was, for a later attempt.
                    return Err(e);
                }
                let _ = self.maps.ports.delete(&spec.ifindex);
                let _ = self.maps.punts.delete(&spec.punt_ifindex);
                let _ = self.maps.port_slots.update(&slot, &PortVal::default());
                if let Some(o) = self.forwarding.get(&spec.ifindex).or(original.as_ref()) {
                    restore_forwarding(o);
                }
                self.forwarding.remove(&spec.ifindex);
                return Err(e);
            }
        };
        // A value the caller knew (set_forwarding_original) wins over the one found now.
        if let Some(o) = original {
            self.forwarding.entry(spec.ifindex).or_insert(o);
        }
        self.ports.insert(
            spec.id,
            PortState {
                spec: *spec,
                slot,
                links,
            },
        );
        self.reapply()?;
        Ok(())
    }

    /// Slots of an earlier vnetd's ports and links nobody took back yet (not to be given to
    /// new ones before `commit` frees them).
    fn unclaimed_port_slots(&self) -> Vec<u32> {
        self.pins
            .as_ref()
            .map(|p| p.earlier.ports.values().map(|v| v.slot).collect())
            .unwrap_or_default()
    }

    fn unclaimed_link_slots(&self) -> Vec<u32> {
        self.pins
            .as_ref()
            .map(|p| p.earlier.links.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether the bucket at `idx` is already the one `rate` asks for.
    fn rate_is(&self, idx: u32, rate: Option<Rate>) -> bool {
        let Ok(Some(v)) = self.maps.rates.lookup_locked(&idx) else {
            return false;
        };
        let want = match rate {
            Some(r) => RateVal::full(r.bits_per_sec, r.burst_bytes, 0),
            None => RateVal::default(),
        };
        v.params() == want.params()
    }

    /// Changes a port's policy (source check and rate) at run time. A changed rate starts
    /// with a full bucket; an unchanged one keeps its state.
    pub fn update_port(&mut self, id: PortId, policy: &PortPolicy) -> Result<(), Error> {
        let st = self.ports.get(&id).ok_or(Error::UnknownPort(id))?;
        let mut spec = st.spec;
        let slot = st.slot;
        if spec.policy.rate != policy.rate {
            self.write_rate(slot, policy.rate)?;
        }
        spec.policy = *policy;
        let val = self.port_val(&spec, slot);
        self.maps.port_slots.update(&slot, &val)?;
        self.maps.ports.update(&spec.ifindex, &val)?;
        if let Some(st) = self.ports.get_mut(&id) {
            st.spec = spec;
        }
        Ok(())
    }

    /// Detaches a port: rules to it fall back to the slow path first, then its programs and
    /// entries go.
    pub fn detach_port(&mut self, id: PortId) -> Result<(), Error> {
        let st = self.ports.remove(&id).ok_or(Error::UnknownPort(id))?;
        let res = self.reapply();
        // Put forwarding back first: the device is never left forwarding without a program.
        self.restore_forwarding(st.spec.ifindex);
        let [port, punt] = st.links;
        self.release_link(Program::PortIngress, st.spec.ifindex, port);
        self.release_link(Program::PuntIngress, st.spec.punt_ifindex, punt);
        let _ = self.maps.ports.delete(&st.spec.ifindex);
        let _ = self.maps.punts.delete(&st.spec.punt_ifindex);
        self.maps.port_slots.update(&st.slot, &PortVal::default())?;
        res.map(|_| ())
    }

    /// Adds or changes a plain udp link.
    pub fn set_link(&mut self, spec: &LinkSpec) -> Result<(), Error> {
        if spec.vni > 0x00ff_ffff || spec.remote.is_unspecified() || spec.udp_port == 0 {
            return Err(Error::Invalid(format!("link {:?}: {spec:?}", spec.id)));
        }
        let new_key = rx_key(spec);
        if let Some((other, _)) = self
            .links
            .iter()
            .find(|(id, l)| **id != spec.id && rx_key(&l.spec) == new_key)
        {
            return Err(Error::Invalid(format!(
                "link {:?}: ({}, VNI {}) is already link {other:?}",
                spec.id, spec.remote, spec.vni
            )));
        }
        // An earlier vnetd's link to the same (remote, VNI) keeps its slot.
        let earlier = match (self.links.contains_key(&spec.id), &mut self.pins) {
            (false, Some(p)) => {
                let found = p
                    .earlier
                    .links
                    .iter()
                    .find(|(_, l)| l.remote() == spec.remote && l.vni == spec.vni)
                    .map(|(s, _)| *s);
                found.and_then(|s| p.earlier.links.remove(&s).map(|_| s))
            }
            _ => None,
        };
        let (slot, old) = match (self.links.get(&spec.id), earlier) {
            (Some(l), _) => (l.slot, Some(l.spec)),
            (None, Some(s)) => (s, None),
            (None, None) => (
                Self::free_slot(
                    self.links
                        .values()
                        .map(|l| l.slot)
                        .chain(self.unclaimed_link_slots()),
                    self.cfg.max_links,
                    "link",
                )?,
                None,
            ),
        };
        let idx = self.cfg.max_ports + slot;
        if old.is_none() && earlier.is_none() {
            self.maps.counters.zero_percpu(&idx)?;
        }
        let rate_kept = match old {
            Some(o) => o.rate == spec.rate,
            None => earlier.is_some() && self.rate_is(idx, spec.rate),
        };
        if !rate_kept {
            self.write_rate(idx, spec.rate)?;
        }
        let val = LinkVal {
            slot,
            vni: spec.vni,
            remote_be: layout::ip_be(spec.remote),
            local_be: layout::ip_be(spec.local),
            dport_be: spec.udp_port.to_be(),
            flags: if spec.rate.is_some() {
                layout::LINK_RATE
            } else {
                0
            } | if spec.punt { layout::LINK_PUNT } else { 0 }
                | if spec.relay_tag.is_some() {
                    layout::LINK_RELAYED
                } else {
                    0
                },
            sport_be: spec.src_port.unwrap_or(0).to_be(),
            via_ifindex: spec.via_device.unwrap_or(0),
            path_mtu: spec.path_mtu.unwrap_or(0),
            relay_tag: spec.relay_tag.unwrap_or_default(),
            ..LinkVal::default()
        };
        self.maps.links.update(&slot, &val)?;
        if earlier.is_none() {
            self.maps.link_cache.zero_percpu(&slot)?;
        }
        self.insert_rx(&new_key, slot)?;
        if let Some(o) = old {
            let old_key = rx_key(&o);
            if old_key != new_key {
                self.delete_rx(&old_key);
            }
        }
        self.links.insert(spec.id, LinkState { spec: *spec, slot });
        if old.is_none() {
            self.reapply()?;
        }
        Ok(())
    }

    /// Removes a link: rules to it fall back to the slow path first.
    pub fn del_link(&mut self, id: PortId) -> Result<(), Error> {
        let st = self.links.remove(&id).ok_or(Error::UnknownLink(id))?;
        let res = self.reapply();
        self.delete_rx(&rx_key(&st.spec));
        self.maps.links.update(&st.slot, &LinkVal::default())?;
        res.map(|_| ())
    }

    fn insert_rx(&self, key: &RxKey, slot: u32) -> Result<(), Error> {
        match key {
            RxKey::Plain(k) => self.maps.links_rx.update(k, &slot),
            RxKey::Relayed(k) => self.maps.relay_rx.update(k, &slot),
        }
    }

    fn delete_rx(&self, key: &RxKey) {
        let _ = match key {
            RxKey::Plain(k) => self.maps.links_rx.delete(k),
            RxKey::Relayed(k) => self.maps.relay_rx.delete(k),
        };
    }
}

/// How the underlay program finds a link's datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxKey {
    /// By (remote, VNI), and the remote's port when the link's ports are fixed.
    Plain(LinkKey),
    /// Through a relay: by (relay endpoint, VNI, the peer's tag).
    Relayed(RelayRxKey),
}

fn rx_key(spec: &LinkSpec) -> RxKey {
    if let Some(tag) = spec.relay_tag {
        return RxKey::Relayed(RelayRxKey::new(spec.remote, spec.udp_port, spec.vni, tag));
    }
    let sport = if spec.src_port.is_some() {
        spec.udp_port
    } else {
        0
    };
    RxKey::Plain(LinkKey::new(spec.remote, sport, spec.vni))
}
