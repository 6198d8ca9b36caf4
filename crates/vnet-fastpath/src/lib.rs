//! vnet's kernel fast path (issue #10): eBPF programs at tcx that forward, entirely in the
//! kernel, what vnet's forwarding table can decide exactly (known unicast between fast-path
//! ports and plain udp links), with vnetd as the control plane and slow path, as ovs-vswitchd
//! is to the OVS kernel datapath.
//!
//! - [`compile()`] (pure): route rules and ports to the forwarding map's contents, only where the
//!   result equals `vnet_core::ForwardingTable::decide`; the rest is slow.
//! - [`FastPath`] (I/O): loads and verifies the programs (`bpf/fastpath.bpf.c`, built by
//!   clang in build.rs), attaches them with tcx, and keeps the maps in step.
//! - [`layout`] (pure): the maps' keys and values, the settings, flags and counter indexes,
//!   defined once in `src/layout_def.rs` and expanded once into the Rust types and the
//!   programs' C header (`layout_c`: its C spelling), which build.rs writes; a test checks the
//!   compiled object's BTF against them, without root.
//!
//! The kernel side (the programs, their libbpf skeleton, the loader) is the cargo feature
//! `kernel` (on by default; vnetd's `kernel-fastpath`). Without it nothing needs clang or
//! libbpf: [`compile()`], [`layout`] and the plain types build, and [`FastPath::open`] says
//! the kernel fast path is not built in.
//!
//! Modules, bottom up: `spec`, `layout_c`, `layout`, `sysctl`, `error`, `compile`, `pin`
//! (pure); with the feature `maps` (skeleton and typed maps), `progs`, `takeover`, `fastpath`
//! (the struct), then one job each on it: `load`, `attach`, `slots`, `table`, `readout`.
//!
//! The call sequence of an engine:
//!
//! ```no_run
//! use std::net::Ipv4Addr;
//! use vnet_core::{MacMatch, PortId, RouteRule};
//! use vnet_fastpath::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let (eth0, veth_host, punt_tap) = (2, 5, 6);
//! # let mac: vnet_wire::MacAddr = "52:54:00:00:0a:01".parse()?;
//! # let remote_mac: vnet_wire::MacAddr = "52:54:00:00:0b:01".parse()?;
//! let mut fp = match FastPath::open(&FastPathConfig::default()) {
//!     Ok(fp) => fp,
//!     Err(why) => { eprintln!("kernel fast path off: {why}"); return Ok(()) } // all in user space
//! };
//! fp.attach_underlay(eth0)?;
//! fp.attach_port(&PortSpec {
//!     id: PortId(1), ifindex: veth_host, punt_ifindex: punt_tap, mac, vni: 1, mtu: 1450,
//!     delivery: Delivery::Peer, policy: PortPolicy::default(),
//! })?;
//! fp.set_link(&LinkSpec {
//!     id: PortId(2), vni: 1, remote: Ipv4Addr::new(10, 0, 0, 2), local: Ipv4Addr::new(10, 0, 0, 1),
//!     udp_port: 4789, rate: None, via_device: None, src_port: None, punt: false, path_mtu: None,
//!     relay_tag: None,
//! })?;
//! let ports = [
//!     CompilePort { id: PortId(1), vni: 1, egress: Egress::FastPort },
//!     CompilePort { id: PortId(2), vni: 1, egress: Egress::UdpLink },
//! ];
//! let rules = [
//!     RouteRule { vni: 1, src: MacMatch::Any, dst: MacMatch::Exact(mac), dest: PortId(1) },
//!     RouteRule { vni: 1, src: MacMatch::Any, dst: MacMatch::Exact(remote_mac), dest: PortId(2) },
//! ];
//! fp.apply_table(&compile(&ports, &rules, false))?;   // again on every configuration change
//! let c = fp.port_counters(PortId(1))?;                // merge into `show stats`
//! let m = fp.matrix()?;                                 // merge into `show matrix`
//! # let _ = (c, m);
//! fp.detach_port(PortId(1))?;
//! drop(fp);                                             // detaches and frees everything
//! # Ok(()) }
//! ```

pub mod compile;
mod error;
pub mod layout;
mod layout_c;
pub mod pin;
mod spec;
mod sysctl;

#[cfg(feature = "kernel")]
mod attach;
#[cfg(feature = "kernel")]
mod fastpath;
#[cfg(feature = "kernel")]
mod load;
#[cfg(feature = "kernel")]
mod maps;
#[cfg(feature = "kernel")]
mod progs;
#[cfg(feature = "kernel")]
mod readout;
#[cfg(feature = "kernel")]
mod relay;
#[cfg(feature = "kernel")]
mod slots;
#[cfg(feature = "kernel")]
mod table;
#[cfg(feature = "kernel")]
mod takeover;
#[cfg(not(feature = "kernel"))]
mod unbuilt;

pub use compile::{
    compile, kernel_decision, plan_update, recompile, Action, CompilePort, CompiledTable, Egress,
    FwdEntry, FwdKey, KernelDecision, KeyKind, TablePlan, Touched,
};
pub use error::{Error, Unavailable};
#[cfg(feature = "kernel")]
pub use fastpath::{FastPath, OuterCacheInvalidator};
#[cfg(feature = "kernel")]
pub use readout::{CounterSlot, Readout};
pub use spec::{
    ApplyReport, Counters, Delivery, FastPathConfig, GlobalCounters, LinkSpec, PortPolicy,
    PortSpec, Program, Rate, RelayCounts, RelayPair, TestRun, TCX_DROP, TCX_NEXT, TCX_PASS,
    TCX_REDIRECT,
};
pub use sysctl::{restore_forwarding, ForwardingOriginal};
#[cfg(not(feature = "kernel"))]
pub use unbuilt::{CounterSlot, FastPath, OuterCacheInvalidator, Readout};
