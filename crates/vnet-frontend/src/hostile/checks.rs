//! What is checked after a variant's misbehaviour: does the backend still answer, does the
//! ring go on or work again once re-initialised, did it close on EOF, is the canary intact.

use super::report::CaseReport;
use super::session::{Sess, TX};
use crate::conn::ConnError;
use std::time::{Duration, Instant};

pub(super) fn check_canary(s: &Sess, rep: &mut CaseReport) {
    if let Some((a, b)) = s.mem.canary_damage() {
        rep.canary_intact = false;
        rep.canary_damage = Some(format!(
            "memfd offsets {a:#x}..={b:#x} (region size {:#x})",
            s.mem.region_size()
        ));
    }
}

/// After a misbehaviour on a live connection: probe, then see whether the device still works.
pub(super) fn finish_live(s: &mut Sess, rep: &mut CaseReport, data: bool) {
    if s.conn.peer_closed() {
        rep.connection_closed = true;
    }
    if !rep.connection_closed {
        let (n, eof) = s.conn.drain_pending();
        if n > 0 {
            rep.notes.push(format!(
                "backend sent {n} bytes nobody asked for (discarded)"
            ));
        }
        rep.connection_closed |= eof;
    }
    if !rep.connection_closed {
        s.probe(rep);
    }
    if rep.connection_closed || rep.answers_after != Some(true) || !s.opts.round {
        return;
    }
    let mut notes = Vec::new();
    if data {
        match s.valid_tx() {
            Ok(ok) => rep.ring_continues = Some(ok),
            Err(e) => notes.push(format!("valid frame: {e:#}")),
        }
        match s.conn.get_vring_base(TX as u32) {
            Ok(b) => {
                rep.vring_base_after = Some(b);
                s.started[TX] = false;
            }
            Err(e) => {
                notes.push(format!("GET_VRING_BASE: {e}"));
                if matches!(e, ConnError::Closed) {
                    rep.connection_closed = true;
                }
            }
        }
        if !rep.connection_closed {
            let r = s
                .setup(TX, &mut notes)
                .and_then(|_| s.sync())
                .and_then(|_| s.valid_tx());
            match r {
                Ok(ok) => rep.works_after_reinit = Some(ok),
                Err(e) => notes.push(format!("re-init: {e:#}")),
            }
        }
    } else {
        let r = s.bring_up(&mut notes).and_then(|_| s.valid_tx());
        match r {
            Ok(ok) => rep.works_after_reinit = Some(ok),
            Err(e) => {
                if e.downcast_ref::<ConnError>()
                    .is_some_and(|c| matches!(c, ConnError::Closed))
                {
                    rep.connection_closed = true;
                }
                notes.push(format!("valid setup after the case: {e:#}"));
            }
        }
    }
    rep.notes.extend(notes);
    if s.conn.peer_closed() {
        rep.connection_closed = true;
    }
}

/// After a truncated message: the backend is waiting for more bytes. Give it EOF and see
/// that it closes its side.
pub(super) fn finish_stream(s: &mut Sess, rep: &mut CaseReport) {
    std::thread::sleep(s.opts.settle);
    if s.conn.peer_closed() {
        rep.connection_closed = true;
        rep.closed_after_eof = Some(true);
        rep.notes.push("closed before EOF".into());
        return;
    }
    if let Err(e) = s.conn.shutdown_write() {
        rep.notes.push(format!("shutdown: {e}"));
    }
    let deadline = Instant::now() + s.opts.probe_timeout;
    let mut closed = false;
    while Instant::now() < deadline {
        if s.conn.peer_closed() {
            closed = true;
            break;
        }
        // Drain anything the backend says before closing.
        let _ = crate::conn::poll_readable(s.conn.raw_fd(), Duration::from_millis(20));
        if s.conn.drain_pending().1 {
            closed = true;
            break;
        }
    }
    rep.connection_closed = closed;
    rep.closed_after_eof = Some(closed);
}
