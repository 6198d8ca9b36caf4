//! The data path's side of reach (issue #31, `docs/design/reach.md`): where a reach link's
//! datagrams go now (its [`LinkPath`], swapped whole when vnetd's reach thread chooses another
//! path), the bounded hand-over of reach's own datagrams (pings, pongs, STUN answers) from the
//! VXLAN socket's reader to that thread, and a relay's forwarding table. The decisions are
//! `vnet-reach`'s; this module only carries them out.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use socket2::SockAddr;
use vnet_core::DropReason;
use vnet_reach::wire::{relay_header, RELAY_HEADER_LEN};
use vnet_reach::{RelayTable, Tag};

/// Reach datagrams waiting for the reach thread, at most (a flood beyond is dropped, counted).
pub const INBOX_DEPTH: usize = 1024;

/// Where a udp link's datagrams go: its peer's endpoint, or a relay's with the header that
/// names the peer in front of every datagram.
#[derive(Debug, Clone)]
pub struct LinkPath {
    pub to: SockAddr,
    pub relay_header: Option<[u8; RELAY_HEADER_LEN]>,
    /// The largest IP packet of a guest the path carries whole, when its MTU is known (a reach
    /// link's): a larger one is not sent and its sender is told (`too_big`).
    pub limit: Option<usize>,
}

impl LinkPath {
    pub fn direct(to: SocketAddr) -> LinkPath {
        LinkPath {
            to: SockAddr::from(to),
            relay_header: None,
            limit: None,
        }
    }

    /// Through the relay at `relay` to the peer tagged `peer`.
    pub fn relayed(relay: SocketAddr, peer: Tag) -> LinkPath {
        LinkPath {
            to: SockAddr::from(relay),
            relay_header: Some(relay_header(peer)),
            limit: None,
        }
    }

    /// The same path, its MTU (the largest outer IP packet) known: what of it a guest's IP
    /// packet may take, after the outer IP (20 bytes; 40 over IPv6) and UDP headers, this
    /// path's prefix, VXLAN and the inner Ethernet header, and `extra` (an encrypted link's).
    pub fn with_mtu(mut self, mtu: Option<usize>, outer_v6: bool, extra: usize) -> LinkPath {
        let outer = if outer_v6 { 40 } else { 20 } + 8 + self.prefix().len() + 8 + 14 + extra;
        self.limit = mtu.map(|m| m.saturating_sub(outer));
        self
    }

    /// The bytes in front of every datagram (empty on a direct path).
    pub fn prefix(&self) -> &[u8] {
        self.relay_header.as_ref().map_or(&[][..], |h| &h[..])
    }
}

/// A link's current path, shared by its sending side and its handshakes.
pub type PathCell = ArcSwap<LinkPath>;

/// What a socket address is written as for this socket: an IPv4 peer of an IPv6 socket is
/// IPv4-mapped.
pub fn for_socket(to: SocketAddr, socket_is_v6: bool) -> SocketAddr {
    match (socket_is_v6, to) {
        (true, SocketAddr::V4(v4)) => {
            SocketAddr::new(std::net::IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
        }
        _ => to,
    }
}

/// How vnetd's reach thread is reached from the data path, and the relay's table; set once
/// when vnetd starts reach (without it, reach's datagrams are dropped as not VXLAN).
#[derive(Default)]
pub struct ReachEdge {
    inbox: OnceLock<SyncSender<(SocketAddr, Vec<u8>)>>,
    relay: OnceLock<Arc<Mutex<RelayTable>>>,
    /// Reach datagrams handed to the reach thread.
    pub handed: AtomicU64,
    /// Reach datagrams dropped because the reach thread's inbox was full (or absent).
    pub inbox_full: AtomicU64,
    /// Relay datagrams that arrived from a relay for one of our reach links.
    pub relayed_in: AtomicU64,
    /// Relay datagrams from anyone but a relay this host is bound to: dropped.
    pub relayed_unknown: AtomicU64,
    /// Guests told that a frame did not fit its link's path (ICMP "fragmentation needed" /
    /// "packet too big" sent back).
    pub too_big_answered: AtomicU64,
    /// Guests' IPv4 datagrams without DF too large for their link's path, cut into
    /// fragments that fit (`fragment.rs`) instead.
    pub fragmented: AtomicU64,
}

impl ReachEdge {
    /// Opens the inbox; the receiver is the reach thread's. Only once.
    pub fn open_inbox(&self) -> Option<Receiver<(SocketAddr, Vec<u8>)>> {
        let (tx, rx) = sync_channel(INBOX_DEPTH);
        self.inbox.set(tx).ok().map(|_| rx)
    }

    /// Makes this host a relay with `table`. Only once.
    pub fn set_relay(&self, table: Arc<Mutex<RelayTable>>) -> bool {
        self.relay.set(table).is_ok()
    }

    pub fn relay(&self) -> Option<&Arc<Mutex<RelayTable>>> {
        self.relay.get()
    }

    /// Whether this daemon runs reach (its reach thread opened the inbox).
    pub fn enabled(&self) -> bool {
        self.inbox.get().is_some()
    }

    /// Hands a reach datagram to the reach thread (copied). Not taken: without reach it is
    /// no datagram this daemon knows (`bad_vxlan`, as before reach); with a full inbox, a
    /// flood (`queue_full`, and `inbox_full` in `show reach`).
    pub fn hand_over(&self, from: SocketAddr, bytes: &[u8]) -> Result<(), DropReason> {
        let Some(tx) = self.inbox.get() else {
            return Err(DropReason::BadVxlan);
        };
        match tx.try_send((from, bytes.to_vec())) {
            Ok(()) => {
                self.handed.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.inbox_full.fetch_add(1, Relaxed);
                Err(DropReason::QueueFull)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_is_bounded_and_counts() {
        let e = ReachEdge::default();
        let from: SocketAddr = "10.0.0.1:4789".parse().unwrap();
        assert_eq!(
            e.hand_over(from, b"x"),
            Err(DropReason::BadVxlan),
            "no reach here"
        );
        let rx = e.open_inbox().unwrap();
        assert!(e.open_inbox().is_none());
        let full = (0..INBOX_DEPTH + 10)
            .filter(|_| e.hand_over(from, b"ping") == Err(DropReason::QueueFull))
            .count();
        assert_eq!(full, 10);
        assert_eq!(e.handed.load(Relaxed), INBOX_DEPTH as u64);
        assert_eq!(e.inbox_full.load(Relaxed), 10);
        assert_eq!(rx.try_recv().unwrap(), (from, b"ping".to_vec()));
    }

    #[test]
    fn paths() {
        let d = LinkPath::direct("198.51.100.1:4789".parse().unwrap());
        assert!(d.prefix().is_empty());
        let r = LinkPath::relayed("198.51.100.9:4789".parse().unwrap(), Tag([7; 8]));
        assert_eq!(r.prefix().len(), RELAY_HEADER_LEN);
        // A 1500-byte path: 1450 for a guest's packet directly, 1438 relayed, 32 less
        // encrypted; 1280 over IPv6 leaves 1210.
        assert_eq!(d.clone().with_mtu(Some(1500), false, 0).limit, Some(1450));
        assert_eq!(r.clone().with_mtu(Some(1500), false, 0).limit, Some(1438));
        assert_eq!(r.clone().with_mtu(Some(1500), false, 32).limit, Some(1406));
        assert_eq!(d.clone().with_mtu(Some(1280), true, 0).limit, Some(1210));
        assert_eq!(d.with_mtu(None, false, 0).limit, None);
        assert_eq!(&r.prefix()[4..], &[7; 8]);
        assert_eq!(
            for_socket("10.0.0.1:1".parse().unwrap(), true),
            "[::ffff:10.0.0.1]:1".parse::<SocketAddr>().unwrap()
        );
    }
}
