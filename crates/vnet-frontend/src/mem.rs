//! Guest memory: one memfd mapped shared into this process, handed to the backend with
//! SET_MEM_TABLE. Buffers and rings are carved out of it with a bump allocator.
//!
//! The mapping may be larger than the declared region (hostile mode): the part past
//! `region_size` is never declared to the backend and holds a canary pattern.

use crate::proto::MemRegion;
use anyhow::{bail, Context, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::Mutex;

pub const PAGE: usize = 4096;

pub fn align_up(v: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two());
    (v + align - 1) & !(align - 1)
}

pub struct GuestMem {
    fd: OwnedFd,
    base: *mut u8,
    /// Bytes mapped (memfd size).
    len: usize,
    /// Bytes declared to the backend (from offset 0 of the memfd).
    region_size: usize,
    /// Guest physical address of offset 0.
    gpa_base: u64,
    next: Mutex<usize>,
}

// SAFETY: the mapping is shared memory owned by this struct for its whole lifetime; all access
// goes through raw pointers with explicit atomics or copies, as with any VMM's guest memory
// (which another process - the backend - writes concurrently anyway).
unsafe impl Send for GuestMem {}
// SAFETY: see Send; the allocator state is behind a Mutex.
unsafe impl Sync for GuestMem {}

impl GuestMem {
    /// Creates a memfd of `total` bytes, maps it, declares the first `region_size` bytes.
    /// The memfd cannot be sealed (as a VMM that never asks for sealing makes it).
    pub fn new(region_size: usize, total: usize, gpa_base: u64) -> Result<Self> {
        Self::with_sealing(region_size, total, gpa_base, false)
    }

    /// As [`Self::new`]; `sealable`: made with `MFD_ALLOW_SEALING`, so the backend can seal it
    /// against shrinking.
    pub fn with_sealing(
        region_size: usize,
        total: usize,
        gpa_base: u64,
        sealable: bool,
    ) -> Result<Self> {
        if region_size == 0 || !region_size.is_multiple_of(PAGE) || total < region_size {
            bail!("bad guest memory size {region_size}/{total}");
        }
        if !gpa_base.is_multiple_of(PAGE as u64) || gpa_base.checked_add(total as u64).is_none() {
            bail!("guest physical base {gpa_base:#x} must be page aligned and not overflow");
        }
        let name = c"vnet-frontend-guest";
        let flags = libc::MFD_CLOEXEC | if sealable { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: `name` is a valid NUL-terminated string; flags are plain constants.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own fd with a checked size.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), total as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error()).context("ftruncate memfd");
        }
        // SAFETY: a new shared mapping of the whole memfd; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap guest memory");
        }
        Ok(GuestMem {
            fd,
            base: p.cast(),
            len: total,
            region_size,
            gpa_base,
            next: Mutex::new(0),
        })
    }

    /// Sets the memfd's size (hostile: cut short under the backend, then given back; the
    /// bytes cut off come back as zeros). Nothing may touch the mapping past the file's end
    /// meanwhile: that is SIGBUS, here as in the backend.
    pub fn set_file_size(&self, len: usize) -> std::io::Result<()> {
        // SAFETY: ftruncate on our own fd; the mapping stays as it is.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn region_size(&self) -> usize {
        self.region_size
    }
    pub fn gpa_base(&self) -> u64 {
        self.gpa_base
    }

    /// The region as declared normally: whole declared size, mmap_offset 0.
    pub fn region(&self) -> MemRegion {
        MemRegion {
            guest_phys_addr: self.gpa_base,
            memory_size: self.region_size as u64,
            userspace_addr: self.base as u64,
            mmap_offset: 0,
        }
    }

    /// Allocates `size` bytes aligned to `align` inside the declared region; returns the offset.
    pub fn alloc(&self, size: usize, align: usize) -> Result<usize> {
        let mut next = self
            .next
            .lock()
            .map_err(|_| anyhow::anyhow!("allocator lock poisoned"))?;
        let off = align_up(*next, align);
        let end = off
            .checked_add(size)
            .filter(|&e| e <= self.region_size)
            .with_context(|| {
                format!(
                    "guest memory exhausted: need {size} more bytes at {off:#x} of {:#x} (raise --mem-mb)",
                    self.region_size
                )
            })?;
        *next = end;
        Ok(off)
    }

    /// Guest physical address of an offset (what descriptors hold).
    pub fn gpa(&self, off: usize) -> u64 {
        self.gpa_base + off as u64
    }
    /// Our virtual address of an offset (what SET_VRING_ADDR holds).
    pub fn uva(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "guest memory access {off:#x}+{len} out of the mapping"
        );
    }

    /// Copies `data` into guest memory at `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: bounds checked above; the source is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off), data.len()) }
    }

    /// Copies guest memory at `off` into `out`.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        // SAFETY: bounds checked above; the destination is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), out.as_mut_ptr(), out.len()) }
    }

    /// Fills `len` bytes at `off` with `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        self.check(off, len);
        // SAFETY: bounds checked above.
        unsafe { std::ptr::write_bytes(self.base.add(off), byte, len) }
    }

    /// An atomic view of the u16 at `off` (must be 2-aligned).
    pub fn u16_at(&self, off: usize) -> &AtomicU16 {
        self.check(off, 2);
        assert_eq!(off % 2, 0, "unaligned u16 at {off:#x}");
        // SAFETY: in bounds, aligned, and the mapping lives as long as `self`; AtomicU16 has
        // the layout of u16 and every bit pattern is valid.
        unsafe { &*(self.base.add(off) as *const AtomicU16) }
    }

    /// An atomic view of the u32 at `off` (must be 4-aligned).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        assert_eq!(off % 4, 0, "unaligned u32 at {off:#x}");
        // SAFETY: as for u16_at.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    pub fn write_u16(&self, off: usize, v: u16) {
        self.u16_at(off).store(v, Ordering::Relaxed)
    }
    pub fn write_u32(&self, off: usize, v: u32) {
        self.u32_at(off).store(v, Ordering::Relaxed)
    }
    pub fn write_u64(&self, off: usize, v: u64) {
        self.write(off, &v.to_le_bytes())
    }
    pub fn read_u32(&self, off: usize) -> u32 {
        self.u32_at(off).load(Ordering::Relaxed)
    }

    /// The canary byte at memfd offset `off` (a position-dependent pattern, so shifted copies
    /// are caught too).
    pub fn canary_byte(off: usize) -> u8 {
        let x = off as u64;
        (((x >> 8) ^ x ^ 0xA5) as u8).rotate_left((x % 7) as u32)
    }

    /// Fills everything past the declared region with the canary pattern.
    pub fn fill_canary(&self) {
        let mut chunk = vec![0u8; 64 * 1024];
        let mut off = self.region_size;
        while off < self.len {
            let n = chunk.len().min(self.len - off);
            for (i, b) in chunk[..n].iter_mut().enumerate() {
                *b = Self::canary_byte(off + i);
            }
            self.write(off, &chunk[..n]);
            off += n;
        }
    }

    /// Offsets of the first and last canary byte that differ, if any.
    pub fn canary_damage(&self) -> Option<(usize, usize)> {
        let mut chunk = vec![0u8; 64 * 1024];
        let mut off = self.region_size;
        let mut damage: Option<(usize, usize)> = None;
        while off < self.len {
            let n = chunk.len().min(self.len - off);
            self.read(off, &mut chunk[..n]);
            for (i, b) in chunk[..n].iter().enumerate() {
                if *b != Self::canary_byte(off + i) {
                    let at = off + i;
                    damage = Some(damage.map_or((at, at), |(a, _)| (a, at)));
                }
            }
            off += n;
        }
        damage
    }
}

impl Drop for GuestMem {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `new`; nothing borrows it
        // any more since `self` is being dropped.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_and_canary() {
        let m = GuestMem::new(1 << 20, 2 << 20, 0x10_0000).expect("memfd");
        let a = m.alloc(100, 16).expect("alloc");
        let b = m.alloc(100, 4096).expect("alloc");
        assert_eq!(a, 0);
        assert_eq!(b, 4096);
        assert_eq!(m.gpa(b), 0x10_1000);
        assert!(m.alloc(1 << 20, 16).is_err());
        m.fill_canary();
        assert_eq!(m.canary_damage(), None);
        m.write(m.region_size() + 10, &[0, 0, 0]);
        let d = m.canary_damage().expect("damage seen");
        assert!(d.0 >= m.region_size() + 10 && d.1 <= m.region_size() + 12);
    }
}
