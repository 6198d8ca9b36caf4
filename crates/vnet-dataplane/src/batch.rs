//! UDP datagrams waiting for the end of a forwarding batch, and how they are sent: a run of
//! consecutive datagrams to one link, all of one size but the last (which may be shorter),
//! goes as one `sendmsg` with `UDP_SEGMENT` (the kernel's stack handles the run once); the rest
//! go in `sendmmsg` batches, in order. Datagrams of encrypted links are first gathered into one
//! send buffer and sealed there in place (equal plaintext sizes give equal ciphertext sizes, so
//! runs survive). Where runs split is a pure function ([`plan_runs`]) tested on its own.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use vm_memory::VolatileSlice;
use vnet_core::{DropReason, PortCounters};
use vnet_crypto::{DATA_HEADER_LEN, DATA_OVERHEAD, TAG_LEN};
use vnet_wire::VXLAN_HEADER_LEN;

use crate::counters::OffloadCounters;
use crate::crypto::LinkCrypto;
use crate::reach::{LinkPath, PathCell};
use crate::sys::IoPart;
use crate::vxlan_socket::{VxlanSocket, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
use socket2::SockAddr;

/// The sending side of a udp link.
pub struct UdpLinkTx {
    pub sock: Arc<VxlanSocket>,
    /// Where its datagrams go now: the configured peer, or (a reach link) the path vnetd's
    /// reach thread chose, swapped whole.
    pub path: Arc<PathCell>,
    /// The configured peer when nothing else decides the path (None: a reach link).
    pub fixed_peer: Option<std::net::SocketAddr>,
    pub header: [u8; VXLAN_HEADER_LEN],
    /// Smallest datagram size the kernel refused to segment (larger than the path MTU);
    /// runs of that size or more go one datagram at a time.
    pub gso_refused: AtomicUsize,
    /// Set for an encrypted link: datagrams are sealed, handshakes run.
    pub crypto: Option<Arc<LinkCrypto>>,
    /// The link's port counters (for drops found only when the batch is sent).
    pub counters: Arc<PortCounters>,
}

/// The bytes of a datagram after the part vnet rewrote: ordinary memory, or a guest's shared
/// memory (vhost-user cut-through), which is never read here, only handed to the kernel.
#[derive(Clone, Copy)]
pub enum Rest<'a> {
    Local(&'a [u8]),
    Guest(VolatileSlice<'a>),
}

impl<'a> Rest<'a> {
    pub fn len(&self) -> usize {
        match self {
            Rest::Local(b) => b.len(),
            Rest::Guest(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn part(&self) -> IoPart<'a> {
        match self {
            Rest::Local(b) => IoPart::from(*b),
            Rest::Guest(s) => IoPart::from_volatile(s),
        }
    }

    /// Appends these bytes to `out` (a volatile copy for guest memory).
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        match self {
            Rest::Local(b) => out.extend_from_slice(b),
            Rest::Guest(s) => {
                let at = out.len();
                out.resize(at + s.len(), 0);
                s.copy_to(&mut out[at..]);
            }
        }
    }
}

/// Datagrams waiting to be sent, borrowing the frames they carry.
#[derive(Default)]
pub struct TxBatch<'a> {
    /// (link, head, rest): `head` is a range of `heads` (bytes we wrote: the checked MACs, or
    /// headers with a completed checksum), `rest` the frame bytes after it, borrowed.
    udp: Vec<(&'a UdpLinkTx, Range<usize>, Rest<'a>)>,
    heads: Vec<u8>,
    /// What [`TxBatch::flush`] works in, kept for the next batch (see [`TxSpare`]).
    work: FlushWork,
}

/// One datagram ready to send: its link, the link's path, its parts (the path's prefix
/// first), its length.
type Ready<'b> = (&'b UdpLinkTx, &'b LinkPath, [IoPart<'b>; 4], usize);

/// The vectors a flush fills and empties again (those whose elements borrow are kept empty,
/// as [`Spare`]s).
#[derive(Default)]
struct FlushWork {
    sealed: Vec<u8>,
    paths: Vec<Arc<LinkPath>>,
    path_of: Vec<usize>,
    ranges: Vec<Option<Range<usize>>>,
    keys: Vec<(usize, usize)>,
    items: Spare<Ready<'static>>,
    singles: Spare<(&'static SockAddr, [IoPart<'static>; 4])>,
    parts: Spare<IoPart<'static>>,
}

/// What one thread keeps of its batches between them: their vectors, so that a batch
/// allocates nothing once the thread has sent one as large (wireguard-go pools its buffers for
/// the same reason). [`TxBatch::reusing`] takes them, [`TxBatch::give_back`] returns them.
#[derive(Default)]
pub struct TxSpare {
    udp: Spare<(&'static UdpLinkTx, Range<usize>, Rest<'static>)>,
    heads: Vec<u8>,
    work: FlushWork,
}

/// An empty vector kept for its allocation: `T` names the element type with `'static` where
/// the elements it will hold borrow (frames, guest memory, paths), so it is stored without a
/// lifetime and [`recycle`]d to the caller's when taken.
struct Spare<T>(Vec<T>);

impl<T> Default for Spare<T> {
    fn default() -> Self {
        Spare(Vec::new())
    }
}

impl<T> Spare<T> {
    /// Keeps `v`'s allocation (emptied).
    fn keep<U>(v: Vec<U>) -> Spare<T> {
        Spare(recycle(v))
    }

    /// The allocation, as an empty vector of the caller's element type.
    fn take<U>(&mut self) -> Vec<U> {
        recycle(std::mem::take(&mut self.0))
    }

    #[cfg(test)]
    fn as_ptr(&self) -> *const T {
        self.0.as_ptr()
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: a `Spare` is always empty (`keep` and `take` empty it; nothing else reaches the
// vector), so it holds no pointer into a frame or guest memory, only an allocation, which
// any thread may use or free.
unsafe impl<T> Send for Spare<T> {}

/// An empty vector's allocation, for elements of a type of the same layout (here: the same
/// type with other lifetimes). std collects a vector's own `IntoIter` in place, so this moves
/// no element (there are none) and keeps the capacity.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// How a run of datagrams goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// Datagrams `range` in one `UDP_SEGMENT` send of `size`-byte segments.
    Segmented { range: Range<usize>, size: usize },
    /// Datagrams `range`, each on its own (in a `sendmmsg` batch).
    Singles(Range<usize>),
}

/// Splits datagrams (their link, as an identity, and their sizes) into runs: consecutive
/// datagrams to the same link, all of the first one's size except the last, which may be
/// shorter, at most `GSO_MAX_SEGMENTS` and `GSO_MAX_BYTES` per run; a run of one, or one the
/// link cannot segment (`gso_ok(first item of the run, size)` false), is sent as singles.
pub fn plan_runs(
    items: &[(usize, usize)],
    mut gso_ok: impl FnMut(usize, usize) -> bool,
) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let (link, size) = items[i];
        let per = (GSO_MAX_BYTES / size.max(1)).clamp(1, GSO_MAX_SEGMENTS);
        let mut j = i + 1;
        while j < items.len() && j - i < per {
            let (l, len) = items[j];
            if l != link || len > size {
                break;
            }
            j += 1;
            if len < size {
                break;
            }
        }
        if j - i > 1 && gso_ok(i, size) {
            runs.push(Run::Segmented { range: i..j, size });
        } else {
            match runs.last_mut() {
                Some(Run::Singles(r)) if r.end == i => r.end = j,
                _ => runs.push(Run::Singles(i..j)),
            }
        }
        i = j;
    }
    runs
}

impl<'a> TxBatch<'a> {
    /// A batch in the vectors `spare` kept (empty ones the first time).
    pub fn reusing(spare: &mut TxSpare) -> TxBatch<'a> {
        TxBatch {
            udp: spare.udp.take(),
            heads: std::mem::take(&mut spare.heads),
            work: std::mem::take(&mut spare.work),
        }
    }

    /// Returns this batch's vectors to `spare` (emptied: flush first).
    pub fn give_back(mut self, spare: &mut TxSpare) {
        self.heads.clear();
        spare.udp = Spare::keep(self.udp);
        spare.heads = self.heads;
        spare.work = self.work;
    }

    pub fn is_empty(&self) -> bool {
        self.udp.is_empty()
    }

    /// Datagrams queued so far.
    pub fn len(&self) -> usize {
        self.udp.len()
    }

    /// Queues a datagram of `link`: `head` (copied into the batch) then `rest` (borrowed).
    pub fn push(&mut self, link: &'a UdpLinkTx, head: &[&[u8]], rest: Rest<'a>) {
        let at = self.heads.len();
        for h in head {
            self.heads.extend_from_slice(h);
        }
        self.udp.push((link, at..self.heads.len(), rest));
    }

    /// Seals the datagrams of encrypted links (into `sealed`) and lists every datagram with
    /// the parts it is sent from; a datagram of an encrypted link without a session is
    /// dropped and counted (`no_session`).
    ///
    /// `sealed` is sized once for the whole batch and every datagram is laid out in it as
    /// `[data header][VXLAN header, frame][tag]`, gathered there (the one copy: a guest's bytes
    /// are read straight from its memory) and sealed in place. Each run of consecutive
    /// datagrams to one link takes its session once and its counters in one
    /// [`vnet_crypto::Session::reserve`]; nothing is allocated per datagram.
    fn ready<'b>(
        &'b self,
        sealed: &'b mut Vec<u8>,
        paths: &'b [Arc<LinkPath>],
        path_of: &[usize],
        ranges: &mut Vec<Option<Range<usize>>>,
        items: &mut Vec<Ready<'b>>,
    ) {
        let need: usize = self
            .udp
            .iter()
            .filter(|(l, _, _)| l.crypto.is_some())
            .map(|(_, h, rest)| DATA_OVERHEAD + VXLAN_HEADER_LEN + h.len() + rest.len())
            .sum();
        sealed.clear();
        sealed.reserve(need);
        ranges.clear();
        let mut i = 0;
        while i < self.udp.len() {
            let link = self.udp[i].0;
            let Some(c) = &link.crypto else {
                ranges.push(None);
                i += 1;
                continue;
            };
            let run = &self.udp[i..];
            let n = run
                .iter()
                .take_while(|(l, _, _)| std::ptr::eq(*l, link))
                .count();
            let first = c
                .sending_session()
                .ok_or(DropReason::NoSession)
                .and_then(|s| {
                    s.reserve(n as u64)
                        .map(|k| (s, k))
                        .map_err(crate::crypto::drop_reason)
                });
            for (k, (_, h, rest)) in run[..n].iter().enumerate() {
                let at = sealed.len();
                let r = match &first {
                    Ok((s, counter)) => {
                        sealed.resize(at + DATA_HEADER_LEN, 0);
                        sealed.extend_from_slice(&link.header);
                        sealed.extend_from_slice(&self.heads[h.clone()]);
                        rest.copy_into(sealed);
                        sealed.resize(sealed.len() + TAG_LEN, 0);
                        s.seal_in_place(counter + k as u64, &mut sealed[at..])
                            .map_err(crate::crypto::drop_reason)
                    }
                    Err(reason) => Err(*reason),
                };
                match r {
                    Ok(()) => {
                        c.sealed.fetch_add(1, Relaxed);
                        ranges.push(Some(at..sealed.len()));
                    }
                    Err(reason) => {
                        sealed.truncate(at);
                        link.counters.count_drop(reason);
                        ranges.push(Some(at..at));
                    }
                }
            }
            i += n;
        }
        let sealed: &'b Vec<u8> = sealed;
        items.clear();
        let ready = self
            .udp
            .iter()
            .zip(ranges.drain(..))
            .zip(path_of)
            .filter_map(|(((l, h, rest), r), p)| {
                let path = &*paths[*p];
                let prefix = path.prefix();
                match r {
                    None => Some((
                        *l,
                        path,
                        [
                            IoPart::from(prefix),
                            IoPart::from(&l.header[..]),
                            IoPart::from(&self.heads[h.clone()]),
                            rest.part(),
                        ],
                        prefix.len() + VXLAN_HEADER_LEN + h.len() + rest.len(),
                    )),
                    Some(r) if r.is_empty() => None,
                    Some(r) => Some((
                        *l,
                        path,
                        [
                            IoPart::from(prefix),
                            IoPart::from(&sealed[r.clone()]),
                            IoPart::from(&[][..]),
                            IoPart::from(&[][..]),
                        ],
                        prefix.len() + r.len(),
                    )),
                }
            });
        items.extend(ready);
    }

    /// Each queued datagram's link's path, loaded once per run of datagrams to one link (so a
    /// path swapped meanwhile takes effect at the next batch, never half-way through a run).
    fn paths(&self, paths: &mut Vec<Arc<LinkPath>>, of: &mut Vec<usize>) {
        paths.clear();
        of.clear();
        let mut last: Option<*const UdpLinkTx> = None;
        for (l, _, _) in &self.udp {
            let id = *l as *const UdpLinkTx;
            if last != Some(id) {
                paths.push(l.path.load_full());
                last = Some(id);
            }
            of.push(paths.len() - 1);
        }
    }

    /// Sends the batch (see the module header) and empties it.
    pub fn flush(&mut self, offload: &OffloadCounters, daemon: &PortCounters, sock: &VxlanSocket) {
        if self.udp.is_empty() {
            return;
        }
        let mut w = std::mem::take(&mut self.work);
        self.paths(&mut w.paths, &mut w.path_of);
        let mut items: Vec<Ready<'_>> = w.items.take();
        self.ready(
            &mut w.sealed,
            &w.paths,
            &w.path_of,
            &mut w.ranges,
            &mut items,
        );
        // Links by identity, for the pure planner (one path per link within a batch).
        let keys = &mut w.keys;
        keys.clear();
        keys.extend(
            items
                .iter()
                .map(|(l, _, _, len)| (*l as *const UdpLinkTx as usize, *len)),
        );
        let runs = plan_runs(keys, |first, size| {
            sock.gso_enabled() && size < items[first].0.gso_refused.load(Relaxed)
        });
        let mut singles: Vec<(&SockAddr, [IoPart<'_>; 4])> = w.singles.take();
        let send_singles = |singles: &mut Vec<(&SockAddr, [IoPart<'_>; 4])>| {
            if singles.is_empty() {
                return;
            }
            let sent = sock.send_many(singles);
            offload.udp_batch_sends.fetch_add(1, Relaxed);
            for _ in sent..singles.len() {
                daemon.count_drop(DropReason::TxError);
            }
            singles.clear();
        };
        let mut parts: Vec<IoPart<'_>> = w.parts.take();
        for run in runs {
            let range = match run {
                Run::Segmented { range, size } => {
                    let (link, path) = (items[range.start].0, items[range.start].1);
                    parts.clear();
                    for (_, _, p, _) in &items[range.clone()] {
                        parts.extend_from_slice(p);
                    }
                    send_singles(&mut singles);
                    match sock.send_parts(&path.to, &parts, Some(size as u16)) {
                        Ok(()) => {
                            offload.udp_gso_sends.fetch_add(1, Relaxed);
                            continue;
                        }
                        Err(None) => {
                            // Larger than the path MTU: remember, and send these one by one.
                            link.gso_refused.fetch_min(size, Relaxed);
                            range
                        }
                        Err(Some(r)) => {
                            for _ in range {
                                daemon.count_drop(r);
                            }
                            continue;
                        }
                    }
                }
                Run::Singles(range) => range,
            };
            for (_, path, p, _) in &items[range] {
                singles.push((&path.to, *p));
            }
        }
        send_singles(&mut singles);
        w.singles = Spare::keep(singles);
        w.parts = Spare::keep(parts);
        w.items = Spare::keep(items);
        w.paths.clear();
        self.work = w;
        self.udp.clear();
        self.heads.clear();
    }
}

#[cfg(test)]
mod tests;
