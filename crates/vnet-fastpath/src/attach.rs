//! The programs on devices: tcx links, pinned by a name that says which program on which
//! device, so a later vnetd finds them ([`held_links`]) and swaps its programs into them
//! instead of detaching (frames flow throughout); the underlay devices' attachments. A device
//! is named by its ifindex, which means something in one network namespace only (a tcx link
//! says no more of itself): the pin directory is one namespace's (vnetd names it by the
//! namespace's cookie, `pin.rs`), so a link found there is on this namespace's device.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::error::Error;
use crate::fastpath::FastPath;
use crate::pin;
use crate::progs::tcx_attach;
use crate::spec::Program;

/// The pin name of the tcx link of `prog` on `ifindex`.
pub(crate) fn link_pin_name(prog: Program, ifindex: u32) -> String {
    let role = match prog {
        Program::PortIngress => "port",
        Program::PuntIngress => "punt",
        Program::UnderlayIngress => "underlay",
        Program::TunnelIngress => "tunnel",
    };
    format!("{role}-{ifindex}")
}

/// The tcx links pinned in `dir` that are still attached, by pin name; defunct ones (their
/// device went) are unpinned.
pub(crate) fn held_links(dir: &Path) -> BTreeMap<String, OwnedFd> {
    let mut held = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return held;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        match pin::open(&e.path()) {
            Ok(Some(fd)) if pin::tcx_link(fd.as_fd()).is_ok_and(|l| l.ifindex != 0) => {
                held.insert(name, fd);
            }
            _ => {
                let _ = pin::unpin(&e.path());
            }
        }
    }
    held
}

impl FastPath {
    /// `prog`'s tcx link on `ifindex`: the one an earlier vnetd pinned there (its program
    /// swapped for ours now, or at `commit` while taking over), or a new one, pinned.
    pub(crate) fn attach(&mut self, p: Program, ifindex: u32) -> Result<OwnedFd, Error> {
        let prog = self.progs.fd(p);
        let name = link_pin_name(p, ifindex);
        if let Some(pins) = &mut self.pins {
            if let Some(fd) = pins.held.remove(&name) {
                let on = pin::tcx_link(fd.as_fd()).map(|l| l.ifindex).unwrap_or(0);
                if on == ifindex {
                    if !pins.holding {
                        pin::update_link(fd.as_fd(), prog)
                            .map_err(|source| Error::Attach { ifindex, source })?;
                    }
                    return Ok(fd);
                }
                // Defunct (its device went) or on another device by now: replaced.
                let _ = pin::unpin(&pins.link_path(&name));
            }
        }
        let fd = tcx_attach(prog, ifindex).map_err(|source| Error::Attach { ifindex, source })?;
        if let Some(pins) = &self.pins {
            if let Err(e) = pin::pin(fd.as_fd(), &pins.link_path(&name)) {
                tracing::warn!(%name, "kernel fast path: cannot pin the attachment ({e}): it goes with this process");
            }
        }
        Ok(fd)
    }

    /// Lets go of a tcx link for good: its pin goes, then the descriptor (which detaches it).
    pub(crate) fn release_link(&self, p: Program, ifindex: u32, fd: OwnedFd) {
        if let Some(pins) = &self.pins {
            let _ = pin::unpin(&pins.link_path(&link_pin_name(p, ifindex)));
        }
        drop(fd);
    }

    pub(crate) fn attached_ifindexes(&self) -> BTreeSet<u32> {
        let mut s: BTreeSet<u32> = self.underlays.keys().copied().collect();
        for p in self.ports.values() {
            s.insert(p.spec.ifindex);
            s.insert(p.spec.punt_ifindex);
        }
        s
    }

    /// Attaches `underlay_ingress` to an underlay netdev (by ifindex): VXLAN for local
    /// fast-path ports is decapsulated there, the rest goes on to the stack untouched.
    pub fn attach_underlay(&mut self, ifindex: u32) -> Result<(), Error> {
        self.attach_device(Program::UnderlayIngress, ifindex)
    }

    /// Variant (a), kept for measurement: attaches `tunnel_ingress` to a collect-metadata
    /// VXLAN device, whose decapsulated frames it delivers to local fast-path ports.
    pub fn attach_tunnel_device(&mut self, ifindex: u32) -> Result<(), Error> {
        self.attach_device(Program::TunnelIngress, ifindex)
    }

    fn attach_device(&mut self, p: Program, ifindex: u32) -> Result<(), Error> {
        if self.attached_ifindexes().contains(&ifindex) {
            return Err(Error::AlreadyAttached(ifindex));
        }
        let fd = self.attach(p, ifindex)?;
        self.underlays.insert(ifindex, (p, fd));
        Ok(())
    }

    pub fn detach_underlay(&mut self, ifindex: u32) -> Result<(), Error> {
        let (p, fd) = self
            .underlays
            .remove(&ifindex)
            .ok_or(Error::UnknownUnderlay(ifindex))?;
        self.release_link(p, ifindex, fd);
        Ok(())
    }
}
