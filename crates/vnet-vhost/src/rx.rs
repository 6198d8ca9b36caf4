//! Receive: frames for the guest written into its receive buffers (with mergeable buffers,
//! over as many chains as a frame takes). Cut-through: by the thread that has the frame, from
//! its own buffer; copying, or while the guest has no buffers: queued in the ring's backlog
//! for the device thread. The notification policy ([`crate::notify`]) decides when the guest
//! hears of it.
//!
//! The backlog is bounded in frames and in bytes (`rx_backlog`).

use std::sync::atomic::Ordering::*;
use std::sync::Mutex;
use std::time::Instant;

use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vnet_core::{DropReason, LockRecover};
use vnet_offload::{VirtioNetHdr, VIRTIO_NET_HDR_LEN};

use crate::device::{Dev, Mem, Ring, HDR_LEN};
use crate::notify::{Action, Notifier, RingView};

impl Dev {
    /// Picks the receive ring for the engine's `queue`.
    fn rx_ring(&self, queue: usize) -> &Mutex<Ring> {
        let k = queue % self.pairs;
        &self.rings[2 * k]
    }

    /// A frame for the guest. Cut-through: written into its receive buffers now, from the
    /// caller's buffer. Copying: copied into the backlog for the device thread.
    pub fn deliver(
        &self,
        queue: usize,
        vh: &VirtioNetHdr,
        parts: &[&[u8]],
    ) -> Result<(), DropReason> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if vh.gso_kind() == VirtioNetHdr::GSO_NONE && len > self.max_frame {
            return Err(DropReason::Oversize);
        }
        if self.broken.load(Relaxed) {
            return Err(DropReason::TxError);
        }
        let Some(mem) = self.mem.load_full() else {
            return Err(DropReason::TxError);
        };
        if mem.faulted() {
            return Err(DropReason::TxError);
        }
        let cfg = self.cfg.load();
        let mut ring = self.rx_ring(queue).lock_or_recover();
        if !ring.live() {
            return Err(DropReason::TxError);
        }
        if !cfg.cut_through || !ring.backlog.is_empty() {
            ring.backlog.push_back(*vh, parts)?;
            drop(ring);
            let _ = self.wake.write(1);
            return Ok(());
        }
        let now = Instant::now();
        let view = ring.view(&mem);
        if ring.notifier.before_frame(&view, now) == Action::Notify {
            ring.signal();
        }
        let mrg = self.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        match write_rx(&mut ring.queue, &mem, vh, parts, mrg) {
            Ok(true) => {
                ring.notifier.after_frame(len);
                self.stats.rx_direct.fetch_add(1, Relaxed);
                Ok(())
            }
            Ok(false) => {
                // No buffers: keep it until the guest adds some (it kicks the receive queue).
                // The backlog was empty: there is room.
                ring.backlog.push_back(*vh, parts)?;
                if arm_rx_kick(&mut ring.queue, &mem) {
                    // Buffers came meanwhile, and no kick will say so: the device thread
                    // drains the backlog now.
                    drop(ring);
                    let _ = self.wake.write(1);
                }
                Ok(())
            }
            Err(RxError::Chain(why)) => {
                drop(ring);
                self.bad_chain(why);
                Err(DropReason::BadOffload)
            }
            Err(RxError::Ring(why)) => {
                drop(ring);
                self.mark_broken(why);
                Err(DropReason::TxError)
            }
        }
    }

    /// End of a burst of deliveries: the notification decision for every receive ring.
    pub fn end_of_burst(&self) {
        self.notify_live_rings(Notifier::end_of_burst);
    }

    /// The earliest backstop re-check any receive ring wants.
    pub fn backstop_deadline(&self) -> Option<Instant> {
        (0..self.pairs)
            .filter_map(|k| {
                self.rings[2 * k]
                    .lock_or_recover()
                    .notifier
                    .backstop_deadline()
            })
            .min()
    }

    pub fn backstop(&self) {
        self.notify_live_rings(Notifier::backstop_due);
    }

    /// Asks the notifier of every running receive ring whether the guest hears now
    /// (`decide`), and signals it if so.
    fn notify_live_rings(&self, decide: impl Fn(&mut Notifier, &RingView, Instant) -> Action) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        let now = Instant::now();
        for k in 0..self.pairs {
            let mut r = self.rings[2 * k].lock_or_recover();
            if !r.live() {
                continue;
            }
            let v = r.view(&mem);
            if decide(&mut r.notifier, &v, now) == Action::Notify {
                r.signal();
            }
        }
    }

    /// Moves backlogged frames into the guest's receive buffers while it has some (the device
    /// thread: on a receive kick, or when the copying path queued frames).
    pub fn drain_backlog(&self) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        if self.broken.load(Relaxed) || mem.faulted() {
            return;
        }
        let mrg = self.acked.load(Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let now = Instant::now();
        for k in 0..self.pairs {
            let mut r = self.rings[2 * k].lock_or_recover();
            if !r.live() || r.backlog.is_empty() {
                continue;
            }
            let view = r.view(&mem);
            if r.notifier.before_frame(&view, now) == Action::Notify {
                r.signal();
            }
            while let Some((vh, f)) = r.backlog.pop_front() {
                match write_rx(&mut r.queue, &mem, &vh, &[&f], mrg) {
                    Ok(true) => {
                        r.notifier.after_frame(f.len());
                        self.stats.rx_copied.fetch_add(1, Relaxed);
                    }
                    Ok(false) => {
                        r.backlog.push_front(vh, f);
                        if arm_rx_kick(&mut r.queue, &mem) {
                            continue;
                        }
                        break;
                    }
                    Err(RxError::Chain(why)) => self.bad_chain(why),
                    Err(RxError::Ring(why)) => {
                        drop(r);
                        return self.mark_broken(why);
                    }
                }
            }
            let v = r.view(&mem);
            if r.notifier.end_of_burst(&v, Instant::now()) == Action::Notify {
                r.signal();
            }
        }
    }
}

/// A receive ring has too few buffers for the next frame: asks the guest to kick the queue
/// when it adds one. With `EVENT_IDX` a guest kicks only when its avail index passes the
/// `avail_event` we publish. `avail_event` goes to the avail index as it is now, not to
/// `next_avail` (`Queue::enable_notification`'s choice): buffers the guest already offered
/// but that are too few for the frame must not make its next addition a silent one. Then the
/// avail index is read again: `true` means the guest added buffers in between, and no kick
/// will come for them, so the caller tries again now. Without `EVENT_IDX` receive rings
/// never suppress kicks (nothing to arm): `false`.
pub(crate) fn arm_rx_kick(queue: &mut Queue, mem: &Mem) -> bool {
    if !queue.event_idx_enabled() {
        return false;
    }
    let saved = queue.next_avail();
    let Ok(avail) = queue.avail_idx(mem, Acquire) else {
        // An unreadable ring: the next walk of it finds that and marks the device.
        return false;
    };
    queue.set_next_avail(avail.0);
    let added = queue.enable_notification(mem).unwrap_or(false);
    queue.set_next_avail(saved);
    added
}

enum RxError {
    /// The frame does not fit the chain (no mergeable buffers): dropped, the chain consumed.
    Chain(&'static str),
    /// The guest's ring or buffers are unusable: the device is marked broken.
    Ring(&'static str),
}

/// Writes [virtio-net header, frame gathered from `parts`] into as many receive chains as it
/// takes (one without mergeable buffers). `Ok(false)`: not enough buffers, nothing consumed.
fn write_rx(
    queue: &mut Queue,
    mem: &Mem,
    vh: &VirtioNetHdr,
    parts: &[&[u8]],
    mrg: bool,
) -> Result<bool, RxError> {
    let mut hdr = [0u8; HDR_LEN];
    hdr[..VIRTIO_NET_HDR_LEN].copy_from_slice(&vh.emit());
    let total = HDR_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
    // Source cursor over [hdr, parts...].
    let mut src: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
    src.push(&hdr);
    src.extend(parts.iter().copied().filter(|p| !p.is_empty()));
    let (mut si, mut so) = (0usize, 0usize);
    let saved = queue.next_avail();
    let mut used: [(u16, u32); 64] = [(0, 0); 64];
    let mut nused = 0;
    let mut written = 0usize;
    let mut first: Option<GuestAddress> = None;
    while written < total {
        let chain = match queue.iter(mem) {
            Ok(mut it) => it.next(),
            Err(_) => {
                queue.set_next_avail(saved);
                return Err(RxError::Ring("receive ring index or address is invalid"));
            }
        };
        let Some(chain) = chain else {
            queue.set_next_avail(saved);
            return Ok(false);
        };
        let head = chain.head_index();
        let mut len = 0usize;
        for desc in chain.writable() {
            let dlen = desc.len() as usize;
            if first.is_none() {
                if dlen < HDR_LEN {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring(
                        "receive buffer smaller than the virtio-net header",
                    ));
                }
                first = Some(desc.addr());
            }
            let mut off = 0usize;
            while off < dlen && written < total {
                let piece = src[si];
                let n = (piece.len() - so).min(dlen - off);
                let Some(dst) = desc.addr().checked_add(off as u64) else {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring("receive descriptor address overflows"));
                };
                if mem.write_slice(&piece[so..so + n], dst).is_err() {
                    queue.set_next_avail(saved);
                    return Err(RxError::Ring("receive descriptor outside guest memory"));
                }
                off += n;
                so += n;
                written += n;
                len += n;
                if so == piece.len() {
                    si += 1;
                    so = 0;
                }
            }
            if written == total {
                break;
            }
        }
        if len == 0 {
            queue.set_next_avail(saved);
            return Err(RxError::Ring("receive chain without writable descriptors"));
        }
        if nused == used.len() {
            queue.set_next_avail(saved);
            return Err(RxError::Ring(
                "frame needs more receive chains than we follow",
            ));
        }
        used[nused] = (head, len as u32);
        nused += 1;
        if written < total && !mrg {
            // Without mergeable buffers a frame must fit one chain: consume it and drop.
            let _ = queue.add_used(mem, head, 0);
            return Err(RxError::Chain(
                "frame larger than a receive chain (no mergeable buffers)",
            ));
        }
    }
    if let Some(a) = first {
        let nb = (nused as u16).to_le_bytes();
        let at = a
            .checked_add(VIRTIO_NET_HDR_LEN as u64)
            .ok_or(RxError::Ring("receive descriptor address overflows"))?;
        if mem.write_slice(&nb, at).is_err() {
            return Err(RxError::Ring("receive descriptor outside guest memory"));
        }
    }
    for &(h, l) in &used[..nused] {
        if queue.add_used(mem, h, l).is_err() {
            return Err(RxError::Ring("used ring outside guest memory"));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    //! Receive buffers on a real `GuestMemoryMmap`, with rings built by `virtio-queue`'s own
    //! test helpers: what a guest (or a hostile one) can offer.

    use super::*;
    use crate::notify::need_event;
    use crate::testing::{frame, mem, BUF, MEM};
    use std::num::Wrapping;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    /// Writes the frame made of `parts` with a plain header (no offloads).
    fn write_plain(
        queue: &mut Queue,
        m: &Mem,
        parts: &[&[u8]],
        mrg: bool,
    ) -> Result<bool, RxError> {
        write_rx(queue, m, &VirtioNetHdr::default(), parts, mrg)
    }

    /// A receive ring of `n` single-descriptor chains of `len` bytes each.
    fn rx_queue(m: &Mem, n: u16, len: u32) -> (MockSplitQueue<'_, Mem>, Queue) {
        let q = MockSplitQueue::new(m, 16);
        let descs: Vec<RawDescriptor> = (0..n)
            .map(|i| {
                RawDescriptor::from(SplitDescriptor::new(
                    BUF + i as u64 * 0x1_0000,
                    len,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        for (i, d) in descs.iter().enumerate() {
            q.desc_table().store(i as u16, *d).unwrap();
            q.avail().ring().ref_at(i).unwrap().store(i as u16);
        }
        q.avail().idx().store(n);
        let queue: Queue = q.create_queue().unwrap();
        (q, queue)
    }

    #[test]
    fn receive_fills_one_buffer_or_merges_several() {
        let m = mem();
        let f = frame(1000);
        // One buffer large enough.
        let (_q, mut queue) = rx_queue(&m, 2, 2048);
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f[..10], &f[10..]], true),
            Ok(true)
        ));
        let mut got = vec![0u8; f.len()];
        m.read_slice(&mut got, GuestAddress(BUF + HDR_LEN as u64))
            .unwrap();
        assert_eq!(got, f);
        // num_buffers (the last two bytes of the header) says 1.
        let mut nb = [0u8; 2];
        m.read_slice(&mut nb, GuestAddress(BUF + VIRTIO_NET_HDR_LEN as u64))
            .unwrap();
        assert_eq!(u16::from_le_bytes(nb), 1);

        // Buffers of 512 bytes: merged over as many as it takes with MRG_RXBUF; refused
        // without.
        let (_q, mut queue) = rx_queue(&m, 4, 512);
        assert!(matches!(write_plain(&mut queue, &m, &[&f], true), Ok(true)));
        m.read_slice(&mut nb, GuestAddress(BUF + VIRTIO_NET_HDR_LEN as u64))
            .unwrap();
        assert_eq!(
            u16::from_le_bytes(nb) as usize,
            (HDR_LEN + f.len()).div_ceil(512)
        );
        let (_q, mut queue) = rx_queue(&m, 4, 512);
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f], false),
            Err(RxError::Chain(_))
        ));
        // Not enough buffers: nothing consumed.
        let (_q, mut queue) = rx_queue(&m, 1, 512);
        let before = queue.next_avail();
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f], true),
            Ok(false)
        ));
        assert_eq!(queue.next_avail(), before);
    }

    /// `avail_event` as the device published it: after the used ring's 16 entries.
    fn avail_event(q: &MockSplitQueue<'_, Mem>, m: &Mem) -> Wrapping<u16> {
        Wrapping(
            m.read_obj::<u16>(q.used_addr().unchecked_add(4 + 8 * 16))
                .unwrap(),
        )
    }

    #[test]
    fn a_guest_that_adds_a_buffer_after_the_device_ran_short_is_asked_to_kick() {
        let m = mem();
        let f = frame(1000);
        // One buffer of 512 bytes offered, the frame takes two.
        let (q, mut queue) = rx_queue(&m, 1, 512);
        queue.set_event_idx(true);
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f], true),
            Ok(false)
        ));
        assert!(
            !arm_rx_kick(&mut queue, &m),
            "the guest added nothing meanwhile"
        );
        assert_eq!(
            queue.next_avail(),
            0,
            "the offered buffer stays for the frame"
        );
        // The guest publishes its second buffer (avail index 1 -> 2) and kicks if virtio's
        // rule says so.
        let (old, new) = (Wrapping(1), Wrapping(2));
        assert!(need_event(avail_event(&q, &m), new, old));
        // What `enable_notification` alone publishes (next_avail, which the guest has passed
        // already) would let that buffer come without a kick, and the frame wait for ever.
        queue.enable_notification(&m).unwrap();
        assert!(!need_event(avail_event(&q, &m), new, old));

        // Without EVENT_IDX the guest kicks for every buffer: nothing to arm.
        let (_q, mut queue) = rx_queue(&m, 0, 512);
        assert!(!arm_rx_kick(&mut queue, &m));
    }

    #[test]
    fn receive_into_hostile_buffers_marks_the_ring() {
        let m = mem();
        let f = frame(100);
        // A buffer smaller than the virtio-net header.
        let (_q, mut queue) = rx_queue(&m, 1, 4);
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f], true),
            Err(RxError::Ring(_))
        ));
        // A buffer outside guest memory.
        let q = MockSplitQueue::new(&m, 16);
        q.desc_table()
            .store(
                0,
                RawDescriptor::from(SplitDescriptor::new(
                    MEM - 8,
                    4096,
                    VRING_DESC_F_WRITE as u16,
                    0,
                )),
            )
            .unwrap();
        q.avail().ring().ref_at(0).unwrap().store(0);
        q.avail().idx().store(1);
        let mut queue: Queue = q.create_queue().unwrap();
        assert!(matches!(
            write_plain(&mut queue, &m, &[&f], true),
            Err(RxError::Ring(_))
        ));
    }
}
