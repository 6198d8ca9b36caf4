//! Hostile-frontend cases: negotiate normally, misbehave, and record what the backend did.
//!
//! Every variant runs on its own connection. Guest memory is a memfd twice the declared
//! region; the undeclared half holds a canary pattern and hostile descriptors/rings point into
//! it, so a backend that fails to bounds-check shows up as `canary_intact: false`. The
//! `mem_truncate` variants cut the memfd short under the backend (a backend that does not
//! survive the SIGBUS goes away); the memfd gets its size back before this side touches it.

use crate::conn::{Conn, ConnError};
use crate::device::{self, Endpoint, Negotiated, Queue, SetupOpts};
use crate::frame::{self, FrameSpec};
use crate::mem::{GuestMem, PAGE};
use crate::proto::{self, req, MemRegion};
use crate::ring::{DriverRing, RingLayout, DESC_F_NEXT, DESC_F_WRITE};
use anyhow::{Context, Result};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Case names for `--case` (each has several variants).
pub const CASES: &[&str] = &[
    "desc_out_of_memory",
    "desc_len_huge",
    "desc_loop",
    "desc_index_oob",
    "ring_size_bad",
    "ring_addr_outside",
    "mem_table_bad",
    "avail_idx_jump",
    "rx_desc_readonly",
    "rx_buf_tiny",
    "msg_garbage",
    "truncated",
    "mem_truncate",
];

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

/// What happened in one variant.
#[derive(Debug, Default, Serialize)]
pub struct CaseReport {
    pub case: String,
    pub variant: String,
    pub description: String,
    pub connected: bool,
    /// The normal part (negotiation / bring-up) failed.
    pub setup_error: Option<String>,
    /// Sending the misbehaviour failed (typically: the connection was already closed).
    pub send_error: Option<String>,
    /// Requests the backend explicitly rejected (REPLY_ACK status != 0).
    pub nacks: Vec<String>,
    pub connection_closed: bool,
    /// Did the backend answer GET_FEATURES after the misbehaviour?
    pub answers_after: Option<bool>,
    /// "answered", "closed", "timeout" or an error.
    pub probe: Option<String>,
    /// Used entries the backend produced on the hostile ring (and the first few lengths).
    pub used_entries: Option<usize>,
    pub used_lens: Vec<u32>,
    /// GET_VRING_BASE of the tx ring before re-initialising it.
    pub vring_base_after: Option<u32>,
    /// A valid frame queued behind the hostile ones was consumed (ring still processed).
    pub ring_continues: Option<bool>,
    /// After re-initialising the ring (or after a valid setup), a valid frame was consumed.
    pub works_after_reinit: Option<bool>,
    /// rx cases: hostile read-only buffers written / guard bytes around tiny buffers damaged.
    pub readonly_written: Option<bool>,
    pub guard_intact: Option<bool>,
    /// The undeclared half of the memfd still holds the canary.
    pub canary_intact: bool,
    pub canary_damage: Option<String>,
    /// truncated: the backend closed its side after our EOF.
    pub closed_after_eof: Option<bool>,
    /// mem_truncate: the memfd was cut short (false: refused, e.g. sealed by the backend).
    pub mem_cut: Option<bool>,
    /// survived | closed | hung | corrupted | connect_failed | setup_failed
    pub verdict: String,
    pub notes: Vec<String>,
}

impl CaseReport {
    /// Verdicts that mean the backend misbehaved (or could not be tested).
    pub fn is_failure(&self) -> bool {
        matches!(
            self.verdict.as_str(),
            "corrupted" | "hung" | "connect_failed" | "setup_failed"
        )
    }

    fn conn_err(&mut self, what: &str, e: ConnError) {
        match e {
            ConnError::Closed => self.connection_closed = true,
            ConnError::Nack { request, status } => self
                .nacks
                .push(format!("{what}: {} status {status:#x}", req::name(request))),
            other => {
                self.send_error.get_or_insert(format!("{what}: {other}"));
            }
        }
    }
}

const SCRATCH: usize = 256 * 1024;
const READONLY_BYTE: u8 = 0x5a;
const GUARD_BYTE: u8 = 0xc3;

/// A connection for one variant.
struct Sess {
    conn: Conn,
    neg: Negotiated,
    mem: Arc<GuestMem>,
    layouts: [RingLayout; 2],
    queues: [Option<Queue>; 2],
    rings: [Option<DriverRing>; 2],
    started: [bool; 2],
    /// [virtio hdr + valid frame]
    frame_off: usize,
    frame_len: usize,
    scratch: usize,
    opts: HostileOpts,
}

const RX: usize = 0;
const TX: usize = 1;

impl Sess {
    /// `sealable`: guest memory the backend can seal against shrinking.
    fn connect(
        ep: &Endpoint,
        o: &HostileOpts,
        sealable: bool,
    ) -> Result<Sess, (bool, anyhow::Error)> {
        let stream = ep.open(o.setup.timeout).map_err(|e| (false, e.into()))?;
        let mut conn = Conn::new(stream, o.setup.timeout);
        let neg = device::negotiate(&mut conn, &o.setup).map_err(|e| (true, e))?;
        Self::with_conn(conn, neg, o, sealable).map_err(|e| (true, e))
    }

    fn with_conn(conn: Conn, neg: Negotiated, o: &HostileOpts, sealable: bool) -> Result<Sess> {
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

    fn num(&self) -> u16 {
        self.layouts[TX].num
    }

    fn set_mem(&self) -> Result<(), ConnError> {
        device::set_mem_table(&self.conn, &self.mem)
    }

    /// (Re)initialises ring `i` properly (stopping it first if it was started).
    fn setup(&mut self, i: usize, notes: &mut Vec<String>) -> Result<()> {
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

    fn bring_up(&mut self, notes: &mut Vec<String>) -> Result<()> {
        self.set_mem()?;
        self.setup(RX, notes)?;
        self.setup(TX, notes)?;
        self.sync()
    }

    /// Makes sure the backend has processed everything sent so far.
    fn sync(&self) -> Result<()> {
        if !self.neg.reply_ack {
            self.conn.get_u64(req::GET_FEATURES)?;
        }
        Ok(())
    }

    fn kick(&self, i: usize) {
        if let Some(q) = &self.queues[i] {
            let _ = q.kick.write(1);
        }
    }

    fn ring(&mut self, i: usize) -> Result<&mut DriverRing> {
        self.rings[i].as_mut().context("ring not set up")
    }

    /// Pops every used entry of ring `i`.
    fn collect_used(&mut self, i: usize) -> Vec<(u32, u32)> {
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

    /// Queues the valid frame (descriptor num-1) on the tx ring, kicks, waits for it.
    fn valid_tx(&mut self) -> Result<bool> {
        let valid = self.num() - 1;
        let (off, len) = (self.frame_off, self.frame_len);
        let gpa = self.mem.gpa(off);
        let r = self.ring(TX)?;
        r.set_desc(valid, gpa, len as u32, 0, 0);
        r.push(valid);
        r.publish();
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
    fn probe(&mut self, rep: &mut CaseReport) {
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

/// How a variant finishes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Misbehaves before/while setting up: recovery is a full, valid bring-up.
    Setup,
    /// Misbehaves on running rings: check the ring continues, then re-initialise tx.
    Data,
    /// Raw messages that desynchronise the stream: finish by EOF.
    Stream,
    /// Cuts guest memory short on running rings: the memfd gets its size back (zeros), then
    /// as `Data`; the canary is gone with the cut, so it is not checked.
    Truncate,
}

type Body = fn(&mut Sess, &mut CaseReport) -> Result<()>;

struct Variant {
    case: &'static str,
    name: &'static str,
    what: &'static str,
    kind: Kind,
    /// Needs rx traffic during rx_wait.
    rx: bool,
    body: Body,
}

macro_rules! v {
    ($case:expr, $name:expr, $what:expr, $kind:expr, $rx:expr, $body:expr) => {
        Variant {
            case: $case,
            name: $name,
            what: $what,
            kind: $kind,
            rx: $rx,
            body: $body,
        }
    };
}

/// Puts a chain of hostile descriptors on ring `i` (head = first entry), publishes, kicks.
fn post(s: &mut Sess, i: usize, descs: &[(u16, u64, u32, u16, u16)], heads: &[u16]) -> Result<()> {
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

fn canary_gpa(s: &Sess) -> u64 {
    s.mem.gpa(s.mem.region_size()) + 0x1000
}

fn region_end_gpa(s: &Sess) -> u64 {
    s.mem.gpa(s.mem.region_size())
}

fn variants() -> Vec<Variant> {
    use Kind::*;
    vec![
        // --- descriptors pointing outside guest memory ---
        v!("desc_out_of_memory", "tx_beyond_region", "tx descriptor addr in the undeclared (canary) half of the memfd", Data, false, |s, _| {
            let a = canary_gpa(s);
            post(s, TX, &[(0, a, 1500, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "tx_straddling_end", "tx descriptor starting 64 bytes before the region end, 4096 long", Data, false, |s, _| {
            let a = region_end_gpa(s) - 64;
            post(s, TX, &[(0, a, 4096, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "tx_addr_wraps", "tx descriptor at 0xffff_ffff_ffff_f000 (addr+len overflows)", Data, false, |s, _| {
            post(s, TX, &[(0, 0xffff_ffff_ffff_f000, 0x2000, 0, 0)], &[0])
        }),
        v!("desc_out_of_memory", "rx_beyond_region", "writable rx descriptors in the canary half (needs rx traffic)", Data, true, |s, _| {
            let a = canary_gpa(s);
            let d: Vec<_> = (0..16u16).map(|i| (i, a + i as u64 * 4096, 4096, DESC_F_WRITE, 0)).collect();
            let h: Vec<u16> = (0..16).collect();
            post(s, RX, &d, &h)
        }),
        v!("desc_out_of_memory", "rx_straddling_end", "writable rx descriptor 64 bytes before the region end, 4096 long (needs rx traffic)", Data, true, |s, _| {
            let a = region_end_gpa(s) - 64;
            post(s, RX, &[(0, a, 4096, DESC_F_WRITE, 0)], &[0])
        }),
        // --- huge lengths ---
        v!("desc_len_huge", "tx_len_max", "tx descriptor of len 0xffffffff inside memory", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, u32::MAX, 0, 0)], &[0])
        }),
        v!("desc_len_huge", "tx_chain_len_overflow", "tx chain of two 0x80000000-byte descriptors (total overflows u32)", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 0x8000_0000, DESC_F_NEXT, 1), (1, a, 0x8000_0000, 0, 0)], &[0])
        }),
        v!("desc_len_huge", "rx_len_max", "writable rx descriptor of len 0xffffffff 4 KiB before the region end (needs rx traffic)", Data, true, |s, _| {
            let a = region_end_gpa(s) - 4096;
            post(s, RX, &[(0, a, u32::MAX, DESC_F_WRITE, 0)], &[0])
        }),
        // --- loops ---
        v!("desc_loop", "self_loop", "tx descriptor whose NEXT points to itself", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 0)], &[0])
        }),
        v!("desc_loop", "cycle", "tx chain 0 -> 1 -> 2 -> 0", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 1), (1, a, 64, DESC_F_NEXT, 2), (2, a, 64, DESC_F_NEXT, 0)], &[0])
        }),
        v!("desc_loop", "rx_cycle", "rx chain 0 -> 1 -> 0 of writable descriptors (needs rx traffic)", Data, true, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, RX, &[(0, a, 8, DESC_F_WRITE | DESC_F_NEXT, 1), (1, a + 64, 8, DESC_F_WRITE | DESC_F_NEXT, 0)], &[0])
        }),
        // --- indices out of range ---
        v!("desc_index_oob", "head_oob", "avail ring entry (head) = ring size + 5", Data, false, |s, _| {
            let n = s.num();
            post(s, TX, &[], &[n + 5])
        }),
        v!("desc_index_oob", "next_oob", "tx descriptor NEXT = ring size", Data, false, |s, _| {
            let (a, n) = (s.mem.gpa(s.scratch), s.num());
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, n)], &[0])
        }),
        v!("desc_index_oob", "next_max", "tx descriptor NEXT = 0xffff", Data, false, |s, _| {
            let a = s.mem.gpa(s.scratch);
            post(s, TX, &[(0, a, 64, DESC_F_NEXT, 0xffff)], &[0])
        }),
        // --- avail index jumps ---
        v!("avail_idx_jump", "jump_1000", "tx avail idx advanced by 1000 at once (ring of --ring-size)", Data, false, |s, _| {
            let r = s.ring(TX)?;
            let v = r.avail_idx.wrapping_add(1000);
            r.force_avail_idx(v);
            s.kick(TX);
            Ok(())
        }),
        v!("avail_idx_jump", "jump_0x8000", "tx avail idx advanced by 0x8000", Data, false, |s, _| {
            let r = s.ring(TX)?;
            let v = r.avail_idx.wrapping_add(0x8000);
            r.force_avail_idx(v);
            s.kick(TX);
            Ok(())
        }),
        // --- rx buffers the backend must not use as such ---
        v!("rx_desc_readonly", "readonly", "rx descriptors without the WRITE flag (needs rx traffic)", Data, true, |s, _| {
            let base = s.scratch;
            s.mem.fill(base, SCRATCH, READONLY_BYTE);
            let d: Vec<_> = (0..64u16).map(|i| (i, s.mem.gpa(base + i as usize * 4096), 4096, 0, 0)).collect();
            let h: Vec<u16> = (0..64).collect();
            post(s, RX, &d, &h)
        }),
        v!("rx_buf_tiny", "tiny", "rx buffers of 4 bytes (guard bytes after each; one at the region end) (needs rx traffic)", Data, true, |s, _| {
            let base = s.scratch;
            s.mem.fill(base, SCRATCH, GUARD_BYTE);
            let mut d: Vec<_> = (0..63u16).map(|i| (i, s.mem.gpa(base + i as usize * 64), 4, DESC_F_WRITE, 0)).collect();
            d.push((63, region_end_gpa(s) - 4, 4, DESC_F_WRITE, 0));
            let h: Vec<u16> = (0..64).collect();
            post(s, RX, &d, &h)
        }),
        // --- ring setup ---
        v!("ring_size_bad", "num_0", "SET_VRING_NUM 0 on the tx ring, then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 0)),
        v!("ring_size_bad", "num_3", "SET_VRING_NUM 3 (not a power of two), then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 3)),
        v!("ring_size_bad", "num_65536", "SET_VRING_NUM 65536 (above 32768), then start it and queue a frame", Setup, false, |s, rep| bad_ring_num(s, rep, 65536)),
        v!("ring_addr_outside", "desc_outside", "tx desc table in the canary half, then a kick", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let out = s.mem.uva(s.mem.region_size()) + 0x1000;
            bad_ring_addr(s, rep, out, s.mem.uva(l.used), s.mem.uva(l.avail), true)
        }),
        v!("ring_addr_outside", "used_outside", "tx used ring in the canary half, a valid frame queued", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let out = s.mem.uva(s.mem.region_size()) + 0x1000;
            bad_ring_addr(s, rep, s.mem.uva(l.desc), out, s.mem.uva(l.avail), true)
        }),
        v!("ring_addr_outside", "avail_unmapped", "tx avail ring at address 0x1000 (no region there)", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            bad_ring_addr(s, rep, s.mem.uva(l.desc), s.mem.uva(l.used), 0x1000, true)
        }),
        v!("ring_addr_outside", "desc_straddle", "tx desc table starting 64 bytes before the region end", Setup, false, |s, rep| {
            let l = s.layouts[TX];
            let d = s.mem.uva(s.mem.region_size()) - 64;
            bad_ring_addr(s, rep, d, s.mem.uva(l.used), s.mem.uva(l.avail), true)
        }),
        // --- memory tables ---
        v!("mem_table_bad", "size_zero", "one region of size 0", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.memory_size = 0;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "gpa_overflow", "region whose guest address + size overflows", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.guest_phys_addr = u64::MAX - 0xfff;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "uaddr_overflow", "region whose userspace address + size overflows", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.userspace_addr = u64::MAX - 0xfff;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "beyond_file", "mmap_offset + size beyond the memfd's size (a mapping that SIGBUSes), then rings in it", Setup, false, |s, rep| {
            let mut r = s.mem.region();
            r.mmap_offset = s.mem.len() as u64;
            bad_mem_table(s, rep, 1, &[r], 1)
        }),
        v!("mem_table_bad", "fd_count_short", "two regions declared, one fd", Setup, false, |s, rep| {
            let r = s.mem.region();
            let mut r2 = r;
            r2.guest_phys_addr += r.memory_size;
            r2.userspace_addr += r.memory_size;
            bad_mem_table(s, rep, 2, &[r, r2], 1)
        }),
        v!("mem_table_bad", "fd_count_extra", "one region, three fds", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 1, &[r], 3)
        }),
        v!("mem_table_bad", "no_fd", "one region, no fd", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 1, &[r], 0)
        }),
        v!("mem_table_bad", "nregions_huge", "region count 0xffff with one region of payload", Setup, false, |s, rep| {
            let r = s.mem.region();
            bad_mem_table(s, rep, 0xffff, &[r], 1)
        }),
        v!("mem_table_bad", "nregions_zero", "region count 0 (and no fd)", Setup, false, |s, rep| {
            bad_mem_table(s, rep, 0, &[], 0)
        }),
        // --- garbage messages (on a running device) ---
        v!("msg_garbage", "unknown_request", "request code 0x7fff0000 with an 8-byte payload", Data, false, |s, rep| {
            raw(s, rep, 0x7fff_0000, proto::FLAG_VERSION_1, &[0u8; 8], &[])
        }),
        v!("msg_garbage", "request_zero", "request code 0", Data, false, |s, rep| {
            raw(s, rep, 0, proto::FLAG_VERSION_1, &[], &[])
        }),
        v!("msg_garbage", "size_over_max", "SET_FEATURES with a complete 4097-byte payload (over the 4096 limit)", Data, false, |s, rep| {
            raw(s, rep, req::SET_FEATURES, proto::FLAG_VERSION_1, &[0u8; 4097], &[])
        }),
        v!("msg_garbage", "bad_version", "GET_FEATURES with protocol version 2 in the flags", Data, false, |s, rep| {
            raw(s, rep, req::GET_FEATURES, 0x2, &[], &[])
        }),
        v!("msg_garbage", "reply_flag", "SET_VRING_NUM carrying the REPLY flag", Data, false, |s, rep| {
            let n = s.num() as u32;
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1 | proto::FLAG_REPLY, &proto::vring_state(0, n), &[])
        }),
        v!("msg_garbage", "short_payload", "SET_VRING_NUM with a 4-byte payload (needs 8)", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1, &[0u8; 4], &[])
        }),
        v!("msg_garbage", "long_payload", "SET_VRING_BASE with a 16-byte payload", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_BASE, proto::FLAG_VERSION_1, &[0u8; 16], &[])
        }),
        v!("msg_garbage", "vring_index_oob", "SET_VRING_NUM/ENABLE/KICK for ring indices 200 and 255", Data, false, |s, rep| {
            let fd = s.queues[TX].as_ref().map(|q| q.kick.as_raw_fd());
            raw(s, rep, req::SET_VRING_NUM, proto::FLAG_VERSION_1, &proto::vring_state(200, 256), &[])?;
            raw(s, rep, req::SET_VRING_ENABLE, proto::FLAG_VERSION_1, &proto::vring_state(200, 1), &[])?;
            match fd {
                Some(fd) => raw(s, rep, req::SET_VRING_KICK, proto::FLAG_VERSION_1, &proto::u64_payload(255), &[fd]),
                None => Ok(()),
            }
        }),
        v!("msg_garbage", "unexpected_fds", "GET_FEATURES with three fds attached", Data, false, |s, rep| {
            let fd = s.mem.fd();
            raw(s, rep, req::GET_FEATURES, proto::FLAG_VERSION_1, &[], &[fd, fd, fd])?;
            // Our GET_FEATURES gets a reply: consume it so the probe is not confused.
            if let Err(e) = s.conn.recv_reply(req::GET_FEATURES) {
                rep.notes.push(format!("no reply to GET_FEATURES with fds: {e}"));
            }
            Ok(())
        }),
        v!("msg_garbage", "too_many_fds", "SET_VRING_CALL with 40 fds attached (more than backends accept)", Data, false, |s, rep| {
            let fd = s.queues[TX].as_ref().map_or(s.mem.fd(), |q| q.call.as_raw_fd());
            let fds = vec![fd; 40];
            raw(s, rep, req::SET_VRING_CALL, proto::FLAG_VERSION_1, &proto::u64_payload(1), &fds)
        }),
        v!("msg_garbage", "noreply_ack_flag", "SET_VRING_ENABLE ring 1 with NEED_REPLY although REPLY_ACK may not be negotiated", Data, false, |s, rep| {
            raw(s, rep, req::SET_VRING_ENABLE, proto::FLAG_VERSION_1 | proto::FLAG_NEED_REPLY, &proto::vring_state(1, 1), &[])?;
            if let Ok(p) = s.conn.recv_reply(req::SET_VRING_ENABLE) {
                rep.notes.push(format!("backend acked with {} bytes", p.len()));
            }
            Ok(())
        }),
        // --- truncated messages: the backend must handle EOF mid-message ---
        v!("truncated", "header_partial", "6 bytes of a header, then EOF", Stream, false, |s, rep| {
            let h = proto::header(req::GET_FEATURES, proto::FLAG_VERSION_1, 0);
            send_bytes(s, rep, &h[..6])
        }),
        v!("truncated", "payload_missing", "SET_VRING_ADDR header (size 40) without payload, then EOF", Stream, false, |s, rep| {
            let h = proto::header(req::SET_VRING_ADDR, proto::FLAG_VERSION_1, 40);
            send_bytes(s, rep, &h)
        }),
        v!("truncated", "payload_partial", "SET_MEM_TABLE header (size 40) with 20 payload bytes and the fd, then EOF", Stream, false, |s, rep| {
            let mut b = proto::header(req::SET_MEM_TABLE, proto::FLAG_VERSION_1, 40).to_vec();
            b.extend_from_slice(&proto::mem_table(1, &[s.mem.region()])[..20]);
            if let Err(e) = s.conn.send_raw(&b, &[s.mem.fd()]) {
                rep.conn_err("send", e);
            }
            Ok(())
        }),
        v!("truncated", "size_huge", "SET_VRING_NUM header claiming a 256 MiB payload, 64 bytes sent, then EOF", Stream, false, |s, rep| {
            let mut b = proto::header(req::SET_VRING_NUM, proto::FLAG_VERSION_1, 0x1000_0000).to_vec();
            b.extend_from_slice(&[0xee; 64]);
            send_bytes(s, rep, &b)
        }),
        // --- guest memory cut short under the backend (SIGBUS when it touches it) ---
        v!("mem_truncate", "tx_kick", "memfd (not sealable) cut to 0 bytes on running rings, then a queued tx frame kicked", Truncate, false, |s, rep| {
            queue_valid_tx(s)?;
            cut(s, rep);
            for _ in 0..3 {
                s.kick(TX);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }),
        v!("mem_truncate", "rx_traffic", "memfd (not sealable) cut to 0 bytes while rx buffers are posted and traffic arrives (needs rx traffic)", Truncate, true, |s, rep| {
            let a = s.mem.gpa(s.scratch);
            let d: Vec<_> = (0..16u16).map(|i| (i, a + i as u64 * 4096, 4096, DESC_F_WRITE, 0)).collect();
            let h: Vec<u16> = (0..16).collect();
            post(s, RX, &d, &h)?;
            std::thread::sleep(s.opts.rx_wait / 4);
            cut(s, rep);
            s.kick(RX);
            Ok(())
        }),
        v!("mem_truncate", "sealed_memfd", "memfd made sealable: the backend seals it against shrinking, so the cut must be refused", Truncate, false, |s, rep| {
            queue_valid_tx(s)?;
            cut(s, rep);
            s.kick(TX);
            Ok(())
        }),
    ]
}

/// Cuts the memfd to 0 bytes (`mem_cut` says whether the kernel allowed it).
fn cut(s: &Sess, rep: &mut CaseReport) {
    match s.mem.set_file_size(0) {
        Ok(()) => rep.mem_cut = Some(true),
        Err(e) => {
            rep.mem_cut = Some(false);
            rep.notes.push(format!("ftruncate refused: {e}"));
        }
    }
}

/// Queues the valid frame (descriptor num-1) on the tx ring without kicking.
fn queue_valid_tx(s: &mut Sess) -> Result<()> {
    let valid = s.num() - 1;
    let (off, len) = (s.frame_off, s.frame_len);
    let gpa = s.mem.gpa(off);
    let r = s.ring(TX)?;
    r.set_desc(valid, gpa, len as u32, 0, 0);
    r.push(valid);
    r.publish();
    Ok(())
}

fn send_bytes(s: &mut Sess, rep: &mut CaseReport, b: &[u8]) -> Result<()> {
    if let Err(e) = s.conn.send_raw(b, &[]) {
        rep.conn_err("send", e);
    }
    Ok(())
}

/// Sends one raw message; a closed connection is recorded, not an error.
fn raw(
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
fn try_req(s: &Sess, rep: &mut CaseReport, code: u32, payload: &[u8], fds: &[i32]) -> bool {
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
fn start_tx(s: &mut Sess, rep: &mut CaseReport, num: u32, addrs: (u64, u64, u64), frame: bool) {
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

fn device_eventfds() -> std::io::Result<(
    vmm_sys_util::eventfd::EventFd,
    vmm_sys_util::eventfd::EventFd,
)> {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    Ok((EventFd::new(EFD_NONBLOCK)?, EventFd::new(EFD_NONBLOCK)?))
}

fn bad_ring_num(s: &mut Sess, rep: &mut CaseReport, num: u32) -> Result<()> {
    if !try_req(
        s,
        rep,
        req::SET_MEM_TABLE,
        &proto::mem_table(1, &[s.mem.region()]),
        &[s.mem.fd()],
    ) {
        return Ok(());
    }
    let l = s.layouts[TX];
    let addrs = (s.mem.uva(l.desc), s.mem.uva(l.used), s.mem.uva(l.avail));
    start_tx(s, rep, num, addrs, true);
    Ok(())
}

fn bad_ring_addr(
    s: &mut Sess,
    rep: &mut CaseReport,
    desc: u64,
    used: u64,
    avail: u64,
    frame: bool,
) -> Result<()> {
    if !try_req(
        s,
        rep,
        req::SET_MEM_TABLE,
        &proto::mem_table(1, &[s.mem.region()]),
        &[s.mem.fd()],
    ) {
        return Ok(());
    }
    let n = s.num() as u32;
    start_tx(s, rep, n, (desc, used, avail), frame);
    Ok(())
}

fn bad_mem_table(
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
        let l = s.layouts[TX];
        let addrs = (s.mem.uva(l.desc), s.mem.uva(l.used), s.mem.uva(l.avail));
        start_tx(s, rep, s.num() as u32, addrs, true);
    }
    Ok(())
}

fn run_variant(ep: &Endpoint, o: &HostileOpts, v: &Variant) -> CaseReport {
    let mut rep = CaseReport {
        case: v.case.into(),
        variant: v.name.into(),
        description: v.what.into(),
        canary_intact: true,
        ..Default::default()
    };
    let mut s = match Sess::connect(ep, o, v.name == "sealed_memfd") {
        Ok(s) => s,
        Err((connected, e)) => {
            rep.connected = connected;
            rep.verdict = if connected {
                "setup_failed"
            } else {
                "connect_failed"
            }
            .into();
            rep.setup_error = Some(format!("{e:#}"));
            return rep;
        }
    };
    rep.connected = true;
    if v.kind != Kind::Setup {
        let mut notes = Vec::new();
        // (Truncate too: the cut comes on running rings.)
        if let Err(e) = s.bring_up(&mut notes) {
            rep.verdict = "setup_failed".into();
            rep.setup_error = Some(format!("{e:#}"));
            return rep;
        }
        rep.notes.extend(notes);
    }
    if let Err(e) = (v.body)(&mut s, &mut rep) {
        rep.notes.push(format!("internal: {e:#}"));
    }
    match v.kind {
        Kind::Stream => finish_stream(&mut s, &mut rep),
        Kind::Data => {
            std::thread::sleep(if v.rx { o.rx_wait } else { o.settle });
            let ring = if v.rx { RX } else { TX };
            let used = s.collect_used(ring);
            rep.used_entries = Some(used.len());
            rep.used_lens = used.iter().take(8).map(|e| e.1).collect();
            if v.rx && used.is_empty() {
                rep.notes.push(
                    "no rx used entries: either the backend refused the buffers or no traffic arrived during --rx-wait".into(),
                );
            }
            finish_live(&mut s, &mut rep, true);
        }
        Kind::Setup => {
            std::thread::sleep(o.settle);
            finish_live(&mut s, &mut rep, false);
        }
        Kind::Truncate => {
            std::thread::sleep(if v.rx { o.rx_wait } else { o.settle });
            if let Err(e) = s.mem.set_file_size(s.mem.len()) {
                // Touching the memory now would be SIGBUS here: report and stop.
                rep.notes.push(format!("memfd size not restored: {e}"));
                rep.verdict = "setup_failed".into();
                return rep;
            }
            finish_live(&mut s, &mut rep, true);
        }
    }
    // Buffer checks for the rx cases.
    if v.case == "rx_desc_readonly" {
        let mut b = vec![0u8; 64 * 4096];
        s.mem.read(s.scratch, &mut b);
        rep.readonly_written = Some(b.iter().any(|&x| x != READONLY_BYTE));
    }
    if v.case == "rx_buf_tiny" {
        let mut b = vec![0u8; 63 * 64];
        s.mem.read(s.scratch, &mut b);
        let ok = b
            .chunks(64)
            .all(|c| c[4..].iter().all(|&x| x == GUARD_BYTE));
        rep.guard_intact = Some(ok);
    }
    if rep.mem_cut == Some(true) {
        rep.notes
            .push("canary not checked: the memfd was cut short (its bytes are zeros now)".into());
    } else {
        check_canary(&s, &mut rep);
    }
    rep.verdict = verdict(&rep);
    rep
}

fn check_canary(s: &Sess, rep: &mut CaseReport) {
    if let Some((a, b)) = s.mem.canary_damage() {
        rep.canary_intact = false;
        rep.canary_damage = Some(format!(
            "memfd offsets {a:#x}..={b:#x} (region size {:#x})",
            s.mem.region_size()
        ));
    }
}

/// After a misbehaviour on a live connection: probe, then see whether the device still works.
fn finish_live(s: &mut Sess, rep: &mut CaseReport, data: bool) {
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
fn finish_stream(s: &mut Sess, rep: &mut CaseReport) {
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

fn verdict(r: &CaseReport) -> String {
    if !r.canary_intact || r.readonly_written == Some(true) || r.guard_intact == Some(false) {
        "corrupted"
    } else if r.closed_after_eof == Some(false) {
        "hung"
    } else if r.connection_closed {
        "closed"
    } else if r.probe.as_deref() == Some("timeout") {
        "hung"
    } else {
        "survived"
    }
    .into()
}

/// Runs `case` ("all" for every case); returns one report per variant.
pub fn run(
    ep: &Endpoint,
    o: &HostileOpts,
    case: &str,
    mut progress: impl FnMut(&CaseReport),
) -> Result<Vec<CaseReport>> {
    let all = variants();
    let chosen: Vec<&Variant> = if case == "all" {
        all.iter().collect()
    } else {
        let (c, v) = case.split_once('/').unwrap_or((case, ""));
        let list: Vec<&Variant> = all
            .iter()
            .filter(|x| x.case == c && (v.is_empty() || x.name == v))
            .collect();
        if list.is_empty() {
            anyhow::bail!("unknown case {case:?}; cases: all, {}", CASES.join(", "));
        }
        list
    };
    let mut out = Vec::new();
    for v in chosen {
        let rep = run_variant(ep, o, v);
        progress(&rep);
        out.push(rep);
        // Let the backend notice the closed connection before the next one.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(out)
}

/// "case/variant" names, for --list.
pub fn variant_names() -> Vec<String> {
    variants()
        .iter()
        .map(|v| format!("{}/{}: {}", v.case, v.name, v.what))
        .collect()
}
