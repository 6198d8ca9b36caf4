//! The forwarding map: the compiled table written with the fewest changes
//! ([`FastPath::apply_table`]), held while a takeover waits, and the end of a takeover ([`FastPath::commit`]): the
//! difference from the earlier vnetd's table, this process's programs swapped into every
//! link, and what the earlier vnetd had and this one has not let go.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd};

use vnet_core::PortId;

use crate::compile::{plan_update, Action, CompiledTable, FwdEntry, FwdKey};
use crate::error::Error;
use crate::fastpath::FastPath;
use crate::layout::{self, FwdMapKey, FwdVal, LinkKey, LinkVal, PortVal};
use crate::pin;
use crate::spec::{ApplyReport, Program};
use crate::takeover;

impl FastPath {
    /// Replaces the forwarding table with `table` with the fewest map writes: new and changed
    /// entries first, stale ones deleted last, so an entry in both tables is never missing.
    /// Targets that are not attached ports or set links are slow.
    pub fn apply_table(&mut self, table: &CompiledTable) -> Result<ApplyReport, Error> {
        self.table = table.clone();
        self.reapply()
    }

    /// Changes the table where the rules changed: `update` edits the table in place (as
    /// [`crate::recompile`] does) and returns the keys it may have changed; only those entries
    /// are written, in key order (an entry before the ones it leads to), deletes last. No copy
    /// of the table. When the map is short of room for them, or an earlier apply had to leave
    /// entries out, the whole table is planned again as [`FastPath::apply_table`] does (the
    /// degradation to slow is a property of the whole table).
    pub fn update_table(
        &mut self,
        update: impl FnOnce(&mut CompiledTable) -> BTreeSet<FwdKey>,
    ) -> Result<ApplyReport, Error> {
        let keys = update(&mut self.table);
        if self.pins.as_ref().is_some_and(|p| p.holding) {
            return Ok(ApplyReport::default());
        }
        let new_keys = keys
            .iter()
            .filter(|k| self.table.entries.contains_key(k) && !self.current.contains_key(k))
            .count();
        // Written in full earlier (every desired key is in the map) and room for the new keys.
        let whole = self.current.len() == self.table.entries.len()
            && self.current.len() + new_keys <= self.cfg.max_table as usize;
        if !whole {
            return self.reapply();
        }
        let mut report = ApplyReport::default();
        let mut deletes = Vec::new();
        for k in &keys {
            let Some(mut e) = self.table.entries.get(k).copied() else {
                if self.current.contains_key(k) {
                    deletes.push(*k);
                }
                continue;
            };
            if !self.known(e.action) {
                e.action = Action::Slow;
            }
            if self.current.get(k) == Some(&e) {
                continue;
            }
            self.write_entry(k, e, &mut report);
        }
        self.delete_entries(&deletes, &mut report)?;
        Ok(report)
    }

    /// Writes one forwarding entry and records it as the kernel's. A failed write is counted
    /// as the table being full and skipped: within the planned room it cannot happen, and if
    /// it does, the rest still holds (every entry leads only to entries written before it).
    fn write_entry(&mut self, k: &FwdKey, e: FwdEntry, report: &mut ApplyReport) {
        let val = FwdVal {
            action: self.action_word(e.action),
            flags: e.flags(),
        };
        if let Err(err) = self.maps.fwd.update(&map_key(k), &val) {
            tracing::warn!(?k, %err, "fast path: forwarding entry not written");
            self.table_full += 1;
            return;
        }
        self.current.insert(*k, e);
        report.written += 1;
    }

    /// Deletes stale entries (last, after every write, so an entry in both tables is never
    /// missing).
    fn delete_entries(&mut self, keys: &[FwdKey], report: &mut ApplyReport) -> Result<(), Error> {
        for k in keys {
            self.maps.fwd.delete(&map_key(k))?;
            self.current.remove(k);
            report.deleted += 1;
        }
        Ok(())
    }

    /// Whether the target of an action is an attached port or a set link.
    fn known(&self, a: Action) -> bool {
        match a {
            Action::Port(p) => self.ports.contains_key(&p),
            Action::Link(l) => self.links.contains_key(&l),
            _ => true,
        }
    }

    pub(crate) fn reapply(&mut self) -> Result<ApplyReport, Error> {
        if self.pins.as_ref().is_some_and(|p| p.holding) {
            // Taking over: the kernel forwards by the earlier table until `commit`.
            return Ok(ApplyReport::default());
        }
        let mut t = self.table.clone();
        for e in t.entries.values_mut() {
            if !self.known(e.action) {
                e.action = Action::Slow;
            }
        }
        let plan = plan_update(&self.current, &t, self.cfg.max_table as usize);
        let mut report = ApplyReport {
            left_out: plan.left_out,
            ..Default::default()
        };
        self.table_full += plan.left_out as u64;
        for (k, e) in &plan.upserts {
            self.write_entry(k, *e, &mut report);
        }
        self.delete_entries(&plan.deletes, &mut report)?;
        Ok(report)
    }

    fn action_word(&self, a: Action) -> u32 {
        match a {
            Action::None => layout::action(layout::ACT_NONE, 0),
            Action::Slow => layout::action(layout::ACT_SLOW, 0),
            Action::Port(p) => match self.ports.get(&p) {
                Some(st) => layout::action(layout::ACT_PORT, st.slot),
                None => layout::action(layout::ACT_SLOW, 0),
            },
            Action::Link(l) => match self.links.get(&l) {
                Some(st) => layout::action(layout::ACT_LINK, st.slot),
                None => layout::action(layout::ACT_SLOW, 0),
            },
        }
    }

    /// The number of entries in the kernel's forwarding table.
    pub fn table_len(&self) -> usize {
        self.current.len()
    }

    /// Ends a takeover, once the restored configuration's ports and links are attached and its
    /// table applied: writes the difference between the earlier vnetd's table and this one
    /// (nothing, when nothing changed), swaps this process's programs into every link, lets
    /// go of what the earlier vnetd had and this one does not (ports, links, attachments; the
    /// devices' forwarding put back), and pins the maps if they are new. Until then the kernel
    /// forwarded by the earlier state, unchanged.
    pub fn commit(&mut self) -> Result<ApplyReport, Error> {
        let Some(p) = &mut self.pins else {
            return Ok(ApplyReport::default());
        };
        if !p.holding {
            return Ok(ApplyReport::default());
        }
        p.holding = false;
        let earlier = std::mem::take(&mut p.earlier);
        let held = std::mem::take(&mut p.held);
        let links_dir = p.dir.join("links");
        let port_slots: BTreeMap<u32, PortId> =
            self.ports.iter().map(|(id, st)| (st.slot, *id)).collect();
        let link_slots: BTreeMap<u32, PortId> =
            self.links.iter().map(|(id, st)| (st.slot, *id)).collect();
        let (known, stale) = takeover::known_entries(&earlier.fwd, &port_slots, &link_slots);
        self.current = known;
        let mut report = self.reapply()?;
        for k in stale {
            if !self.current.contains_key(&k) {
                let _ = self.maps.fwd.delete(&map_key(&k));
                report.deleted += 1;
            }
        }
        // Every link runs this process's programs from now on.
        let mut swaps: Vec<(Program, u32, BorrowedFd<'_>)> = Vec::new();
        for st in self.ports.values() {
            swaps.push((Program::PortIngress, st.spec.ifindex, st.links[0].as_fd()));
            swaps.push((
                Program::PuntIngress,
                st.spec.punt_ifindex,
                st.links[1].as_fd(),
            ));
        }
        for (ifindex, (p, fd)) in &self.underlays {
            swaps.push((*p, *ifindex, fd.as_fd()));
        }
        for (p, ifindex, fd) in swaps {
            if let Err(e) = pin::update_link(fd, self.progs.fd(p)) {
                tracing::warn!(
                    ifindex,
                    program = p.name(),
                    "kernel fast path: program swap failed: {e}"
                );
            }
        }
        // What the earlier vnetd had and this one has not.
        for (ifindex, pv) in &earlier.ports {
            let _ = self.maps.ports.delete(ifindex);
            let _ = self.maps.punts.delete(&pv.punt_ifindex);
            let _ = self.maps.port_slots.update(&pv.slot, &PortVal::default());
        }
        for (slot, lv) in &earlier.links {
            if lv.flags & crate::layout::LINK_RELAYED != 0 {
                let _ = self.maps.relay_rx.delete(&crate::layout::RelayRxKey::new(
                    lv.remote(),
                    u16::from_be(lv.dport_be),
                    lv.vni,
                    lv.relay_tag,
                ));
            } else {
                let _ = self.maps.links_rx.delete(&LinkKey::of(lv));
            }
            let _ = self.maps.links.update(slot, &LinkVal::default());
        }
        for (name, fd) in held {
            tracing::info!(%name, "kernel fast path: an attachment the configuration no longer has goes");
            let _ = pin::unpin(&links_dir.join(&name));
            drop(fd);
        }
        for ifindex in earlier.ports.keys() {
            self.restore_forwarding(*ifindex);
        }
        if self.pins.as_ref().is_some_and(|p| p.maps_to_pin) {
            self.pin_maps()
                .map_err(|e| Error::Invalid(format!("pinning the maps: {e}")))?;
        }
        tracing::info!(
            written = report.written,
            deleted = report.deleted,
            "kernel fast path: takeover complete"
        );
        Ok(report)
    }
}

impl FwdEntry {
    fn flags(&self) -> u32 {
        if self.check_src {
            layout::FWDF_CHECK_SRC
        } else {
            0
        }
    }
}

/// A key of the compiled table as the map holds it.
fn map_key(k: &FwdKey) -> FwdMapKey {
    FwdMapKey::new(k.vni, k.kind.wire(), k.src, k.dst)
}
