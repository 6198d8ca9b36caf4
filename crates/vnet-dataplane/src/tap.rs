//! TAP devices: a local VM's NIC, or a namespace playing one.
//!
//! With offload on (the default), the TAP is opened with `IFF_VNET_HDR` and told that vnet
//! handles checksum and TSO/USO (`TUNSETOFFLOAD`), so the guest hands over 64 KB segments with
//! partial checksums, and vnet may hand it coalesced segments back. `queues N` opens N queues
//! (`IFF_MULTI_QUEUE`), one descriptor each, which different dispatchers can serve.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tracing::warn;
use vnet_control::Interface;
use vnet_core::DropReason;
use vnet_offload::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};
use vnet_wire::MAX_FRAME_LEN;

use crate::made;
use crate::netlink::Rtnl;
use crate::netns;
use crate::nic::GuestNic;
use crate::sys::{self, IfReq};

// linux/if_tun.h, as libc has it; `ifr_flags` is a short.
use libc::{TUNSETIFF, TUNSETOFFLOAD, TUNSETPERSIST};
use libc::{TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN, TUN_F_USO4, TUN_F_USO6};
const IFF_TAP: i16 = libc::IFF_TAP as i16;
const IFF_NO_PI: i16 = libc::IFF_NO_PI as i16;
const IFF_VNET_HDR: i16 = libc::IFF_VNET_HDR as i16;
const IFF_MULTI_QUEUE: i16 = libc::IFF_MULTI_QUEUE as i16;

static NO_USO_LOGGED: AtomicBool = AtomicBool::new(false);

/// An open TAP device. vnetd's own TAPs are persistent (`TUNSETPERSIST`) and carry its alias
/// `vnet:INSTANCE:NAME` ([`crate::made`]): closing them leaves the device (the guest keeps its NIC and
/// addresses across a restart; a TAP without a reader has no carrier); [`Tap::remove`] deletes
/// it. A TAP someone else made is attached to and never removed.
#[derive(Debug)]
pub struct Tap {
    queues: Vec<File>,
    ifname: String,
    netns: Option<String>,
    max_frame: usize,
    vnet_hdr: bool,
    /// vnetd made it (persistent, with its alias).
    made: bool,
    /// It was there already: a TAP an earlier run of this vnetd made, adopted.
    adopted: bool,
}

fn open_queue(ifname: &str, flags: i16) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq::new(ifname)?;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    req.ioctl(file.as_raw_fd(), TUNSETIFF)
        .map_err(|e| io::Error::new(e.kind(), format!("TUNSETIFF {ifname}: {e}")))?;
    sys::set_nonblocking(file.as_raw_fd())?;
    Ok(file)
}

/// `TUNSETPERSIST`: whether the device outlives its last descriptor.
fn set_persist(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its argument by value (an int flag), no pointer.
    sys::cvt(unsafe { libc::ioctl(fd, TUNSETPERSIST as _, on as libc::c_ulong) }).map(|_| ())
}

fn set_offload(fd: RawFd) -> io::Result<()> {
    let base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned int), no pointer.
    let r = unsafe {
        libc::ioctl(
            fd,
            TUNSETOFFLOAD as _,
            (base | TUN_F_USO4 | TUN_F_USO6) as libc::c_ulong,
        )
    };
    if r == 0 {
        return Ok(());
    }
    if !NO_USO_LOGGED.swap(true, Relaxed) {
        warn!("this kernel's TAP has no UDP segmentation offload (USO); using TSO and checksum offload only");
    }
    // SAFETY: as above.
    sys::cvt(unsafe { libc::ioctl(fd, TUNSETOFFLOAD as _, base as libc::c_ulong) }).map(|_| ())
}

/// What is at the TAP's name in its namespace before vnetd opens it.
enum Found {
    Nothing,
    /// A TAP this vnetd made for this interface (an earlier run's): adopted (and marked
    /// anew when its alias is of the old format).
    Ours {
        mark: bool,
    },
    /// A TAP someone else made: attached to, never removed.
    Foreign,
    /// Another kind of device this vnetd made for this interface (a veth from a run with the
    /// kernel fast path): removed first.
    OursOtherKind(u32),
}

/// Whose the device `l` is, for interface `iface`: recorded (an old-format alias) at its name
/// now or at the name the interface asks for (a guest may have renamed it since).
fn whose_tap<'a>(
    me: &made::Owner,
    iface: &Interface,
    l: &'a crate::netlink::LinkDesc,
) -> made::Whose<'a> {
    let at = made::MadeDevice::new(iface.netns.as_deref(), &l.name);
    let asked = made::MadeDevice::new(iface.netns.as_deref(), &iface.ifname);
    me.whose(l.alias.as_deref(), &[&at, &asked])
}

/// Opens the TAP's queues and sets it up, in the thread's current namespace (the caller
/// runs it inside the interface's namespace).
fn open_here(
    iface: &Interface,
    flags: i16,
    me: &made::Owner,
) -> io::Result<(Vec<File>, String, bool, bool)> {
    let mut nl = Rtnl::open()?;
    let mine = me.alias(&iface.name);
    // By its name, or else by this vnetd's alias: a guest may have renamed its NIC (a CNI
    // plugin renames it to the container's eth0).
    let at_name = nl.link(&iface.ifname)?;
    let existing = match at_name {
        Some(l) => Some(l),
        None => nl.links()?.into_iter().find(|l| {
            l.kind.as_deref() == Some("tun")
                && whose_tap(me, iface, l).mine() == Some(iface.name.as_str())
        }),
    };
    let found = match &existing {
        None => Found::Nothing,
        Some(l) => match (l.kind.as_deref(), whose_tap(me, iface, l)) {
            (Some("tun"), w) if w.mine() == Some(iface.name.as_str()) => Found::Ours {
                mark: me.needs_mark(l.alias.as_deref(), &iface.name),
            },
            (Some("tun"), made::Whose::NotVnet) => Found::Foreign,
            (Some("tun"), w) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("TAP {} is {}", iface.ifname, w.describe()),
                ))
            }
            (_, w) if w.mine() == Some(iface.name.as_str()) => Found::OursOtherKind(l.index),
            (_, made::Whose::NotVnet) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("device {} exists and is not a TAP", iface.ifname),
                ))
            }
            (_, w) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("device {} exists and is {}", iface.ifname, w.describe()),
                ))
            }
        },
    };
    let name = match (&found, &existing) {
        (Found::Ours { .. } | Found::Foreign, Some(l)) => l.name.clone(),
        _ => iface.ifname.clone(),
    };
    if let Found::OursOtherKind(index) = found {
        tracing::info!(device = %iface.ifname, "removing the device an earlier vnetd made for interface {} (another kind)", iface.name);
        nl.del_link(index)?;
    }
    let mut queues = Vec::new();
    for _ in 0..iface.queues.max(1) {
        let q = open_queue(&name, flags)?;
        if iface.offload {
            set_offload(q.as_raw_fd())
                .map_err(|e| io::Error::new(e.kind(), format!("TUNSETOFFLOAD {name}: {e}")))?;
        }
        queues.push(q);
    }
    let created = matches!(found, Found::Nothing | Found::OursOtherKind(_));
    let made = !matches!(found, Found::Foreign);
    let l = nl
        .link(&name)?
        .ok_or_else(|| io::Error::other(format!("{name} vanished")))?;
    if created {
        set_persist(queues[0].as_raw_fd(), true)
            .map_err(|e| io::Error::new(e.kind(), format!("TUNSETPERSIST {name}: {e}")))?;
    }
    if created || matches!(found, Found::Ours { mark: true }) {
        nl.set_alias(l.index, &mine)?;
    }
    // Only what differs is set: an adopted TAP keeps its state (its addresses above all).
    if l.address != Some(iface.mac.0) {
        nl.set_address(l.index, iface.mac.0)
            .map_err(|e| io::Error::new(e.kind(), format!("set MAC of {name}: {e}")))?;
    }
    if l.mtu != Some(iface.mtu) {
        nl.set_mtu(l.index, iface.mtu)
            .map_err(|e| io::Error::new(e.kind(), format!("set MTU of {name}: {e}")))?;
    }
    // A TAP it adopts keeps its administrative state; a new or foreign one is brought up.
    let adopted = matches!(found, Found::Ours { .. });
    if !adopted {
        nl.set_up(l.index, true)?;
    }
    Ok((queues, name, made, adopted))
}

impl Tap {
    /// Creates the TAP of `iface` in the interface's namespace (vnetd's own when it names
    /// none), or adopts the one an earlier vnetd made there, or attaches to one someone else
    /// made; sets its MAC and MTU where they differ and brings a new one up.
    pub fn open(iface: &Interface) -> io::Result<Tap> {
        let mut flags = IFF_TAP | IFF_NO_PI;
        if iface.offload {
            flags |= IFF_VNET_HDR;
        }
        if iface.queues > 1 {
            flags |= IFF_MULTI_QUEUE;
        }
        // The device is created (or found) in the namespace of the thread that opens the
        // clone device: the queues are opened inside the interface's namespace, and work from
        // any thread afterwards.
        let me = made::owner();
        let (queues, ifname, made, adopted) = match iface.netns.as_deref() {
            None => open_here(iface, flags, &me)?,
            Some(ns) => {
                let ns = netns::open_netns(ns)?;
                let i = iface.clone();
                netns::in_netns(&ns, move || open_here(&i, flags, &me))?
            }
        };
        if adopted {
            tracing::info!(device = %ifname, netns = ?iface.netns, "TAP adopted (made by an earlier vnetd)");
        }
        Ok(Tap {
            queues,
            ifname,
            netns: iface.netns.clone(),
            // MTU plus Ethernet header and one VLAN tag.
            max_frame: iface.mtu as usize + 18,
            vnet_hdr: iface.offload,
            made,
            adopted,
        })
    }

    /// Whether vnetd made this TAP (then [`Tap::remove`] deletes it).
    pub fn made(&self) -> bool {
        self.made
    }

    /// Whether an earlier vnetd made it and this one adopted it.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// Deletes a TAP vnetd made: it stops being persistent and goes with its last
    /// descriptor. A TAP someone else made is left alone.
    pub fn remove(&self) {
        if !self.made {
            return;
        }
        if let Err(e) = set_persist(self.queues[0].as_raw_fd(), false) {
            warn!(device = %self.ifname, "could not remove the TAP: {e}");
        }
    }

    /// Where the TAP is.
    pub fn device(&self) -> made::MadeDevice {
        made::MadeDevice {
            netns: self.netns.clone(),
            ifname: self.ifname.clone(),
        }
    }

    pub fn queue_fd(&self, q: usize) -> RawFd {
        self.queues[q % self.queues.len()].as_raw_fd()
    }

    pub fn queues(&self) -> usize {
        self.queues.len()
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

impl GuestNic for Tap {
    /// Delivers a frame (given in parts, gathered by the kernel) to the guest on queue `q`.
    /// `vh` must be plain when the TAP has no virtio-net header.
    fn write(&self, q: usize, vh: &VirtioNetHdr, parts: &[&[u8]]) -> Result<(), DropReason> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let limit = if vh.gso_kind() != VirtioNetHdr::GSO_NONE {
            MAX_FRAME_LEN
        } else {
            self.max_frame
        };
        if len > limit {
            return Err(DropReason::Oversize);
        }
        let fd = self.queues[q % self.queues.len()].as_raw_fd();
        let hdr = vh.emit();
        let mut iov: [&[u8]; 20] = [&[]; 20];
        let mut n = 0;
        if self.vnet_hdr {
            iov[0] = &hdr[..VIRTIO_NET_HDR_LEN];
            n = 1;
        }
        let r = if parts.len() + n <= iov.len() {
            for p in parts {
                iov[n] = p;
                n += 1;
            }
            sys::writev(fd, &iov[..n])
        } else {
            let mut v: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
            v.extend_from_slice(&iov[..n]);
            v.extend_from_slice(parts);
            sys::writev(fd, &v)
        };
        r.map(|_| ()).map_err(|_| DropReason::TxError)
    }

    fn has_vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    fn max_frame(&self) -> usize {
        self.max_frame
    }
}
