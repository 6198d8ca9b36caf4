//! TAP devices: a local VM's NIC, or a namespace playing one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vnet_control::Interface;
use vnet_core::DropReason;

use crate::netns;
use crate::sys::{self, IfReq};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;

/// An open TAP device. Closing it removes the device unless it was made persistent outside
/// vnet (then vnet only attached to it).
#[derive(Debug)]
pub struct Tap {
    file: File,
    ifname: String,
    max_frame: usize,
}

impl Tap {
    /// Creates (or attaches to) the TAP of `iface`, sets its MAC and MTU, brings it up and moves
    /// it into the interface's namespace if one is named.
    pub fn open(iface: &Interface) -> io::Result<Tap> {
        let ns = iface.netns.as_deref().map(netns::open_netns).transpose()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")?;
        let mut req = IfReq::new(&iface.ifname)?;
        req.data[..2].copy_from_slice(&(IFF_TAP | IFF_NO_PI).to_ne_bytes());
        req.ioctl(file.as_raw_fd(), TUNSETIFF)
            .map_err(|e| io::Error::new(e.kind(), format!("TUNSETIFF {}: {e}", iface.ifname)))?;
        sys::set_nonblocking(file.as_raw_fd())?;
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
            file,
            ifname: iface.ifname.clone(),
            // MTU plus Ethernet header and one VLAN tag.
            max_frame: iface.mtu as usize + 18,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Delivers a frame to the guest.
    pub fn send(&self, frame: &[u8]) -> Result<(), DropReason> {
        if frame.len() > self.max_frame {
            return Err(DropReason::Oversize);
        }
        match sys::writev(self.fd(), &[frame]) {
            Ok(_) => Ok(()),
            Err(_) => Err(DropReason::TxError),
        }
    }
}
