//! Split virtqueues from the driver's side: layout in guest memory, descriptors, publishing
//! available buffers, reading used ones, and EVENT_IDX notification suppression.

use crate::mem::{align_up, GuestMem, PAGE};
use anyhow::{bail, Result};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const USED_F_NO_NOTIFY: u16 = 1;

/// Where the three parts of a split ring of `num` entries live, as offsets into guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub num: u16,
    /// Descriptor table: 16 bytes per entry, 16-byte aligned (we use a page).
    pub desc: usize,
    /// Available ring: flags, idx, ring[num], used_event; 2-byte aligned.
    pub avail: usize,
    /// Used ring: flags, idx, ring[num] of (id, len), avail_event; 4-byte aligned (we use a
    /// page, like the legacy layout).
    pub used: usize,
    /// Total bytes from `desc` to the end of the used ring.
    pub size: usize,
}

impl RingLayout {
    pub fn desc_bytes(num: u16) -> usize {
        16 * num as usize
    }
    pub fn avail_bytes(num: u16) -> usize {
        6 + 2 * num as usize
    }
    pub fn used_bytes(num: u16) -> usize {
        6 + 8 * num as usize
    }

    /// Layout of a ring of `num` entries starting at `base` (page aligned).
    pub fn new(num: u32, base: usize) -> Result<Self> {
        if num == 0 || num > 32768 || !num.is_power_of_two() {
            bail!("ring size {num} must be a power of two between 1 and 32768");
        }
        if !base.is_multiple_of(PAGE) {
            bail!("ring base {base:#x} not page aligned");
        }
        let num = num as u16;
        let desc = base;
        let avail = desc + Self::desc_bytes(num);
        let used = align_up(avail + Self::avail_bytes(num), PAGE);
        let size = used + Self::used_bytes(num) - base;
        Ok(RingLayout {
            num,
            desc,
            avail,
            used,
            size,
        })
    }

    /// Bytes to reserve for a ring of `num` entries (rounded to pages).
    pub fn reserve(num: u32) -> Result<usize> {
        Ok(align_up(Self::new(num, 0)?.size, PAGE))
    }

    pub fn desc_off(&self, i: u16) -> usize {
        self.desc + 16 * i as usize
    }
    pub fn avail_idx_off(&self) -> usize {
        self.avail + 2
    }
    pub fn avail_ring_off(&self, slot: u16) -> usize {
        self.avail + 4 + 2 * slot as usize
    }
    /// used_event lives after the avail ring entries.
    pub fn used_event_off(&self) -> usize {
        self.avail + 4 + 2 * self.num as usize
    }
    pub fn used_flags_off(&self) -> usize {
        self.used
    }
    pub fn used_idx_off(&self) -> usize {
        self.used + 2
    }
    pub fn used_elem_off(&self, slot: u16) -> usize {
        self.used + 4 + 8 * slot as usize
    }
    /// avail_event lives after the used ring entries.
    pub fn avail_event_off(&self) -> usize {
        self.used + 4 + 8 * self.num as usize
    }
}

/// The virtio spec's vring_need_event: with EVENT_IDX, notify when moving the index from `old`
/// to `new` passes the other side's `event` index (all arithmetic mod 2^16).
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The driver's side of one split ring.
pub struct DriverRing {
    pub mem: Arc<GuestMem>,
    pub layout: RingLayout,
    pub event_idx: bool,
    /// Our shadow of avail->idx (next slot to fill).
    pub avail_idx: u16,
    /// avail->idx as last published (for kick decisions).
    pub published: u16,
    /// Next used entry to consume.
    pub last_used: u16,
}

impl DriverRing {
    /// Zeroes the ring memory and starts with all indices at 0.
    pub fn new(mem: Arc<GuestMem>, layout: RingLayout, event_idx: bool) -> Self {
        mem.fill(layout.desc, layout.size, 0);
        DriverRing {
            mem,
            layout,
            event_idx,
            avail_idx: 0,
            published: 0,
            last_used: 0,
        }
    }

    pub fn num(&self) -> u16 {
        self.layout.num
    }

    /// Writes descriptor `i`.
    pub fn set_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let off = self.layout.desc_off(i);
        self.mem.write_u64(off, addr);
        self.mem.write_u32(off + 8, len);
        self.mem.write_u16(off + 12, flags);
        self.mem.write_u16(off + 14, next);
    }

    /// Puts `head` into the next avail slot (not yet visible to the device).
    pub fn push(&mut self, head: u16) {
        let slot = self.avail_idx % self.layout.num;
        self.mem.write_u16(self.layout.avail_ring_off(slot), head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Makes pushed entries visible; returns true if the device wants a kick for them.
    pub fn publish(&mut self) -> bool {
        let old = self.published;
        let new = self.avail_idx;
        if old == new {
            return false;
        }
        self.mem
            .u16_at(self.layout.avail_idx_off())
            .store(new, Ordering::Release);
        self.published = new;
        // The device's suppression state must be read after the index store is visible.
        fence(Ordering::SeqCst);
        self.kick_needed(old, new)
    }

    /// Would moving avail->idx from `old` to `new` need a kick?
    pub fn kick_needed(&self, old: u16, new: u16) -> bool {
        if self.event_idx {
            let ev = self
                .mem
                .u16_at(self.layout.avail_event_off())
                .load(Ordering::Acquire);
            need_event(ev, new, old)
        } else {
            let flags = self
                .mem
                .u16_at(self.layout.used_flags_off())
                .load(Ordering::Acquire);
            flags & USED_F_NO_NOTIFY == 0
        }
    }

    /// Writes avail->idx directly (hostile cases).
    pub fn force_avail_idx(&mut self, v: u16) {
        self.mem
            .u16_at(self.layout.avail_idx_off())
            .store(v, Ordering::Release);
        self.avail_idx = v;
        self.published = v;
    }

    /// The device's used->idx.
    pub fn used_idx(&self) -> u16 {
        self.mem
            .u16_at(self.layout.used_idx_off())
            .load(Ordering::Acquire)
    }

    /// Number of used entries not yet consumed (as the device claims them).
    pub fn pending_used(&self) -> u16 {
        self.used_idx().wrapping_sub(self.last_used)
    }

    /// Takes the next used entry: (descriptor id, written length).
    pub fn pop_used(&mut self) -> Option<(u32, u32)> {
        if self.used_idx() == self.last_used {
            return None;
        }
        let off = self.layout.used_elem_off(self.last_used % self.layout.num);
        let id = self.mem.read_u32(off);
        let len = self.mem.read_u32(off + 4);
        self.last_used = self.last_used.wrapping_add(1);
        Some((id, len))
    }

    /// With EVENT_IDX: ask for a call once the used index passes `last_used + delay`.
    /// Returns true if used entries are already pending (so no call will come for them).
    pub fn arm_call(&self, delay: u16) -> bool {
        if self.event_idx {
            self.mem
                .u16_at(self.layout.used_event_off())
                .store(self.last_used.wrapping_add(delay), Ordering::Release);
            fence(Ordering::SeqCst);
        }
        self.used_idx() != self.last_used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_math() {
        let l = RingLayout::new(256, 0).expect("layout");
        assert_eq!(l.desc, 0);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.used_event_off(), 4096 + 4 + 512);
        assert_eq!(l.used, 8192);
        assert_eq!(l.avail_event_off(), 8192 + 4 + 2048);
        assert_eq!(l.size, 8192 + 6 + 2048);
        assert_eq!(RingLayout::reserve(256).expect("reserve"), 3 * 4096);
        let s = RingLayout::new(4, 8192).expect("layout");
        assert_eq!((s.desc, s.avail, s.used), (8192, 8192 + 64, 12288));
        assert_eq!(s.desc_off(3), 8192 + 48);
        assert_eq!(s.used_elem_off(2), 12288 + 4 + 16);
        let big = RingLayout::new(32768, 0).expect("layout");
        assert_eq!(big.avail, 512 * 1024);
        assert_eq!(big.used % 4096, 0);
        assert!(big.used >= big.avail + 6 + 65536);
        assert!(RingLayout::new(0, 0).is_err());
        assert!(RingLayout::new(3, 0).is_err());
        assert!(RingLayout::new(65536, 0).is_err());
        assert!(RingLayout::new(256, 100).is_err());
    }

    #[test]
    fn need_event_arithmetic() {
        // Device asked to be told when idx passes 5: moving 3 -> 6 crosses it.
        assert!(need_event(5, 6, 3));
        // 3 -> 5 does not (event means "after entry `event` is made available").
        assert!(!need_event(5, 5, 3));
        assert!(need_event(4, 5, 3));
        // Exactly the next one.
        assert!(need_event(3, 4, 3));
        assert!(!need_event(4, 4, 3));
        // Nothing moved.
        assert!(!need_event(3, 3, 3));
        // Stale event far behind: no notification.
        assert!(!need_event(0, 1000, 990));
        // Wrap-around.
        assert!(need_event(0xffff, 2, 0xfffe));
        assert!(need_event(0, 2, 0xfffe));
        assert!(!need_event(2, 2, 0xfffe));
    }

    #[test]
    fn driver_ring_roundtrip() {
        let mem = Arc::new(GuestMem::new(1 << 20, 1 << 20, 0).expect("mem"));
        let off = mem
            .alloc(RingLayout::reserve(8).expect("r"), PAGE)
            .expect("a");
        let l = RingLayout::new(8, off).expect("l");
        let mut r = DriverRing::new(mem.clone(), l, true);
        r.set_desc(0, 0x1234, 100, 0, 0);
        r.push(0);
        // avail_event = 0 (device wants to hear about entry 0).
        assert!(r.publish());
        assert_eq!(mem.u16_at(l.avail_idx_off()).load(Ordering::Relaxed), 1);
        r.push(0);
        // avail_event still 0: moving 1 -> 2 does not pass it.
        assert!(!r.publish());
        // Device consumes and reports used.
        mem.write_u32(l.used_elem_off(0), 0);
        mem.write_u32(l.used_elem_off(0) + 4, 7);
        mem.write_u16(l.used_idx_off(), 1);
        assert_eq!(r.pop_used(), Some((0, 7)));
        assert_eq!(r.pop_used(), None);
        assert!(!r.arm_call(0));
        assert_eq!(mem.u16_at(l.used_event_off()).load(Ordering::Relaxed), 1);
    }
}
