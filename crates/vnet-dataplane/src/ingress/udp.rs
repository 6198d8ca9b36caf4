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
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vnet_core::{DropReason, PortId};
use vnet_crypto::wire::is_crypto;
use vnet_crypto::Message;
use vnet_offload::{claimed_frame_len, gso_header, PayloadRef};
use vnet_wire::{VxlanPacket, VXLAN_HEADER_LEN};

use crate::batch::TxBatch;
use crate::crypto::{self, LinkCrypto, OpenCache};
use crate::forward::{process, Arrival, FwdCtx};
use crate::gro::flush_coalescers;
use crate::ingress::{Reader, RxWork};
use crate::shared::{Shared, Snapshot};
use crate::udp::VxlanSocket;

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
        for m in w.recvd.iter() {
            let i = m.buf;
            let buf = &mut w.bufs[i][..m.len];
            if m.seg < m.len && !is_crypto(buf) && is_tunnel_gso(buf, m.seg) {
                // One VXLAN datagram whose inner frame a local kernel sender never segmented.
                frames += 1;
                w.plan.push(RxItem::Vxlan {
                    i,
                    off: 0,
                    end: m.len,
                    mss: Some(m.seg),
                    from: m.from,
                });
                continue;
            }
            // Datagrams of `seg` bytes, the last shorter; an empty datagram is one too.
            let mut off = 0;
            loop {
                let end = (off + m.seg).min(m.len);
                frames += 1;
                if is_crypto(&buf[off..end]) {
                    if let Some((start, stop, port)) =
                        open_datagram(shared, snap, &mut cache, buf, (off, end), m.from)
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
                    });
                }
                off = end;
                if off >= m.len {
                    break;
                }
            }
        }
        let mut pass = Pass {
            shared,
            snap,
            ctx: &mut w.ctx,
            bufs: &w.bufs,
            batch: TxBatch::default(),
        };
        for item in &w.plan {
            match *item {
                RxItem::Vxlan {
                    i,
                    off,
                    end,
                    mss,
                    from,
                } => pass.datagram(i, (off, end), from, mss),
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
    /// One VXLAN datagram at `off..end` of buffer `i`: only from a link's peer, only with a
    /// VNI that peer has a link for.
    fn datagram(
        &mut self,
        i: usize,
        (off, end): (usize, usize),
        from: std::net::SocketAddr,
        tunnel_mss: Option<usize>,
    ) {
        let (shared, snap, bufs) = (self.shared, self.snap, self.bufs);
        let data = &bufs[i][off..end];
        shared.daemon.rx(data.len());
        let ip = from.ip().to_canonical();
        if !snap.udp_ips.contains(&ip) {
            return shared.daemon.count_drop(DropReason::UnknownPeer);
        }
        let pkt = match VxlanPacket::new_checked(data) {
            Ok(p) => p,
            Err(_) => return shared.daemon.count_drop(DropReason::BadVxlan),
        };
        let Some(&port) = snap.udp_peers.get(&(ip, pkt.vni())) else {
            return shared.daemon.count_drop(DropReason::UnknownVni);
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

/// A datagram of a receive batch, ready to forward.
#[derive(Clone, Copy)]
pub(crate) enum RxItem {
    /// Plaintext VXLAN at `off..end` of buffer `i`.
    Vxlan {
        i: usize,
        off: usize,
        end: usize,
        mss: Option<usize>,
        from: std::net::SocketAddr,
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
fn open_datagram(
    shared: &Shared,
    snap: &Snapshot,
    cache: &mut OpenCache,
    buf: &mut [u8],
    (off, end): (usize, usize),
    from: std::net::SocketAddr,
) -> Option<(usize, usize, PortId)> {
    let len = end - off;
    shared.daemon.rx(len);
    let ip = from.ip().to_canonical();
    if !snap.udp_ips.contains(&ip) {
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
    let Some(&port) = snap.udp_peers.get(&(ip, msg.vni())) else {
        shared.daemon.count_drop(DropReason::UnknownVni);
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
