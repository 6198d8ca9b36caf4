//! The routing core of vnet (paper 001, section 4.2): route rules on (source MAC, destination
//! MAC), the hash route cache over them, the forwarding decision for a frame (route, flood,
//! learn or drop), per-port counters with drop reasons, and the traffic matrix.
//!
//! Ports (interfaces and links) are known here only by a [`PortId`], their VNI and their
//! [`PortKind`]; everything that touches the OS lives in `vnet-dataplane`.

#![forbid(unsafe_code)]

mod cache;
mod forward;
mod learn;
mod matrix;
mod ratelimit;
mod route;
mod stats;
mod sync;
#[cfg(test)]
mod testing;

pub use cache::RouteCache;
pub use forward::{
    Decision, ForwardingTable, PortInfo, PortKind, TableChange, Targets, Touched, CHANGE_LOG_DEPTH,
};
pub use learn::{LearnTable, LEARN_AGE_MS, LEARN_CAPACITY};
pub use matrix::{MatrixEntry, TrafficMatrix, MATRIX_CAPACITY};
pub use ratelimit::TokenBucket;
pub use route::{MacMatch, RouteRule, RouteTable};
pub use stats::{DropReason, PortCounters, PortCountersSnapshot};
pub use sync::{CondvarRecover, LockRecover, RwLockRecover};

/// Hash maps on the forwarding path: aHash (fast, and keyed per process so a guest choosing
/// MACs cannot aim collisions at a table).
pub type FastMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
pub type FastSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// A port of the switch: an interface or a link, numbered by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PortId(pub u32);
