//! A udp link's way out: each frame becomes a VXLAN datagram in the batch ([`TxBatch`]), sent
//! when the batch ends as an iovec [VXLAN header, checked MACs, rest of the frame] (nothing
//! copied, even from a guest's shared memory). A guest's 64 KB TSO frame is cut in user space
//! (headers written to scratch, checksums computed, payloads left in place) and sent as runs of
//! up to 64 datagrams in one `sendmsg` with `UDP_SEGMENT`. An encrypted link's datagrams are
//! sealed when the batch is sent, and the segments of a TSO frame keep their checksums
//! partial when the peer takes them (the AEAD authenticates every byte).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use socket2::SockAddr;
use vnet_control::Link;
use vnet_core::{DropReason, PortCounters, PortKind};
use vnet_offload::{segment, segment_with, L4Checksum, SegmentList, VirtioNetHdr};
use vnet_wire::VxlanRepr;
use vnet_wire::{ETHERNET_HEADER_LEN, VXLAN_HEADER_LEN};

use crate::batch::{Rest, UdpLinkTx};
use crate::counters::OffloadCounters;
use crate::crypto::LinkCrypto;
use crate::kernel::KernelAttach;
use crate::port::{Frame, Port, Tx};
use crate::ports::{OpenError, Opened};
use crate::reach::{LinkPath, PathCell};
use crate::sys::IoPart;
use crate::vxlan_socket::VxlanSocket;
use crate::vxlan_socket::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS};

/// A udp link (`link add ... udp`): datagrams on the shared VXLAN socket, sealed when it is
/// encrypted (which needs this host's key). A plain IPv4 link is offered to the kernel fast
/// path.
pub fn open(
    l: &Link,
    to: SocketAddr,
    sock: &Arc<VxlanSocket>,
    key: Option<&vnet_crypto::PrivateKey>,
) -> Result<Opened, OpenError> {
    let local_v6 = sock.local_addr().is_ipv6();
    if to.is_ipv6() && !local_v6 {
        return Err(OpenError::Unsupported(format!(
            "{to} is IPv6 but the UDP socket is bound to IPv4 (start vnetd with --bind ::)"
        )));
    }
    let to_sa = crate::reach::for_socket(to, local_v6);
    // A reach link starts at its configured address; vnetd's reach thread swaps the path
    // (Engine::set_reach_path) as soon as it knows a better one.
    let path = Arc::new(PathCell::from_pointee(LinkPath::direct(to_sa)));
    let counters = Arc::new(PortCounters::default());
    let mut workers = Vec::new();
    let crypto = match l.encrypt {
        None => None,
        Some(peer_key) => {
            let Some(key) = key.cloned() else {
                return Err(OpenError::Unsupported(
                    "an encrypted link needs this host's key (start vnetd with --key-file)".into(),
                ));
            };
            let c = Arc::new(LinkCrypto::new(
                &l.name,
                key,
                peer_key,
                l.vni,
                sock.clone(),
                path.clone(),
                crate::crypto::timers_from_env(),
            ));
            workers.push(c.start_timer()?);
            Some(c)
        }
    };
    let plain = crypto.is_none();
    let reach = l.reach.is_some();
    let tx = UdpLinkTx {
        sock: sock.clone(),
        path,
        fixed_peer: (!reach).then_some(to_sa),
        header: VxlanRepr { vni: l.vni }.header(),
        gso_refused: AtomicUsize::new(usize::MAX),
        crypto,
        counters: counters.clone(),
    };
    let mut o = Opened::new(Arc::new(tx), PortKind::OverlayLink);
    o.counters = counters;
    o.workers = workers;
    if !reach {
        // A reach link's datagrams are its peer's by the endpoints reach confirmed, never by
        // an address alone (two sites may use the same private one).
        o.udp_peer = Some(to.ip().to_canonical());
    }
    // A reach link's datagrams leave from the socket's port in the kernel too (a NAT keeps
    // one mapping for the link), and its path moves (Engine::set_reach_path).
    if plain {
        o.kernel = Some(KernelAttach::Link {
            remote: to,
            src_port: reach.then(|| sock.local_addr().port()),
        });
    }
    Ok(o)
}

/// Largest frame a UDP link carries whole: one UDP datagram holds at most 65507 bytes (IPv4).
pub const UDP_MAX_FRAME: usize = 65507 - VXLAN_HEADER_LEN;

/// Whether a frame's IP packets (each segment's, for a TSO frame) exceed `limit` bytes.
fn exceeds(f: &Frame<'_>, limit: usize) -> bool {
    let ip = if f.vh.gso_kind() != VirtioNetHdr::GSO_NONE {
        // A segment: the headers the guest says it has, and one segment's payload.
        (f.vh.hdr_len as usize).saturating_sub(ETHERNET_HEADER_LEN) + f.vh.gso_size as usize
    } else {
        f.len().saturating_sub(ETHERNET_HEADER_LEN)
    };
    ip > limit
}

impl Port for UdpLinkTx {
    fn send<'a>(&'a self, tx: &mut Tx<'_, 'a>, f: &Frame<'a>) -> Result<(), DropReason> {
        // A frame the path cannot carry whole: not sent (forwarding tells its sender).
        if let Some(limit) = self.path.load().limit {
            if exceeds(f, limit) {
                return Err(DropReason::TooBig);
            }
        }
        let gso = f.vh.gso_kind() != VirtioNetHdr::GSO_NONE;
        let Some(frame) = f.whole() else {
            // A guest's frame in its shared memory (always plain: see `Ingress::forward_guest`):
            // the datagram is [VXLAN header, MACs + the copied head, the guest's bytes].
            if gso || f.vh.needs_csum() {
                return Err(DropReason::BadOffload);
            }
            if f.len() > self.max_frame() {
                return Err(DropReason::Oversize);
            }
            let rest = f.tail.map(Rest::Guest).unwrap_or(Rest::Local(&[]));
            tx.batch.push(self, &[&f.macs, &f.head[12..]], rest);
            return Ok(());
        };
        if let Some(c) = self.crypto.as_ref().filter(|_| gso) {
            // Encrypted: cut in user space; every segment is sealed on its own at flush
            // (runs of equal-size segments still go as one UDP_SEGMENT send). When the peer
            // takes them, the segments' TCP/UDP checksums are left partial: the AEAD covers
            // every byte, and no pass over the payload is spent on a checksum.
            let l4 = match c.partial_checksums() {
                true => L4Checksum::Partial,
                false => L4Checksum::Complete,
            };
            segment_with(frame, &f.vh, tx.seg, l4).map_err(|_| DropReason::BadOffload)?;
            tx.seg.pin_macs(&f.macs);
            tx.offload.gso(tx.seg.len());
            for s in &tx.seg.segs {
                tx.batch.push(
                    self,
                    &[&tx.seg.headers[s.hdr.clone()]],
                    Rest::Local(&frame[s.payload.clone()]),
                );
            }
            return Ok(());
        }
        if gso {
            return send_segmented(tx.offload, self, frame, &f.vh, tx.seg, &f.macs);
        }
        if frame.len() > self.max_frame() {
            return Err(DropReason::Oversize);
        }
        if f.vh.needs_csum() {
            // Complete the checksum in a copy of the headers; the rest of the frame is sent
            // from where it is.
            match segment(frame, &f.vh, tx.seg) {
                Ok(()) if tx.seg.len() == 1 => {
                    tx.seg.pin_macs(&f.macs);
                    let rest = tx.seg.segs[0].payload.clone();
                    tx.batch
                        .push(self, &[&tx.seg.headers], Rest::Local(&frame[rest]));
                    Ok(())
                }
                _ => Err(DropReason::BadOffload),
            }
        } else {
            tx.batch.push(self, &[&f.macs], Rest::Local(&frame[12..]));
            Ok(())
        }
    }

    fn as_udp(&self) -> Option<&UdpLinkTx> {
        Some(self)
    }

    fn state(&self) -> vnet_control::status::LinkState {
        match &self.crypto {
            Some(c) if !c.established() => vnet_control::status::LinkState::Connecting,
            _ => vnet_control::status::LinkState::Up,
        }
    }
}

impl UdpLinkTx {
    /// The largest frame one datagram of this link carries.
    fn max_frame(&self) -> usize {
        if self.crypto.is_some() {
            UDP_MAX_FRAME - vnet_crypto::DATA_OVERHEAD
        } else {
            UDP_MAX_FRAME
        }
    }
}

/// Sends a guest's large segment as VXLAN datagrams: cut in user space (headers only; the
/// payload is gathered from the guest's buffer), then one `UDP_SEGMENT` send per run of up to
/// 64 segments.
fn send_segmented(
    offload: &OffloadCounters,
    link: &UdpLinkTx,
    frame: &[u8],
    vh: &VirtioNetHdr,
    seg: &mut SegmentList,
    macs: &[u8; 12],
) -> Result<(), DropReason> {
    let UdpLinkTx {
        sock,
        path,
        header,
        gso_refused,
        ..
    } = link;
    let path = path.load_full();
    let (to, prefix) = (&path.to, path.prefix());
    segment(frame, vh, seg).map_err(|_| DropReason::BadOffload)?;
    seg.pin_macs(macs);
    offload.gso(seg.len());
    let n = seg.len();
    let dgram = |k: usize| {
        prefix.len() + VXLAN_HEADER_LEN + seg.segs[k].hdr.len() + seg.segs[k].payload.len()
    };
    // segment() makes every datagram the same size but the last, so any run of consecutive
    // segments is a valid UDP_SEGMENT send; runs are bounded by count and by bytes.
    let per = (GSO_MAX_BYTES / dgram(0)).clamp(1, GSO_MAX_SEGMENTS);
    let mut parts: Vec<IoPart<'_>> = Vec::with_capacity(per * 4);
    for i in (0..n).step_by(per) {
        let j = (i + per).min(n);
        parts.clear();
        for k in i..j {
            let [h, p] = seg.parts(frame, k);
            parts.extend_from_slice(&[
                IoPart::from(prefix),
                IoPart::from(&header[..]),
                h.into(),
                p.into(),
            ]);
        }
        let size = dgram(i);
        let gso = (j - i > 1 && sock.gso_enabled() && size < gso_refused.load(Relaxed))
            .then_some(size as u16);
        let result = match gso {
            Some(_) => sock.send_parts(to, &parts, gso),
            None => Err(None),
        };
        match result {
            Ok(()) => {
                offload.udp_gso_sends.fetch_add(1, Relaxed);
            }
            Err(None) => {
                if gso.is_some() {
                    gso_refused.fetch_min(size, Relaxed);
                }
                // No segmentation offload for this run: its datagrams go in one sendmmsg.
                let msgs: Vec<(&SockAddr, [IoPart<'_>; 4])> = (i..j)
                    .map(|k| {
                        let [h, p] = seg.parts(frame, k);
                        (
                            to,
                            [
                                IoPart::from(prefix),
                                IoPart::from(&header[..]),
                                h.into(),
                                p.into(),
                            ],
                        )
                    })
                    .collect();
                if sock.send_many(&msgs) < msgs.len() {
                    return Err(DropReason::TxError);
                }
                offload.udp_batch_sends.fetch_add(1, Relaxed);
            }
            Err(Some(r)) => return Err(r),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
