//! The compiled object's maps with their key and value types. The object is reached through
//! libbpf-cargo's skeleton (OUT_DIR/fastpath.skel.rs, which build.rs generates from the
//! object): every map and program is a field of it and `.rodata` a typed struct, so a map
//! renamed in bpf/fastpath.bpf.c fails to compile here rather than at load time. The `maps!`
//! table below says once which types of src/layout.rs each map holds; [`Maps`] is what the
//! loader writes and reads through, and the test at the end checks the table and every struct
//! of src/layout.rs against the BTF of the object, without root.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use libbpf_rs::{MapCore, MapFlags, MapHandle, OpenMapMut};

use crate::error::Error;
use crate::layout::{
    counter, global, BpfType, FwdMapKey, FwdVal, LinkCache, LinkKey, LinkVal, MatrixKey, MatrixVal,
    PortVal, RateVal, RelayFwdKey, RelayRxKey, RelayVal,
};
use crate::spec::FastPathConfig;

/// libbpf-cargo's skeleton of the object (generated code, outside this crate's lints).
#[allow(
    clippy::all,
    clippy::pedantic,
    unsafe_op_in_unsafe_fn,
    unused_qualifications
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/fastpath.skel.rs"));
}

pub(crate) use skel::{FastpathMaps, FastpathProgs, FastpathSkelBuilder, OpenFastpathMaps};

/// A map whose keys are `K` and values `V` (a descriptor of its own: it outlives the object).
pub(crate) struct Map<K, V> {
    handle: MapHandle,
    name: &'static str,
    /// Writes (updates and deletes) through any map of the same [`Maps`]: what a change
    /// costs the kernel, counted for the tests and `show stats`.
    writes: Arc<AtomicU64>,
    _types: PhantomData<fn(K) -> V>,
}

impl<K: BpfType, V: BpfType> Map<K, V> {
    fn new(
        m: &libbpf_rs::MapMut<'_>,
        name: &'static str,
        writes: &Arc<AtomicU64>,
    ) -> Result<Self, libbpf_rs::Error> {
        Ok(Map {
            handle: MapHandle::try_from(m)?,
            name,
            writes: writes.clone(),
            _types: PhantomData,
        })
    }

    fn err(&self) -> impl FnOnce(libbpf_rs::Error) -> Error {
        let map = self.name;
        move |source| Error::Map { map, source }
    }

    pub fn handle(&self) -> &MapHandle {
        &self.handle
    }

    /// Another descriptor of the same map.
    pub fn try_clone(&self) -> Result<Self, Error> {
        Ok(Map {
            handle: MapHandle::try_from(&self.handle).map_err(self.err())?,
            name: self.name,
            writes: self.writes.clone(),
            _types: PhantomData,
        })
    }

    pub fn update(&self, k: &K, v: &V) -> Result<(), Error> {
        self.writes.fetch_add(1, Relaxed);
        self.handle
            .update(k.as_bytes(), v.as_bytes(), MapFlags::ANY)
            .map_err(self.err())
    }

    /// Under the value's spin lock, as the programs update it (`BPF_F_LOCK`).
    pub fn update_locked(&self, k: &K, v: &V) -> Result<(), Error> {
        self.writes.fetch_add(1, Relaxed);
        self.handle
            .update(k.as_bytes(), v.as_bytes(), MapFlags::LOCK)
            .map_err(self.err())
    }

    fn read(b: &[u8]) -> Option<V> {
        V::read_from_prefix(b).ok().map(|(v, _)| v)
    }

    fn lookup_with(&self, k: &K, flags: MapFlags) -> Result<Option<V>, Error> {
        let v = self
            .handle
            .lookup(k.as_bytes(), flags)
            .map_err(self.err())?;
        Ok(v.as_deref().and_then(Self::read))
    }

    pub fn lookup(&self, k: &K) -> Result<Option<V>, Error> {
        self.lookup_with(k, MapFlags::ANY)
    }

    /// Under the value's spin lock (a consistent copy of a value the programs change).
    pub fn lookup_locked(&self, k: &K) -> Result<Option<V>, Error> {
        self.lookup_with(k, MapFlags::LOCK)
    }

    /// Removes `k`; a key that is not there is no error.
    pub fn delete(&self, k: &K) -> Result<(), Error> {
        self.writes.fetch_add(1, Relaxed);
        match self.handle.delete(k.as_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err()(e)),
        }
    }

    /// The keys, as a walk of the map sees them (entries may come and go meanwhile).
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.handle
            .keys()
            .filter_map(|b| K::read_from_prefix(&b).ok().map(|(k, _)| k))
    }

    /// Each CPU's value of a per-CPU map (`None` when `k` is not there).
    pub fn lookup_percpu(&self, k: &K) -> Result<Option<Vec<V>>, Error> {
        let v = self
            .handle
            .lookup_percpu(k.as_bytes(), MapFlags::ANY)
            .map_err(self.err())?;
        Ok(v.map(|cpus| cpus.iter().filter_map(|b| Self::read(b)).collect()))
    }

    /// Sets every CPU's value of `k` of a per-CPU map to zero.
    pub fn zero_percpu(&self, k: &K) -> Result<(), Error> {
        let cpus = libbpf_rs::num_possible_cpus().map_err(self.err())?;
        let zeros = vec![vec![0u8; std::mem::size_of::<V>()]; cpus];
        self.writes.fetch_add(1, Relaxed);
        self.handle
            .update_percpu(k.as_bytes(), &zeros, MapFlags::ANY)
            .map_err(self.err())
    }
}

/// The maps of the object: name, key and value types, and the size `FastPathConfig` gives
/// it (`None`: as the object declares). One line per map; the names are the skeleton's
/// fields, the types are checked against the object's BTF (test below).
macro_rules! maps {
    ($( $(#[doc = $doc:literal])* $name:ident : $k:ty => $v:ty = $size:expr ; )*) => {
        /// The maps after load (pinned with a pin directory; the object's internal maps,
        /// `.rodata`, are each process's own).
        pub(crate) struct Maps {
            $( $(#[doc = $doc])* pub $name: Map<$k, $v>, )*
            /// Writes through any of them.
            pub writes: Arc<AtomicU64>,
        }

        impl Maps {
            pub fn new(m: &FastpathMaps<'_>) -> Result<Maps, libbpf_rs::Error> {
                let writes = Arc::new(AtomicU64::new(0));
                Ok(Maps {
                    $( $name: Map::new(&m.$name, stringify!($name), &writes)?, )*
                    writes,
                })
            }

            /// Every map by name (the pin names).
            pub fn all(&self) -> Vec<(&'static str, &MapHandle)> {
                vec![$( (stringify!($name), self.$name.handle()), )*]
            }
        }

        /// The maps of the opened object by name, each with the size `cfg` gives it.
        pub(crate) fn open_maps<'a, 'obj>(
            m: &'a mut OpenFastpathMaps<'obj>,
            cfg: &FastPathConfig,
        ) -> Vec<(&'static str, &'a mut OpenMapMut<'obj>, Option<u32>)> {
            let size_of = |f: fn(&FastPathConfig) -> Option<u32>| f(cfg);
            vec![$( (stringify!($name), &mut m.$name, size_of($size)), )*]
        }

        /// Which map holds which types, one line each (part of the layout's hash: a map that
        /// changed its key or value means other bytes even at the same sizes).
        pub(crate) fn signature() -> String {
            let mut s = String::new();
            $(
                s.push_str(&format!(
                    "map {} {} {} {} {}\n",
                    stringify!($name),
                    // A plain type by its size alone (how `stringify!` spaces a type is
                    // the compiler's choice, not the layout's).
                    <$k as BpfType>::C_NAME.unwrap_or("-"),
                    std::mem::size_of::<$k>(),
                    <$v as BpfType>::C_NAME.unwrap_or("-"),
                    std::mem::size_of::<$v>(),
                ));
            )*
            s
        }

        /// (name, key size, key struct, value size, value struct) as Rust declares them.
        #[cfg(test)]
        const DECLARED: &[(&str, usize, Option<&str>, usize, Option<&str>)] = &[$(
            (
                stringify!($name),
                std::mem::size_of::<$k>(),
                <$k as BpfType>::C_NAME,
                std::mem::size_of::<$v>(),
                <$v as BpfType>::C_NAME,
            ),
        )*];
    };
}

maps! {
    /// Ports by the ifindex of their device.
    ports: u32 => PortVal = |c| Some(c.max_ports);
    /// Ports by slot (an all-zero value: a free slot).
    port_slots: u32 => PortVal = |c| Some(c.max_ports);
    /// Port slots by the ifindex of their punt TAP.
    punts: u32 => u32 = |c| Some(c.max_ports);
    /// Link slots by (remote, VNI).
    links_rx: LinkKey => u32 = |c| Some(c.max_links);
    /// Links by slot.
    links: u32 => LinkVal = |c| Some(c.max_links);
    /// Relayed links' slots by (relay endpoint, VNI, peer's tag).
    relay_rx: RelayRxKey => u32 = |c| Some(c.max_links);
    /// A relay's admitted pairs: where each goes, its budget and counts.
    relay_fwd: RelayFwdKey => RelayVal = |c| Some(c.max_relay_pairs);
    /// Cached outer next hops by link slot (per CPU).
    link_cache: u32 => LinkCache = |c| Some(c.max_links);
    /// Moved on to make every cached next hop stale.
    outer_epoch: u32 => u32 = |_| None;
    /// The compiled forwarding table.
    fwd: FwdMapKey => FwdVal = |c| Some(c.max_table);
    /// Token buckets by port slot, or max_ports + link slot.
    rates: u32 => RateVal = |c| Some(c.max_ports + c.max_links);
    /// Counters by port slot, or max_ports + link slot (per CPU).
    counters: u32 => [u64; counter::COUNT] = |c| Some(c.max_ports + c.max_links);
    /// The global counters (per CPU).
    global: u32 => [u64; global::COUNT] = |_| None;
    /// The traffic matrix (per CPU, entries allocated as pairs appear).
    matrix: MatrixKey => MatrixVal = |c| Some(c.max_matrix);
}

#[cfg(test)]
mod tests {
    //! The layout check (what Cilium's alignchecker does for its Go types): the BTF that clang
    //! wrote into the object says how the programs see every struct and map; the Rust side
    //! must see the same. Runs without root (the object is parsed, not loaded).

    use super::*;
    use crate::layout::{StructLayout, STRUCTS};
    use libbpf_rs::btf::types::{Array, Enum, Int, Ptr, Struct, Var};
    use libbpf_rs::btf::BtfType;
    use libbpf_rs::{Btf, HasSize, ReferencesType};

    static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fastpath.bpf.o"));

    fn size(t: BtfType<'_>) -> Option<usize> {
        let t = t.skip_mods_and_typedefs();
        if let Ok(i) = Int::try_from(t) {
            return Some(i.size());
        }
        if let Ok(s) = Struct::try_from(t) {
            return Some(s.size());
        }
        if let Ok(e) = Enum::try_from(t) {
            return Some(e.size());
        }
        if let Ok(a) = Array::try_from(t) {
            return Some(a.capacity() * size(a.contained_type())?);
        }
        None
    }

    fn name(t: BtfType<'_>) -> String {
        t.skip_mods_and_typedefs()
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// What differs between the struct as Rust lays it out and as the object's BTF says.
    fn struct_errors(btf: &Btf<'_>, s: &StructLayout) -> Vec<String> {
        // By kind and name: a map and a struct may share a name (`link_cache`).
        let c = btf
            .type_by_kind::<Struct<'_>>()
            .find(|t| t.name().is_some_and(|n| n == s.c_name));
        let Some(c) = c else {
            return vec![format!("struct {}: not in the object", s.c_name)];
        };
        let mut errs = Vec::new();
        if c.size() != s.size {
            errs.push(format!(
                "struct {}: {} bytes in the object, {} in Rust",
                s.c_name,
                c.size(),
                s.size
            ));
        }
        let members: Vec<_> = c.iter().collect();
        if members.len() != s.fields.len() {
            errs.push(format!(
                "struct {}: {} fields in the object, {} in Rust",
                s.c_name,
                members.len(),
                s.fields.len()
            ));
        }
        for (m, f) in members.iter().zip(s.fields) {
            let mname = m.name.map(|n| n.to_string_lossy().into_owned());
            let offset = match m.attr {
                libbpf_rs::btf::types::MemberAttr::Normal { offset } => offset as usize / 8,
                libbpf_rs::btf::types::MemberAttr::BitField { .. } => usize::MAX,
            };
            let msize = btf.type_by_id::<BtfType<'_>>(m.ty).and_then(size);
            if mname.as_deref() != Some(f.name) || offset != f.offset || msize != Some(f.size) {
                errs.push(format!(
                    "struct {}: field {:?} at {offset} of {msize:?} bytes in the object, \
                     {} at {} of {} bytes in Rust",
                    s.c_name, mname, f.name, f.offset, f.size
                ));
            }
        }
        errs
    }

    /// What differs between a map of the `maps!` table and its definition in the object.
    fn map_errors(
        btf: &Btf<'_>,
        (map, ksize, kname, vsize, vname): (&str, usize, Option<&str>, usize, Option<&str>),
    ) -> Vec<String> {
        let var = btf
            .type_by_kind::<Var<'_>>()
            .find(|t| t.name().is_some_and(|n| n == map));
        let Some(var) = var else {
            return vec![format!("map {map}: not in the object")];
        };
        let Ok(def) = Struct::try_from(var.referenced_type().skip_mods_and_typedefs()) else {
            return vec![format!("map {map}: not a map definition")];
        };
        let mut errs = Vec::new();
        for (what, want_size, want_name) in [("key", ksize, kname), ("value", vsize, vname)] {
            let t = def
                .iter()
                .find(|m| m.name.is_some_and(|n| n == what))
                .and_then(|m| btf.type_by_id::<Ptr<'_>>(m.ty))
                .map(|p| p.referenced_type());
            let Some(t) = t else {
                errs.push(format!("map {map}: no {what} type"));
                continue;
            };
            let (got_size, got_name) = (size(t), name(t));
            if got_size != Some(want_size) {
                errs.push(format!(
                    "map {map}: {what} of {got_size:?} bytes ({got_name}) in the object, \
                     {want_size} in Rust"
                ));
            }
            if let Some(n) = want_name {
                if got_name != n {
                    errs.push(format!(
                        "map {map}: {what} is `{got_name}` in the object, `struct {n}` in Rust"
                    ));
                }
            }
        }
        errs
    }

    #[test]
    fn the_rust_layouts_are_the_objects() {
        let btf = Btf::from_raw("fastpath", OBJECT)
            .expect("the object parses")
            .expect("the object has BTF");
        let mut errs: Vec<String> = STRUCTS
            .iter()
            .flat_map(|s| struct_errors(&btf, s))
            .collect();
        errs.extend(DECLARED.iter().flat_map(|m| map_errors(&btf, *m)));
        assert!(
            errs.is_empty(),
            "the BPF object and src/layout.rs / src/maps.rs disagree:\n{}",
            errs.join("\n")
        );
    }

    #[test]
    fn every_map_of_the_object_is_declared() {
        // A map added to bpf/fastpath.bpf.c needs its line in `maps!` (or the loader would
        // neither size nor pin it).
        let btf = Btf::from_raw("fastpath", OBJECT).unwrap().unwrap();
        let sec = btf
            .type_by_kind::<libbpf_rs::btf::types::DataSec<'_>>()
            .find(|t| t.name().is_some_and(|n| n == ".maps"))
            .expect("a .maps section");
        for v in sec.iter() {
            let n = btf
                .type_by_id::<BtfType<'_>>(v.ty)
                .and_then(|t| t.name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            assert!(
                DECLARED.iter().any(|d| d.0 == n),
                "map {n} of the object is not in the maps! table"
            );
        }
    }
}
