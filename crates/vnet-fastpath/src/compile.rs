//! From the routing core's inputs (route rules, ports with their VNI and kind of egress) to the
//! contents of the kernel's forwarding map. Only what the kernel can decide exactly as
//! [`vnet_core::ForwardingTable::decide`] would is compiled; everything else is "slow" (punted
//! to vnetd). Pure: no I/O; the property test at the bottom checks the claim.
//!
//! The map has four kinds of key, one per rank of `vnet_core::RouteTable` (destination rank
//! first, then source): (src, dst), (any, dst), (src, any), (any, any). The kernel looks up
//! (any, dst) first; only when that entry says exact-source entries exist (`check_src`) does it
//! look up (src, dst). When no entry of the destination ranks decides, it falls to (any, any),
//! and from there to (src, any) the same way. So the common case (destination rules only) is
//! one lookup. A `not MAC` rule that could match a destination makes that destination slow; a
//! `not` rule on the any-destination ranks makes the fallback slow; a rank whose best rules
//! name more than one target (or a target that is neither a fast-path port nor a plain udp
//! link) is slow; learning makes everything slow.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use vnet_core::{MacMatch, PortId, RouteRule, RouteTable};
use vnet_wire::MacAddr;

/// What kind of egress a port is, as far as the kernel path cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Egress {
    /// A fast-path port of this host (a veth or netdev with the programs attached).
    FastPort,
    /// A plain IPv4 `udp` link (VXLAN, not encrypted).
    UdpLink,
    /// Anything else: a TAP or vhost-user guest served by vnetd, an encrypted, TCP or direct
    /// link. Frames for it are punted.
    Other,
}

/// A port as the compiler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompilePort {
    pub id: PortId,
    pub vni: u32,
    pub egress: Egress,
}

/// Which rank a key stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyKind {
    /// (any, any): the fallback of a VNI.
    Any,
    /// (any, dst).
    Dst,
    /// (src, dst).
    SrcDst,
    /// (src, any).
    Src,
}

impl KeyKind {
    /// The `FWD_*` value of the C header.
    pub fn wire(self) -> u16 {
        match self {
            KeyKind::SrcDst => crate::layout::FWD_SRC_DST,
            KeyKind::Dst => crate::layout::FWD_DST,
            KeyKind::Src => crate::layout::FWD_SRC,
            KeyKind::Any => crate::layout::FWD_ANY,
        }
    }

    /// The kind of an `FWD_*` value (a map an earlier vnetd wrote).
    pub fn from_wire(w: u16) -> Option<KeyKind> {
        [KeyKind::SrcDst, KeyKind::Dst, KeyKind::Src, KeyKind::Any]
            .into_iter()
            .find(|k| k.wire() == w)
    }
}

/// A key of the forwarding map. Unused MACs are zero. The derived order (VNI, kind, ...) is
/// the order the loader inserts in: fallbacks first, exact-source entries after the
/// destination entries that point at them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FwdKey {
    pub vni: u32,
    pub kind: KeyKind,
    pub src: MacAddr,
    pub dst: MacAddr,
}

/// What the kernel does with a frame a key matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// No rule of this rank: look at the next rank.
    None,
    /// Punt to vnetd.
    Slow,
    /// Deliver to this fast-path port.
    Port(PortId),
    /// Encapsulate to this plain udp link.
    Link(PortId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FwdEntry {
    pub action: Action,
    /// Exact-source entries exist below this one: look them up first.
    pub check_src: bool,
}

/// The compiled forwarding table: the map's whole desired contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompiledTable {
    pub entries: BTreeMap<FwdKey, FwdEntry>,
}

impl CompiledTable {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The lookup the BPF program does (`fwd_decide` in fastpath.bpf.c), on this table:
    /// [`Action::None`] when nothing decides (the program punts).
    pub fn lookup(&self, vni: u32, src: MacAddr, dst: MacAddr) -> Action {
        let get = |kind, s, d| {
            self.entries.get(&FwdKey {
                vni,
                kind,
                src: s,
                dst: d,
            })
        };
        if let Some(e) = get(KeyKind::Dst, MacAddr::ZERO, dst) {
            if e.check_src {
                if let Some(s) = get(KeyKind::SrcDst, src, dst) {
                    return s.action;
                }
            }
            if e.action != Action::None {
                return e.action;
            }
        }
        let Some(e) = get(KeyKind::Any, MacAddr::ZERO, MacAddr::ZERO) else {
            return Action::None;
        };
        if e.check_src {
            if let Some(s) = get(KeyKind::Src, src, MacAddr::ZERO) {
                return s.action;
            }
        }
        e.action
    }
}

fn has_not(r: &RouteRule) -> bool {
    matches!(r.src, MacMatch::Not(_)) || matches!(r.dst, MacMatch::Not(_))
}

/// Writes the entries of one destination key of `vni`, `dst` (`Some(d)`: the (any, d) entry
/// and its (source, d) entries; `None`: the VNI's fallback (any, any) and (source, any)
/// entries): the base entry (slow when a rule that matches there has a `not`; else the action
/// of the `group`'s any-source rules, flagged to check the source when a rule names one) and a
/// narrower entry for each source a rule names.
fn write_rank(
    out: &mut CompiledTable,
    slow: bool,
    group: &[&RouteRule],
    vni: u32,
    dst: Option<MacAddr>,
    port: &impl Fn(PortId) -> Option<CompilePort>,
) {
    let key = |kind, src, dst| FwdKey {
        vni,
        kind,
        src,
        dst,
    };
    let base = match dst {
        Some(d) => key(KeyKind::Dst, MacAddr::ZERO, d),
        None => key(KeyKind::Any, MacAddr::ZERO, MacAddr::ZERO),
    };
    let narrow = |s| match dst {
        Some(d) => key(KeyKind::SrcDst, s, d),
        None => key(KeyKind::Src, s, MacAddr::ZERO),
    };
    let act = |t: &BTreeSet<PortId>| action_for(t, port);
    if slow {
        let e = FwdEntry {
            action: Action::Slow,
            check_src: false,
        };
        out.entries.insert(base, e);
        return;
    }
    let mut any_src = BTreeSet::new();
    let mut by_src: BTreeMap<MacAddr, BTreeSet<PortId>> = BTreeMap::new();
    for r in group {
        match r.src {
            MacMatch::Any => {
                any_src.insert(r.dest);
            }
            MacMatch::Exact(s) => {
                by_src.entry(s).or_default().insert(r.dest);
            }
            MacMatch::Not(_) => unreachable!("a group with a `not` is slow"),
        }
    }
    for (s, t) in &by_src {
        let e = FwdEntry {
            action: act(t),
            check_src: false,
        };
        out.entries.insert(narrow(*s), e);
    }
    let e = FwdEntry {
        action: act(&any_src),
        check_src: !by_src.is_empty(),
    };
    if e.action != Action::None || e.check_src {
        out.entries.insert(base, e);
    }
}

/// The action for the best rank's set of targets.
fn action_for(targets: &BTreeSet<PortId>, port: &impl Fn(PortId) -> Option<CompilePort>) -> Action {
    let mut it = targets.iter();
    match (it.next(), it.next()) {
        (None, _) => Action::None,
        (Some(p), None) => match port(*p).map(|p| p.egress) {
            Some(Egress::FastPort) => Action::Port(*p),
            Some(Egress::UdpLink) => Action::Link(*p),
            _ => Action::Slow,
        },
        _ => Action::Slow,
    }
}

/// The entries of one unicast destination `d` of `vni`: its (any, dst) entry and its
/// (src, dst) entries, from the rules whose destination is exactly `d` (`exact`) and the
/// VNI's wildcard rules (`wild`). Nothing when no rule names `d`.
fn compile_dest(
    out: &mut CompiledTable,
    vni: u32,
    d: MacAddr,
    exact: &[&RouteRule],
    wild: &[&RouteRule],
    port: &impl Fn(PortId) -> Option<CompilePort>,
) {
    if exact.is_empty() || !d.is_unicast() {
        return;
    }
    let slow =
        exact.iter().any(|r| has_not(r)) || wild.iter().any(|r| r.dst.matches(d) && has_not(r));
    write_rank(out, slow, exact, vni, Some(d), port);
}

/// The fallback entries of `vni`: from the rules whose destination is `any` or `not X`.
fn compile_wild(
    out: &mut CompiledTable,
    vni: u32,
    wild: &[&RouteRule],
    port: &impl Fn(PortId) -> Option<CompilePort>,
) {
    let slow = wild.iter().any(|r| has_not(r));
    write_rank(out, slow, wild, vni, None, port);
}

/// Compiles the rules of every VNI. Rules whose destination is not a port of their VNI are
/// ignored, as `ForwardingTable::new` ignores them.
pub fn compile(ports: &[CompilePort], rules: &[RouteRule], learning: bool) -> CompiledTable {
    let mut out = CompiledTable::default();
    if learning {
        return out;
    }
    let port: BTreeMap<PortId, CompilePort> = ports.iter().map(|p| (p.id, *p)).collect();
    let port = |id: PortId| port.get(&id).copied();
    // Per VNI: the rules by exact destination, and the wildcards.
    type Groups<'a> = (BTreeMap<MacAddr, Vec<&'a RouteRule>>, Vec<&'a RouteRule>);
    let mut by_vni: BTreeMap<u32, Groups<'_>> = BTreeMap::new();
    for r in rules {
        if port(r.dest).map(|p| p.vni) != Some(r.vni) {
            continue;
        }
        let g = by_vni.entry(r.vni).or_default();
        match r.dst {
            MacMatch::Exact(d) => g.0.entry(d).or_default().push(r),
            _ => g.1.push(r),
        }
    }
    for (vni, (exact, wild)) in by_vni {
        for (d, rs) in &exact {
            compile_dest(&mut out, vni, *d, rs, &wild, &port);
        }
        compile_wild(&mut out, vni, &wild, &port);
    }
    out
}

/// Where the rules changed (the routing core's notion: the route caches forget the same).
pub use vnet_core::Touched;

/// Brings `table` (compiled from the rules before the change) in line with `routes` at the
/// `touched` places only, so that it equals a full [`compile`] of `routes`; returns the keys
/// whose entry may have changed (set or gone), for the map writes. `routes` holds only rules
/// whose destination is a port of their VNI (a `vnet_core::ForwardingTable`'s). A change of
/// the wildcards recompiles the whole VNI; a change of one destination, that destination.
pub fn recompile(
    table: &mut CompiledTable,
    routes: &RouteTable,
    touched: &[Touched],
    port: impl Fn(PortId) -> Option<CompilePort>,
    learning: bool,
) -> BTreeSet<FwdKey> {
    let mut keys = BTreeSet::new();
    if learning {
        return keys;
    }
    let mut dsts: BTreeSet<(u32, MacAddr)> = BTreeSet::new();
    let mut vnis: BTreeSet<u32> = BTreeSet::new();
    for t in touched {
        match *t {
            Touched::Dst(vni, d) => {
                dsts.insert((vni, d));
            }
            Touched::Wild(vni) => {
                vnis.insert(vni);
            }
        }
    }
    dsts.retain(|(vni, _)| !vnis.contains(vni));
    let mut fresh = CompiledTable::default();
    for vni in &vnis {
        let lo = FwdKey {
            vni: *vni,
            kind: KeyKind::Any,
            src: MacAddr::ZERO,
            dst: MacAddr::ZERO,
        };
        let hi = FwdKey {
            vni: *vni,
            kind: KeyKind::Src,
            src: MacAddr([0xff; 6]),
            dst: MacAddr([0xff; 6]),
        };
        keys.extend(table.entries.range(lo..=hi).map(|(k, _)| *k));
        let wild: Vec<&RouteRule> = routes.wild_rules(*vni).iter().collect();
        for (d, rs) in routes.exact_groups(*vni) {
            let rs: Vec<&RouteRule> = rs.iter().collect();
            compile_dest(&mut fresh, *vni, d, &rs, &wild, &port);
        }
        compile_wild(&mut fresh, *vni, &wild, &port);
    }
    for (vni, d) in &dsts {
        let dk = FwdKey {
            vni: *vni,
            kind: KeyKind::Dst,
            src: MacAddr::ZERO,
            dst: *d,
        };
        keys.insert(dk);
        // (src, dst) keys sort by source first: the VNI's few are scanned for this one.
        let lo = FwdKey {
            kind: KeyKind::SrcDst,
            src: MacAddr::ZERO,
            dst: MacAddr::ZERO,
            vni: *vni,
        };
        let hi = FwdKey {
            src: MacAddr([0xff; 6]),
            dst: MacAddr([0xff; 6]),
            ..lo
        };
        keys.extend(
            table
                .entries
                .range(lo..=hi)
                .filter(|(k, _)| k.dst == *d)
                .map(|(k, _)| *k),
        );
        let exact: Vec<&RouteRule> = routes.exact_rules(*vni, *d).iter().collect();
        let wild: Vec<&RouteRule> = routes.wild_rules(*vni).iter().collect();
        compile_dest(&mut fresh, *vni, *d, &exact, &wild, &port);
    }
    for k in &keys {
        table.entries.remove(k);
    }
    keys.extend(fresh.entries.keys().copied());
    table.entries.extend(fresh.entries);
    keys
}

/// What the kernel does with a frame, as a whole (the program's checks around the lookup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelDecision {
    /// Punted to vnetd (or passed to the stack, from the underlay).
    Slow,
    /// Forwarded in the kernel to this port or link.
    Forward(PortId),
}

/// The kernel's decision for a frame (src, dst) entering through `ingress` (a fast-path port
/// or a plain udp link) in `vni`: multicast is punted, the table decides unicast, a result
/// equal to the ingress is punted, and from a link only delivery to a fast-path port happens
/// in the kernel. This mirrors port_ingress / underlay_ingress.
pub fn kernel_decision(
    table: &CompiledTable,
    ingress: CompilePort,
    src: MacAddr,
    dst: MacAddr,
) -> KernelDecision {
    if dst.is_multicast() {
        return KernelDecision::Slow;
    }
    match (ingress.egress, table.lookup(ingress.vni, src, dst)) {
        (_, Action::Port(p)) if p == ingress.id => KernelDecision::Slow,
        (Egress::FastPort, Action::Port(p) | Action::Link(p)) => KernelDecision::Forward(p),
        (Egress::UdpLink, Action::Port(p)) => KernelDecision::Forward(p),
        _ => KernelDecision::Slow,
    }
}

/// The map writes that take the kernel's table from `current` to `desired` within `capacity`
/// entries. Inserts and overwrites come first, in key order (fallbacks before the entries that
/// lead to them), deletes last, so an entry present in both is never missing, not even for an
/// instant. When the new keys do not fit, the ones that do not fit are left out and the entry
/// that would otherwise decide for their frames is made slow, so a missing entry can only ever
/// make a frame slow, never send it elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablePlan {
    pub upserts: Vec<(FwdKey, FwdEntry)>,
    pub deletes: Vec<FwdKey>,
    /// Entries of `desired` left out for lack of room (the table-full count).
    pub left_out: usize,
    /// The table after the plan.
    pub result: BTreeMap<FwdKey, FwdEntry>,
}

pub fn plan_update(
    current: &BTreeMap<FwdKey, FwdEntry>,
    desired: &CompiledTable,
    capacity: usize,
) -> TablePlan {
    let slow = FwdEntry {
        action: Action::Slow,
        check_src: false,
    };
    let mut want = desired.entries.clone();
    // While both old and new entries are in the map (deletes come last) every new key needs
    // room beside all of the current ones.
    let mut room = capacity.saturating_sub(current.len());
    let mut left_out = 0;
    let keys: Vec<FwdKey> = want.keys().copied().collect();
    for k in keys {
        if current.contains_key(&k) || !want.contains_key(&k) {
            continue;
        }
        if room > 0 {
            room -= 1;
            continue;
        }
        want.remove(&k);
        left_out += 1;
        let anyk = FwdKey {
            vni: k.vni,
            kind: KeyKind::Any,
            src: MacAddr::ZERO,
            dst: MacAddr::ZERO,
        };
        match k.kind {
            // Without its (any, dst) entry a destination falls to the fallback: make that slow,
            // and its exact-source entries are unreachable.
            KeyKind::Dst => {
                let orphans: Vec<FwdKey> = want
                    .keys()
                    .filter(|o| o.vni == k.vni && o.kind == KeyKind::SrcDst && o.dst == k.dst)
                    .copied()
                    .collect();
                for o in orphans {
                    want.remove(&o);
                    left_out += 1;
                }
                if let Some(e) = want.get_mut(&anyk) {
                    *e = slow;
                }
            }
            KeyKind::SrcDst => {
                let dk = FwdKey {
                    kind: KeyKind::Dst,
                    src: MacAddr::ZERO,
                    ..k
                };
                if let Some(e) = want.get_mut(&dk) {
                    *e = slow;
                }
            }
            KeyKind::Src => {
                if let Some(e) = want.get_mut(&anyk) {
                    *e = slow;
                }
            }
            // No fallback entry: frames that would use it find nothing and are punted.
            KeyKind::Any => {
                let orphans: Vec<FwdKey> = want
                    .keys()
                    .filter(|o| o.vni == k.vni && o.kind == KeyKind::Src)
                    .copied()
                    .collect();
                for o in orphans {
                    want.remove(&o);
                    left_out += 1;
                }
            }
        }
    }
    let upserts = want
        .iter()
        .filter(|(k, e)| current.get(k) != Some(e))
        .map(|(k, e)| (*k, *e))
        .collect();
    let deletes = current
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    TablePlan {
        upserts,
        deletes,
        left_out,
        result: want,
    }
}

#[cfg(test)]
mod tests;
