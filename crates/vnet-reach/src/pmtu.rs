//! Path-MTU discovery by probing, in the manner of RFC 8899 (datagram PLPMTUD), for one path
//! (a peer's chosen endpoint). The kernel learns a path's MTU only from the ICMP
//! "fragmentation needed" / "packet too big" a router sends back for a DF datagram; where that
//! ICMP is filtered, datagrams larger than the path vanish and the kernel never knows (a black
//! hole). Here the path is asked directly: a probe is a ping padded to the size probed whose
//! pong is padded the same (`wire::FLAG_PAD_REPLY`), authenticated like every ping, so an
//! answer proves that both directions carry that size.
//!
//! The search (RFC 8899's SEARCHING) sends one probe of every candidate size above the largest
//! confirmed one at once, a round, and again when the round's probes timed out: the largest
//! answered size is confirmed at once, and a size unanswered [`MAX_PROBES`] times is too big
//! (and so is every larger one), which ends the search. A path that carries everything is
//! known after one round trip; a smaller one after `MAX_PROBES` probe timeouts. Once found
//! (SEARCH_COMPLETE), the size is confirmed every [`CONFIRM_MS`]: [`MAX_PROBES`] confirmations
//! lost in a row are a black hole (the path shrank, a route changed): the figure drops to
//! BASE_PLPMTU and the search starts again. Every [`RAISE_MS`] a path below its ceiling is
//! searched upward again (RFC 8899's PMTU_RAISE_TIMER, shorter here). The kernel's figure (the
//! route's MTU, or what an ICMP taught it) is a ceiling: never probed above, and the smaller
//! of the two wins. A path that answers nothing, not even BASE, is the reach machine's
//! business (a dead path), not this one's: here it is ERROR, retried later.
//!
//! Sizes are IP packets (what the kernel calls the path MTU); a probe's UDP payload is that
//! less the IP and UDP headers. Pure: the reach machine sends the probes, hands back the pongs
//! and says the time.

use std::net::SocketAddr;

use crate::wire::{MAX_PROBE_LEN, PING_LEN, TXID_LEN};
use crate::Random;

/// The size assumed to pass before anything is known, over IPv4 (RFC 8899 5.1.2 recommends
/// 1200; IPv4 has no minimum beyond 68 that paths honour in practice).
pub const BASE_V4: usize = 1200;
/// The same over IPv6: its minimum link MTU.
pub const BASE_V6: usize = 1280;
/// The largest size probed (a jumbo frame's path).
pub const MAX_PLPMTU: usize = 9000;
/// The candidate sizes, ascending: common tunnel and PPPoE paths below Ethernet's 1500, then
/// jumbo steps. The ceiling itself is a candidate too (the route's MTU when nothing smaller is
/// known), so a path is never held below it for want of a step.
pub const SIZES: [usize; 14] = [
    1200, 1280, 1360, 1400, 1420, 1450, 1472, 1480, 1492, 1500, 2000, 4000, 8000, 9000,
];
/// Probes of one size lost (unanswered) before that size is taken as too big: one lost probe
/// may be loss, three in a row at 1 % loss happen once in a million.
pub const MAX_PROBES: u32 = 3;
/// A probe is lost when not answered within twice the path's round trip and 50 ms, at least
/// this long (a loaded host answers late) ...
pub const MIN_PROBE_TIMEOUT_MS: u64 = 150;
/// ... and at most this long.
pub const MAX_PROBE_TIMEOUT_MS: u64 = 2_000;
/// The found size is confirmed this often (how soon a path that shrank is noticed, plus
/// `MAX_PROBES` probe timeouts). Each confirmation is a full-size ping each way per peer: at
/// 5 s, about 2.4 kbit/s per peer (2.4 Mbit/s for a host with 1,000 direct peers).
pub const CONFIRM_MS: u64 = 5_000;
/// A path below its ceiling is searched upward again this often (RFC 8899: 600 s).
pub const RAISE_MS: u64 = 30_000;
/// A path that answered no probe at all is searched again after this.
pub const ERROR_RETRY_MS: u64 = 5_000;
/// The search waits this long at most for the kernel's figure (its ceiling) before probing
/// up to [`MAX_PLPMTU`]: the caller gives it as soon as the path is chosen.
pub const CEILING_WAIT_MS: u64 = 1_000;

/// The IP and UDP headers in front of a probe's payload.
fn overhead(endpoint: SocketAddr) -> usize {
    if endpoint.is_ipv4() {
        20 + 8
    } else {
        40 + 8
    }
}

/// A probe to send now: its transaction id (recorded as outstanding), the size probed and the
/// UDP payload that makes it that size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOrder {
    pub txid: [u8; TXID_LEN],
    pub size: usize,
    pub payload: usize,
}

/// What a [`Pmtu::due`] call says: probes to send, probes it found lost, and whether the
/// found size just stopped passing (a black hole: the search starts again from BASE).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    pub probes: Vec<ProbeOrder>,
    pub lost: u64,
    pub black_hole: bool,
}

/// An answer to one of this machine's probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The size passed both ways.
    Confirmed(usize),
    /// The pong was shorter than the probe (a peer that did not pad it): not a confirmation,
    /// counted as a lost probe of that size.
    Short(usize),
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    txid: [u8; TXID_LEN],
    size: usize,
    payload: usize,
    sent_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// RFC 8899's BASE and SEARCHING in one: probing every candidate above `confirmed`.
    Search {
        since_ms: u64,
        confirmed: Option<usize>,
        /// Lost probes per size in this search.
        lost: Vec<(usize, u32)>,
        /// The search follows a black hole: until something is confirmed, BASE is used.
        after_black_hole: bool,
    },
    /// SEARCH_COMPLETE: `plpmtu` passes, confirmed every [`CONFIRM_MS`].
    Done {
        plpmtu: usize,
        next_confirm_ms: u64,
        /// Confirmations lost in a row.
        losses: u32,
        next_raise_ms: u64,
    },
    /// Not even BASE was answered.
    Error {
        retry_ms: u64,
        after_black_hole: bool,
    },
}

/// One path's probing state.
#[derive(Debug, Clone)]
pub struct Pmtu {
    endpoint: SocketAddr,
    base: usize,
    ceiling: Option<usize>,
    state: State,
    outstanding: Vec<Probe>,
    started_ms: u64,
    /// How long the last search that found a size took, ms.
    search_ms: Option<u64>,
}

impl Pmtu {
    /// A new path to `endpoint`: the search starts at the next [`Pmtu::due`] (once the
    /// ceiling is known, or after [`CEILING_WAIT_MS`]).
    pub fn new(endpoint: SocketAddr, now_ms: u64) -> Pmtu {
        Pmtu {
            endpoint,
            base: if endpoint.is_ipv4() { BASE_V4 } else { BASE_V6 },
            ceiling: None,
            state: State::Search {
                since_ms: now_ms,
                confirmed: None,
                lost: Vec::new(),
                after_black_hole: false,
            },
            outstanding: Vec::new(),
            started_ms: now_ms,
            search_ms: None,
        }
    }

    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    pub fn base(&self) -> usize {
        self.base
    }

    /// The kernel's figure for this path (the route's MTU, or a smaller one an ICMP taught
    /// it), when it has one: never probed above; a found size above it comes down to it.
    pub fn set_ceiling(&mut self, ceiling: Option<usize>) {
        self.ceiling = ceiling.map(|c| c.min(MAX_PLPMTU));
        if let (Some(c), State::Done { plpmtu, .. }) = (self.ceiling, &mut self.state) {
            if c < *plpmtu {
                *plpmtu = c;
            }
        }
    }

    pub fn ceiling(&self) -> Option<usize> {
        self.ceiling
    }

    /// The size probing found (or, while searching, the largest confirmed so far; BASE after a
    /// black hole until something is): `None` while nothing is known.
    pub fn probed(&self) -> Option<usize> {
        match &self.state {
            State::Search {
                confirmed,
                after_black_hole,
                ..
            } => confirmed.or(after_black_hole.then_some(self.base)),
            State::Done { plpmtu, .. } => Some(*plpmtu),
            State::Error {
                after_black_hole, ..
            } => after_black_hole.then_some(self.base),
        }
    }

    /// The path's MTU to use: the probed size and the kernel's, the smaller; the kernel's
    /// alone while probing knows nothing yet (a new path is not taken for a black hole before
    /// a probe says so).
    pub fn mtu(&self) -> Option<usize> {
        match (self.probed(), self.ceiling) {
            (Some(p), Some(c)) => Some(p.min(c)),
            (p, c) => p.or(c),
        }
    }

    /// `searching`, `done`, `black-hole` (searching again after one) or `error`.
    pub fn state_word(&self) -> &'static str {
        match &self.state {
            State::Search {
                after_black_hole: true,
                ..
            } => "black-hole",
            State::Search { .. } => "searching",
            State::Done { .. } => "done",
            State::Error { .. } => "error",
        }
    }

    /// How long the last search that found a size took (from its start to the size known).
    pub fn search_ms(&self) -> Option<u64> {
        self.search_ms
    }

    /// The sizes to search among, ascending: the candidates from BASE up to the ceiling, and
    /// the ceiling itself. Empty when the ceiling is below BASE (the kernel knows better).
    fn candidates(&self) -> Vec<usize> {
        let top = self.ceiling.unwrap_or(MAX_PLPMTU).min(MAX_PLPMTU);
        if top < self.base {
            return Vec::new();
        }
        let mut v: Vec<usize> = std::iter::once(self.base)
            .chain(SIZES.iter().copied())
            .filter(|s| *s >= self.base && *s <= top)
            .collect();
        v.push(top);
        v.sort_unstable();
        v.dedup();
        v
    }

    fn timeout_us(rtt_us: Option<u64>) -> u64 {
        let t = rtt_us.map_or(0, |r| 2 * r / 1000 + 50);
        t.clamp(MIN_PROBE_TIMEOUT_MS, MAX_PROBE_TIMEOUT_MS) * 1000
    }

    fn search(&mut self, now_ms: u64, confirmed: Option<usize>, after_black_hole: bool) {
        self.outstanding.clear();
        self.state = State::Search {
            since_ms: now_ms,
            confirmed,
            lost: Vec::new(),
            after_black_hole,
        };
    }

    fn finish(&mut self, plpmtu: usize, now_ms: u64) {
        if let State::Search { since_ms, .. } = self.state {
            self.search_ms = Some(now_ms.saturating_sub(since_ms));
        }
        self.outstanding.clear();
        self.state = State::Done {
            plpmtu,
            next_confirm_ms: now_ms + CONFIRM_MS,
            losses: 0,
            next_raise_ms: now_ms + RAISE_MS,
        };
    }

    /// A probe of `size` was lost (timed out, or answered short).
    fn lost(&mut self, size: usize) {
        match &mut self.state {
            State::Search { lost, .. } => match lost.iter_mut().find(|(s, _)| *s == size) {
                Some((_, n)) => *n += 1,
                None => lost.push((size, 1)),
            },
            State::Done { plpmtu, losses, .. } if size >= *plpmtu => *losses += 1,
            _ => {}
        }
    }

    /// Probes that timed out are lost; the state moves on; the probes to send now (recorded
    /// as outstanding, sent at `now_us`). `rtt_us`: the path's smoothed round trip.
    pub fn due(&mut self, now_us: u64, rtt_us: Option<u64>, rng: &mut dyn Random) -> Due {
        let now_ms = now_us / 1000;
        let timeout = Self::timeout_us(rtt_us);
        let mut due = Due::default();
        let (expired, kept): (Vec<Probe>, Vec<Probe>) = self
            .outstanding
            .iter()
            .partition(|p| now_us.saturating_sub(p.sent_us) >= timeout);
        self.outstanding = kept;
        for p in expired {
            due.lost += 1;
            self.lost(p.size);
        }
        if self.ceiling.is_none() && now_ms < self.started_ms + CEILING_WAIT_MS {
            return due;
        }
        let cands = self.candidates();
        let Some(&top) = cands.last() else {
            return due;
        };
        let mut sizes: Vec<usize> = Vec::new();
        // At most a few moves (a black hole or a raise starts a search, whose round goes out
        // at once).
        for _ in 0..3 {
            match &mut self.state {
                State::Search {
                    confirmed, lost, ..
                } => {
                    let confirmed = *confirmed;
                    let above = |s: &usize| confirmed.is_none_or(|c| *s > c);
                    // Probes at or below the confirmed size, or above the ceiling: moot.
                    self.outstanding.retain(|p| p.size <= top && above(&p.size));
                    let lost_of =
                        |s: usize| lost.iter().find(|(x, _)| *x == s).map_or(0, |(_, n)| *n);
                    let too_big = cands
                        .iter()
                        .copied()
                        .find(|s| lost_of(*s) >= MAX_PROBES)
                        .unwrap_or(usize::MAX);
                    let next = cands.iter().copied().find(above);
                    match next {
                        None => self.finish(confirmed.unwrap_or(top), now_ms),
                        Some(n) if n >= too_big => match confirmed {
                            Some(c) => self.finish(c, now_ms),
                            None => {
                                let after_black_hole = matches!(
                                    self.state,
                                    State::Search {
                                        after_black_hole: true,
                                        ..
                                    }
                                );
                                self.outstanding.clear();
                                self.state = State::Error {
                                    retry_ms: now_ms + ERROR_RETRY_MS,
                                    after_black_hole,
                                };
                            }
                        },
                        Some(_) => {
                            if self.outstanding.is_empty() {
                                // A round: every size above the confirmed one, below the
                                // smallest known too big.
                                sizes.extend(
                                    cands.iter().copied().filter(|s| above(s) && *s < too_big),
                                );
                            }
                            break;
                        }
                    }
                }
                State::Done {
                    plpmtu,
                    next_confirm_ms,
                    losses,
                    next_raise_ms,
                } => {
                    if *losses >= MAX_PROBES {
                        due.black_hole = true;
                        self.search(now_ms, None, true);
                        continue;
                    }
                    if now_ms >= *next_raise_ms && self.outstanding.is_empty() {
                        *next_raise_ms = now_ms + RAISE_MS;
                        if *plpmtu < top {
                            let p = *plpmtu;
                            self.search(now_ms, Some(p), false);
                            continue;
                        }
                    }
                    if self.outstanding.is_empty() && (now_ms >= *next_confirm_ms || *losses > 0) {
                        *next_confirm_ms = now_ms + CONFIRM_MS;
                        sizes.push(*plpmtu);
                    }
                    break;
                }
                State::Error {
                    retry_ms,
                    after_black_hole,
                } => {
                    if now_ms >= *retry_ms {
                        let b = *after_black_hole;
                        self.search(now_ms, None, b);
                        continue;
                    }
                    break;
                }
            }
        }
        let overhead = overhead(self.endpoint);
        for size in sizes {
            let payload = size.saturating_sub(overhead).clamp(PING_LEN, MAX_PROBE_LEN);
            let mut txid = [0u8; TXID_LEN];
            rng.fill(&mut txid);
            self.outstanding.push(Probe {
                txid,
                size,
                payload,
                sent_us: now_us,
            });
            due.probes.push(ProbeOrder {
                txid,
                size,
                payload,
            });
        }
        due
    }

    /// A pong answering `txid` arrived, `len` bytes of UDP payload: `None` if it answers no
    /// probe of this machine (it may answer a plain ping).
    pub fn on_pong(&mut self, txid: [u8; TXID_LEN], len: usize, now_ms: u64) -> Option<Answer> {
        let i = self.outstanding.iter().position(|p| p.txid == txid)?;
        let p = self.outstanding.swap_remove(i);
        if len < p.payload {
            self.lost(p.size);
            return Some(Answer::Short(p.size));
        }
        let top = self.candidates().last().copied();
        match &mut self.state {
            State::Search { confirmed, .. } => {
                let c = confirmed.map_or(p.size, |c| c.max(p.size));
                *confirmed = Some(c);
                if top.is_some_and(|t| c >= t) {
                    self.finish(c, now_ms);
                }
            }
            State::Done { plpmtu, losses, .. } => {
                if p.size >= *plpmtu {
                    *losses = 0;
                }
            }
            State::Error { .. } => {}
        }
        Some(Answer::Confirmed(p.size))
    }

    /// When [`Pmtu::due`] next has something to do, ms.
    pub fn next_wake_ms(&self, now_ms: u64, rtt_us: Option<u64>) -> u64 {
        let timeout_ms = Self::timeout_us(rtt_us) / 1000;
        let mut t = u64::MAX;
        for p in &self.outstanding {
            t = t.min(p.sent_us / 1000 + timeout_ms);
        }
        if self.ceiling.is_none() && now_ms < self.started_ms + CEILING_WAIT_MS {
            return t.min(self.started_ms + CEILING_WAIT_MS);
        }
        if self.candidates().is_empty() {
            return t.max(now_ms);
        }
        match &self.state {
            State::Search { .. } if self.outstanding.is_empty() => t = now_ms,
            State::Search { .. } => {}
            State::Done {
                next_confirm_ms,
                losses,
                next_raise_ms,
                ..
            } => {
                if self.outstanding.is_empty() {
                    t = t.min(if *losses > 0 {
                        now_ms
                    } else {
                        *next_confirm_ms
                    });
                }
                t = t.min(*next_raise_ms);
            }
            State::Error { retry_ms, .. } => t = t.min(*retry_ms),
        }
        t.max(now_ms)
    }
}

#[cfg(test)]
mod tests;
