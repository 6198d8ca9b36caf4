//! The misbehaviours the cases are made of: hostile descriptor chains, raw and truncated
//! messages, bad ring and memory-table setups, the memfd cut. Each records what the backend
//! answered in the report and leaves judging it to the caller.

use super::report::CaseReport;
use super::session::{Sess, TX};
use crate::conn::ConnError;
use crate::proto::{self, req, MemRegion};
use anyhow::Result;
use std::os::fd::AsRawFd;

/// Puts a chain of hostile descriptors on ring `i` (head = first entry), publishes, kicks.
pub(super) fn post(
    s: &mut Sess,
    i: usize,
    descs: &[(u16, u64, u32, u16, u16)],
    heads: &[u16],
) -> Result<()> {
    let r = s.ring(i)?;
    for &(idx, addr, len, flags, next) in descs {
        r.set_desc(idx, addr, len, flags, next);
    }
    for &h in heads {
        r.push(h);
    }
    r.publish();
    s.kick(i);
    Ok(())
}

pub(super) fn canary_gpa(s: &Sess) -> u64 {
    s.mem.gpa(s.mem.region_size()) + 0x1000
}

pub(super) fn region_end_gpa(s: &Sess) -> u64 {
    s.mem.gpa(s.mem.region_size())
}

/// Cuts the memfd to 0 bytes (`mem_cut` says whether the kernel allowed it).
pub(super) fn cut(s: &Sess, rep: &mut CaseReport) {
    match s.mem.set_file_size(0) {
        Ok(()) => rep.mem_cut = Some(true),
        Err(e) => {
            rep.mem_cut = Some(false);
            rep.notes.push(format!("ftruncate refused: {e}"));
        }
    }
}

/// Advances the tx ring's avail idx by `by` without any descriptor behind it, and kicks.
pub(super) fn jump_avail_idx(s: &mut Sess, by: u16) -> Result<()> {
    let r = s.ring(TX)?;
    let v = r.avail_idx.wrapping_add(by);
    r.force_avail_idx(v);
    s.kick(TX);
    Ok(())
}

pub(super) fn send_bytes(s: &mut Sess, rep: &mut CaseReport, b: &[u8]) -> Result<()> {
    if let Err(e) = s.conn.send_raw(b, &[]) {
        rep.conn_err("send", e);
    }
    Ok(())
}

/// Sends one raw message; a closed connection is recorded, not an error.
pub(super) fn raw(
    s: &mut Sess,
    rep: &mut CaseReport,
    code: u32,
    flags: u32,
    payload: &[u8],
    fds: &[i32],
) -> Result<()> {
    if let Err(e) = s.conn.send_message(code, flags, payload, fds) {
        rep.conn_err(&req::name(code), e);
    }
    Ok(())
}

/// Sends a request the normal way (NEED_REPLY when negotiated), recording the outcome.
/// Returns false if the connection is gone.
pub(super) fn try_req(
    s: &Sess,
    rep: &mut CaseReport,
    code: u32,
    payload: &[u8],
    fds: &[i32],
) -> bool {
    match s.conn.request(code, payload, fds) {
        Ok(()) => true,
        Err(e) => {
            let closed = matches!(e, ConnError::Closed);
            rep.conn_err(&req::name(code), e);
            !closed
        }
    }
}

/// Starts the tx ring with the given addresses and (optionally) queues a valid frame in the
/// normal layout's desc/avail (whatever the backend was told).
pub(super) fn start_tx(
    s: &mut Sess,
    rep: &mut CaseReport,
    num: u32,
    addrs: (u64, u64, u64),
    frame: bool,
) {
    let l = s.layouts[TX];
    s.mem.fill(l.desc, l.size, 0);
    let q = match device_eventfds() {
        Ok(q) => q,
        Err(e) => {
            rep.notes.push(format!("eventfd: {e}"));
            return;
        }
    };
    let steps: Vec<(u32, Vec<u8>, Vec<i32>)> = vec![
        (req::SET_VRING_NUM, proto::vring_state(1, num), vec![]),
        (req::SET_VRING_BASE, proto::vring_state(1, 0), vec![]),
        (
            req::SET_VRING_ADDR,
            proto::vring_addr(1, 0, addrs.0, addrs.1, addrs.2, 0),
            vec![],
        ),
        (
            req::SET_VRING_CALL,
            proto::u64_payload(1),
            vec![q.1.as_raw_fd()],
        ),
        (
            req::SET_VRING_KICK,
            proto::u64_payload(1),
            vec![q.0.as_raw_fd()],
        ),
    ];
    for (code, p, fds) in steps {
        if !try_req(s, rep, code, &p, &fds) {
            return;
        }
    }
    s.started[TX] = true;
    if s.neg.protocol_features
        && !try_req(
            s,
            rep,
            req::SET_VRING_ENABLE,
            &proto::vring_state(1, 1),
            &[],
        )
    {
        return;
    }
    if frame {
        // A valid frame at descriptor 0 in our normal layout.
        let off = l.desc;
        s.mem.write_u64(off, s.mem.gpa(s.frame_off));
        s.mem.write_u32(off + 8, s.frame_len as u32);
        s.mem.write_u16(l.avail_ring_off(0), 0);
        s.mem
            .u16_at(l.avail_idx_off())
            .store(1, std::sync::atomic::Ordering::Release);
    }
    let _ = q.0.write(1);
    // Keep the eventfds alive while the backend may use them.
    std::thread::sleep(s.opts.settle);
    let used = s
        .mem
        .u16_at(l.used_idx_off())
        .load(std::sync::atomic::Ordering::Acquire);
    rep.used_entries = Some(used as usize);
}

pub(super) fn device_eventfds() -> std::io::Result<(
    vmm_sys_util::eventfd::EventFd,
    vmm_sys_util::eventfd::EventFd,
)> {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    Ok((EventFd::new(EFD_NONBLOCK)?, EventFd::new(EFD_NONBLOCK)?))
}

/// The tx ring's addresses in the normal layout, as the backend is told them.
fn normal_tx_addrs(s: &Sess) -> (u64, u64, u64) {
    let l = s.layouts[TX];
    (s.mem.uva(l.desc), s.mem.uva(l.used), s.mem.uva(l.avail))
}

/// Sends a valid memory table, then starts the tx ring as [`start_tx`] does.
fn start_tx_after_valid_table(
    s: &mut Sess,
    rep: &mut CaseReport,
    num: u32,
    addrs: (u64, u64, u64),
    frame: bool,
) -> Result<()> {
    if try_req(
        s,
        rep,
        req::SET_MEM_TABLE,
        &proto::mem_table(1, &[s.mem.region()]),
        &[s.mem.fd()],
    ) {
        start_tx(s, rep, num, addrs, frame);
    }
    Ok(())
}

pub(super) fn bad_ring_num(s: &mut Sess, rep: &mut CaseReport, num: u32) -> Result<()> {
    let addrs = normal_tx_addrs(s);
    start_tx_after_valid_table(s, rep, num, addrs, true)
}

pub(super) fn bad_ring_addr(
    s: &mut Sess,
    rep: &mut CaseReport,
    desc: u64,
    used: u64,
    avail: u64,
    frame: bool,
) -> Result<()> {
    let n = s.num() as u32;
    start_tx_after_valid_table(s, rep, n, (desc, used, avail), frame)
}

pub(super) fn bad_mem_table(
    s: &mut Sess,
    rep: &mut CaseReport,
    n: u32,
    regions: &[MemRegion],
    nfds: usize,
) -> Result<()> {
    let fds = vec![s.mem.fd(); nfds];
    if !try_req(
        s,
        rep,
        req::SET_MEM_TABLE,
        &proto::mem_table(n, regions),
        &fds,
    ) {
        return Ok(());
    }
    // If the table was taken, make the backend use it: start tx in our normal addresses.
    if rep.nacks.is_empty() {
        let addrs = normal_tx_addrs(s);
        start_tx(s, rep, s.num() as u32, addrs, true);
    }
    Ok(())
}
