//! The vnet data path: the OS edge. Read it in layers, each importing only those below:
//!
//! ```text
//! engine      the control side: opens ports by kind, publishes snapshots   (engine.rs)
//! ports       one module per port kind: how it opens (its devices, readers  (ports/)
//!             and threads) and how frames leave through it
//! dispatch    dispatcher threads: epoll, polling, modes, pinning            (dispatch.rs)
//! ingress     how frames enter: a Reader per source kind, Source            (ingress/)
//! gro_to_guest coalesced frames to guest NICs, flushed at a batch's end     (gro_to_guest.rs)
//! forward     a frame's decision, and its fan-out through Port::send        (forward.rs)
//! shared      the snapshot of ports and routes, learning, the matrix        (shared.rs)
//! port        the interface between forward and ports                       (port.rs)
//! batch       UDP datagrams deferred to the end of a batch                  (batch.rs)
//! devices     TAP, VXLAN socket, packet socket, guest-NIC trait, guards,    (tap.rs,
//!             an encrypted link's edge, the offload counters (counters.rs)   vxlan_socket.rs, ...)
//!             and what outlives vnetd (made.rs: devices vnetd made, adopted on restart)
//! os          system calls, netlink, namespaces, threads                     (sys.rs, netns.rs, ...)
//!             and the underlay's rtnetlink events                             (underlay_watch.rs)
//! ```
//!
//! A frame's path: a dispatcher finds a descriptor ready, its [`ingress::Reader`] reads a
//! batch and hands each frame to [`forward::process`], which checks it, looks up the route
//! and calls [`port::Port::send`] on each egress port; a udp link's datagrams wait in the
//! batch ([`batch::TxBatch`]) and go out together at its end.

pub mod batch;
pub mod counters;
pub mod crypto;
pub mod dispatch;
pub mod engine;
pub mod forward;
pub mod fragment;
pub mod gro_to_guest;
pub mod guard;
pub mod ingress;
pub mod kernel;
pub mod made;
pub mod netlink;
pub mod netns;
pub mod nic;
pub mod packet;
pub mod port;
pub mod ports;
pub mod reach;
pub mod shared;
pub mod sys;
pub mod tap;
pub mod too_big;
pub mod underlay_watch;
pub mod vxlan_socket;
mod worker;

#[cfg(test)]
mod testing;

pub use engine::{Engine, EngineError, EngineStatus, Leave, NicFactory, ReachPath};
pub use ingress::guest::{
    CutThrough, CutThroughLink, DecidedFrames, GuestFrame, Ingress, GUEST_HEAD,
};
pub use nic::GuestNic;
