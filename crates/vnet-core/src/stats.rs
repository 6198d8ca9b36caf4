use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a frame, datagram or connection was dropped. Every drop in vnet has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    Truncated,
    Oversize,
    BadVxlan,
    UnknownVni,
    UnknownPeer,
    BadStream,
    NoRoute,
    NotForOverlay,
    QueueFull,
    TxError,
    BadOffload,
    /// An encrypted-link datagram that did not authenticate (or plaintext VXLAN on an
    /// encrypted link).
    BadAuth,
    /// An encrypted-link datagram or handshake initiation seen before.
    Replay,
    /// A frame for, or a datagram from, an encrypted link that has no session (yet).
    NoSession,
    /// A handshake message that was malformed, for another key, or unexpected.
    BadHandshake,
    /// A guest sent a frame whose source MAC is not its interface's (and `any-source` is off).
    SpoofedSrc,
    /// The port's token bucket (`rate`) was empty; or an encrypted link's handshake budget
    /// was spent (a flood), or, under such load, a handshake message came without the cookie
    /// MAC the link asked its peer for.
    RateLimited,
    /// An encrypted link's handshake message without a valid MAC (v3's `mac1`: the sender
    /// does not know this host's public key), or a cookie reply that did not authenticate:
    /// refused before any key-exchange work.
    BadMac,
    /// A frame larger than its link's path carries (its path MTU, learned): not sent, its
    /// sender told so (ICMP "fragmentation needed" / "packet too big", as the kernel's VXLAN
    /// does) so that its TCP sends smaller segments.
    TooBig,
}

impl DropReason {
    pub const ALL: [DropReason; 19] = [
        DropReason::Truncated,
        DropReason::Oversize,
        DropReason::BadVxlan,
        DropReason::UnknownVni,
        DropReason::UnknownPeer,
        DropReason::BadStream,
        DropReason::NoRoute,
        DropReason::NotForOverlay,
        DropReason::QueueFull,
        DropReason::TxError,
        DropReason::BadOffload,
        DropReason::BadAuth,
        DropReason::Replay,
        DropReason::NoSession,
        DropReason::BadHandshake,
        DropReason::SpoofedSrc,
        DropReason::RateLimited,
        DropReason::BadMac,
        DropReason::TooBig,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::Oversize => "oversize",
            DropReason::BadVxlan => "bad_vxlan",
            DropReason::UnknownVni => "unknown_vni",
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::BadStream => "bad_stream",
            DropReason::NoRoute => "no_route",
            DropReason::NotForOverlay => "not_for_overlay",
            DropReason::QueueFull => "queue_full",
            DropReason::TxError => "tx_error",
            DropReason::BadOffload => "bad_offload",
            DropReason::BadAuth => "bad_auth",
            DropReason::Replay => "replay",
            DropReason::NoSession => "no_session",
            DropReason::BadHandshake => "bad_handshake",
            DropReason::SpoofedSrc => "spoofed_src",
            DropReason::RateLimited => "rate_limited",
            DropReason::BadMac => "bad_mac",
            DropReason::TooBig => "too_big",
        }
    }

    fn index(&self) -> usize {
        *self as usize
    }
}

/// Lock-free counters of one port (or of the daemon itself), updated by the forwarding threads.
#[derive(Debug, Default)]
pub struct PortCounters {
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    drops: [AtomicU64; DropReason::ALL.len()],
}

impl PortCounters {
    pub fn rx(&self, bytes: usize) {
        self.rx_frames.fetch_add(1, Relaxed);
        self.rx_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub fn tx(&self, bytes: usize) {
        self.tx_frames.fetch_add(1, Relaxed);
        self.tx_bytes.fetch_add(bytes as u64, Relaxed);
    }

    pub fn count_drop(&self, reason: DropReason) {
        self.drops[reason.index()].fetch_add(1, Relaxed);
    }

    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()].load(Relaxed)
    }

    pub fn snapshot(&self) -> PortCountersSnapshot {
        PortCountersSnapshot {
            rx_frames: self.rx_frames.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_frames: self.tx_frames.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            drops: DropReason::ALL
                .iter()
                .filter_map(|r| {
                    let n = self.drops(*r);
                    (n > 0).then(|| (r.as_str().to_string(), n))
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PortCountersSnapshot {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub drops: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let c = PortCounters::default();
        c.rx(100);
        c.tx(60);
        c.count_drop(DropReason::NoRoute);
        c.count_drop(DropReason::NoRoute);
        let s = c.snapshot();
        assert_eq!(
            (s.rx_frames, s.rx_bytes, s.tx_frames, s.tx_bytes),
            (1, 100, 1, 60)
        );
        assert_eq!(s.drops.get("no_route"), Some(&2));
        assert_eq!(s.drops.len(), 1);
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
