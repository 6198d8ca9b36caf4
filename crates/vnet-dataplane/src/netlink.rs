//! rtnetlink: the link operations the data path needs (find a device, move one into a
//! namespace, bring one up, delete one) are the `vnet-netlink` crate's, shared with vnet-cni.

pub use vnet_netlink::{describe, LinkDesc, Rtnl};
