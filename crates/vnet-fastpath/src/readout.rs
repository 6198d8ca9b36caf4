//! What the kernel path counted, read back: a port's or link's counters, its token bucket,
//! the global counters and the traffic matrix, each summed over CPUs.

use std::collections::BTreeMap;

use vnet_core::{MatrixEntry, PortId};
use vnet_wire::MacAddr;

use crate::error::Error;
use crate::fastpath::FastPath;
use crate::layout::{counter, global};
use crate::spec::{Counters, GlobalCounters};

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
        let sum = add_up(self.maps.counters.lookup_percpu(&idx)?);
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

    pub fn port_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.ports.get(&id).ok_or(Error::UnknownPort(id))?;
        self.read_counters(st.slot)
    }

    pub fn link_counters(&self, id: PortId) -> Result<Counters, Error> {
        let st = self.links.get(&id).ok_or(Error::UnknownLink(id))?;
        self.read_counters(self.cfg.max_ports + st.slot)
    }

    /// A port's or link's token bucket fill in bytes (negative in debt), if it has a rate.
    pub fn rate_available(&self, id: PortId) -> Result<Option<i64>, Error> {
        let (idx, limited) = if let Some(p) = self.ports.get(&id) {
            (p.slot, p.spec.policy.rate.is_some())
        } else if let Some(l) = self.links.get(&id) {
            (self.cfg.max_ports + l.slot, l.spec.rate.is_some())
        } else {
            return Err(Error::UnknownPort(id));
        };
        if !limited {
            return Ok(None);
        }
        Ok(self.maps.rates.lookup_locked(&idx)?.map(|r| r.available()))
    }

    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        let sum = add_up(self.maps.global.lookup_percpu(&0)?);
        Ok(GlobalCounters {
            unknown_port: sum[global::UNKNOWN_PORT],
            not_vxlan: sum[global::NOT_VXLAN],
            unknown_link: sum[global::UNKNOWN_LINK],
            fib_fail: sum[global::FIB_FAIL],
            vni_mismatch: sum[global::VNI_MISMATCH],
            table_full: self.table_full,
            matrix_full: sum[global::MATRIX_FULL],
        })
    }

    /// The kernel's traffic matrix (what it forwarded), summed over CPUs. Pairs it had no
    /// room for are counted in [`GlobalCounters::matrix_full`].
    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        let mut out = Vec::new();
        for key in self.maps.matrix.keys() {
            // Entries are never removed (not an LRU); a key without a value is skipped all the same.
            let Some(per_cpu) = self.maps.matrix.lookup_percpu(&key)? else {
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
}
