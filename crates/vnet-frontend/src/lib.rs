//! vnet-frontend: a small vhost-user-net **frontend** that plays the VMM, for benchmarking a
//! backend's data path without an emulated CPU and for hostile-frontend robustness tests.
//!
//! The binary `vhost-frontend` connects to a backend's vhost-user socket (or, with
//! `--listen`, accepts one backend in client mode), shares one memfd as guest memory with
//! SET_MEM_TABLE, negotiates like QEMU (GET_FEATURES, SET_OWNER, protocol features MQ and
//! REPLY_ACK when offered, GET_QUEUE_NUM, SET_FEATURES with VERSION_1, MRG_RXBUF, EVENT_IDX and
//! optionally CSUM/GUEST_CSUM/HOST_TSO4/GUEST_TSO4), and sets up split virtqueues: ring 2k
//! receives, ring 2k+1 transmits.
//!
//! ```text
//! vhost-frontend [--socket PATH] [--listen] [--mem-mb 64] [--queue-pairs 1] [--ring-size 256]
//!                [--no-event-idx] [--no-mrg-rxbuf] [--offload] [--timeout 10] <MODE>
//!   probe                      print the negotiated features and queue count (JSON)
//!   bench --role tx|rx|both --size 1500 [--duration S | --count N] [--rate PPS] [--json]
//!         [--dst-mac MAC] [--src-mac MAC] [--batch 32] [--idle 2]
//!   hostile --case NAME|all [--list] [--settle-ms 300] [--rx-wait 1] [--no-round]
//!   isolation --marker BYTES [--scribble] [--duration 30] [--idle 2]
//!   refill [--first 1] [--then 15] [--buffer-len 256] [--wait 2] [--timeout 3]
//! ```
//!
//! `bench` reports frames, bytes (Ethernet, no virtio header), seconds, pps, gbit_per_s,
//! kicks, calls (sum of the call eventfd counters), call_wakeups (reads of them),
//! frames_per_call and calls_per_MB. `hostile` reports per variant whether the backend closed
//! the connection, still answered, still moved frames, and whether the canary (the
//! undeclared second half of the memfd) stayed intact. Exit status: 0 ok, 1 error, 2 the
//! backend disconnected (bench) or a hostile case found corruption/a hang. `isolation` reports
//! whether any byte run of foreign frames (those carrying `--marker`) reached the guest's
//! receive buffers, and checks the frames for it. `refill` offers too few receive buffers,
//! adds more later kicking only as EVENT_IDX says, and reports whether the frames that waited
//! arrived.
//!
//! Modules: [`proto`] wire format, [`conn`] the socket, [`mem`] guest memory, [`ring`] split
//! rings and EVENT_IDX, [`frame`] test frames and checksums, [`device`] bring-up, [`bench`],
//! [`hostile`], [`isolation`] and [`refill`] the modes.
//!
//! It depends on no vnet crate, on purpose: it is the other side of the vhost-user and virtio
//! contracts that `vnet-vhost` and `vnet-offload` implement, written again from the
//! specifications (request codes, ring layouts, the virtio-net header), so that a mistake in
//! the backend's reading of a specification cannot hide on both sides of the tests.

pub mod bench;
pub mod conn;
pub mod device;
pub mod frame;
pub mod hostile;
pub mod isolation;
pub mod mem;
pub mod proto;
pub mod refill;
pub mod ring;
