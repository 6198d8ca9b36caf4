//! Underlay changes as the kernel announces them (rtnetlink multicast: IPv4 routes and rules,
//! neighbours, links, IPv4 addresses). Any of them may move a link's outer next hop, which the
//! kernel fast path caches per CPU for up to a second; the watcher's thread calls back so the
//! cache is forgotten within milliseconds instead. Events are coalesced: at most one call per
//! [`MIN_GAP`], and always one after the last event.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use tracing::warn;

use crate::sys::{self, EventFd, Wake};
use crate::worker::Worker;

const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV4_RULE: u32 = 8;

/// The shortest time between two calls.
pub const MIN_GAP: Duration = Duration::from_millis(10);

/// The watcher's thread (in the network namespace of the thread that starts it); stopped and
/// joined when dropped.
pub struct UnderlayWatch {
    _worker: Worker,
}

impl UnderlayWatch {
    /// Subscribes to the events and calls `on_change` after each burst of them.
    pub fn start(on_change: impl Fn() + Send + 'static) -> io::Result<UnderlayWatch> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        for g in [
            RTNLGRP_LINK,
            RTNLGRP_NEIGH,
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV4_ROUTE,
            RTNLGRP_IPV4_RULE,
        ] {
            sock.add_membership(g)?;
        }
        let worker = Worker::spawn("vnet-underlay".into(), move |stop| {
            run(&sock, &stop, &on_change)
        })?;
        Ok(UnderlayWatch { _worker: worker })
    }
}

fn run(sock: &Socket, stop: &EventFd, on_change: &dyn Fn()) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut last: Option<Instant> = None;
    loop {
        match sys::wait_readable(sock.as_raw_fd(), stop, None) {
            Ok(Wake::Stop) => return,
            Ok(_) => {}
            Err(e) => {
                // Cannot happen on a live socket; if it does, fall back to calling regularly.
                warn!("underlay watch: {e}");
                if stopped_within(stop, Duration::from_millis(100)) {
                    return;
                }
                on_change();
                continue;
            }
        }
        if let Some(since) = last.map(|t| t.elapsed()) {
            // Events arriving while this waits are covered by the call that follows.
            if since < MIN_GAP && stopped_within(stop, MIN_GAP - since) {
                return;
            }
        }
        drain(sock, &mut buf);
        on_change();
        last = Some(Instant::now());
    }
}

/// Waits up to `d`; true when told to stop meanwhile.
fn stopped_within(stop: &EventFd, d: Duration) -> bool {
    let ms = d.as_millis().clamp(1, i32::MAX as u128) as i32;
    sys::poll_one(stop.as_raw_fd(), libc::POLLIN, ms).unwrap_or(false)
}

/// Reads every queued message (their content does not matter: any may move a next hop).
fn drain(sock: &Socket, buf: &mut Vec<u8>) {
    loop {
        buf.clear();
        match sock.recv(buf, libc::MSG_DONTWAIT) {
            Ok(_) => {}
            // The queue overflowed: events were lost, and the call that follows covers them.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(_) => return, // EAGAIN: empty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;

    use crate::testing::{ip, private_netns};

    #[test]
    fn changes_are_reported_and_coalesced() {
        // (the watcher thread started below inherits the namespace)
        if !private_netns() {
            return;
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let w = UnderlayWatch::start(move || {
            c.fetch_add(1, Relaxed);
        })
        .expect("watch starts");
        let wait_for = |n: usize| {
            let t0 = Instant::now();
            while calls.load(Relaxed) < n && t0.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(1));
            }
            t0.elapsed()
        };
        // A link and a neighbour appear: reported within milliseconds.
        ip("link add w0 type veth peer name w1");
        assert!(wait_for(1) < Duration::from_millis(500));
        ip("link set w0 up");
        ip("addr add 10.77.0.1/24 dev w0");
        ip("neigh replace 10.77.0.2 lladdr 02:00:00:00:00:02 dev w0 nud permanent");
        let before = calls.load(Relaxed);
        ip("neigh replace 10.77.0.2 lladdr 02:00:00:00:00:03 dev w0 nud permanent");
        wait_for(before + 1);
        assert!(calls.load(Relaxed) > before, "a neighbour change");
        // A burst of 100 changes: at most one call per MIN_GAP (and one after the last).
        let t0 = Instant::now();
        let before = calls.load(Relaxed);
        for i in 0..100 {
            ip(&format!("route replace 10.78.{i}.0/24 via 10.77.0.2"));
        }
        std::thread::sleep(MIN_GAP * 3);
        let n = calls.load(Relaxed) - before;
        let most = (t0.elapsed().as_millis() / MIN_GAP.as_millis()) as usize + 1;
        assert!((1..=most).contains(&n), "{n} calls, at most {most}");
        drop(w); // stops and joins
    }
}
