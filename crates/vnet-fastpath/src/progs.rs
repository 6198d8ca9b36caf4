//! The loaded programs, held by descriptors of their own (the object is closed after load;
//! a program lives while a descriptor or a tcx link refers to it): attached with tcx, swapped
//! into pinned links, and run on a frame for tests (`BPF_PROG_TEST_RUN`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::maps::FastpathProgs;
use crate::spec::Program;

/// One descriptor per program of the object (the skeleton's fields).
pub(crate) struct Progs {
    port_ingress: OwnedFd,
    underlay_ingress: OwnedFd,
    punt_ingress: OwnedFd,
    tunnel_ingress: OwnedFd,
}

impl Progs {
    pub fn new(p: &FastpathProgs<'_>) -> io::Result<Progs> {
        Ok(Progs {
            port_ingress: p.port_ingress.as_fd().try_clone_to_owned()?,
            underlay_ingress: p.underlay_ingress.as_fd().try_clone_to_owned()?,
            punt_ingress: p.punt_ingress.as_fd().try_clone_to_owned()?,
            tunnel_ingress: p.tunnel_ingress.as_fd().try_clone_to_owned()?,
        })
    }

    pub fn fd(&self, p: Program) -> BorrowedFd<'_> {
        match p {
            Program::PortIngress => self.port_ingress.as_fd(),
            Program::UnderlayIngress => self.underlay_ingress.as_fd(),
            Program::PuntIngress => self.punt_ingress.as_fd(),
            Program::TunnelIngress => self.tunnel_ingress.as_fd(),
        }
    }
}

/// Attaches `prog` at the tcx ingress of `ifindex`; the link lives as long as the fd.
pub(crate) fn tcx_attach(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<OwnedFd> {
    let opts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    // SAFETY: `prog` is a valid program fd for the duration of the call and `opts` a fully
    // initialised options struct whose `sz` is its own size, as libbpf requires.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            ifindex as i32,
            libbpf_sys::BPF_TCX_INGRESS,
            &opts,
        )
    };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: bpf_link_create returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Runs `prog` `repeat` times on `frame` with the context `ctx` (a `struct __sk_buff`): its
/// return value, the frame as it left it, and the kernel's mean time of one run in ns.
pub(crate) fn test_run(
    prog: BorrowedFd<'_>,
    frame: &[u8],
    ctx: &[u8],
    repeat: u32,
) -> io::Result<(i32, Vec<u8>, u32)> {
    let mut out = vec![0u8; frame.len() + 256];
    let len = |n: usize| u32::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let mut opts = libbpf_sys::bpf_test_run_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
        data_in: frame.as_ptr().cast(),
        data_size_in: len(frame.len())?,
        data_out: out.as_mut_ptr().cast(),
        data_size_out: len(out.len())?,
        ctx_in: ctx.as_ptr().cast(),
        ctx_size_in: len(ctx.len())?,
        repeat: repeat as _,
        ..Default::default()
    };
    // SAFETY: `prog` is a valid program fd for the call; the input pointers and sizes
    // describe `frame` and `ctx`, the output ones `out`, all alive across the call (the
    // kernel writes at most `data_size_out` bytes and sets it to what it wrote); `sz` is the
    // options struct's own size, as libbpf requires.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(prog.as_raw_fd(), &mut opts) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc));
    }
    out.truncate(opts.data_size_out as usize);
    Ok((opts.retval as i32, out, opts.duration))
}
