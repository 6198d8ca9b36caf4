//! The vhost-user requests ([`crate::msg`] decodes them): each one checked against what was
//! offered and against guest memory, then applied to the device. A request that does not fit
//! is an error: the caller drops the connection and resets the device.

use std::fs::File;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use tracing::warn;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vnet_core::LockRecover;
use vnet_dataplane::GuestFrame;
use vnet_offload::VirtioNetHdr;

use crate::device::{invalid, Dev, GuestMem, Session};
use crate::msg::{self, proto, MemRegion, Request, F_PROTOCOL_FEATURES};
use crate::sigbus;

impl Dev {
    /// Handles one request; `Ok(Some(bytes))` is the reply to send.
    pub fn handle(
        &self,
        s: &mut Session,
        h: &msg::Header,
        req: Request,
        mut files: Vec<File>,
    ) -> io::Result<Option<Vec<u8>>> {
        let mut take_fd = || files.pop();
        let reply = match req {
            Request::GetFeatures => Some(msg::reply_u64(h, self.features())),
            Request::SetFeatures(v) => {
                if v & !self.features() != 0 {
                    return Err(invalid(format!("features {v:#x} were not offered")));
                }
                self.acked.store(v, SeqCst);
                let eidx = v & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
                for r in &self.rings {
                    let mut r = r.lock_or_recover();
                    r.queue.set_event_idx(eidx);
                    if v & F_PROTOCOL_FEATURES == 0 {
                        // Without protocol features every ring is enabled at once.
                        r.enabled = true;
                    }
                }
                None
            }
            Request::SetOwner => None,
            Request::ResetOwner | Request::ResetDevice => {
                self.reset(s);
                None
            }
            Request::GetProtocolFeatures => Some(msg::reply_u64(
                h,
                proto::MQ | proto::REPLY_ACK | proto::RARP,
            )),
            Request::SetProtocolFeatures(v) => {
                if v & !(proto::MQ | proto::REPLY_ACK | proto::RARP) != 0 {
                    return Err(invalid(format!(
                        "protocol features {v:#x} were not offered"
                    )));
                }
                s.acked_proto = v;
                None
            }
            // QEMU (and DPDK) read it as queue pairs for virtio-net.
            Request::GetQueueNum => Some(msg::reply_u64(h, self.pairs as u64)),
            Request::SetMemTable(regions) => {
                if files.len() != regions.len() {
                    return Err(invalid("one file descriptor per memory region"));
                }
                let mut mapped = Vec::with_capacity(regions.len());
                // After `mapped`, so dropped before it on an error.
                let mut guard = sigbus::Guard::new();
                for (r, f) in regions.iter().zip(files.drain(..)) {
                    let sealed = check_backing(&f, r)?;
                    let page = sigbus::page_size(&f);
                    let m = MmapRegion::build(
                        Some(FileOffset::new(f, r.mmap_offset)),
                        r.size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                    )
                    .map_err(|e| invalid(format!("map guest memory: {e}")))?;
                    if let Err(e) = guard.add(m.as_ptr() as usize, m.size(), page) {
                        if !sealed {
                            return Err(invalid(format!(
                                "guest memory that the frontend can cut short, unguarded: {e}"
                            )));
                        }
                        warn!(interface = %self.name, "guest memory region not guarded against SIGBUS ({e}); it is sealed against shrinking");
                    }
                    mapped.push(
                        GuestRegionMmap::new(m, GuestAddress(r.guest_addr))
                            .ok_or_else(|| invalid("guest region overflows"))?,
                    );
                }
                let mem = GuestMemoryMmap::from_regions(mapped)
                    .map_err(|e| invalid(format!("guest memory: {e}")))?;
                self.mem.store(Some(Arc::new(GuestMem::new(guard, mem))));
                s.regions = regions;
                None
            }
            Request::SetVringNum { index, num } => {
                let n = u16::try_from(num).map_err(|_| invalid("ring size above 32768"))?;
                let mut r = self.ring(index)?;
                r.queue
                    .try_set_size(n)
                    .map_err(|e| invalid(format!("ring {index} size {num}: {e}")))?;
                None
            }
            Request::SetVringAddr(a) => {
                let to_gpa = |ua: u64| -> io::Result<GuestAddress> {
                    s.regions
                        .iter()
                        .find(|m| ua >= m.user_addr && ua - m.user_addr < m.size)
                        .map(|m| GuestAddress(m.guest_addr + (ua - m.user_addr)))
                        .ok_or_else(|| {
                            invalid(format!("ring address {ua:#x} outside guest memory"))
                        })
                };
                let (desc, avail, used) = (to_gpa(a.desc)?, to_gpa(a.avail)?, to_gpa(a.used)?);
                let mut r = self.ring(a.index)?;
                let q = &mut r.queue;
                q.try_set_desc_table_address(desc)
                    .and_then(|_| q.try_set_avail_ring_address(avail))
                    .and_then(|_| q.try_set_used_ring_address(used))
                    .map_err(|e| invalid(format!("ring {} address: {e}", a.index)))?;
                None
            }
            Request::SetVringBase { index, num } => {
                let n = u16::try_from(num).map_err(|_| invalid("ring base above 65535"))?;
                let mut r = self.ring(index)?;
                r.queue.set_next_avail(n);
                r.queue.set_next_used(n);
                r.notifier.reset(Wrapping(n));
                None
            }
            Request::GetVringBase { index } => {
                let mut r = self.ring(index)?;
                r.started = false;
                r.queue.set_ready(false);
                r.kick = None;
                r.backlog.clear();
                s.kicks_changed = true;
                Some(msg::reply_state(h, index, u32::from(r.queue.next_avail())))
            }
            Request::SetVringKick { index, has_fd } => {
                let mem = self.mem.load_full();
                let mut r = self.ring(index)?;
                r.kick = if has_fd { take_fd() } else { None };
                let Some(mem) = mem else {
                    return Err(invalid("ring started before the memory table"));
                };
                r.queue.set_ready(true);
                if !r.queue.is_valid(&**mem) {
                    r.queue.set_ready(false);
                    return Err(invalid(format!(
                        "ring {index} does not fit in guest memory or is misaligned"
                    )));
                }
                r.started = true;
                let next = Wrapping(r.queue.next_used());
                r.notifier.reset(next);
                s.kicks_changed = true;
                None
            }
            Request::SetVringCall { index, has_fd } => {
                let mut r = self.ring(index)?;
                r.call = if has_fd { take_fd() } else { None };
                None
            }
            Request::SetVringErr { index, .. } => {
                drop(self.ring(index)?);
                None
            }
            Request::SetVringEnable { index, enable } => {
                self.ring(index)?.enabled = enable;
                None
            }
            Request::SendRarp(mac) => {
                self.announce(mac);
                None
            }
            Request::NetSetMtu(_) => None,
        };
        Ok(reply)
    }

    /// After a migration the frontend asks us to announce the guest's MAC: a RARP broadcast
    /// from it, so switches and peers learn where it is now.
    fn announce(&self, mac: [u8; 6]) {
        let mut f = [0u8; 60];
        f[..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&0x8035u16.to_be_bytes());
        // htype 1, ptype IPv4, hlen 6, plen 4, op 3 (reverse request), sha = tha = mac.
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]);
        f[22..28].copy_from_slice(&mac);
        f[32..38].copy_from_slice(&mac);
        let mut ctx = self.ctx.lock_or_recover();
        self.ingress.forward_guest(
            &mut ctx,
            &[(VirtioNetHdr::default(), GuestFrame::Copied(&f[..]))],
        );
    }
}

/// The file behind a memory region must hold the whole region: touching a mapping past the
/// end of its file is SIGBUS. A memfd is also sealed against shrinking where it allows it
/// (QEMU seals its memfds already), so the frontend cannot cut it short later. Returns whether
/// the file is sealed so; every region is guarded against SIGBUS anyway ([`sigbus`]).
fn check_backing(f: &File, r: &MemRegion) -> io::Result<bool> {
    let meta = f.metadata()?;
    let end = r
        .mmap_offset
        .checked_add(r.size)
        .ok_or_else(|| invalid("memory region overflows its file"))?;
    if !meta.file_type().is_file() || meta.len() < end {
        return Err(invalid(format!(
            "memory region ends at byte {end} of a file of {} bytes",
            meta.len()
        )));
    }
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own; F_GET_SEALS/F_ADD_SEALS take an int argument.
    let seals = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        // Not a memfd (a file on /dev/shm or hugetlbfs): nothing can seal it.
        return Ok(false);
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return Ok(true);
    }
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    Ok(r == 0)
}
