//! rtnetlink for vnet, synchronously, with messages built and read by `netlink-packet-route`
//! rather than by hand: one library for the data path (vnet-dataplane: TAPs, veths, the
//! kernel fast path's devices) and the CNI plugin (vnet-cni: the container's side of its NIC).
//!
//! `message` builds the requests and reads the answers (pure); [`Rtnl`] is the socket that
//! sends them, one request at a time in the calling thread's namespace; [`in_netns`] runs a
//! job in another namespace.

mod message;
mod netns;
mod rtnl;

pub use message::{address_of, describe, LinkDesc};
pub use netns::in_netns;
pub use rtnl::Rtnl;
