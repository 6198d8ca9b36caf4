//! The build without the `kernel` feature (no clang, no libbpf): [`FastPath::open`] says the
//! kernel fast path is not built in, as it says why it is unavailable on a machine without
//! BPF, and the caller runs everything in user space. The other methods exist so the callers
//! compile the same either way; none can run, as no `FastPath` can be made.

#![forbid(unsafe_code)]

use vnet_core::{MatrixEntry, PortId};

use crate::compile::CompiledTable;
use crate::error::{Error, Unavailable};
use crate::spec::{
    ApplyReport, Counters, FastPathConfig, GlobalCounters, LinkSpec, PortPolicy, PortSpec, Program,
    RelayCounts, RelayPair, TestRun,
};
use crate::sysctl::ForwardingOriginal;

/// vnet's kernel fast path, not built in: [`FastPath::open`] always fails.
#[derive(Debug)]
pub enum FastPath {}

/// The outer-cache invalidator of a fast path that cannot exist here (a value a caller can
/// hold, so its code after asking for one is not unreachable; there is nothing to invalidate).
#[derive(Debug, Clone)]
pub struct OuterCacheInvalidator(());

impl OuterCacheInvalidator {
    pub fn invalidate(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// Where a port's counters are (none can be, here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterSlot {}

/// The counting maps for readers (none can exist here).
#[derive(Debug)]
pub enum Readout {}

impl Readout {
    pub fn counters(&self, _slot: CounterSlot) -> Result<Counters, Error> {
        match *self {}
    }

    pub fn rate_available(&self, _slot: CounterSlot) -> Result<Option<i64>, Error> {
        match *self {}
    }

    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        match *self {}
    }

    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        match *self {}
    }
}

impl FastPath {
    pub fn counter_slot(&self, _id: PortId) -> Option<CounterSlot> {
        match *self {}
    }

    pub fn readout(&self) -> Result<Readout, Error> {
        match *self {}
    }

    pub fn map_writes(&self) -> u64 {
        match *self {}
    }

    pub fn table_full(&self) -> u64 {
        match *self {}
    }

    pub fn open(_cfg: &FastPathConfig) -> Result<FastPath, Unavailable> {
        Err(Unavailable::NotBuiltIn)
    }

    pub fn pinned(&self) -> bool {
        match *self {}
    }

    pub fn config(&self) -> &FastPathConfig {
        match *self {}
    }

    pub fn invalidate_outer_cache(&self) -> Result<(), Error> {
        match *self {}
    }

    pub fn outer_cache_invalidator(&self) -> OuterCacheInvalidator {
        match *self {}
    }

    pub fn forwarding_originals(&self) -> Vec<ForwardingOriginal> {
        match *self {}
    }

    pub fn set_forwarding_original(&mut self, _o: ForwardingOriginal) {
        match *self {}
    }

    pub fn restore_forwarding(&mut self, _ifindex: u32) {
        match *self {}
    }

    pub fn restore_forwarding_all(&mut self) {
        match *self {}
    }

    pub fn taking_over(&self) -> bool {
        match *self {}
    }

    pub fn teardown(self) {
        match self {}
    }

    pub fn test_run(
        &self,
        _prog: Program,
        _frame: &[u8],
        _ifindex: u32,
        _gso_size: u32,
    ) -> Result<TestRun, Error> {
        match *self {}
    }

    pub fn time_runs(
        &self,
        _prog: Program,
        _frame: &[u8],
        _ifindex: u32,
        _repeat: u32,
    ) -> Result<std::time::Duration, Error> {
        match *self {}
    }

    pub fn attach_underlay(&mut self, _ifindex: u32) -> Result<(), Error> {
        match *self {}
    }

    pub fn attach_tunnel_device(&mut self, _ifindex: u32) -> Result<(), Error> {
        match *self {}
    }

    pub fn detach_underlay(&mut self, _ifindex: u32) -> Result<(), Error> {
        match *self {}
    }

    pub fn attach_port(&mut self, _spec: &PortSpec) -> Result<(), Error> {
        match *self {}
    }

    pub fn update_port(&mut self, _id: PortId, _policy: &PortPolicy) -> Result<(), Error> {
        match *self {}
    }

    pub fn detach_port(&mut self, _id: PortId) -> Result<(), Error> {
        match *self {}
    }

    pub fn set_link(&mut self, _spec: &LinkSpec) -> Result<(), Error> {
        match *self {}
    }

    pub fn set_relay_pair(&mut self, _pair: &RelayPair) -> Result<(), Error> {
        match *self {}
    }

    pub fn relay_pair_counts(&self, _pair: &RelayPair) -> Result<Option<RelayCounts>, Error> {
        match *self {}
    }

    pub fn del_relay_pair(&mut self, _pair: &RelayPair) -> Result<(), Error> {
        match *self {}
    }

    pub fn retain_relay_pairs(&mut self, _keep: impl Fn(&crate::layout::RelayFwdKey) -> bool) {
        match *self {}
    }

    pub fn del_link(&mut self, _id: PortId) -> Result<(), Error> {
        match *self {}
    }

    pub fn apply_table(&mut self, _table: &CompiledTable) -> Result<ApplyReport, Error> {
        match *self {}
    }

    pub fn update_table(
        &mut self,
        _update: impl FnOnce(&mut CompiledTable) -> std::collections::BTreeSet<crate::FwdKey>,
    ) -> Result<ApplyReport, Error> {
        match *self {}
    }

    pub fn table_len(&self) -> usize {
        match *self {}
    }

    pub fn commit(&mut self) -> Result<ApplyReport, Error> {
        match *self {}
    }

    pub fn port_counters(&self, _id: PortId) -> Result<Counters, Error> {
        match *self {}
    }

    pub fn link_counters(&self, _id: PortId) -> Result<Counters, Error> {
        match *self {}
    }

    pub fn rate_available(&self, _id: PortId) -> Result<Option<i64>, Error> {
        match *self {}
    }

    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        match *self {}
    }

    pub fn matrix(&self) -> Result<Vec<MatrixEntry>, Error> {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_says_the_fast_path_is_not_built_in() {
        let e = FastPath::open(&FastPathConfig::default()).unwrap_err();
        assert!(matches!(e, Unavailable::NotBuiltIn));
        assert!(e.to_string().contains("no kernel fast path"), "{e}");
    }
}
