//! The vnet data path: the OS edge. TAP devices ([`tap`]), the VXLAN/UDP socket ([`udp`]),
//! TCP links ([`tcp`]), direct links on a host NIC ([`packet`]), and the [`Engine`] that joins
//! them through the routing core of `vnet-core`.

pub mod engine;
pub mod netns;
pub mod packet;
pub mod sys;
pub mod tap;
pub mod tcp;
pub mod udp;
mod worker;

pub use engine::{Engine, EngineError, PortStatus};
