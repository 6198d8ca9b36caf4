//! One connection to the backend for one variant: negotiation, guest memory with its canary
//! half, the two rings, and the normal operations (bring-up, a valid frame, the probe) that the
//! hostile cases misbehave around.

use super::report::CaseReport;
use crate::conn::{Conn, ConnError};
use crate::device::{self, Endpoint, Negotiated, Queue, SetupOpts};
use crate::frame::{self, FrameSpec};
use crate::mem::{GuestMem, PAGE};
use crate::proto::{self, req};
use crate::ring::{DriverRing, RingLayout};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct HostileOpts {
    pub setup: SetupOpts,
    /// Time the backend gets to react to a misbehaviour.
    pub settle: Duration,
    /// rx cases: how long to leave hostile rx buffers posted (send traffic meanwhile).
    pub rx_wait: Duration,
    /// How long to wait for the probe's reply.
    pub probe_timeout: Duration,
    /// Try a normal frame after each case.
    pub round: bool,
    pub frame: FrameSpec,
}

pub(super) const SCRATCH: usize = 256 * 1024;
pub(super) const READONLY_BYTE: u8 = 0x5a;
pub(super) const GUARD_BYTE: u8 = 0xc3;

/// A connection for one variant.
pub(super) struct Sess {
    pub(super) conn: Conn,
    pub(super) neg: Negotiated,
    pub(super) mem: Arc<GuestMem>,
    pub(super) layouts: [RingLayout; 2],
    pub(super) queues: [Option<Queue>; 2],
    pub(super) rings: [Option<DriverRing>; 2],
    pub(super) started: [bool; 2],
    /// [virtio hdr + valid frame]
    pub(super) frame_off: usize,
    pub(super) frame_len: usize,
    pub(super) scratch: usize,
    pub(super) opts: HostileOpts,
}

/// Ring indices: the device's receive and transmit queues.
pub(super) const RX: usize = 0;
pub(super) const TX: usize = 1;

impl Sess {
    /// `sealable`: guest memory the backend can seal against shrinking.
    pub(super) fn connect(
        ep: &Endpoint,
        o: &HostileOpts,
        sealable: bool,
    ) -> Result<Sess, (bool, anyhow::Error)> {
        let stream = ep.open(o.setup.timeout).map_err(|e| (false, e.into()))?;
        let mut conn = Conn::new(stream, o.setup.timeout);
        let neg = device::negotiate(&mut conn, &o.setup).map_err(|e| (true, e))?;
        Self::with_conn(conn, neg, o, sealable).map_err(|e| (true, e))
    }

    pub(super) fn with_conn(
        conn: Conn,
        neg: Negotiated,
        o: &HostileOpts,
        sealable: bool,
    ) -> Result<Sess> {
        let region = o.setup.mem_mb << 20;
        let mem = Arc::new(GuestMem::with_sealing(
            region,
            2 * region,
            o.setup.gpa_base,
            sealable,
        )?);
        mem.fill_canary();
        let mut layouts = Vec::new();
        for _ in 0..2 {
            let off = mem.alloc(RingLayout::reserve(o.setup.ring_size)?, PAGE)?;
            layouts.push(RingLayout::new(o.setup.ring_size, off)?);
        }
        let mut spec = o.frame.clone();
        spec.size = spec.size.min(spec.mtu + frame::ETH_HLEN);
        let (h, f) = frame::build_frame(&spec)?;
        let mut buf = h.to_bytes().to_vec();
        buf.extend_from_slice(&f);
        let frame_off = mem.alloc(buf.len(), 64)?;
        mem.write(frame_off, &buf);
        let scratch = mem.alloc(SCRATCH, PAGE)?;
        Ok(Sess {
            conn,
            neg,
            mem,
            layouts: [layouts[0], layouts[1]],
            queues: [None, None],
            rings: [None, None],
            started: [false, false],
            frame_off,
            frame_len: buf.len(),
            scratch,
            opts: o.clone(),
        })
    }

    pub(super) fn num(&self) -> u16 {
        self.layouts[TX].num
    }

    pub(super) fn set_mem(&self) -> Result<(), ConnError> {
        device::set_mem_table(&self.conn, &self.mem)
    }

    /// (Re)initialises ring `i` properly (stopping it first if it was started).
    pub(super) fn setup(&mut self, i: usize, notes: &mut Vec<String>) -> Result<()> {
        if self.started[i] {
            match self.conn.get_vring_base(i as u32) {
                Ok(b) => notes.push(format!("GET_VRING_BASE({i}) = {b}")),
                Err(e) => notes.push(format!("GET_VRING_BASE({i}) failed: {e}")),
            }
            self.started[i] = false;
        }
        let q = device::setup_ring(&self.conn, &self.mem, i as u32, self.layouts[i])?;
        self.started[i] = true;
        if self.neg.protocol_features {
            device::enable_ring(&self.conn, i as u32, true)?;
        }
        self.rings[i] = Some(DriverRing::new(
            self.mem.clone(),
            self.layouts[i],
            self.neg.event_idx,
        ));
        self.queues[i] = Some(q);
        Ok(())
    }

    pub(super) fn bring_up(&mut self, notes: &mut Vec<String>) -> Result<()> {
        self.set_mem()?;
        self.setup(RX, notes)?;
        self.setup(TX, notes)?;
        self.sync()
    }

    /// Makes sure the backend has processed everything sent so far.
    pub(super) fn sync(&self) -> Result<()> {
        if !self.neg.reply_ack {
            self.conn.get_u64(req::GET_FEATURES)?;
        }
        Ok(())
    }

    pub(super) fn kick(&self, i: usize) {
        if let Some(q) = &self.queues[i] {
            let _ = q.kick.write(1);
        }
    }

    pub(super) fn ring(&mut self, i: usize) -> Result<&mut DriverRing> {
        self.rings[i].as_mut().context("ring not set up")
    }

    /// Pops every used entry of ring `i`.
    pub(super) fn collect_used(&mut self, i: usize) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        if let Some(r) = self.rings[i].as_mut() {
            while v.len() < 4 * r.num() as usize {
                match r.pop_used() {
                    Some(e) => v.push(e),
                    None => break,
                }
            }
        }
        v
    }

    /// Queues the valid frame (descriptor num-1) on the tx ring without kicking; returns the
    /// descriptor.
    pub(super) fn queue_valid_tx(&mut self) -> Result<u16> {
        let valid = self.num() - 1;
        let (off, len) = (self.frame_off, self.frame_len);
        let gpa = self.mem.gpa(off);
        let r = self.ring(TX)?;
        r.set_desc(valid, gpa, len as u32, 0, 0);
        r.push(valid);
        r.publish();
        Ok(valid)
    }

    /// Queues the valid frame on the tx ring, kicks, waits for it.
    pub(super) fn valid_tx(&mut self) -> Result<bool> {
        let valid = self.queue_valid_tx()?;
        self.kick(TX);
        let deadline = Instant::now() + self.opts.settle.max(Duration::from_millis(500));
        while Instant::now() < deadline {
            let r = self.ring(TX)?;
            while let Some((id, _)) = r.pop_used() {
                if id == valid as u32 {
                    return Ok(true);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(false)
    }

    /// GET_FEATURES: does the backend still answer?
    pub(super) fn probe(&mut self, rep: &mut CaseReport) {
        let saved = self.conn.timeout;
        self.conn.timeout = self.opts.probe_timeout;
        let deadline = Instant::now() + self.opts.probe_timeout;
        let c = &self.conn;
        let r = c
            .send_message(req::GET_FEATURES, proto::FLAG_VERSION_1, &[], &[])
            .and_then(|_| loop {
                // Skip stray replies (e.g. acks of garbage) until ours or the deadline.
                match c.recv_reply(req::GET_FEATURES) {
                    Ok(_) => return Ok(()),
                    Err(ConnError::Protocol(p)) => {
                        rep.notes.push(format!("probe: {p}"));
                        if Instant::now() >= deadline {
                            return Err(ConnError::Timeout);
                        }
                    }
                    Err(e) => return Err(e),
                }
            });
        self.conn.timeout = saved;
        match r {
            Ok(()) => {
                rep.answers_after = Some(true);
                rep.probe = Some("answered".into());
            }
            Err(ConnError::Closed) => {
                rep.answers_after = Some(false);
                rep.connection_closed = true;
                rep.probe = Some("closed".into());
            }
            Err(ConnError::Timeout) => {
                rep.answers_after = Some(false);
                rep.probe = Some("timeout".into());
            }
            Err(e) => {
                rep.answers_after = Some(false);
                rep.probe = Some(format!("error: {e}"));
            }
        }
    }
}
