//! [`FastPath`], vnet's kernel fast path once loaded: what it holds and its small accessors.
//! The work is in the modules above it, one job each: `load` (loading, verifying, reusing
//! pinned maps), `attach` (tcx links on devices), `slots` (ports and links in their map
//! slots), `table` (the forwarding map, the end of a takeover), `readout` (counters, rates,
//! the traffic matrix).
//!
//! With a pin directory ([`FastPathConfig::pin_dir`], what vnetd uses) the maps and the tcx
//! links are pinned in bpffs (`pin`): they outlive the process, so the kernel goes
//! on forwarding while no vnetd runs, and the next [`FastPath`] reuses the maps, takes the
//! ports and links back to the slots they had (`takeover`), holds every write of the
//! forwarding table and every program swap until [`FastPath::commit`] (the kernel forwards by
//! the earlier state meanwhile), then writes only what differs and swaps its programs into the
//! pinned links. Only [`FastPath::teardown`] removes what is pinned. Without a pin directory
//! every object is owned by a descriptor: dropping the [`FastPath`], or the process dying,
//! detaches and frees everything.
//!
//! The IPv4 `forwarding` it turns on for ports' devices is put back on detach, on teardown,
//! and on drop when nothing is pinned; [`FastPath::forwarding_originals`] is for a later
//! process (a pinned fast path keeps the devices forwarding until a teardown).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use vnet_core::{LockRecover, PortId};

use crate::compile::{CompiledTable, FwdEntry, FwdKey};
use crate::error::Error;
use crate::maps::{Map, Maps};
use crate::pin;
use crate::progs::Progs;
use crate::spec::{FastPathConfig, LinkSpec, PortSpec, Program};
use crate::sysctl::{restore_forwarding, ForwardingOriginal};
use crate::takeover::Earlier;

pub(crate) struct PortState {
    pub spec: PortSpec,
    pub slot: u32,
    /// The tcx links of `port_ingress` and `punt_ingress`.
    pub links: [OwnedFd; 2],
}

pub(crate) struct LinkState {
    pub spec: LinkSpec,
    pub slot: u32,
}

/// The pin directory and what an earlier vnetd left in it.
pub(crate) struct Pins {
    pub dir: PathBuf,
    /// The directory of the maps in it, named by their layout's hash (`maps-HASH`).
    pub maps_dir: String,
    /// The earlier vnetd's state (empty when there was none), taken back as ports and links
    /// attach.
    pub earlier: Earlier,
    /// Its pinned tcx links by pin name, until claimed.
    pub held: BTreeMap<String, OwnedFd>,
    /// Taking over: no write of the forwarding table and no program swap until `commit`.
    pub holding: bool,
    /// The maps are this process's own (the pinned ones were absent or of another layout):
    /// pinned at `commit`, when the links run programs that use them.
    pub maps_to_pin: bool,
}

impl Pins {
    pub fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join(&self.maps_dir).join(name)
    }

    pub fn link_path(&self, name: &str) -> PathBuf {
        self.dir.join("links").join(name)
    }
}

/// vnet's kernel fast path, loaded and verified. See the crate documentation for the call
/// sequence.
pub struct FastPath {
    pub(crate) cfg: FastPathConfig,
    // Attachments are declared before the programs: they go first when dropped.
    pub(crate) ports: BTreeMap<PortId, PortState>,
    pub(crate) links: BTreeMap<PortId, LinkState>,
    pub(crate) underlays: BTreeMap<u32, (Program, OwnedFd)>,
    pub(crate) table: CompiledTable,
    pub(crate) current: BTreeMap<FwdKey, FwdEntry>,
    pub(crate) table_full: u64,
    /// IPv4 `forwarding` of the ports' devices before the fast path turned it on, by ifindex.
    pub(crate) forwarding: BTreeMap<u32, ForwardingOriginal>,
    pub(crate) epoch: OuterCacheInvalidator,
    /// Pinned maps and links (None: nothing outlives the process).
    pub(crate) pins: Option<Pins>,
    pub(crate) maps: Maps,
    pub(crate) progs: Progs,
}

/// Makes every CPU's cached outer next hops stale at once (the programs compare each entry's
/// epoch with `outer_epoch`). Cheap, thread-safe and independent of the [`FastPath`]'s
/// lifetime: vnetd's netlink watcher holds one.
#[derive(Clone)]
pub struct OuterCacheInvalidator {
    pub(crate) epoch: Arc<Mutex<Map<u32, u32>>>,
}

impl std::fmt::Debug for OuterCacheInvalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OuterCacheInvalidator")
    }
}

impl OuterCacheInvalidator {
    pub fn invalidate(&self) -> Result<(), Error> {
        let map = self.epoch.lock_or_recover();
        let now = map.lookup(&0)?.unwrap_or(0);
        map.update(&0, &now.wrapping_add(1))
    }
}

impl std::fmt::Debug for FastPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastPath")
            .field("cfg", &self.cfg)
            .field("ports", &self.ports.keys().collect::<Vec<_>>())
            .field("links", &self.links.keys().collect::<Vec<_>>())
            .field("underlays", &self.underlays.keys().collect::<Vec<_>>())
            .field("table_entries", &self.current.len())
            .finish()
    }
}

impl FastPath {
    /// Whether the maps and links are pinned (forwarding outlives the process).
    pub fn pinned(&self) -> bool {
        self.pins.is_some()
    }

    pub fn config(&self) -> &FastPathConfig {
        &self.cfg
    }

    /// Forgets every cached outer next hop (each CPU asks bpf_fib_lookup again on the next
    /// packet): for vnetd to call when the underlay's routes or neighbours changed.
    pub fn invalidate_outer_cache(&self) -> Result<(), Error> {
        self.epoch.invalidate()
    }

    /// A handle to [`FastPath::invalidate_outer_cache`] for another thread.
    pub fn outer_cache_invalidator(&self) -> OuterCacheInvalidator {
        self.epoch.clone()
    }

    /// The IPv4 `forwarding` values of the devices the fast path turned it on for, as they
    /// were before (to keep across a restart of the process, with the programs pinned).
    pub fn forwarding_originals(&self) -> Vec<ForwardingOriginal> {
        self.forwarding.values().cloned().collect()
    }

    /// Records the original `forwarding` of a device (known from an earlier run that left it
    /// on): [`FastPath::attach_port`] keeps it instead of the value it finds, and a restore
    /// puts it back, whether or not a port is attached to the device.
    pub fn set_forwarding_original(&mut self, o: ForwardingOriginal) {
        self.forwarding.insert(o.ifindex, o);
    }

    /// Puts `forwarding` of `ifindex` back to its original value and forgets it (no-op for a
    /// device the fast path did not change).
    pub fn restore_forwarding(&mut self, ifindex: u32) {
        if let Some(o) = self.forwarding.remove(&ifindex) {
            restore_forwarding(&o);
        }
    }

    /// Puts every device's `forwarding` back (called when the FastPath is dropped; callable
    /// on its own for a process that leaves its programs attached but its devices restored).
    pub fn restore_forwarding_all(&mut self) {
        for (_, o) in std::mem::take(&mut self.forwarding) {
            restore_forwarding(&o);
        }
    }

    /// Whether a takeover waits for [`FastPath::commit`].
    pub fn taking_over(&self) -> bool {
        self.pins.as_ref().is_some_and(|p| p.holding)
    }

    /// Removes everything: the tcx links (the programs leave the devices), the pins and their
    /// directory (the maps are freed), and puts the devices' forwarding back. What vnetd's
    /// teardown does; dropping a pinned [`FastPath`] leaves it all in place instead.
    pub fn teardown(mut self) {
        if let Some(p) = self.pins.take() {
            if let Err(e) = pin::remove_dir(&p.dir) {
                tracing::warn!(dir = %p.dir.display(), "kernel fast path: removing the pins: {e}");
            }
            drop(p.held);
        }
        self.ports.clear();
        self.underlays.clear();
        self.restore_forwarding_all();
    }
}

impl Drop for FastPath {
    fn drop(&mut self) {
        // Unpinned, the programs go with the descriptors, and no device may keep forwarding
        // without one. Pinned, they stay (the devices keep forwarding, with their programs,
        // until a teardown).
        if self.pins.is_none() {
            self.restore_forwarding_all();
        }
    }
}
