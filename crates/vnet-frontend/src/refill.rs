//! `refill`: a guest that offers too few receive buffers for the frames coming to it, then adds
//! more the way a Linux guest does: with EVENT_IDX it kicks the receive queue only when the
//! backend's `avail_event` asks for it (virtio's `vring_need_event`).
//!
//! The backend, out of buffers for a frame, keeps it and must say in `avail_event` that it
//! wants to hear of the next buffer. A backend that publishes an index the guest has passed
//! already (the first buffer it has not used, behind the few the guest offered) never hears of
//! the new buffers, and the frames waiting for them never arrive once traffic stops. The test
//! around this mode sends a short burst of frames larger than the first buffers while the
//! frontend waits, then checks that they arrive after the refill.

use crate::device::Device;
use crate::frame::{VirtioNetHdr, VNET_HDR_LEN};
use crate::ring::DESC_F_WRITE;
use anyhow::{bail, Result};
use serde::Serialize;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct RefillOpts {
    /// Receive buffers offered first.
    pub first: u16,
    /// Receive buffers added after `wait`.
    pub then: u16,
    /// Bytes per buffer (at least the virtio-net header).
    pub buffer_len: u32,
    /// How long the first buffers stay alone (the test sends its frames meanwhile).
    pub wait: Duration,
    /// How long to wait for frames after the refill.
    pub timeout: Duration,
}

#[derive(Debug, Default, Serialize)]
pub struct RefillReport {
    pub first_buffers: u16,
    pub then_buffers: u16,
    pub buffer_len: u32,
    /// Buffers the backend returned before the refill (a frame small enough for the first
    /// buffers came; the test's frames are larger).
    pub used_before_refill: u64,
    /// The backend's `avail_event` when the refill was published, and the avail index before
    /// and after it.
    pub avail_event_at_refill: u16,
    pub avail_before_refill: u16,
    pub avail_after_refill: u16,
    /// Whether virtio's rule asked for a kick for the refill (then it was sent).
    pub kicked_on_refill: bool,
    /// Frames (first buffers of a merged frame) and their bytes, virtio-net header excluded,
    /// returned after the refill.
    pub frames: u64,
    pub bytes: u64,
    /// Milliseconds from the refill to the first frame.
    pub first_frame_ms: Option<f64>,
}

/// Runs on a device that is up (ring 0 receives).
pub fn run(dev: &Device, o: &RefillOpts) -> Result<RefillReport> {
    if (o.buffer_len as usize) < VNET_HDR_LEN {
        bail!("--buffer-len must hold the {VNET_HDR_LEN}-byte virtio-net header");
    }
    let q = &dev.queues[0];
    let mut ring = dev.driver_ring(0);
    let total = o.first as usize + o.then as usize;
    if total == 0 || total > ring.num() as usize {
        bail!(
            "--first + --then must be 1 to {} (the ring size)",
            ring.num()
        );
    }
    if !ring.event_idx {
        bail!("the backend did not negotiate EVENT_IDX: nothing to test");
    }
    let mem = ring.mem.clone();
    let mut bufs = Vec::with_capacity(total);
    for i in 0..total as u16 {
        let off = mem.alloc(o.buffer_len as usize, 64)?;
        mem.fill(off, o.buffer_len as usize, 0);
        bufs.push(off);
        ring.set_desc(i, mem.gpa(off), o.buffer_len, DESC_F_WRITE, 0);
    }
    let mut rep = RefillReport {
        first_buffers: o.first,
        then_buffers: o.then,
        buffer_len: o.buffer_len,
        ..Default::default()
    };
    for i in 0..o.first {
        ring.push(i);
    }
    ring.arm_call(0);
    if ring.publish() {
        q.kick.write(1)?;
    }
    let start = Instant::now();
    while start.elapsed() < o.wait {
        while ring.pop_used().is_some() {
            rep.used_before_refill += 1;
        }
        if dev.conn.peer_closed() {
            bail!("backend closed the connection");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    rep.avail_event_at_refill = mem
        .u16_at(ring.layout.avail_event_off())
        .load(Ordering::Acquire);
    rep.avail_before_refill = ring.avail_idx;
    for i in o.first..total as u16 {
        ring.push(i);
    }
    rep.kicked_on_refill = ring.publish();
    rep.avail_after_refill = ring.avail_idx;
    if rep.kicked_on_refill {
        q.kick.write(1)?;
    }
    let refilled = Instant::now();
    let mut hdr = [0u8; VNET_HDR_LEN];
    // Buffers still to come of a frame merged over several.
    let mut more: u16 = 0;
    while refilled.elapsed() < o.timeout {
        while let Some((id, len)) = ring.pop_used() {
            let Some(&off) = bufs.get(id as usize) else {
                bail!("backend returned used id {id}, not one we gave it");
            };
            let len = (len as usize).min(o.buffer_len as usize);
            if more > 0 {
                more -= 1;
                rep.bytes += len as u64;
                continue;
            }
            if len < VNET_HDR_LEN {
                bail!("backend returned a {len}-byte buffer, shorter than the virtio-net header");
            }
            mem.read(off, &mut hdr);
            more = VirtioNetHdr::from_bytes(&hdr).num_buffers.max(1) - 1;
            rep.frames += 1;
            rep.bytes += (len - VNET_HDR_LEN) as u64;
            rep.first_frame_ms
                .get_or_insert(refilled.elapsed().as_secs_f64() * 1e3);
        }
        if dev.conn.peer_closed() {
            bail!("backend closed the connection");
        }
        if ring.arm_call(0) {
            continue;
        }
        crate::conn::poll_readable(q.call.as_raw_fd(), Duration::from_millis(5))?;
        let _ = q.call.read();
    }
    Ok(rep)
}
