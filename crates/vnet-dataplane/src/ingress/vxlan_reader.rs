//! The VXLAN socket's datagrams: every udp link shares one socket, so each datagram's
//! link is found from (source IP, VNI) (the Linux kernel picks the VXLAN source port by flow
//! hash, so the port says nothing). A datagram is accepted only from a link's peer
//! (`unknown_peer`), with a VXLAN header (`bad_vxlan`) of a VNI that peer has a link for
//! (`unknown_vni`). `UDP_GRO` hands over many datagrams per message, split here by segment
//! size; a kernel VXLAN peer on a veth underlay hands over unsegmented 64 KB inner frames
//! (tunnel GSO), forwarded as a guest's TSO frame would go. Encrypted links' messages are
//! answered (handshakes) or opened in place first (no copy; the session looked up once per
//! batch and link), so the second pass forwards every frame from the receive buffers and the
//! coalescer still merges them for guests.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use socket2::SockAddr;
use vnet_core::{DropReason, LockRecover, PortId};
use vnet_crypto::wire::is_crypto;
use vnet_crypto::Message;
use vnet_offload::{claimed_frame_len, gso_header, PayloadRef};
use vnet_reach::wire::Kind;
use vnet_wire::{VxlanPacket, VXLAN_HEADER_LEN};

use crate::batch::TxBatch;
use crate::crypto::{self, LinkCrypto, OpenCache};
use crate::forward::{process, Arrival, FwdCtx};
use crate::gro_to_guest::flush_coalescers;
use crate::ingress::{Reader, RxWork};
use crate::shared::{Shared, Snapshot};
use crate::sys::IoPart;
use crate::vxlan_socket::VxlanSocket;

/// The daemon's VXLAN socket, read by one dispatcher.
pub struct VxlanReader {
    pub sock: Arc<VxlanSocket>,
}

impl Reader for VxlanReader {
    fn fd(&self) -> RawFd {
        self.sock.fd()
    }

    fn drain(&self, w: &mut RxWork, shared: &Shared, snap: &Snapshot) -> io::Result<usize> {
        self.sock
            .recv_batch(&mut w.mmsg, &mut w.bufs, &mut w.msgs, &mut w.recvd)?;
        // First pass: answer handshake messages and decrypt the data of encrypted links in
        // place (the plaintext overwrites its ciphertext), so that the second pass forwards
        // every frame from the receive buffers, coalescing as for plaintext VXLAN.
        w.plan.clear();
        let mut frames = 0;
        let mut cache = OpenCache::default();
        let mut relay = RelayOut::default();
        for m in w.recvd.iter() {
            let i = m.buf;
            let buf = &mut w.bufs[i][..m.len];
            if m.seg < m.len && buf.first() == Some(&VXLAN_FLAGS) && is_tunnel_gso(buf, m.seg) {
                // One VXLAN datagram whose inner frame a local kernel sender never segmented.
                frames += 1;
                w.plan.push(RxItem::Vxlan {
                    i,
                    off: 0,
                    end: m.len,
                    mss: Some(m.seg),
                    from: m.from,
                    port: None,
                });
                continue;
            }
            // Datagrams of `seg` bytes, the last shorter; an empty datagram is one too.
            let mut off = 0;
            loop {
                let end = (off + m.seg).min(m.len);
                frames += 1;
                let d = &buf[off..end];
                // STUN first: a Binding answer's first byte is an encrypted link's type 1.
                if vnet_reach::stun::is_stun(d) {
                    shared.daemon.rx(d.len());
                    if let Err(r) = shared.reach.hand_over(m.from, d) {
                        shared.daemon.count_drop(r);
                    }
                } else if let Some(kind) = vnet_reach::wire::kind_of(d) {
                    match kind {
                        Kind::Relay => relay.arrived(
                            shared,
                            snap,
                            buf,
                            (off, end),
                            m.from,
                            i,
                            &mut w.plan,
                            &mut cache,
                        ),
                        _ => {
                            shared.daemon.rx(d.len());
                            if let Err(r) = shared.reach.hand_over(m.from, d) {
                                shared.daemon.count_drop(r);
                            }
                        }
                    }
                } else if is_crypto(d) {
                    if let Some((start, stop, port)) =
                        open_datagram(shared, snap, &mut cache, buf, (off, end), m.from, None)
                    {
                        w.plan.push(RxItem::Decrypted {
                            i,
                            start,
                            end: stop,
                            port,
                        });
                    }
                } else {
                    w.plan.push(RxItem::Vxlan {
                        i,
                        off,
                        end,
                        mss: None,
                        from: m.from,
                        port: None,
                    });
                }
                off = end;
                if off >= m.len {
                    break;
                }
            }
        }
        relay.send(shared, &w.bufs);
        let batch = TxBatch::reusing(&mut w.ctx.tx_spare);
        let mut pass = Pass {
            shared,
            snap,
            ctx: &mut w.ctx,
            bufs: &w.bufs,
            batch,
        };
        for item in &w.plan {
            match *item {
                RxItem::Vxlan {
                    i,
                    off,
                    end,
                    mss,
                    from,
                    port,
                } => pass.datagram(i, (off, end), from, mss, port),
                RxItem::Decrypted {
                    i,
                    start,
                    end,
                    port,
                } => pass.decrypted(i, (start, end), port),
            }
        }
        let Pass {
            ctx,
            bufs,
            mut batch,
            ..
        } = pass;
        flush_coalescers(shared, snap, ctx, bufs);
        batch.flush(&shared.offload, &shared.daemon, &snap.udp);
        batch.give_back(&mut ctx.tx_spare);
        snap.end_of_burst();
        Ok(frames)
    }
}

/// The second pass over a receive batch: what forwarding its datagrams needs, and the
/// batch of datagrams they make for udp links.
struct Pass<'a, 'w> {
    shared: &'a Shared,
    snap: &'a Snapshot,
    ctx: &'w mut FwdCtx,
    bufs: &'a [Vec<u8>],
    batch: TxBatch<'a>,
}

impl<'a> Pass<'a, '_> {
    /// One VXLAN datagram at `off..end` of buffer `i`: only from a link's peer (an endpoint
    /// reach confirmed, or a plain link's address), only with a VNI that peer has a link for;
    /// `known` when a relay brought it (the link then comes from the relay header's tag).
    fn datagram(
        &mut self,
        i: usize,
        (off, end): (usize, usize),
        from: std::net::SocketAddr,
        tunnel_mss: Option<usize>,
        known: Option<PortId>,
    ) {
        let (shared, snap, bufs) = (self.shared, self.snap, self.bufs);
        let data = &bufs[i][off..end];
        shared.daemon.rx(data.len());
        let port = match known {
            Some(p) => p,
            None => match find_link(snap, from, data) {
                Ok(p) => p,
                Err(r) => return shared.daemon.count_drop(r),
            },
        };
        if link_crypto(snap, port).is_some() {
            // Plaintext claiming to come from an encrypted link's peer: unauthenticated.
            return snap.count_rx_drop(port, data.len(), DropReason::BadAuth);
        }
        let at = PayloadRef {
            buf: i as u32,
            start: (off + VXLAN_HEADER_LEN) as u32,
            end: end as u32,
        };
        let frame = &data[VXLAN_HEADER_LEN..];
        let arrival = match tunnel_mss {
            // A large frame with a partial checksum: forward it as a guest's TSO frame would go.
            Some(mss) => {
                let Some(vh) = gso_header(frame, mss.min(u16::MAX as usize) as u16) else {
                    return snap.count_rx_drop(port, frame.len(), DropReason::BadOffload);
                };
                shared.offload.tunnel_gso.fetch_add(1, Relaxed);
                Arrival::local(vh, frame)
            }
            None => Arrival::wire(frame, at, bufs),
        };
        process(shared, snap, self.ctx, port, arrival, &mut self.batch);
    }

    /// A datagram of encrypted link `port`, decrypted at `start..end` of buffer `i`: VXLAN
    /// whose VNI must be the link's.
    fn decrypted(&mut self, i: usize, (start, end): (usize, usize), port: PortId) {
        let (snap, bufs) = (self.snap, self.bufs);
        let data = &bufs[i][start..end];
        let Some(entry) = snap.ports.get(&port) else {
            return;
        };
        match VxlanPacket::new_checked(data) {
            Ok(p) if p.vni() == entry.info.vni => {}
            _ => return snap.count_rx_drop(port, data.len(), DropReason::BadVxlan),
        }
        let at = PayloadRef {
            buf: i as u32,
            start: (start + VXLAN_HEADER_LEN) as u32,
            end: end as u32,
        };
        let arrival = Arrival::authenticated(&data[VXLAN_HEADER_LEN..], at, bufs);
        process(self.shared, snap, self.ctx, port, arrival, &mut self.batch);
    }
}

/// The link a plaintext VXLAN datagram from `from` belongs to: a reach link whose peer's
/// endpoint it is, else the plain link of its source address and VNI.
fn find_link(snap: &Snapshot, from: SocketAddr, data: &[u8]) -> Result<PortId, DropReason> {
    let ep = vnet_reach::canonical(from);
    let reach = !snap.reach_endpoints.is_empty();
    if !reach && !snap.udp_ips.contains(&ep.ip()) {
        return Err(DropReason::UnknownPeer);
    }
    let pkt = VxlanPacket::new_checked(data).map_err(|_| DropReason::BadVxlan)?;
    let vni = pkt.vni();
    if let Some(&p) = snap.reach_endpoints.get(&(ep, vni)) {
        return Ok(p);
    }
    if !snap.udp_ips.contains(&ep.ip()) {
        return Err(DropReason::UnknownPeer);
    }
    snap.udp_peers
        .get(&(ep.ip(), vni))
        .copied()
        .ok_or(DropReason::UnknownVni)
}

/// The first byte of a VXLAN header (the I flag).
const VXLAN_FLAGS: u8 = 0x08;

/// Relay datagrams of one receive batch: a relay forwards them (collected here, sent at the
/// end of the batch); any other host takes those its relays bring for its reach links.
#[derive(Default)]
struct RelayOut {
    /// (destination, buffer, range) of each datagram to forward, its tag already rewritten.
    out: Vec<(SockAddr, usize, (usize, usize))>,
}

impl RelayOut {
    /// A relay datagram at `off..end` of `buf` (buffer `i`) from `from`.
    #[allow(clippy::too_many_arguments)]
    fn arrived(
        &mut self,
        shared: &Shared,
        snap: &Snapshot,
        buf: &mut [u8],
        (off, end): (usize, usize),
        from: SocketAddr,
        i: usize,
        plan: &mut Vec<RxItem>,
        cache: &mut OpenCache,
    ) {
        let len = end - off;
        shared.daemon.rx(len);
        let Ok((tag, at)) = vnet_reach::wire::parse_relay(&buf[off..end]) else {
            return shared.daemon.count_drop(DropReason::BadVxlan);
        };
        let from = vnet_reach::canonical(from);
        if let Some(table) = shared.reach.relay() {
            // This host relays: pass it on, naming the source instead of the destination.
            let now = shared.now_ns();
            let r = table.lock_or_recover().forward(from, tag, len, now);
            match r {
                Ok((src, to)) => {
                    vnet_reach::wire::set_relay_tag(&mut buf[off..end], src);
                    let to = crate::reach::for_socket(to, snap.udp.local_addr().is_ipv6());
                    self.out.push((SockAddr::from(to), i, (off, end)));
                }
                // Each refusal is counted by reason in the relay's table too (`show reach`).
                Err(vnet_reach::RelayRefusal::RateLimited) => {
                    shared.daemon.count_drop(DropReason::RateLimited)
                }
                Err(_) => shared.daemon.count_drop(DropReason::UnknownPeer),
            }
            return;
        }
        if !snap.relays.contains(&from) {
            // Without reach a relay datagram is no datagram this daemon knows (as before
            // reach); with it, one from a host that is not its relay.
            if !shared.reach.enabled() {
                return shared.daemon.count_drop(DropReason::BadVxlan);
            }
            shared.reach.relayed_unknown.fetch_add(1, Relaxed);
            return shared.daemon.count_drop(DropReason::UnknownPeer);
        }
        shared.reach.relayed_in.fetch_add(1, Relaxed);
        let inner = &buf[off + at..end];
        if is_crypto(inner) {
            if let Some((start, stop, port)) =
                open_datagram(shared, snap, cache, buf, (off + at, end), from, Some(tag))
            {
                plan.push(RxItem::Decrypted {
                    i,
                    start,
                    end: stop,
                    port,
                });
            }
            return;
        }
        let Ok(pkt) = VxlanPacket::new_checked(inner) else {
            return shared.daemon.count_drop(DropReason::BadVxlan);
        };
        let Some(&port) = snap.reach_tags.get(&(tag, pkt.vni())) else {
            return shared.daemon.count_drop(DropReason::UnknownVni);
        };
        plan.push(RxItem::Vxlan {
            i,
            off: off + at,
            end,
            mss: None,
            from,
            port: Some(port),
        });
    }

    /// Sends what a relay forwards. Datagrams that arrived as one GRO message (back to back in
    /// one buffer, one size but the last) and go to one destination leave as one
    /// `UDP_SEGMENT` send of that same memory (their tags were rewritten in place): a bulk
    /// stream through a relay costs it about a syscall per 64 KB, not per datagram. The rest
    /// go in one `sendmmsg`.
    fn send(&mut self, shared: &Shared, bufs: &[Vec<u8>]) {
        if self.out.is_empty() {
            return;
        }
        let snap = shared.snapshot.load();
        let sock = &snap.udp;
        let mut singles: Vec<(&SockAddr, [IoPart<'_>; 1])> = Vec::new();
        let mut k = 0;
        while k < self.out.len() {
            let (to, i, (start, first_end)) = &self.out[k];
            let size = first_end - start;
            // How far the run goes: same buffer and destination, contiguous, same size but
            // the last, within what one send may carry.
            let mut end = *first_end;
            let mut j = k + 1;
            while j < self.out.len() && j - k < crate::vxlan_socket::GSO_MAX_SEGMENTS {
                let (t2, i2, (s2, e2)) = &self.out[j];
                if t2 != to
                    || i2 != i
                    || *s2 != end
                    || e2 - s2 > size
                    || e2 - start > crate::vxlan_socket::GSO_MAX_BYTES
                {
                    break;
                }
                end = *e2;
                j += 1;
                if e2 - s2 < size {
                    break;
                }
            }
            let run = &bufs[*i][*start..end];
            let sent = j - k > 1
                && sock.gso_enabled()
                && sock
                    .send_parts(to, &[IoPart::from(run)], Some(size as u16))
                    .is_ok();
            if !sent {
                for (to, i, (s, e)) in &self.out[k..j] {
                    singles.push((to, [IoPart::from(&bufs[*i][*s..*e])]));
                }
            }
            k = j;
        }
        let sent = sock.send_many(&singles);
        for _ in sent..singles.len() {
            shared.daemon.count_drop(DropReason::TxError);
        }
        drop(singles);
        self.out.clear();
    }
}

/// A datagram of a receive batch, ready to forward.
#[derive(Clone, Copy)]
pub(crate) enum RxItem {
    /// Plaintext VXLAN at `off..end` of buffer `i`; `port` when a relay brought it.
    Vxlan {
        i: usize,
        off: usize,
        end: usize,
        mss: Option<usize>,
        from: std::net::SocketAddr,
        port: Option<PortId>,
    },
    /// A decrypted VXLAN datagram at `start..end` of buffer `i`, from encrypted link `port`.
    Decrypted {
        i: usize,
        start: usize,
        end: usize,
        port: PortId,
    },
}

fn link_crypto(snap: &Snapshot, port: PortId) -> Option<&Arc<LinkCrypto>> {
    snap.ports
        .get(&port)
        .and_then(|p| p.port.as_udp())
        .and_then(|l| l.crypto.as_ref())
}

/// An encrypted-link message at `off..end` of `buf`: a handshake message is answered; a data
/// message is authenticated and decrypted, its plaintext (a VXLAN datagram) written over the
/// ciphertext. Returns where the plaintext is and the link's port; every refusal is counted.
/// `relayed`: a relay brought it from the peer with this tag.
fn open_datagram(
    shared: &Shared,
    snap: &Snapshot,
    cache: &mut OpenCache,
    buf: &mut [u8],
    (off, end): (usize, usize),
    from: std::net::SocketAddr,
    relayed: Option<vnet_reach::Tag>,
) -> Option<(usize, usize, PortId)> {
    let len = end - off;
    if relayed.is_none() {
        shared.daemon.rx(len);
    }
    let ep = vnet_reach::canonical(from);
    if relayed.is_none() && snap.reach_endpoints.is_empty() && !snap.udp_ips.contains(&ep.ip()) {
        shared.daemon.count_drop(DropReason::UnknownPeer);
        return None;
    }
    let msg = match Message::parse(&buf[off..end]) {
        Ok(m) => m,
        Err(e) => {
            shared.daemon.count_drop(crypto::drop_reason(e));
            return None;
        }
    };
    let vni = msg.vni();
    let found = match relayed {
        Some(tag) => snap.reach_tags.get(&(tag, vni)),
        None => snap
            .reach_endpoints
            .get(&(ep, vni))
            .or_else(|| snap.udp_peers.get(&(ep.ip(), vni))),
    };
    let Some(&port) = found else {
        let r = match relayed.is_none() && !snap.udp_ips.contains(&ep.ip()) {
            true => DropReason::UnknownPeer,
            false => DropReason::UnknownVni,
        };
        shared.daemon.count_drop(r);
        return None;
    };
    let counters = &snap.ports.get(&port)?.counters;
    let Some(c) = link_crypto(snap, port) else {
        // An encrypted-link message for a plaintext link.
        let r = match msg {
            Message::Data { .. } => DropReason::NoSession,
            _ => DropReason::BadHandshake,
        };
        snap.count_rx_drop(port, len, r);
        return None;
    };
    let Message::Data { receiver, .. } = msg else {
        c.handshake(&msg, counters);
        return None;
    };
    match c.open_in_place(receiver, &mut buf[off..end], cache) {
        Ok(plain) if plain.is_empty() => None, // a keepalive: it only confirmed the session
        Ok(plain) => Some((off + plain.start, off + plain.end, port)),
        Err(e) => {
            snap.count_rx_drop(port, len, crypto::drop_reason(e));
            None
        }
    }
}

/// Whether a received message with a GRO segment size is really one VXLAN datagram carrying
/// an unsegmented large frame (a kernel sender on a veth underlay hands over its tunnel GSO
/// packet whole; the "segment size" is then the inner MSS). A batch of real datagrams has a
/// first inner frame that ends exactly at the segment boundary.
fn is_tunnel_gso(msg: &[u8], seg: usize) -> bool {
    match msg.get(VXLAN_HEADER_LEN..).and_then(claimed_frame_len) {
        Some(n) => VXLAN_HEADER_LEN + n > seg,
        None => false,
    }
}

#[cfg(test)]
mod tests;
