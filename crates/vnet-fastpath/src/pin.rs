//! bpffs, so the fast path outlives vnetd (issue #17): the kernel keeps a program, a map or an
//! attachment (a tcx link) as long as something refers to it, and a file in bpffs is such a
//! reference. vnetd pins its maps and its tcx links under a directory of its own; frames keep
//! flowing while no vnetd runs, and the next one reopens what is pinned, swaps its own
//! programs into the links (`BPF_LINK_UPDATE`, atomic per link) and goes on writing the same
//! maps. The same design as Cilium's agent (maps and programs pinned, taken over on restart).
//!
//! A pin directory is one daemon's (issue #32): vnetd names it by its instance and its network
//! namespace (a tcx link's device is an ifindex, which means something in one namespace only),
//! and the maps in it sit in `maps-HASH`, HASH their layout's ([`crate::layout::layout_hash`]).
//! A teardown removes a directory only when it looks as vnet makes them
//! ([`not_a_pin_dir`]). A bpffs that is the process's own (a private mount namespace) dies with
//! it, and the pins with it: said at warning level.
//!
//! The thin, unsafe layer over libbpf's object calls is here, each call with its reason
//! (with the `kernel` feature; the bpffs directory calls, which a teardown needs, are always
//! here).

use std::ffi::CString;
use std::io;
#[cfg(feature = "kernel")]
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The magic number of bpffs (`BPF_FS_MAGIC`).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The usual mount point of bpffs.
pub const BPFFS: &str = "/sys/fs/bpf";

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

/// Whether `path` is on a bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = cpath(path) else {
        return false;
    };
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a statfs the call may fill.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// The inode of a process's mount namespace (`None`: not readable, as PID 1's in some
/// sandboxes).
fn mnt_ns(pid: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| m.ino())
}

/// Whether the bpffs at `root` is this process's own rather than the host's: its mount
/// namespace is not PID 1's (or cannot be told from it) and it mounted the bpffs itself, or the
/// bpffs is another filesystem than the one PID 1 sees there. Pins in such a bpffs go when
/// the mount namespace goes (`ip netns exec`'s, a container's).
pub fn private_bpffs(root: &Path, mounted_here: bool) -> bool {
    let (me, init) = (mnt_ns("self"), mnt_ns("1"));
    if me.is_some() && me == init {
        return false;
    }
    if mounted_here {
        return true;
    }
    let rel = root.strip_prefix("/").unwrap_or(root);
    match (
        std::fs::metadata(root),
        std::fs::metadata(Path::new("/proc/1/root").join(rel)),
    ) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        _ => false,
    }
}

/// Makes sure `dir` exists on a bpffs: mounts bpffs at /sys/fs/bpf when nothing is mounted
/// there (as systemd does at boot, and Cilium's agent where it did not), then creates `dir`.
/// Says at warning level when the bpffs is this process's own ([`private_bpffs`]).
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    let root = Path::new(BPFFS);
    let mut mounted = false;
    if dir.starts_with(root) && !is_bpffs(root) {
        std::fs::create_dir_all(root)?;
        let (src, fstype) = (CString::new("bpf")?, CString::new("bpf")?);
        let target = cpath(root)?;
        // SAFETY: NUL-terminated strings that live across the call; no data argument.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("no bpffs at {BPFFS} and mounting one failed: {e}"),
            ));
        }
        mounted = true;
    }
    if dir.starts_with(root) && private_bpffs(root, mounted) {
        tracing::warn!(
            "the bpffs at {BPFFS} is this vnetd's own{} (a private mount namespace: `ip netns exec`, a container without the host's {BPFFS}): the pinned kernel fast path will not outlive this vnetd, and the next one starts it afresh (guests lose frames across a restart). Give vnetd the host's {BPFFS} (`nsenter --net` instead of `ip netns exec`; a container: bind-mount {BPFFS})",
            if mounted { ", mounted now" } else { "" }
        );
    } else if mounted {
        tracing::info!("mounted bpffs at {BPFFS}");
    }
    std::fs::create_dir_all(dir)?;
    if !is_bpffs(dir) {
        return Err(io::Error::other(format!(
            "{} is not on a bpffs",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(feature = "kernel")]
/// Pins the object `fd` refers to at `path`, replacing what was pinned there.
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    unpin(path)?;
    let c = cpath(path)?;
    // SAFETY: `fd` is a valid BPF object descriptor for the call; `c` is NUL-terminated.
    let r = unsafe { libbpf_sys::bpf_obj_pin(fd.as_raw_fd(), c.as_ptr()) };
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r));
    }
    Ok(())
}

#[cfg(feature = "kernel")]
/// Opens what is pinned at `path`; `None` when nothing is.
pub fn open(path: &Path) -> io::Result<Option<OwnedFd>> {
    let c = cpath(path)?;
    // SAFETY: `c` is NUL-terminated; the call returns a new descriptor or an error.
    let fd = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if fd < 0 {
        let e = io::Error::from_raw_os_error(-fd);
        return match e.kind() {
            io::ErrorKind::NotFound => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: bpf_obj_get returned a new descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Removes the pin at `path` (the object lives on while anything else refers to it).
pub fn unpin(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(feature = "kernel")]
/// What a tcx link says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcxLink {
    /// The device it is attached to; 0 when the device is gone (the link is defunct).
    pub ifindex: u32,
    /// The program it runs.
    pub prog_id: u32,
}

#[cfg(feature = "kernel")]
/// The `bpf_*_info` of the object behind `fd`, as `get` (libbpf's `bpf_*_get_info_by_fd`)
/// reads it.
///
/// # Safety
/// `T` is plain data for which all-zero bytes are a valid value (libbpf's info structs are),
/// and `get` writes at most the length it is given into the `T` it is given.
unsafe fn info_by_fd<T>(
    fd: BorrowedFd<'_>,
    get: unsafe extern "C" fn(std::ffi::c_int, *mut T, *mut u32) -> std::ffi::c_int,
) -> io::Result<T> {
    // SAFETY: all-zero is a valid `T` (the caller's promise), to be overwritten.
    let mut info: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as u32;
    // SAFETY: `info` has `len` bytes; `get` writes at most that many (the caller's promise).
    let r = unsafe { get(fd.as_raw_fd(), &mut info, &mut len) };
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r));
    }
    Ok(info)
}

#[cfg(feature = "kernel")]
/// Reads a tcx link's device and program.
pub fn tcx_link(fd: BorrowedFd<'_>) -> io::Result<TcxLink> {
    // SAFETY: bpf_link_info is plain data, valid all zero, and the kernel writes at most the
    // length it is given.
    let info = unsafe { info_by_fd(fd, libbpf_sys::bpf_link_get_info_by_fd)? };
    if info.type_ != libbpf_sys::BPF_LINK_TYPE_TCX {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a tcx link"));
    }
    // SAFETY: the link is a tcx link (checked above), so the union holds its tcx member.
    let ifindex = unsafe { info.__bindgen_anon_1.tcx.ifindex };
    Ok(TcxLink {
        ifindex,
        prog_id: info.prog_id,
    })
}

#[cfg(feature = "kernel")]
/// Runs `prog` in the link from now on (atomic: every packet sees the old program or the new).
pub fn update_link(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let opts = libbpf_sys::bpf_link_update_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_update_opts>() as _,
        ..Default::default()
    };
    // SAFETY: both descriptors are valid for the call and `opts` is a fully initialised
    // options struct whose `sz` is its own size, as libbpf requires.
    let r = unsafe { libbpf_sys::bpf_link_update(link.as_raw_fd(), prog.as_raw_fd(), &opts) };
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r));
    }
    Ok(())
}

#[cfg(feature = "kernel")]
/// The id of the program behind `fd`.
pub fn prog_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: bpf_prog_info is plain data, valid all zero, and the kernel writes at most the
    // length it is given.
    let info = unsafe { info_by_fd(fd, libbpf_sys::bpf_prog_get_info_by_fd)? };
    Ok(info.id)
}

/// The identity of this process's network namespace: its cookie (`SO_NETNS_COOKIE`, never
/// reused while the machine runs, as pins are not kept across a reboot).
pub fn netns_cookie() -> io::Result<u64> {
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SO_NETNS_COOKIE (linux/asm-generic/socket.h), Linux 5.14.
    const SO_NETNS_COOKIE: libc::c_int = 71;
    // SAFETY: a valid socket; `cookie` has `len` bytes for the kernel to write a u64 into.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// What a pin directory holds at its top (`maps-HASH` of each layout, `maps` of vnets from
/// before the hash, `links`): whether `name` is one of them.
pub fn is_pin_entry(name: &str) -> bool {
    name == "links" || name == "maps" || name.starts_with("maps-")
}

/// The directories of maps in `dir` other than `own` (maps of another layout).
pub fn other_maps_dirs<'a>(dir: &Path, own: &'a str) -> impl Iterator<Item = PathBuf> + 'a {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(move |e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n != own && n != "links" && is_pin_entry(n))
        })
        .map(|e| e.path())
}

/// Moves the maps pinned in `dir/from` to `dir/to` (an empty or absent directory): the maps
/// stay the same objects.
pub fn move_maps(dir: &Path, from: &str, to: &str) -> io::Result<()> {
    std::fs::rename(dir.join(from), dir.join(to))
}

/// Why `dir` is not a pin directory as vnet makes them (`None`: it is one, or there is nothing
/// there): on a bpffs, a directory and not a link to one, holding nothing but `maps*` and
/// `links` directories. A teardown removes nothing else, whatever a state file names.
pub fn not_a_pin_dir(dir: &Path) -> Option<String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("cannot look at it: {e}")),
    };
    if meta.file_type().is_symlink() {
        return Some("it is a symbolic link".into());
    }
    if !meta.is_dir() {
        return Some("it is not a directory".into());
    }
    if !is_bpffs(dir) {
        return Some("it is not on a bpffs".into());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return Some(format!("cannot list it: {e}")),
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !is_pin_entry(&name) {
            return Some(format!("it holds {name:?}, which vnet does not pin"));
        }
    }
    None
}

/// Removes a pin directory and everything pinned in it (a teardown).
pub fn remove_dir(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
