//! Surviving a frontend that cuts guest memory short under vnetd.
//!
//! Touching a shared mapping past the end of its file raises SIGBUS, whose default action
//! ends the process: a hostile VMM could take vnetd down by shrinking the file behind guest
//! memory. A memfd sealed against shrinking (`F_SEAL_SHRINK`: QEMU's memfd backend seals, and
//! vnetd adds the seal where the memfd allows it) cannot be cut short; anything else can (a
//! file on /dev/shm or hugetlbfs, a memfd made without sealing), and even a sealed hugetlbfs
//! memfd can fault once its pages are punched out and the huge page pool is empty. So every
//! guest memory region is also registered here ([`Guard`]), in a fixed table a signal handler
//! can read without locks. vnetd's SIGBUS handler, when the fault's address lies in a
//! registered range, maps an anonymous page over the faulting page (the access then completes,
//! reading zeros or writing into memory nobody else sees), flags the registration and returns;
//! the device thread sees the flag and drops the frontend. Any other SIGBUS goes to the handler
//! that was installed before (Rust's stack-overflow handler), or takes the default action.
//!
//! Nothing here runs on the data path: registering costs a table slot per region, and the
//! device checks one flag per batch.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Once, OnceLock};

/// Guarded ranges at most: 8 regions (a vhost-user memory table's most) for 128 devices.
const SLOTS: usize = 1024;
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// One guarded range. Published by `end` (stored last, cleared first), so the handler never
/// sees a half-made entry.
struct Slot {
    used: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    /// The mapping's page size: the unit the handler replaces.
    page: AtomicUsize,
    /// The registration's flag (a box the [`Guard`] owns while the slot is published).
    flag: AtomicPtr<AtomicBool>,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    used: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    flag: AtomicPtr::new(std::ptr::null_mut()),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The SIGBUS action before ours, for faults that are not in guest memory.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// The guarded ranges of one guest memory. Dropping it unregisters them: drop it before the
/// regions are unmapped, so an address a later mapping reuses is never taken for guest memory.
pub struct Guard {
    slots: Vec<usize>,
    flag: Box<AtomicBool>,
}

impl Default for Guard {
    fn default() -> Self {
        Guard::new()
    }
}

impl Guard {
    pub fn new() -> Guard {
        Guard {
            slots: Vec::new(),
            flag: Box::new(AtomicBool::new(false)),
        }
    }

    /// Guards the `len` bytes mapped at `addr`, in pages of `page` bytes (a power of two; the
    /// mapping starts on a page boundary). Fails when the handler cannot be installed or
    /// the table is full.
    pub fn add(&mut self, addr: usize, len: usize, page: usize) -> io::Result<()> {
        if !page.is_power_of_two() || !addr.is_multiple_of(page) || addr.checked_add(len).is_none()
        {
            return Err(io::Error::other(
                "guest memory mapping not on a page boundary",
            ));
        }
        if !install() {
            return Err(io::Error::other(
                "the SIGBUS handler could not be installed",
            ));
        }
        for (i, s) in TABLE.iter().enumerate() {
            if s.used
                .compare_exchange(false, true, AcqRel, Relaxed)
                .is_ok()
            {
                s.start.store(addr, Relaxed);
                s.page.store(page, Relaxed);
                s.flag
                    .store(std::ptr::from_ref(&*self.flag).cast_mut(), Relaxed);
                s.end.store(addr + len, Release);
                self.slots.push(i);
                return Ok(());
            }
        }
        Err(io::Error::other(
            "more guest memory regions than the SIGBUS guard holds",
        ))
    }

    /// A guarded range faulted: the frontend cut the memory short.
    pub fn faulted(&self) -> bool {
        self.flag.load(Relaxed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Nothing touches the ranges any more (their memory is being dropped), so no handler
        // can be using these slots' flag.
        for &i in &self.slots {
            let s = &TABLE[i];
            s.end.store(0, Release);
            s.flag.store(std::ptr::null_mut(), Release);
            s.used.store(false, Release);
        }
    }
}

/// The page size of a mapping of `f`: the huge page size on hugetlbfs, else the base page.
pub fn page_size(f: &impl AsRawFd) -> usize {
    // SAFETY: a zeroed statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into `st`, ours, for a descriptor the caller keeps open.
    let r = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
    if r == 0 && st.f_type as u64 == HUGETLBFS_MAGIC && st.f_bsize > 0 {
        return st.f_bsize as usize;
    }
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Installs the handler once for the process; whether it is in place.
fn install() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value (no flags, empty mask) that we fill in.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; the kernel overwrites it with the previous action.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        // SA_ONSTACK: Rust's threads have an alternate signal stack; use it when there is one.
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: sigemptyset initialises the mask of our own struct; sigaction installs a
        // handler that is an `extern "C" fn` of the SA_SIGINFO signature and reads only
        // static, lock-free state.
        let r = unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, &mut old)
        };
        if r == 0 {
            let _ = PREVIOUS.set(old);
            INSTALLED.store(true, SeqCst);
        }
    });
    INSTALLED.load(SeqCst)
}

/// The SIGBUS handler. Only async-signal-safe work: atomics, `mmap`, `sigaction`, `raise`.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A positive si_code: the kernel raised it for a fault (not sent by a process).
    if code > 0 && survive_guest_fault(addr) {
        return;
    }
    pass_on(sig, info, ctx);
}

/// If `addr` is in guarded guest memory: an anonymous page over the faulting one, the flag
/// set; true when the access can be run again.
fn survive_guest_fault(addr: usize) -> bool {
    for s in TABLE.iter() {
        let end = s.end.load(Acquire);
        if end == 0 || addr >= end || addr < s.start.load(Relaxed) {
            continue;
        }
        let page = s.page.load(Relaxed);
        let at = addr & !(page - 1);
        // SAFETY: `at..at + page` lies within one guest memory mapping of ours (the range is
        // registered, so still mapped, and starts on a page boundary); replacing it with
        // private anonymous memory changes only what vnetd reads and writes there. mmap is a
        // plain system call, safe in a signal handler.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                at,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1 as libc::c_long,
                0 as libc::c_long,
            )
        };
        if r as usize != at {
            return false;
        }
        let f = s.flag.load(Acquire);
        if !f.is_null() {
            // SAFETY: a published slot's flag points into its Guard's box, which outlives the
            // registration; the fault came from memory of that registration, so it is live.
            unsafe { (*f).store(true, SeqCst) };
        }
        return true;
    }
    false
}

/// A SIGBUS that is not ours: the previous handler, or the default action.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if let Some(old) = PREVIOUS.get() {
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN {
            if old.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: installed with SA_SIGINFO, so the handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: installed without SA_SIGINFO, so the handler takes the signal only.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
                f(sig);
            }
            return;
        }
    }
    // The default action back in place: the faulting access runs again and ends the process
    // as it would have without us; a signal sent by a process is raised again.
    // SAFETY: a zeroed sigaction with SIG_DFL is a valid action; sigaction and raise are
    // async-signal-safe.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        if (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, OwnedFd};

    /// A memfd of `len` bytes that can be cut short, mapped shared.
    fn mapping(len: usize) -> (OwnedFd, *mut u8) {
        // SAFETY: a valid C string and flags.
        let fd = unsafe { libc::memfd_create(c"sigbus-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain system calls on our own descriptor; a new mapping.
        let p = unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (fd, p.cast())
    }

    #[test]
    fn a_fault_in_guarded_memory_is_survived_and_flagged() {
        let len = 4 * 4096;
        let (fd, p) = mapping(len);
        // SAFETY: within the mapping, before it is cut short.
        unsafe { std::ptr::write_volatile(p.add(4096), 7u8) };
        let mut g = Guard::new();
        g.add(p as usize, len, page_size(&fd)).unwrap();
        assert!(!g.faulted());
        // SAFETY: our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
        // Past the end of the file now: SIGBUS, survived; the page reads as zeros and takes
        // writes.
        // SAFETY: within the mapping; the fault is what is tested.
        let v = unsafe { std::ptr::read_volatile(p.add(4096)) };
        assert_eq!(v, 0);
        // SAFETY: as above (another page: another fault).
        unsafe { std::ptr::write_volatile(p.add(3 * 4096 + 5), 9u8) };
        // SAFETY: as above.
        assert_eq!(unsafe { std::ptr::read_volatile(p.add(3 * 4096 + 5)) }, 9);
        assert!(g.faulted());
        drop(g);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p.cast(), len) };
    }

    #[test]
    fn a_fault_outside_guarded_memory_still_ends_the_process() {
        // The handler is installed (by a registration) but this mapping is not registered:
        // the child that touches it must die of SIGBUS as without the guard.
        let (other_fd, other) = mapping(4096);
        let mut g = Guard::new();
        g.add(other as usize, 4096, page_size(&other_fd)).unwrap();
        let (fd, p) = mapping(4096);
        // SAFETY: the child only makes async-signal-safe calls and ends with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above; the read faults, which is what is tested.
            unsafe {
                libc::ftruncate(fd.as_raw_fd(), 0);
                let _ = std::ptr::read_volatile(p);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status),
            "child exited normally: {status:#x}"
        );
        assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
        assert!(!g.faulted());
        drop(g);
        // SAFETY: the mappings made above, no longer used.
        unsafe {
            libc::munmap(p.cast(), 4096);
            libc::munmap(other.cast(), 4096);
        }
    }
}
