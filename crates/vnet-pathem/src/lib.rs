//! vnet-pathem: the wide-area lab's path emulator. This kernel has no `netem`, so delay,
//! jitter, random loss and a rate on a path come from this small user-space forwarder: it sits
//! in a namespace of its own between two interfaces (a bump in the wire on the lab's public
//! segment, see `vnetlab/wanlab.py`) and forwards every frame from one to the other, each
//! direction with its own impairment.
//!
//! - `spec`: what a direction does (`delay=10ms,jitter=1ms,loss=0.5%,rate=100mbit`), parsed;
//! - `schedule`: when a frame leaves or why it is dropped (pure, tested with a given clock);
//! - `queue`: the bounded delay line (pure);
//! - `stats`: the counters, as JSON;
//! - `packet`: AF_PACKET sockets (the only `unsafe`), `forward`: one direction's thread.

pub mod forward;
pub mod packet;
pub mod queue;
pub mod schedule;
pub mod spec;
pub mod stats;
