//! Taking over from an earlier vnetd (issue #17): what its pinned maps hold, so the new one
//! attaches the same ports and links to the same slots (the forwarding entries, counters and
//! token buckets stay valid), and writes only what differs between the table it compiles and
//! the one the kernel already forwards by.
//!
//! Reading the maps is I/O ([`Earlier::read`]); relating the entries read to the new process's
//! ports ([`known_entries`]) is pure and tested here.

use std::collections::BTreeMap;

use vnet_core::PortId;
use vnet_wire::MacAddr;

use crate::compile::{Action, FwdEntry, FwdKey, KeyKind};
use crate::layout::{self, FwdMapKey, FwdVal, LinkVal, PortVal};
use crate::maps::Map;

/// A forwarding entry as the map holds it: the action word (kind and slot) and the flags.
pub type RawEntry = (u32, u32);

/// What an earlier vnetd left in the maps.
#[derive(Debug, Default)]
pub struct Earlier {
    /// Its ports, by the ifindex of their device.
    pub ports: BTreeMap<u32, PortVal>,
    /// Its links, by slot.
    pub links: BTreeMap<u32, LinkVal>,
    /// Its forwarding table.
    pub fwd: BTreeMap<FwdKey, RawEntry>,
}

impl Earlier {
    /// Reads the maps (reused from an earlier vnetd's pins).
    pub fn read(
        ports: &Map<u32, PortVal>,
        links: &Map<u32, LinkVal>,
        fwd: &Map<FwdMapKey, FwdVal>,
        max_links: u32,
    ) -> Earlier {
        let mut e = Earlier::default();
        for k in ports.keys() {
            if let Ok(Some(p)) = ports.lookup(&k) {
                e.ports.insert(k, p);
            }
        }
        for slot in 0..max_links {
            if let Ok(Some(l)) = links.lookup(&slot) {
                if l.is_set() {
                    e.links.insert(slot, l);
                }
            }
        }
        for k in fwd.keys() {
            let Ok(Some(v)) = fwd.lookup(&k) else {
                continue;
            };
            let Some(kind) = KeyKind::from_wire(k.kind) else {
                continue;
            };
            e.fwd.insert(
                FwdKey {
                    vni: k.vni,
                    kind,
                    src: MacAddr(k.src),
                    dst: MacAddr(k.dst),
                },
                (v.action, v.flags),
            );
        }
        e
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.links.is_empty() && self.fwd.is_empty()
    }
}

/// The entries of the earlier table as the new process's [`FwdEntry`]s, given which of its
/// ports and links now hold which slots; entries that lead to a slot nobody took back are
/// returned apart (`stale`): the table to come either rewrites them or they are deleted.
pub fn known_entries(
    fwd: &BTreeMap<FwdKey, RawEntry>,
    port_slots: &BTreeMap<u32, PortId>,
    link_slots: &BTreeMap<u32, PortId>,
) -> (BTreeMap<FwdKey, FwdEntry>, Vec<FwdKey>) {
    let mut known = BTreeMap::new();
    let mut stale = Vec::new();
    for (k, &(word, flags)) in fwd {
        let (kind, slot) = layout::action_parts(word);
        let action = match kind {
            layout::ACT_NONE => Some(Action::None),
            layout::ACT_SLOW => Some(Action::Slow),
            layout::ACT_PORT => port_slots.get(&slot).map(|p| Action::Port(*p)),
            layout::ACT_LINK => link_slots.get(&slot).map(|l| Action::Link(*l)),
            _ => None,
        };
        match action {
            Some(action) => {
                known.insert(
                    *k,
                    FwdEntry {
                        action,
                        check_src: flags & layout::FWDF_CHECK_SRC != 0,
                    },
                );
            }
            None => stale.push(*k),
        }
    }
    (known, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> FwdKey {
        FwdKey {
            vni: 1,
            kind: KeyKind::Dst,
            src: MacAddr::ZERO,
            dst: MacAddr([2, 0, 0, 0, 0, n]),
        }
    }

    #[test]
    fn entries_follow_their_slots_to_the_new_ports() {
        let mut fwd = BTreeMap::new();
        fwd.insert(key(1), (layout::action(layout::ACT_PORT, 5), 0));
        fwd.insert(
            key(2),
            (layout::action(layout::ACT_LINK, 0), layout::FWDF_CHECK_SRC),
        );
        fwd.insert(key(3), (layout::action(layout::ACT_SLOW, 0), 0));
        fwd.insert(key(4), (layout::action(layout::ACT_PORT, 6), 0)); // nobody took slot 6
        fwd.insert(key(5), (0xff00_0000, 0)); // an action this version does not know
        let ports = BTreeMap::from([(5, PortId(10))]);
        let links = BTreeMap::from([(0, PortId(11))]);
        let (known, stale) = known_entries(&fwd, &ports, &links);
        assert_eq!(known[&key(1)].action, Action::Port(PortId(10)));
        assert_eq!(known[&key(2)].action, Action::Link(PortId(11)));
        assert!(known[&key(2)].check_src);
        assert_eq!(known[&key(3)].action, Action::Slow);
        assert_eq!(stale, vec![key(4), key(5)]);
    }
}
