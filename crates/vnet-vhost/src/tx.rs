//! Transmit: the frames a guest put in its transmit rings, taken in batches into the overlay.
//! A frame in one piece of guest memory goes on as a volatile slice (cut-through: nothing
//! copies it in user space); one spread over several descriptors, or any frame when
//! cut-through is off, is gathered into a buffer. Every chain is bounded and checked: a bad
//! one is dropped and counted, a broken ring marks the device broken.

use std::sync::atomic::Ordering::*;

use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, VolatileSlice};
use vnet_core::LockRecover;
use vnet_dataplane::GuestFrame;
use vnet_offload::VirtioNetHdr;
use vnet_wire::MAX_FRAME_LEN;

use crate::device::{Dev, Mem, HDR_LEN};

const TX_BATCH: usize = 64;
const MAX_TX_CHAIN: usize = HDR_LEN + MAX_FRAME_LEN;
/// Descriptors we follow in one chain (the queue also bounds it by its size).
const MAX_CHAIN_DESCS: usize = 64;

impl Dev {
    /// Takes every frame the guest transmitted on ring `index`, in batches, into the overlay.
    pub fn process_tx(&self, index: usize) {
        let Some(mem) = self.mem.load_full() else {
            return;
        };
        if self.broken.load(Relaxed) || mem.faulted() {
            return;
        }
        let cut = self.cfg.load().cut_through;
        let Some(ring) = self.rings.get(index) else {
            return;
        };
        let mut ring = ring.lock_or_recover();
        if !ring.live() {
            return;
        }
        let event_idx = self.event_idx();
        let mut items: Vec<TxItem> = Vec::with_capacity(TX_BATCH);
        let mut arena: Vec<Vec<u8>> = Vec::new();
        loop {
            items.clear();
            arena.clear();
            if event_idx {
                let _ = ring.queue.disable_notification(&**mem);
            }
            {
                let mut iter = match ring.queue.iter(&**mem) {
                    Ok(it) => it,
                    Err(e) => {
                        drop(ring);
                        return self.mark_broken(&format!("transmit ring: {e}"));
                    }
                };
                while items.len() < TX_BATCH {
                    let Some(chain) = iter.next() else { break };
                    items.push(read_tx_chain(chain, &mem, cut, &mut arena));
                }
            }
            if items.is_empty() {
                if event_idx && ring.queue.enable_notification(&**mem).unwrap_or(false) {
                    continue;
                }
                break;
            }
            self.forward_items(&items, &arena);
            for it in &items {
                if ring.queue.add_used(&**mem, it.head, 0).is_err() {
                    drop(ring);
                    return self.mark_broken("used ring outside guest memory");
                }
            }
            if ring.queue.needs_notification(&**mem).unwrap_or(true) {
                ring.signal();
                self.stats.tx_notifications.fetch_add(1, Relaxed);
            }
        }
    }

    fn forward_items(&self, items: &[TxItem<'_>], arena: &[Vec<u8>]) {
        let mut frames: Vec<(VirtioNetHdr, GuestFrame<'_>)> = Vec::with_capacity(items.len());
        let (mut cut, mut copied) = (0, 0);
        for it in items {
            match it.frame {
                // The guest's memory goes on as a volatile slice: the forwarding path copies
                // what it reads (the headers, the MACs it checks and then sends) and hands the
                // rest to the kernel, so a guest rewriting its frame meanwhile can corrupt only
                // its own frame, never spoof a checked source.
                TxFrame::Guest(vs) => {
                    frames.push((it.vh, GuestFrame::Shared(vs)));
                    cut += 1;
                }
                TxFrame::Copied(k) => {
                    frames.push((it.vh, GuestFrame::Copied(&arena[k])));
                    copied += 1;
                }
                TxFrame::Bad(why) => self.bad_chain(why),
            }
        }
        self.stats.tx_cut_through.fetch_add(cut, Relaxed);
        self.stats.tx_copied.fetch_add(copied, Relaxed);
        if !frames.is_empty() {
            let mut ctx = self.ctx.lock_or_recover();
            self.ingress.forward_guest(&mut ctx, &frames);
        }
    }
}

struct TxItem<'m> {
    head: u16,
    vh: VirtioNetHdr,
    frame: TxFrame<'m>,
}

enum TxFrame<'m> {
    /// In one piece of guest memory, which the guest may rewrite at any moment: reached only
    /// through this volatile slice, never as a Rust slice.
    Guest(VolatileSlice<'m>),
    /// Copied into the arena at this index.
    Copied(usize),
    Bad(&'static str),
}

#[inline]
fn read_tx_chain<'m, M>(
    chain: virtio_queue::DescriptorChain<M>,
    mem: &'m Mem,
    cut: bool,
    arena: &mut Vec<Vec<u8>>,
) -> TxItem<'m>
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let head = chain.head_index();
    let bad = |why| TxItem {
        head,
        vh: VirtioNetHdr::default(),
        frame: TxFrame::Bad(why),
    };
    let mut descs: [(GuestAddress, usize); MAX_CHAIN_DESCS] =
        [(GuestAddress(0), 0); MAX_CHAIN_DESCS];
    let mut n = 0;
    let mut total = 0usize;
    for d in chain {
        if d.is_write_only() {
            return bad("write-only descriptor in a transmit chain");
        }
        if n == MAX_CHAIN_DESCS {
            return bad("more descriptors than a frame needs");
        }
        total += d.len() as usize;
        if total > MAX_TX_CHAIN {
            return bad("more bytes than a frame can have");
        }
        descs[n] = (d.addr(), d.len() as usize);
        n += 1;
    }
    let descs = &descs[..n];
    if total < HDR_LEN + 14 {
        return bad("shorter than the virtio-net header and an Ethernet header");
    }
    // The header, gathered (it may span descriptors).
    let mut hb = [0u8; HDR_LEN];
    let mut got = 0;
    for &(a, l) in descs {
        let k = l.min(HDR_LEN - got);
        if k > 0 && mem.read_slice(&mut hb[got..got + k], a).is_err() {
            return bad("descriptor outside guest memory");
        }
        got += k;
        if got == HDR_LEN {
            break;
        }
    }
    let Ok(vh) = VirtioNetHdr::parse(&hb) else {
        return bad("bad virtio-net header");
    };
    // The frame in one piece of guest memory: one descriptor holding header and frame, or a
    // header descriptor followed by one frame descriptor.
    let whole = match descs {
        [(a, l)] => a.checked_add(HDR_LEN as u64).map(|a| (a, l - HDR_LEN)),
        [(_, HDR_LEN), (a, l)] => Some((*a, *l)),
        _ => None,
    };
    if cut {
        if let Some((a, l)) = whole {
            return match mem.get_slice(a, l) {
                Ok(vs) => TxItem {
                    head,
                    vh,
                    frame: TxFrame::Guest(vs),
                },
                Err(_) => bad("descriptor outside guest memory"),
            };
        }
    }
    let mut buf = vec![0u8; total - HDR_LEN];
    let mut skip = HDR_LEN;
    let mut at = 0;
    for &(a, l) in descs {
        let s = skip.min(l);
        skip -= s;
        if l == s {
            continue;
        }
        let Some(src) = a.checked_add(s as u64) else {
            return bad("descriptor address overflows");
        };
        if mem.read_slice(&mut buf[at..at + l - s], src).is_err() {
            return bad("descriptor outside guest memory");
        }
        at += l - s;
    }
    arena.push(buf);
    TxItem {
        head,
        vh,
        frame: TxFrame::Copied(arena.len() - 1),
    }
}

#[cfg(test)]
mod tests {
    //! The descriptor walks on a real `GuestMemoryMmap`, with rings built by `virtio-queue`'s
    //! own test helpers: what a guest (or a hostile one) can put in its transmit rings.

    use super::*;
    use crate::testing::{frame, mem, BUF, MEM};
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    /// A transmit frame: the virtio-net header (no offloads) and an Ethernet frame.
    fn put_frame(m: &Mem, at: u64, frame: &[u8]) {
        m.write_slice(&[0u8; HDR_LEN], GuestAddress(at)).unwrap();
        m.write_slice(frame, GuestAddress(at + HDR_LEN as u64))
            .unwrap();
    }

    /// Reads the chain `descs` (in a ring just large enough for it, at least 16) as a
    /// transmit frame, cut-through if `cut`.
    fn read<'m>(
        m: &'m Mem,
        descs: &[RawDescriptor],
        cut: bool,
        arena: &mut Vec<Vec<u8>>,
    ) -> TxItem<'m> {
        let size = descs.len().next_power_of_two().max(16) as u16;
        let q = MockSplitQueue::new(m, size);
        let chain = q.build_desc_chain(descs).expect("chain");
        read_tx_chain(chain, m, cut, arena)
    }

    /// A frame of `len` bytes behind its header at BUF, and the one descriptor holding both.
    fn one_descriptor_frame(m: &Mem, len: usize) -> (Vec<u8>, [RawDescriptor; 1]) {
        let f = frame(len);
        put_frame(m, BUF, &f);
        let d = [desc(BUF, (HDR_LEN + f.len()) as u32, 0)];
        (f, d)
    }

    fn walk(
        m: &Mem,
        descs: &[RawDescriptor],
        cut: bool,
    ) -> (Option<Vec<u8>>, Option<&'static str>) {
        let mut arena = Vec::new();
        let item = read(m, descs, cut, &mut arena);
        match item.frame {
            TxFrame::Guest(vs) => {
                let mut v = vec![0u8; vs.len()];
                vs.copy_to(&mut v[..]);
                (Some(v), None)
            }
            TxFrame::Copied(k) => (Some(arena[k].clone()), None),
            TxFrame::Bad(why) => (None, Some(why)),
        }
    }

    #[test]
    fn one_descriptor_frame_is_cut_through_or_copied() {
        let m = mem();
        let (f, d) = one_descriptor_frame(&m, 1500);
        let mut arena = Vec::new();
        assert!(matches!(
            read(&m, &d, true, &mut arena).frame,
            TxFrame::Guest(_)
        ));
        assert_eq!(walk(&m, &d, true).0.as_deref(), Some(&f[..]));
        assert_eq!(walk(&m, &d, false).0.as_deref(), Some(&f[..]));
    }

    #[test]
    fn header_then_frame_is_one_piece_and_a_scattered_frame_is_gathered() {
        let m = mem();
        let f = frame(600);
        put_frame(&m, BUF, &f);
        // [header][frame]: still one piece of memory for the frame.
        let d = [
            desc(BUF, HDR_LEN as u32, 0),
            desc(BUF + HDR_LEN as u64, f.len() as u32, 0),
        ];
        assert_eq!(walk(&m, &d, true).0.as_deref(), Some(&f[..]));
        // The frame in three pieces, the header split too: gathered into a copy.
        let d = [
            desc(BUF, 4, 0),
            desc(BUF + 4, (HDR_LEN - 4 + 100) as u32, 0),
            desc(BUF + HDR_LEN as u64 + 100, (f.len() - 100) as u32, 0),
        ];
        let mut arena = Vec::new();
        let item = read(&m, &d, true, &mut arena);
        assert!(matches!(item.frame, TxFrame::Copied(0)));
        assert_eq!(arena[0], f);
    }

    #[test]
    fn hostile_chains_are_refused() {
        let m = mem();
        put_frame(&m, BUF, &frame(100));
        // A write-only descriptor in a transmit chain.
        let d = [desc(BUF, 200, VRING_DESC_F_WRITE as u16)];
        assert!(walk(&m, &d, true).1.unwrap().contains("write-only"));
        // Shorter than header + Ethernet header.
        let d = [desc(BUF, (HDR_LEN + 13) as u32, 0)];
        assert!(walk(&m, &d, true).1.is_some());
        // Outside guest memory (cut-through and copying both check).
        let d = [desc(MEM - 20, 200, 0)];
        assert!(walk(&m, &d, true).1.unwrap().contains("outside"));
        assert!(walk(&m, &d, false).1.unwrap().contains("outside"));
        // More bytes than any frame.
        let d = [desc(BUF, u32::MAX / 2, 0), desc(BUF, u32::MAX / 2, 0)];
        assert!(walk(&m, &d, true).1.unwrap().contains("more bytes"));
        // More descriptors than a frame needs (a 65-descriptor chain).
        let d: Vec<RawDescriptor> = (0..(MAX_CHAIN_DESCS as u64 + 1))
            .map(|i| desc(BUF + i * 16, 16, 0))
            .collect();
        let mut arena = Vec::new();
        let item = read(&m, &d, true, &mut arena);
        assert!(matches!(item.frame, TxFrame::Bad(w) if w.contains("more descriptors")));
    }

    #[test]
    fn a_guest_rewriting_its_frame_changes_only_what_is_read_later() {
        // The cut-through frame is a volatile view: a read after the guest rewrites its
        // memory sees the new bytes (no stale Rust slice, no assumption that they are fixed).
        let m = mem();
        let (_, d) = one_descriptor_frame(&m, 200);
        let mut arena = Vec::new();
        let item = read(&m, &d, true, &mut arena);
        let TxFrame::Guest(vs) = item.frame else {
            panic!("not cut-through")
        };
        m.write_slice(&[0xee; 6], GuestAddress(BUF + HDR_LEN as u64 + 6))
            .unwrap();
        let mut now = [0u8; 12];
        vs.copy_to(&mut now[..]);
        assert_eq!(&now[6..12], &[0xee; 6]);
    }
}
