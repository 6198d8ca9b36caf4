//! The vnet data path: the OS edge. TAP devices ([`tap`]), the VXLAN/UDP socket ([`udp`]),
//! TCP links ([`tcp`]), direct links on a host NIC ([`packet`]), the dispatcher threads that
//! read them ([`dispatch`]), the forwarding of each frame with software offloads
//! ([`forward`]), and the [`Engine`] that owns it all.

pub mod crypto;
pub mod dispatch;
pub mod engine;
pub mod forward;
pub mod guard;
pub mod netns;
pub mod nic;
pub mod packet;
pub mod sys;
pub mod tap;
pub mod tcp;
pub mod udp;
mod worker;

pub use engine::{DirectLink, Engine, EngineError, Ingress, NicFactory};
pub use nic::GuestNic;
