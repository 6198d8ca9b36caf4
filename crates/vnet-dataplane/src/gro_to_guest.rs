//! Software GRO's last step: a run of segments a thread's [`Coalescer`](vnet_offload::Coalescer)
//! merged (or a single verified one) written to its guest NIC with a GSO virtio-net header
//! ([`emit`], used by `ports::nic` as it offers frames), and what is still held handed over at
//! the end of a receive batch ([`flush_coalescers`], called by the VXLAN reader before its
//! buffers are reused). Below ingress and the ports, so both reach it without a ring.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vnet_core::PortCounters;
use vnet_offload::{GroOutput, VirtioNetHdr};

use crate::counters::OffloadCounters;
use crate::forward::FwdCtx;
use crate::nic::GuestNic;
use crate::shared::{Shared, Snapshot};

/// Writes a coalesced (or single, verified) frame to a guest.
pub(crate) fn emit(
    offload: &OffloadCounters,
    nic: &dyn GuestNic,
    queue: usize,
    counters: &Arc<PortCounters>,
    g: GroOutput<'_>,
    bufs: &[Vec<u8>],
) {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + g.payloads.len());
    parts.push(g.headers);
    for p in g.payloads {
        let b = &bufs[p.buf as usize];
        parts.push(&b[p.start as usize..p.end as usize]);
    }
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut vhdr = g.vhdr;
    let mut patched = [0u8; 128];
    if total > nic.max_frame()
        && vhdr.gso_kind() == VirtioNetHdr::GSO_NONE
        && g.headers.len() <= patched.len()
    {
        // A single large segment (a kernel sender's unsegmented frame whose checksum it did
        // complete): the guest takes it only as a GSO frame.
        let h = &mut patched[..g.headers.len()];
        h.copy_from_slice(g.headers);
        let mss = (nic.max_frame() + 14)
            .saturating_sub(18 + g.headers.len())
            .max(536) as u16;
        if let Some(v) = vnet_offload::as_partial_gso(h, total, mss) {
            vhdr = v;
            parts[0] = &patched[..g.headers.len()];
        }
    }
    if g.payloads.len() > 1 {
        offload.gro_frames.fetch_add(1, Relaxed);
        offload
            .gro_merged
            .fetch_add(g.payloads.len() as u64, Relaxed);
    }
    if let Err(r) = nic.write(queue, &vhdr, &parts) {
        counters.count_drop(r);
    }
}

/// Hands every coalesced run this thread holds to its guest; call at the end of a receive
/// batch, before the buffers are reused.
pub fn flush_coalescers(shared: &Shared, snap: &Snapshot, ctx: &mut FwdCtx, bufs: &[Vec<u8>]) {
    let queue = ctx.queue;
    for (port, c) in ctx.coalescers.iter_mut() {
        if c.is_empty() {
            continue;
        }
        match snap
            .ports
            .get(port)
            .and_then(|e| e.port.as_nic().map(|n| (n, &e.counters)))
        {
            Some((nic, counters)) => {
                c.flush(&mut |g| emit(&shared.offload, nic, queue, counters, g, bufs));
            }
            None => c.flush(&mut |_| {}),
        }
    }
}
