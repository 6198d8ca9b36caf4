//! The IPv4 `forwarding` sysctl of ports' devices, which the fast path turns on (bpf_fib_lookup
//! needs it, see [`enable_forwarding`]) and puts back. std and libc only: vnetd's teardown
//! puts the values back without a fast path, in the build without it too.

/// A device's IPv4 `forwarding` sysctl as it was before the fast path turned it on (see
/// [`crate::FastPath::forwarding_originals`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardingOriginal {
    pub ifindex: u32,
    /// The device's name when the value was recorded: restored only while it still has it.
    pub ifname: String,
    pub enabled: bool,
}

fn ifname(ifindex: u32) -> Option<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `name` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `name`.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

fn forwarding_path(name: &str) -> String {
    format!("/proc/sys/net/ipv4/conf/{name}/forwarding")
}

/// Turns on IPv4 forwarding on a port's device: bpf_fib_lookup, which finds a link's outer
/// next hop, requires it of the device it looks up from. The stack never sees a frame of a
/// port's device (port_ingress takes them all), so this routes nothing; but a device left
/// with it and no program would let its guest route through the host, so the value found is
/// returned for [`crate::FastPath::restore_forwarding`]. Without it, frames to links are punted
/// (counted `fib_fail`).
#[cfg_attr(not(feature = "kernel"), allow(dead_code))]
pub(crate) fn enable_forwarding(ifindex: u32) -> Option<ForwardingOriginal> {
    let name = ifname(ifindex)?;
    let path = forwarding_path(&name);
    let was = std::fs::read_to_string(&path).ok()?.trim() != "0";
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::warn!(%path, %e, "fast path: cannot enable forwarding; frames to links will be punted");
        return None;
    }
    Some(ForwardingOriginal {
        ifindex,
        ifname: name,
        enabled: was,
    })
}

/// Puts a device's forwarding back as `o` says, if the device still has the same name (also
/// for a teardown without a [`crate::FastPath`]: vnetd keeps the values across restarts).
pub fn restore_forwarding(o: &ForwardingOriginal) {
    if ifname(o.ifindex).as_deref() != Some(o.ifname.as_str()) {
        return; // gone (or another device by now): nothing of ours to put back
    }
    let path = forwarding_path(&o.ifname);
    if let Err(e) = std::fs::write(&path, if o.enabled { "1" } else { "0" }) {
        tracing::warn!(%path, %e, "fast path: cannot restore forwarding");
    }
}
