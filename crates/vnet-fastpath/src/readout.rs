//! What the kernel path counted, read back: a port's or link's counters, its token bucket,
//! the global counters and the traffic matrix, each summed over CPUs. Through the
//! [`FastPath`] itself, or through a [`Readout`]: descriptors of its own on the counting maps,
//! which a reader thread holds so that a status query never waits for the [`FastPath`]'s owner
//! (a change in progress).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use vnet_core::{MatrixEntry, PortId};
use vnet_wire::MacAddr;

use crate::error::Error;
use crate::fastpath::FastPath;
use crate::layout::{counter, global, MatrixKey, MatrixVal, RateVal};
use crate::maps::Map;
use crate::spec::{Counters, GlobalCounters};

/// Where a port's or link's counters and token bucket are, for a [`Readout`]: its index in
/// the counting maps, and whether it has a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSlot {
    index: u32,
    limited: bool,
}

/// The counting maps of a [`FastPath`] on descriptors of their own (cheap to share:
/// `Arc` it). Only reads; the slots it is given come from [`FastPath::counter_slot`].
pub struct Readout {
    counters: Map<u32, [u64; counter::COUNT]>,
    rates: Map<u32, RateVal>,
    global: Map<u32, [u64; global::COUNT]>,
    matrix: Map<MatrixKey, MatrixVal>,
}

impl Readout {
    pub fn counters(&self, slot: CounterSlot) -> Result<Counters, Error> {
        read_counters(&self.counters, slot.index)
    }

    /// The token bucket's fill in bytes (negative in debt), if the slot has a rate.
    pub fn rate_available(&self, slot: CounterSlot) -> Result<Option<i64>, Error> {
        if !slot.limited {
            return Ok(None);
        }
        Ok(self
            .rates
            .lookup_locked(&slot.index)?
            .map(|r| r.available()))
    }

    /// The global counters; `table_full` is the writer's (0 here: the caller adds its own).
    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        global_counters(&self.global, 0)
    }

    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        read_matrix(&self.matrix)
    }
}

fn read_counters(map: &Map<u32, [u64; counter::COUNT]>, idx: u32) -> Result<Counters, Error> {
    let sum = add_up(map.lookup_percpu(&idx)?);
    let mut drops = BTreeMap::new();
    for (name, i) in [
        ("truncated", counter::DROP_TRUNCATED),
        ("oversize", counter::DROP_OVERSIZE),
        ("spoofed_src", counter::DROP_SPOOFED_SRC),
        ("rate_limited", counter::DROP_RATE_LIMITED),
    ] {
        if sum[i] > 0 {
            drops.insert(name, sum[i]);
        }
    }
    Ok(Counters {
        rx_frames: sum[counter::RX_FRAMES],
        rx_bytes: sum[counter::RX_BYTES],
        tx_frames: sum[counter::TX_FRAMES],
        tx_bytes: sum[counter::TX_BYTES],
        punted_frames: sum[counter::PUNT_FRAMES],
        punted_bytes: sum[counter::PUNT_BYTES],
        slow_tx_frames: sum[counter::SLOW_TX_FRAMES],
        slow_tx_bytes: sum[counter::SLOW_TX_BYTES],
        drops,
        neigh_miss: sum[counter::NEIGH_MISS],
        encap_fail: sum[counter::ENCAP_FAIL],
        gro_passed: sum[counter::GRO_PASSED],
        bad_length: sum[counter::BAD_LENGTH],
    })
}

fn global_counters(
    map: &Map<u32, [u64; global::COUNT]>,
    table_full: u64,
) -> Result<GlobalCounters, Error> {
    let sum = add_up(map.lookup_percpu(&0)?);
    Ok(GlobalCounters {
        unknown_port: sum[global::UNKNOWN_PORT],
        not_vxlan: sum[global::NOT_VXLAN],
        unknown_link: sum[global::UNKNOWN_LINK],
        fib_fail: sum[global::FIB_FAIL],
        vni_mismatch: sum[global::VNI_MISMATCH],
        table_full,
        matrix_full: sum[global::MATRIX_FULL],
    })
}

/// The kernel's traffic matrix (what it forwarded), summed over CPUs. Pairs it had no room
/// for are counted in [`GlobalCounters::matrix_full`].
fn read_matrix(map: &Map<MatrixKey, MatrixVal>) -> Result<Vec<MatrixEntry>, Error> {
    let mut out = Vec::new();
    for key in map.keys() {
        // Entries are never removed (not an LRU); a key without a value is skipped all the same.
        let Some(per_cpu) = map.lookup_percpu(&key)? else {
            continue;
        };
        let (frames, bytes) = per_cpu
            .iter()
            .fold((0, 0), |(f, b), v| (f + v.frames, b + v.bytes));
        out.push(MatrixEntry {
            vni: key.vni,
            src: MacAddr(key.src),
            dst: MacAddr(key.dst),
            frames,
            bytes,
        });
    }
    out.sort_by_key(|e| (e.vni, e.src, e.dst));
    Ok(out)
}

/// The per-CPU counter arrays added up.
fn add_up<const N: usize>(per_cpu: Option<Vec<[u64; N]>>) -> [u64; N] {
    let mut sum = [0u64; N];
    for cpu in per_cpu.unwrap_or_default() {
        for (s, v) in sum.iter_mut().zip(cpu) {
            *s += v;
        }
    }
    sum
}

impl FastPath {
    fn read_counters(&self, idx: u32) -> Result<Counters, Error> {
        read_counters(&self.maps.counters, idx)
    }

    pub fn port_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.ports.get(&id).ok_or(Error::UnknownPort(id))?;
        self.read_counters(st.slot)
    }

    pub fn link_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.links.get(&id).ok_or(Error::UnknownLink(id))?;
        self.read_counters(self.cfg.max_ports + st.slot)
    }

    /// Where a port's or link's counters are, for a [`Readout`] (None: not the kernel's).
    pub fn counter_slot(&self, id: PortId) -> Option<CounterSlot> {
        if let Some(p) = self.ports.get(&id) {
            Some(CounterSlot {
                index: p.slot,
                limited: p.spec.policy.rate.is_some(),
            })
        } else {
            self.links.get(&id).map(|l| CounterSlot {
                index: self.cfg.max_ports + l.slot,
                limited: l.spec.rate.is_some(),
            })
        }
    }

    /// The counting maps on descriptors of their own, for readers on other threads.
    pub fn readout(&self) -> Result<Readout, Error> {
        Ok(Readout {
            counters: self.maps.counters.try_clone()?,
            rates: self.maps.rates.try_clone()?,
            global: self.maps.global.try_clone()?,
            matrix: self.maps.matrix.try_clone()?,
        })
    }

    /// Map writes (updates and deletes) this fast path made so far: what changes cost the
    /// kernel.
    pub fn map_writes(&self) -> u64 {
        self.maps.writes.load(Relaxed)
    }

    /// Entries of the forwarding table written or deleted as the kernel's table was kept,
    /// and left out because the map was full, so far.
    pub fn table_full(&self) -> u64 {
        self.table_full
    }

    /// A port's or link's token bucket fill in bytes (negative in debt), if it has a rate.
    pub fn rate_available(&self, id: PortId) -> Result<Option<i64>, Error> {
        let slot = self.counter_slot(id).ok_or(Error::UnknownPort(id))?;
        if !slot.limited {
            return Ok(None);
        }
        Ok(self
            .maps
            .rates
            .lookup_locked(&slot.index)?
            .map(|r| r.available()))
    }

    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        global_counters(&self.maps.global, self.table_full)
    }

    /// The kernel's traffic matrix (what it forwarded), summed over CPUs. Pairs it had no
    /// room for are counted in [`GlobalCounters::matrix_full`].
    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        read_matrix(&self.maps.matrix)
    }
}
