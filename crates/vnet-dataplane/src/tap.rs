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

use crate::netns;
use crate::nic::GuestNic;
use crate::sys::{self, IfReq};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const IFF_MULTI_QUEUE: i16 = 0x0100;
const TUN_F_CSUM: u32 = 0x01;
const TUN_F_TSO4: u32 = 0x02;
const TUN_F_TSO6: u32 = 0x04;
const TUN_F_TSO_ECN: u32 = 0x08;
const TUN_F_USO4: u32 = 0x20;
const TUN_F_USO6: u32 = 0x40;

static NO_USO_LOGGED: AtomicBool = AtomicBool::new(false);

/// An open TAP device. Closing it removes the device unless it was made persistent outside
/// vnet (then vnet only attached to it).
#[derive(Debug)]
pub struct Tap {
    queues: Vec<File>,
    ifname: String,
    max_frame: usize,
    vnet_hdr: bool,
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

impl Tap {
    /// Creates (or attaches to) the TAP of `iface`, sets its MAC and MTU, brings it up and moves
    /// it into the interface's namespace if one is named.
    pub fn open(iface: &Interface) -> io::Result<Tap> {
        let ns = iface.netns.as_deref().map(netns::open_netns).transpose()?;
        let mut flags = IFF_TAP | IFF_NO_PI;
        if iface.offload {
            flags |= IFF_VNET_HDR;
        }
        if iface.queues > 1 {
            flags |= IFF_MULTI_QUEUE;
        }
        let mut queues = Vec::new();
        for _ in 0..iface.queues.max(1) {
            let q = open_queue(&iface.ifname, flags)?;
            if iface.offload {
                set_offload(q.as_raw_fd()).map_err(|e| {
                    io::Error::new(e.kind(), format!("TUNSETOFFLOAD {}: {e}", iface.ifname))
                })?;
            }
            queues.push(q);
        }
        let name = iface.ifname.clone();
        sys::set_mac(&name, iface.mac.0)
            .map_err(|e| io::Error::new(e.kind(), format!("set MAC of {name}: {e}")))?;
        sys::set_mtu(&name, iface.mtu)
            .map_err(|e| io::Error::new(e.kind(), format!("set MTU of {name}: {e}")))?;
        match ns {
            None => sys::set_up(&name)?,
            Some(ns) => {
                let idx = sys::if_index(&name)?;
                netns::move_to_netns(idx, &ns).map_err(|e| {
                    io::Error::new(e.kind(), format!("move {name} into namespace: {e}"))
                })?;
                let n = name.clone();
                netns::in_netns(&ns, move || sys::set_up(&n))?;
            }
        }
        Ok(Tap {
            queues,
            ifname: iface.ifname.clone(),
            // MTU plus Ethernet header and one VLAN tag.
            max_frame: iface.mtu as usize + 18,
            vnet_hdr: iface.offload,
        })
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
