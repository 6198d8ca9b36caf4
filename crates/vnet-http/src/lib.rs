//! vnetd's HTTP listener (`vnetd --http ADDR`): Prometheus metrics at `/metrics`, and a live
//! view of this host and, with `--etcd`, of the whole overlay at `/` (one page, its script and
//! style embedded in the binary, polling JSON at `/api/host` and `/api/overlay`).
//!
//! - [`request`]: the request head, parsed with limits (pure);
//! - [`server`]: the listener, bounded in connections, head size and time, every refusal
//!   counted;
//! - [`app`]: the resources, the token and `Host` checks;
//! - [`metrics`]: the status structs as OpenMetrics text, written directly;
//! - [`overlay`]: the overlay's picture from the agent's state and the published traffic
//!   matrices (pure);
//! - [`source`]: what the listener reads from the daemon.

#![forbid(unsafe_code)]

pub mod app;
pub mod metrics;
pub mod overlay;
pub mod request;
pub mod server;
pub mod source;

pub use app::App;
pub use metrics::BuildInfo;
pub use server::{spawn, HttpCounters, Limits};
pub use source::{AgentSnapshot, HostSnapshot, OverlaySnapshot, Source};
