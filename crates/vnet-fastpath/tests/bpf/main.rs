//! The programs, loaded through the kernel's verifier and run with `BPF_PROG_TEST_RUN` on
//! crafted frames: forwarded, encapsulated, punted, spoofed, oversize, VLAN, broadcast, rate
//! limited, decapsulated (valid and hostile VXLAN, lengths that disagree with the datagram),
//! decisions into another VNI, and the punt TAP's way back; plus table updates, the outer
//! cache's invalidation, locked rate rewrites, the forwarding sysctl put back, pinning and the
//! takeover by a later process, and cleanup. Needs root: each test runs in a network
//! namespace of its own (made by `unshare` on the test's thread) with veth devices, so nothing
//! touches the host but the pins of the pinning tests (a directory of their own on bpffs,
//! removed by the test).
//! Without root the tests skip with a reason, unless VNET_REQUIRE_BPF=1 (CI), which fails.
//!
//! One module a topic; `helpers` holds the lab and the frames they share.

mod forwarding;
mod helpers;
mod lifecycle;
mod relay;
mod tables;
mod timing;
mod vxlan;
