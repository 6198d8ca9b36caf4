//! The traffic matrix (`show matrix`, the live view, etcd's matrix records): frames and bytes
//! per (VNI, source MAC, destination MAC), bounded so that frames of pairs beyond capacity are
//! only counted as overflow. Pure; each data-path thread keeps its own and merges it in.

use vnet_wire::MacAddr;

use crate::FastMap;

/// At most this many (VNI, source, destination) pairs are tracked; frames of further pairs are
/// counted in `overflow` so a guest spraying MACs cannot grow memory.
pub const MATRIX_CAPACITY: usize = 65536;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MatrixEntry {
    pub vni: u32,
    #[serde(serialize_with = "ser_mac")]
    pub src: MacAddr,
    #[serde(serialize_with = "ser_mac")]
    pub dst: MacAddr,
    pub frames: u64,
    pub bytes: u64,
}

fn ser_mac<S: serde::Serializer>(m: &MacAddr, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(m)
}

/// The traffic matrix: what each (source MAC, destination MAC) pair of each VNI has sent
/// through the overlay. The raw material for inferring a parallel application's topology.
#[derive(Debug, Clone)]
pub struct TrafficMatrix {
    map: FastMap<(u32, MacAddr, MacAddr), (u64, u64)>,
    capacity: usize,
    overflow: u64,
}

impl Default for TrafficMatrix {
    fn default() -> Self {
        Self::new(MATRIX_CAPACITY)
    }
}

impl TrafficMatrix {
    pub fn new(capacity: usize) -> Self {
        TrafficMatrix {
            map: FastMap::default(),
            capacity,
            overflow: 0,
        }
    }

    pub fn record(&mut self, vni: u32, src: MacAddr, dst: MacAddr, frames: u64, bytes: u64) {
        let full = self.map.len() >= self.capacity;
        match self.map.get_mut(&(vni, src, dst)) {
            Some(e) => {
                e.0 += frames;
                e.1 += bytes;
            }
            None if full => self.overflow += frames,
            None => {
                self.map.insert((vni, src, dst), (frames, bytes));
            }
        }
    }

    /// Adds another matrix (a thread's local one) into this one.
    pub fn merge_from(&mut self, other: &mut TrafficMatrix) {
        for ((vni, s, d), (f, b)) in other.map.drain() {
            self.record(vni, s, d, f, b);
        }
        self.overflow += std::mem::take(&mut other.overflow);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Entries sorted by VNI, then bytes descending.
    pub fn entries(&self) -> Vec<MatrixEntry> {
        let mut v: Vec<MatrixEntry> = self
            .map
            .iter()
            .map(|(&(vni, src, dst), &(frames, bytes))| MatrixEntry {
                vni,
                src,
                dst,
                frames,
                bytes,
            })
            .collect();
        v.sort_by(|a, b| {
            (a.vni, std::cmp::Reverse(a.bytes), a.src, a.dst).cmp(&(
                b.vni,
                std::cmp::Reverse(b.bytes),
                b.src,
                b.dst,
            ))
        });
        v
    }

    pub fn remove_vni_macs(&mut self, vni: u32) {
        self.map.retain(|k, _| k.0 != vni);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::mac;

    #[test]
    fn records_merges_and_bounds() {
        let mut m = TrafficMatrix::new(2);
        m.record(1, mac(1), mac(2), 1, 100);
        m.record(1, mac(1), mac(2), 1, 50);
        m.record(1, mac(2), mac(1), 1, 60);
        m.record(1, mac(3), mac(1), 1, 60);
        assert_eq!(m.len(), 2);
        assert_eq!(m.overflow(), 1);
        let e = m.entries();
        assert_eq!(e[0].bytes, 150);
        assert_eq!(e[0].frames, 2);
        let mut local = TrafficMatrix::new(10);
        local.record(1, mac(2), mac(1), 3, 30);
        m.merge_from(&mut local);
        assert!(local.is_empty());
        assert_eq!(m.entries()[1].frames, 4);
    }
}
