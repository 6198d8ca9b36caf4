//! How a NIC that is not read by the dispatchers (vhost-user, with its own thread) hands its
//! guest's frames to the overlay, and the vhost-user cut-through receive's way in: which UDP
//! links it reads itself ([`Ingress::cut_through_links`]), the one forwarding decision for
//! each frame it reads ([`Ingress::cut_through`], the same as every other ingress's: counters,
//! guard, learning, traffic matrix, route cache), and the ordinary path for what is not for
//! its guest alone ([`Ingress::forward_decided`], [`Ingress::forward_other_vni`]).
//!
//! ("Cut-through" names the vhost-user receive path here; a *direct link* is something else,
//! the raw-Ethernet link onto a host NIC, `ports::direct`.)
//!
//! A frame the guest transmitted may be handed over where it lies, in the guest's shared
//! memory ([`GuestFrame::Shared`]): the guest can rewrite those bytes at any moment, so vnet
//! never makes a Rust slice of them. Its first bytes are copied (the headers every check reads);
//! the rest goes to the kernel as an iovec (a udp link's datagram) or is copied by a port that
//! must read it. A frame whose offload header needs its bytes read (a checksum to complete,
//! a segment to cut) is copied whole first.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vm_memory::VolatileSlice;
use vnet_core::{DropReason, PortId, PortKind};
use vnet_offload::VirtioNetHdr;

use crate::batch::TxBatch;
use crate::forward::{process, transmit, Arrival, Egress, FwdCtx, Verdict};
use crate::port::Origin;
use crate::shared::Shared;

/// How many bytes of a frame in guest memory are copied for the checks: every header the
/// forwarding path reads (Ethernet, IP, TCP/UDP) fits.
pub const GUEST_HEAD: usize = 128;

/// A UDP link whose datagrams a vhost-user interface receives itself, by cut-through (see
/// [`Ingress::cut_through_links`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutThroughLink {
    pub port: PortId,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub vni: u32,
}

/// A frame a guest transmitted, as its NIC found it.
#[derive(Clone, Copy)]
pub enum GuestFrame<'a> {
    /// Gathered into memory of vnet's own.
    Copied(&'a [u8]),
    /// In one piece of the guest's shared memory (cut-through).
    Shared(VolatileSlice<'a>),
}

/// A guest's way into the overlay, for a NIC on its own thread.
#[derive(Clone)]
pub struct Ingress {
    pub(crate) shared: Arc<Shared>,
    pub(crate) port: PortId,
}

impl Ingress {
    /// Forwards frames (owned, with their virtio-net headers) as one batch. A partial checksum
    /// of an ordinary frame is completed in place first.
    pub fn forward(&self, ctx: &mut FwdCtx, frames: &mut [(VirtioNetHdr, Vec<u8>)]) {
        let snap = self.shared.snapshot.load_full();
        let mut ready: Vec<(VirtioNetHdr, GuestFrame<'_>)> = Vec::with_capacity(frames.len());
        for (vh, f) in frames.iter_mut() {
            if vh.gso_kind() == VirtioNetHdr::GSO_NONE && vh.needs_csum() {
                match vnet_offload::complete_checksum(f, vh) {
                    Ok(()) => vh.flags = VirtioNetHdr::F_DATA_VALID,
                    Err(_) => {
                        snap.count_rx_drop(self.port, f.len(), DropReason::BadOffload);
                        continue;
                    }
                }
            }
            ready.push((*vh, GuestFrame::Copied(&f[..])));
        }
        self.forward_guest(ctx, &ready);
    }

    /// Forwards frames the guest transmitted, as one batch; see the module header for frames
    /// in guest memory. Nothing here writes to them.
    pub fn forward_guest(&self, ctx: &mut FwdCtx, frames: &[(VirtioNetHdr, GuestFrame<'_>)]) {
        let snap = self.shared.snapshot.load_full();
        // Everything that must be read is copied before forwarding starts: the heads of
        // shared frames, and the whole of those whose offload header needs their bytes.
        let shared_count = frames
            .iter()
            .filter(|(_, f)| matches!(f, GuestFrame::Shared(_)))
            .count();
        let mut heads = vec![0u8; shared_count * GUEST_HEAD];
        let mut owned: Vec<Vec<u8>> = Vec::new();
        let mut plan: Vec<Planned> = Vec::with_capacity(frames.len());
        let mut k = 0;
        for (vh, f) in frames {
            plan.push(match f {
                GuestFrame::Copied(_) => Planned::Copied,
                GuestFrame::Shared(s) if needs_bytes(vh) => {
                    let mut v = vec![0u8; s.len()];
                    s.copy_to(&mut v[..]);
                    owned.push(v);
                    Planned::Owned(owned.len() - 1)
                }
                GuestFrame::Shared(s) => {
                    let n = s.len().min(GUEST_HEAD);
                    s.copy_to(&mut heads[k * GUEST_HEAD..k * GUEST_HEAD + n]);
                    k += 1;
                    Planned::Head(k - 1, n)
                }
            });
        }
        let mut batch = TxBatch::default();
        for ((vh, f), p) in frames.iter().zip(&plan) {
            let a = match (f, p) {
                (GuestFrame::Copied(b), _) => Arrival::local(*vh, b),
                (_, Planned::Owned(j)) => Arrival::local(*vh, &owned[*j]),
                (GuestFrame::Shared(s), Planned::Head(h, n)) => Arrival {
                    vh: *vh,
                    head: &heads[h * GUEST_HEAD..h * GUEST_HEAD + n],
                    tail: (s.len() > *n).then(|| s.offset(*n).ok()).flatten(),
                    origin: Origin::Local,
                },
                _ => continue,
            };
            if !a.is_empty() {
                process(&self.shared, &snap, ctx, self.port, a, &mut batch);
            }
        }
        batch.flush(&self.shared.offload, &self.shared.daemon, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
    }

    /// The snapshot generation: it changes whenever ports or routes do.
    pub fn generation(&self) -> u64 {
        self.shared.snapshot.load().table.generation()
    }

    /// The UDP links this interface may receive from itself (vhost-user cut-through): those
    /// of its VNI, when it is the only interface in that VNI and learning is off, so that
    /// every frame from such a link is either for it or not for this host at all.
    pub fn cut_through_links(&self) -> Vec<CutThroughLink> {
        let snap = self.shared.snapshot.load();
        if self.shared.learning.load(Relaxed) {
            return vec![];
        }
        let Some(me) = snap.ports.get(&self.port) else {
            return vec![];
        };
        let vni = me.info.vni;
        let others = snap.ports.iter().any(|(id, p)| {
            *id != self.port && p.info.vni == vni && p.info.kind != PortKind::OverlayLink
        });
        if others {
            return vec![];
        }
        let local = snap.udp.local_addr();
        // Encrypted links never take the cut-through path (it reads plaintext VXLAN only),
        // nor does any link to a peer address an encrypted link shares: the
        // connected socket would take that link's datagrams too.
        let encrypted_peers: Vec<Option<SocketAddr>> = snap
            .ports
            .values()
            .filter_map(|p| p.port.as_udp())
            .filter(|l| l.crypto.is_some())
            .map(|l| l.fixed_peer)
            .collect();
        snap.ports
            .iter()
            .filter(|(_, p)| p.info.vni == vni)
            .filter_map(|(id, p)| {
                let l = p.port.as_udp()?;
                // A reach link has no fixed peer: its path moves (and may be a relay).
                if l.crypto.is_some() || encrypted_peers.contains(&l.fixed_peer) {
                    return None;
                }
                l.fixed_peer.map(|peer| CutThroughLink {
                    port: *id,
                    peer,
                    local,
                    vni,
                })
            })
            .collect()
    }

    /// The forwarding decision for a frame that arrived on `link` at this interface's
    /// cut-through receive: the one every ingress gets (counted on the link, checked by its
    /// guard, learned, recorded in the traffic matrix, the thread's route cache asked). When
    /// it sends the frame to this interface alone and the frame `fits` the guest's receive
    /// buffers, the frame is counted as sent to this interface and the caller writes it there
    /// ([`CutThrough::Guest`]); otherwise its verdict is kept in `later` under `key`, for
    /// [`Self::forward_decided`] to hand it on once the caller's receive ring is released.
    pub fn cut_through(
        &self,
        ctx: &mut FwdCtx,
        link: PortId,
        frame: &[u8],
        fits: bool,
        key: usize,
        later: &mut DecidedFrames,
    ) -> CutThrough {
        let snap = self.shared.snapshot.load();
        let a = Arrival::local(VirtioNetHdr::default(), frame);
        let Some(v) = ctx.decider.decide(&self.shared, &snap, link, &a) else {
            return CutThrough::Dropped;
        };
        if fits && v.targets == [self.port] {
            if let Some(me) = snap.ports.get(&self.port) {
                me.counters.tx(frame.len());
            }
            return CutThrough::Guest;
        }
        later.push(key, &v);
        CutThrough::Elsewhere
    }

    /// Hands on the frames [`Self::cut_through`] decided on but left in `later`, each to the
    /// ports of its verdict (not decided again: already counted, checked and learned);
    /// `frame(key)` gives each one's bytes. Empties `later`.
    pub fn forward_decided<'f>(
        &self,
        ctx: &mut FwdCtx,
        later: &mut DecidedFrames,
        frame: impl Fn(usize) -> &'f [u8],
    ) {
        let snap = self.shared.snapshot.load_full();
        let mut batch = TxBatch::default();
        let mut out = Egress {
            seg: &mut ctx.seg,
            coalescers: &mut ctx.coalescers,
            scratch: &mut ctx.scratch,
            queue: ctx.queue,
        };
        for (key, macs, targets) in &later.frames {
            let v = Verdict {
                macs: *macs,
                targets: &later.targets[targets.start as usize..targets.end as usize],
            };
            let a = Arrival::local(VirtioNetHdr::default(), frame(*key));
            transmit(&self.shared, &snap, &mut out, self.port, v, a, &mut batch);
        }
        batch.flush(&self.shared.offload, &self.shared.daemon, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
        later.clear();
    }

    /// Frames that arrived on `link`, through the ordinary path (decided and transmitted).
    pub fn forward_from<F: AsRef<[u8]>>(&self, ctx: &mut FwdCtx, link: PortId, frames: &[F]) {
        let snap = self.shared.snapshot.load_full();
        let mut batch = TxBatch::default();
        for f in frames {
            process(
                &self.shared,
                &snap,
                ctx,
                link,
                Arrival::local(VirtioNetHdr::default(), f.as_ref()),
                &mut batch,
            );
        }
        batch.flush(&self.shared.offload, &self.shared.daemon, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
    }

    /// Frames (with their VNIs) from `peer` that arrived on the connected socket of one of
    /// its links (vhost-user cut-through) but carry another VNI: each goes on from the link
    /// of its VNI to that peer, as if the shared VXLAN socket had received it (`unknown_vni`
    /// when there is none).
    pub fn forward_other_vni(&self, ctx: &mut FwdCtx, peer: IpAddr, frames: &[(u32, &[u8])]) {
        let snap = self.shared.snapshot.load_full();
        let ip = peer.to_canonical();
        let mut batch = TxBatch::default();
        for &(vni, f) in frames {
            let Some(&port) = snap.udp_peers.get(&(ip, vni)) else {
                self.shared.daemon.count_drop(DropReason::UnknownVni);
                continue;
            };
            let encrypted = snap
                .ports
                .get(&port)
                .and_then(|p| p.port.as_udp())
                .is_some_and(|l| l.crypto.is_some());
            if encrypted {
                // Plaintext claiming to come from an encrypted link's peer: unauthenticated.
                snap.count_rx_drop(port, f.len(), DropReason::BadAuth);
                continue;
            }
            process(
                &self.shared,
                &snap,
                ctx,
                port,
                Arrival::local(VirtioNetHdr::default(), f),
                &mut batch,
            );
        }
        batch.flush(&self.shared.offload, &self.shared.daemon, &snap.udp);
        ctx.flush(&self.shared);
        snap.end_of_burst();
    }

    /// Counts a frame from the guest that never became a frame (a bad descriptor chain).
    pub fn count_drop(&self, reason: DropReason) {
        if let Some(c) = self.shared.port_counters(self.port) {
            c.rx(0);
            c.count_drop(reason);
        }
    }

    /// Counts a datagram received on `link` that was dropped before forwarding.
    pub fn count_link_drop(&self, link: PortId, len: usize, reason: DropReason) {
        if let Some(c) = self.shared.port_counters(link) {
            c.rx(len);
            c.count_drop(reason);
        }
    }
}

/// What [`Ingress::cut_through`] made of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutThrough {
    /// For this interface alone, and counted so: the caller writes it into the guest's
    /// receive buffers.
    Guest,
    /// Let in, bound elsewhere (or not only here, or too large for the guest's buffers): its
    /// verdict waits in the caller's [`DecidedFrames`].
    Elsewhere,
    /// Dropped by the decision, and counted on the link.
    Dropped,
}

/// Frames a cut-through receive decided on but hands on later (its receive ring held
/// meanwhile), with their verdicts: the caller's key for each frame, its checked MACs and
/// where its ports are in `targets`. Reused from batch to batch, so it stops allocating.
#[derive(Debug, Default)]
pub struct DecidedFrames {
    frames: Vec<(usize, [u8; 12], Range<u32>)>,
    targets: Vec<PortId>,
}

impl DecidedFrames {
    fn push(&mut self, key: usize, v: &Verdict<'_>) {
        let start = self.targets.len() as u32;
        self.targets.extend_from_slice(v.targets);
        self.frames
            .push((key, v.macs, start..self.targets.len() as u32));
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.targets.clear();
    }
}

/// How `forward_guest` holds a frame while the batch is forwarded.
enum Planned {
    Copied,
    /// Copied whole (index into the owned copies).
    Owned(usize),
    /// Its first `n` bytes copied (index into the heads); the rest stays in guest memory.
    Head(usize, usize),
}

/// Whether a frame's offload header makes some port read its bytes: a partial checksum to
/// complete or a large segment to cut.
fn needs_bytes(vh: &VirtioNetHdr) -> bool {
    vh.gso_kind() != VirtioNetHdr::GSO_NONE || vh.needs_csum()
}

#[cfg(test)]
mod tests;
