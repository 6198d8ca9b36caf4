//! The threads that read a session's watches and hand their messages to the session's loop:
//! the lasting watch, which starts now, and when the agent's state is older than that, a
//! catch-up watch from the state's revision, closed once the session's loop says it is
//! complete. Why two: see [`splice`](crate::splice); what the messages mean is the
//! [`Machine`](crate::machine::Machine)'s to decide.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use vnet_etcd::{Client, Error, WatchMessage};

use crate::keepalive::KeepAlive;

/// How long the catch-up's reader waits for a message before it looks whether it should stop.
const CATCH_UP_POLL: Duration = Duration::from_millis(100);

/// A message for the session's loop, in the order its watch sent it.
#[derive(Debug)]
pub enum Heard {
    /// A message of the lasting watch.
    Lasting(Result<WatchMessage, Error>),
    /// Every key range of the lasting watch was created, the last after revision `through`;
    /// whether a catch-up watch was opened (the state, at `from - 1`, is older). Sent before
    /// any event of the lasting watch.
    Joined { through: i64, catch_up: bool },
    /// A message of the catch-up watch.
    CatchUp(Result<WatchMessage, Error>),
}

/// What the threads need.
pub struct Watches {
    pub client: Arc<Client>,
    /// The lasting watch's key ranges.
    pub lasting: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The catch-up's key ranges (other than the lasting watch's).
    pub catch_up: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The first revision the agent's state lacks.
    pub from: i64,
    pub tx: Sender<Heard>,
    /// The session ended.
    pub stop: Arc<AtomicBool>,
    /// The catch-up is complete (or the session ended).
    pub catch_up_stop: Arc<AtomicBool>,
    /// Told which endpoint serves the lasting watch.
    pub keepalive: Arc<KeepAlive>,
}

/// Starts the lasting watch's reader, which opens the catch-up when its ranges are created.
pub fn spawn(w: Watches) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("etcd-watch".into())
        .spawn(move || lasting(w))
        .map(|_| ())
}

fn lasting(w: Watches) {
    let mut watch = match w.client.watch_ranges(&w.lasting, 0) {
        Ok(watch) => watch,
        Err(e) => {
            let _ = w.tx.send(Heard::Lasting(Err(e)));
            return;
        }
    };
    w.keepalive.watch_endpoint.store(watch.endpoint(), Relaxed);
    // Until every range is created, events wait here: the loop must know where the lasting
    // watch starts before it takes any of them.
    let mut created = 0;
    let mut through = 0;
    let mut held = Vec::new();
    loop {
        let m = watch.next_message();
        let ended = m.is_err();
        if created < w.lasting.len() {
            if let Ok(WatchMessage::Created { revision, .. }) = &m {
                created += 1;
                through = through.max(*revision);
                if w.tx.send(Heard::Lasting(m)).is_err() {
                    return;
                }
                if created == w.lasting.len() && !joined(&w, through, held.drain(..)) {
                    return;
                }
                continue;
            }
            if matches!(
                m,
                Ok(WatchMessage::Events { .. } | WatchMessage::Progress { .. })
            ) {
                held.push(m);
                continue;
            }
        }
        if w.stop.load(Relaxed) || w.tx.send(Heard::Lasting(m)).is_err() || ended {
            return;
        }
    }
}

/// Every range of the lasting watch is created: says where it starts, opens the catch-up if
/// the state is older, then hands over the messages `held` back. False: the session is over.
fn joined(
    w: &Watches,
    through: i64,
    held: impl Iterator<Item = Result<WatchMessage, Error>>,
) -> bool {
    let catch_up = w.from <= through;
    if w.tx.send(Heard::Joined { through, catch_up }).is_err() {
        return false;
    }
    if catch_up {
        let (client, ranges, from) = (w.client.clone(), w.catch_up.clone(), w.from);
        let (tx, stop, done) = (w.tx.clone(), w.stop.clone(), w.catch_up_stop.clone());
        let spawned = std::thread::Builder::new()
            .name("etcd-catch-up".into())
            .spawn(move || read_catch_up(&client, &ranges, from, &tx, &stop, &done));
        if let Err(e) = spawned {
            let err = Error::WatchEnded(format!("cannot start the catch-up's reader: {e}"));
            let _ = w.tx.send(Heard::CatchUp(Err(err)));
            return false;
        }
    }
    held.into_iter()
        .all(|m| w.tx.send(Heard::Lasting(m)).is_ok())
}

/// Reads the catch-up watch until the session's loop says it is complete; dropping the watch
/// closes its stream (and the proxy's watch on etcd with it, if it was the last on it).
fn read_catch_up(
    client: &Client,
    ranges: &[(Vec<u8>, Option<Vec<u8>>)],
    from: i64,
    tx: &Sender<Heard>,
    stop: &AtomicBool,
    done: &AtomicBool,
) {
    let mut watch = match client.watch_ranges(ranges, from) {
        Ok(watch) => watch,
        Err(e) => {
            let _ = tx.send(Heard::CatchUp(Err(e)));
            return;
        }
    };
    while !stop.load(Relaxed) && !done.load(Relaxed) {
        match watch.next_message_within(CATCH_UP_POLL) {
            Ok(None) => {}
            Ok(Some(m)) => {
                if tx.send(Heard::CatchUp(Ok(m))).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Heard::CatchUp(Err(e)));
                return;
            }
        }
    }
}
