//! Why the fast path cannot be had ([`Unavailable`], from [`crate::FastPath::open`]: vnetd logs
//! it once and runs everything in user space) and why one of its operations failed ([`Error`]).

#![forbid(unsafe_code)]

use vnet_core::PortId;

/// Why the BPF programs could not be loaded, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("no privilege to load BPF programs ({0}): run vnetd as root, or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON")]
    NoPrivilege(String),
    #[error("the kernel is too old for vnet's fast path ({0}): it needs Linux 6.6 or later (tcx)")]
    KernelTooOld(String),
    #[error("BPF is disallowed on this machine ({0}): a setting such as kernel lockdown, a seccomp filter or an LSM refuses it")]
    Disallowed(String),
    #[error("the kernel's verifier refused program {program} (a bug in vnet, please report it with this log):\n{log}")]
    Verifier { program: String, log: String },
    #[error("the fast path could not be set up: {0}")]
    Other(String),
    #[error("this build has no kernel fast path (built without the cargo feature kernel-fastpath of vnetd, or kernel of vnet-fastpath)")]
    NotBuiltIn,
}

/// A failed fast-path operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("port {0:?} is not attached to the fast path")]
    UnknownPort(PortId),
    #[error("link {0:?} is not on the fast path")]
    UnknownLink(PortId),
    #[error("port {0:?} is already attached")]
    PortExists(PortId),
    #[error("no free {0} slot (the fast path holds at most {1}): it stays on the slow path")]
    Full(&'static str, u32),
    #[error("ifindex {0} already has a fast-path program attached by this process")]
    AlreadyAttached(u32),
    #[error("underlay ifindex {0} is not attached")]
    UnknownUnderlay(u32),
    #[error("attaching to ifindex {ifindex} failed: {source}")]
    Attach {
        ifindex: u32,
        source: std::io::Error,
    },
    #[cfg(feature = "kernel")]
    #[error("BPF map {map}: {source}")]
    Map {
        map: &'static str,
        source: libbpf_rs::Error,
    },
    #[error("invalid setting: {0}")]
    Invalid(String),
}
