//! `isolation`: does anything reach this guest's memory that is not for it?
//!
//! The frontend posts receive buffers and, while a test sends traffic (frames for this guest
//! interleaved with frames that are not: another VNI, another guest's MAC), scans for a marker
//! that only the foreign frames carry: every buffer the backend returns, as it returns it, and
//! every receive buffer (posted or not) every few milliseconds and at the end. A backend that
//! lets one run of the marker into this guest's memory is caught. The frames for this guest are
//! checked too (see [`own_frame_ok`]). With `scribble`, a thread keeps rewriting the start of
//! every receive buffer while frames arrive, as a hostile guest would to change a frame bound
//! for another guest between the backend's receive and its read-back; what the other guest
//! receives is checked by the test that sends the traffic.

use crate::device::Device;
use crate::frame::{VirtioNetHdr, ETH_HLEN, VNET_HDR_LEN};
use crate::mem::GuestMem;
use crate::ring::DESC_F_WRITE;
use anyhow::{bail, Result};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ethertype of the test's frames for this guest (IEEE local experimental).
pub const OWN_ETHERTYPE: u16 = 0x88b5;
const BUF_LEN: usize = 4096;
/// Bytes at the start of each buffer the scribbler rewrites: the virtio-net header and the
/// frame's first bytes (its MACs and headers, what a backend decides on).
const SCRIBBLE_LEN: usize = 128;
const SCRIBBLE: &[u8; 8] = b"SCRIBBLE";
const SCAN_EVERY: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
pub struct IsolationOpts {
    /// The bytes only foreign frames carry (at least 8).
    pub marker: Vec<u8>,
    pub scribble: bool,
    /// Longest run.
    pub duration: Duration,
    /// Ends the run when no frame came for this long after the first one.
    pub idle: Duration,
}

/// Where the marker was seen.
#[derive(Debug, Clone, Serialize)]
pub struct Hit {
    pub buffer: usize,
    pub offset: usize,
    /// "returned": in a buffer the backend had just returned; "scan": in a receive buffer.
    pub when: &'static str,
}

#[derive(Debug, Default, Serialize)]
pub struct IsolationReport {
    pub buffers: usize,
    /// Frames the backend returned (with `scribble`: buffers, which our rewriting leaves
    /// unchecked).
    pub frames: u64,
    /// Frames for this guest that arrived whole / altered.
    pub own_ok: u64,
    pub own_bad: u64,
    /// Frames of another ethertype (not the test's).
    pub other: u64,
    pub marker_hits: u64,
    /// The first few.
    pub marker_where: Vec<Hit>,
    pub scans: u64,
    /// Passes of the scribbler over all buffers.
    pub scribbles: u64,
}

/// A frame for this guest as the test builds it: [dst, src, OWN_ETHERTYPE, seq (4 bytes, big
/// endian), byte i = (seq * 7 + i) mod 251]. Another ethertype is not the test's: `None`.
pub fn own_frame_ok(f: &[u8]) -> Option<bool> {
    if f.len() < ETH_HLEN || u16::from_be_bytes([f[12], f[13]]) != OWN_ETHERTYPE {
        return None;
    }
    let p = &f[ETH_HLEN..];
    if p.len() < 4 {
        return Some(false);
    }
    let seq = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) as u64;
    Some(
        p[4..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b as u64 == (seq * 7 + i as u64) % 251),
    )
}

/// Offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

struct Scan<'a> {
    mem: &'a GuestMem,
    bufs: &'a [usize],
    marker: &'a [u8],
    scratch: Vec<u8>,
}

impl Scan<'_> {
    fn buffer(&mut self, i: usize, when: &'static str, rep: &mut IsolationReport) {
        self.mem.read(self.bufs[i], &mut self.scratch);
        if let Some(offset) = find(&self.scratch, self.marker) {
            rep.marker_hits += 1;
            if rep.marker_where.len() < 8 {
                rep.marker_where.push(Hit {
                    buffer: i,
                    offset,
                    when,
                });
            }
        }
    }

    fn all(&mut self, rep: &mut IsolationReport) {
        for i in 0..self.bufs.len() {
            self.buffer(i, "scan", rep);
        }
        rep.scans += 1;
    }
}

/// Rewrites the start of every buffer until `stop`, counting the passes.
fn scribble(mem: &GuestMem, bufs: &[usize], stop: &AtomicBool, passes: &AtomicU64) {
    let mut junk = [0u8; SCRIBBLE_LEN];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = SCRIBBLE[i % SCRIBBLE.len()];
    }
    while !stop.load(Ordering::Relaxed) {
        for &off in bufs {
            mem.write(off, &junk);
        }
        passes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs on a device that is up (ring 0 receives).
pub fn run(dev: &Device, o: &IsolationOpts) -> Result<IsolationReport> {
    if o.marker.len() < 8 {
        bail!("the marker must have at least 8 bytes");
    }
    let q = &dev.queues[0];
    let mut ring = dev.driver_ring(0);
    let mem: Arc<GuestMem> = ring.mem.clone();
    let num = ring.num();
    let mut bufs = Vec::with_capacity(num as usize);
    for i in 0..num {
        let off = mem.alloc(BUF_LEN, 64)?;
        mem.fill(off, BUF_LEN, 0);
        bufs.push(off);
        ring.set_desc(i, mem.gpa(off), BUF_LEN as u32, DESC_F_WRITE, 0);
        ring.push(i);
    }
    ring.arm_call(0);
    ring.publish();
    q.kick.write(1)?;
    let mut rep = IsolationReport {
        buffers: bufs.len(),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let mut scan = Scan {
        mem: &mem,
        bufs: &bufs,
        marker: &o.marker,
        scratch: vec![0u8; BUF_LEN],
    };
    let r = std::thread::scope(|s| -> Result<()> {
        if o.scribble {
            let (m, b, st, p) = (&*mem, &bufs[..], &stop, &passes);
            s.spawn(move || scribble(m, b, st, p));
        }
        let r = receive(dev, &mut ring, &mut scan, o, &mut rep);
        stop.store(true, Ordering::Relaxed);
        r
    });
    rep.scribbles = passes.load(Ordering::Relaxed);
    scan.all(&mut rep);
    r.map(|_| rep)
}

fn receive(
    dev: &Device,
    ring: &mut crate::ring::DriverRing,
    scan: &mut Scan<'_>,
    o: &IsolationOpts,
    rep: &mut IsolationReport,
) -> Result<()> {
    let q = &dev.queues[0];
    let mem = scan.mem;
    let num = ring.num() as u32;
    let started = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = started;
    let mut last_scan = started;
    let mut hdr = [0u8; VNET_HDR_LEN];
    let mut frame = vec![0u8; BUF_LEN];
    // The rest of a frame spread over several buffers (mergeable buffers): skipped.
    let mut more: u16 = 0;
    loop {
        let mut got = 0;
        while let Some((id, len)) = ring.pop_used() {
            got += 1;
            if id >= num {
                bail!("backend returned used id {id} (ring size {num}) - not one we gave it");
            }
            let i = id as usize;
            scan.buffer(i, "returned", rep);
            let len = (len as usize).min(BUF_LEN);
            if o.scribble {
                // Our own rewriting makes the buffer's bytes meaningless: count it only.
                rep.frames += 1;
            } else if more > 0 {
                more -= 1;
            } else if len >= VNET_HDR_LEN {
                rep.frames += 1;
                mem.read(scan.bufs[i], &mut hdr);
                let h = VirtioNetHdr::from_bytes(&hdr);
                more = h.num_buffers.max(1) - 1;
                let f = &mut frame[..len - VNET_HDR_LEN];
                mem.read(scan.bufs[i] + VNET_HDR_LEN, f);
                match own_frame_ok(f) {
                    Some(true) if more == 0 => rep.own_ok += 1,
                    Some(_) => rep.own_bad += 1,
                    None => rep.other += 1,
                }
            }
            ring.push(id as u16);
        }
        let now = Instant::now();
        if got > 0 {
            first.get_or_insert(now);
            last = now;
            if ring.publish() {
                q.kick.write(1)?;
            }
        }
        if now.duration_since(last_scan) >= SCAN_EVERY {
            scan.all(rep);
            last_scan = now;
        }
        if now.duration_since(started) >= o.duration
            || (first.is_some() && now.duration_since(last) >= o.idle)
        {
            return Ok(());
        }
        if dev.conn.peer_closed() {
            bail!("backend closed the connection");
        }
        if got > 0 || ring.arm_call(0) {
            continue;
        }
        crate::conn::poll_readable(q.call.as_raw_fd(), Duration::from_millis(5))?;
        let _ = q.call.read();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(seq: u32, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HLEN];
        f[12..14].copy_from_slice(&OWN_ETHERTYPE.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        for i in 0..len {
            f.push(((seq as u64 * 7 + i as u64) % 251) as u8);
        }
        f
    }

    #[test]
    fn own_frames_are_checked_byte_for_byte() {
        let f = own(12345, 300);
        assert_eq!(own_frame_ok(&f), Some(true));
        let mut bad = f.clone();
        bad[100] ^= 1;
        assert_eq!(own_frame_ok(&bad), Some(false));
        let mut arp = f;
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(own_frame_ok(&arp), None);
    }

    #[test]
    fn the_marker_is_found_anywhere_and_not_in_own_frames() {
        let m = b"XFOREIGN-FRAME-X";
        let mut hay = vec![0u8; 4096];
        assert_eq!(find(&hay, m), None);
        hay[4000..4016].copy_from_slice(m);
        assert_eq!(find(&hay, m), Some(4000));
        // The own frames' pattern never holds it.
        for seq in 0..300 {
            assert_eq!(find(&own(seq, 3000), m), None);
        }
    }
}
