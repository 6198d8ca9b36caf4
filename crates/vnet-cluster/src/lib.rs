//! Distributed control of a vnet overlay from etcd (issue #5): the key schema and its records,
//! the decoded state of an overlay, the derivation of each host's links and routes from it,
//! migration announcements and direct-link suggestions. Pure: no sockets, no etcd client, no
//! files. The daemon feeds it the store's keys and values and applies what it derives.
//!
//! # The key schema
//!
//! Everything about overlay `O` lives under `/vnet/O/`. Values are JSON records; a reader
//! ignores fields it does not know. Keys are canonical (decimal VNI without leading zeros,
//! lower-case MAC with colons): [`parse_key`] refuses any other spelling.
//!
//! | key | value | written by |
//! | --- | --- | --- |
//! | `/vnet/O/hosts/<host-id>` | [`HostRecord`]: `host_id`, `addr` (underlay IPv4 or IPv6), `udp_port`, `tcp_port` (optional), `capabilities` (`vxlan`, `tcp`, `noise`), `public_key` (optional, base64), `version` | the host's daemon, under its lease |
//! | `/vnet/O/interfaces/<vni>/<mac>` | [`InterfaceRecord`]: `mac`, `vni`, `host_id`, `name`, `epoch` | the daemon of the host named, under that host's lease |
//! | `/vnet/O/routes/<id>` | [`RouteRecord`]: `line` (a `route add` line of the control language), `host_id` (optional: only that host) | operators (`vnetctl --etcd`) |
//! | `/vnet/O/policy` | [`Policy`]: `{"template":"mesh"}`, `{"template":"star","proxy":"<host-id>"}` or `{"template":"explicit"}`; absent means mesh | operators |
//! | `/vnet/O/matrix/<host-id>` | [`MatrixRecord`]: the host's traffic matrix, `{"host_id":..,"pairs":[{"vni","src","dst","frames","bytes"},..]}` (the heaviest 512 pairs), read by `vnetctl suggest`; not a [`ClusterKey`] ([`key_for_matrix`]) | the host's daemon, under its lease |
//!
//! Host ids, overlay names and route ids are short words of `A-Z a-z 0-9 _ - .` (host ids at
//! most 20 characters, so that derived link names stay valid). Example:
//!
//! ```text
//! /vnet/lab/hosts/b                          {"host_id":"b","addr":"10.0.0.2","udp_port":4789,"capabilities":["vxlan"],"version":1}
//! /vnet/lab/interfaces/1/52:54:00:00:0b:01   {"mac":"52:54:00:00:0b:01","vni":1,"host_id":"b","name":"vm-b1","epoch":0}
//! /vnet/lab/routes/gw                        {"line":"route add any 52:54:00:00:ff:01 link uplink","host_id":"a"}
//! /vnet/lab/policy                           {"template":"star","proxy":"hub"}
//! ```
//!
//! An interface's placement is one key per (VNI, MAC), so a migration rewrites exactly one key,
//! in one transaction conditioned on the previous host and epoch ([`plan_move`],
//! [`InterfaceMove`]); the new record has `epoch + 1` and is put under the new host's lease.
//! When a host dies its lease expires, its host record and placements vanish, and every other
//! daemon's next derivation drops the links and routes to it.
//!
//! # What is derived ([`derive()`])
//!
//! For the local host, from the [`ClusterState`] and the host's **local** configuration:
//!
//! - **Links**, one per (remote host, VNI), named `c-<host>-v<vni>` ([`derived_link_name`]),
//!   `udp ADDR:UDP_PORT vni N` when both hosts have capability `vxlan`, else a TCP link
//!   (`tcp ADDR:TCP_PORT` from the smaller host id, `tcp accept ADDR` on the other) when both
//!   have `tcp`. A link carries one VNI in the control language, hence one per VNI. Mesh: to
//!   every host that serves a VNI this host serves. Star: a host links only to the proxy, for
//!   each of its VNIs that another host also serves; the proxy links to every host, for each
//!   VNI that at least two hosts use. Explicit: no links. Between two hosts that both have
//!   capability `noise` and a valid `public_key`, the UDP link is encrypted
//!   (`encrypt PEER_KEY`); a host with a key is not linked to one without
//!   ([`Conflict::EncryptionMismatch`]), nor by TCP.
//! - **Routes**: `route add any MAC interface NAME` for each local interface, and
//!   `route add any MAC link L` for each remote interface, where `L` reaches its host (under a
//!   star, the proxy's link). Placement decides: a local interface whose placement names
//!   another host is routed there (it has moved).
//! - **Broadcast**: in a mesh nothing is derived. Links are per VNI and go exactly to the hosts
//!   that serve it, so flooding reaches every such host once, and its split horizon (a frame
//!   from an overlay link is not flooded to another) stops loops; an explicit broadcast route
//!   would instead bypass the local interfaces and loop between hosts. The star's proxy, where
//!   split horizon would stop the relay, gets `route add any broadcast ...` to every port of
//!   the VNI (a multi-destination route of equal rank; the ingress port is left out). Other
//!   multicast (IPv6 neighbour discovery) is not relayed by the proxy unless an operator adds
//!   routes for it.
//! - **Operator routes** from the store, in every template, for this host (no `host_id`, or
//!   this one), when their destination exists here (a local interface or link, or a derived
//!   link, so `link c-b-v1` names "host b in VNI 1" on every host).
//!
//! The result is sorted and does not depend on the order the store's events arrived in.
//!
//! # Conflicts: the local configuration wins
//!
//! The local control language's own objects win over derived ones. A derived link whose name a
//! local link already has (with another definition) is skipped, with the routes over it; a
//! derived link to a peer a local link already reaches (same address and VNI) is skipped and
//! its routes use the local link. A derived or operator route with the same source and
//! destination in the same VNI as a local route is skipped (equal-rank routes would otherwise
//! both be used); operator routes win over the other derived routes the same way. Each skip is
//! reported as a [`Conflict`]; an object identical to a local one is simply not repeated.
//! Local names should not use the prefixes `c-` (derived) and `d-` (suggested).
//!
//! # Driving it from the daemon
//!
//! 1. At start and after every reconnection, read the whole prefix ([`overlay_prefix`]) into
//!    [`ClusterState::from_entries`], then watch from the read's revision and feed each event
//!    to [`ClusterState::apply_put`] / [`ClusterState::apply_delete`]. Errors are bad entries
//!    to count and log; the state keeps its last good knowledge. While etcd is unreachable,
//!    keep the state and the running configuration as they are: nothing is derived from a
//!    missing state, so nothing flaps.
//! 2. After every change (store or local), [`derive()`] with the local-only configuration (the
//!    config file plus control-port commands, without derived objects), bring the record of
//!    what was applied in line with reality ([`DerivedConfig::retain_present`] against the
//!    running configuration), and apply [`diff`]`(applied, derived)` to the running
//!    configuration one command at a time, recording each success with
//!    [`DerivedConfig::apply`]. A failed command is retried by the next diff, so a resync is
//!    idempotent.
//! 3. After a migration, the new host injects [`announce_frame`] as if received from the
//!    moved interface, so learning switches and kernel peers relearn the MAC at once.
//! 4. The host publishes its own [`HostRecord`] and an [`InterfaceRecord`] per local interface
//!    under its lease, and listens for TCP links on `tcp_port` when it publishes `tcp`.

#![forbid(unsafe_code)]

mod announce;
mod derive;
mod incremental;
mod matrix;
mod schema;
mod state;
mod suggest;

pub use announce::{
    announce_frame, gratuitous_arp, gratuitous_rarp, ANNOUNCE_FRAME_LEN, ETHERTYPE_ARP,
    ETHERTYPE_IPV4, ETHERTYPE_RARP,
};
pub use derive::{
    derive, derived_link_name, diff, render_command, Conflict, Derivation, DerivedApplyError,
    DerivedConfig, Overrider, DERIVED_LINK_PREFIX,
};
pub use incremental::Deriver;
pub use matrix::{MatrixRecord, MAX_MATRIX_PAIRS};
pub use schema::{
    encode, hosts_prefix, key_for_host, key_for_interface, key_for_matrix, key_for_policy,
    key_for_route, matrix_prefix, overlay_prefix, parse_entry, parse_key, plan_move,
    CandidateRecord, ClusterEntry, ClusterKey, HostId, HostReach, HostRecord, InterfaceMove,
    InterfaceRecord, OperatorRoute, OverlayName, Policy, RouteId, RouteRecord, SchemaError,
    CAP_NOISE, CAP_RELAY, CAP_TCP, CAP_VXLAN, KEY_ROOT, MAX_HOST_ID_LEN, MAX_KEY_LEN,
    MAX_OVERLAY_NAME_LEN, MAX_ROUTE_ID_LEN, MAX_VALUE_LEN, SCHEMA_VERSION,
};
pub use state::ClusterState;
pub use suggest::{suggest, suggested_link_name, SuggestedLink, SUGGESTED_LINK_PREFIX};
