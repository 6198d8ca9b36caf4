//! vhost-user-net backend: a VM's virtio-net device served by vnetd.
//!
//! The VMM (QEMU, Cloud Hypervisor, ...) shares the guest's memory and virtqueues over a
//! vhost-user socket; this backend, built on the rust-vmm crates, takes frames the guest
//! transmits straight from its descriptors and hands them to the overlay, and writes frames
//! for the guest into its receive descriptors (mergeable buffers), with the virtio-net
//! header's checksum and TSO offloads negotiated with the guest and `EVENT_IDX` notification
//! suppression. The VM rebooting or vnetd restarting is a new connection on the same socket.
//!
//! Every descriptor the guest offers is hostile until checked: chains are bounded (the
//! virtio-queue iterator stops loops and out-of-table indices), every access goes through
//! `vm-memory`'s checked copies (nothing outside the guest's regions is ever touched), a
//! transmit chain with a write-only descriptor or more bytes than a frame can have is
//! dropped and counted, and a receive buffer too small for the header is refused.
//!
//! Status (issue #4, in progress): one queue pair, copy path, batch notification. vnetd does
//! not register this factory yet: QEMU 7.2 (Debian 12) sends `SET_VRING_ENABLE` when the NIC
//! is realized, before `SET_FEATURES`; `vhost`'s request handler refuses that without an acked
//! `VHOST_USER_F_PROTOCOL_FEATURES`, and without protocol features QEMU refuses to start the
//! device (it needs `SET_VRING_ENABLE`). Next: handle the vhost-user requests ourselves (or
//! accept that early message), then multiqueue, cut-through and optimistic notification.

mod backend;

pub use backend::{VhostFactory, VhostNic};
