//! The threads that read a session's watches and hand their messages to the session's loop:
//! the lasting watch, which starts just past etcd's current revision, and a catch-up watch
//! from the agent's state's revision up to there, closed once the session's loop says it is
//! complete. Why two: see [`splice`](crate::splice); what the messages mean is the
//! [`Machine`](crate::machine::Machine)'s to decide.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use vnet_etcd::{Client, Error, WatchMessage};

use crate::keepalive::KeepAlive;

/// How long a reader waits for a message before it looks whether it should stop (a watch no
/// longer read is dropped within this, although nothing happens on its keys).
const STOP_POLL: Duration = Duration::from_millis(500);

/// A message for the session's loop, in the order its watch sent it.
#[derive(Debug)]
pub enum Heard {
    /// The lasting watch starts after revision `through`; whether a catch-up watch was opened
    /// (the state, at `from - 1`, is older). Sent before any message of either watch.
    Joined { through: i64, catch_up: bool },
    /// A message of the lasting watch.
    Lasting(Result<WatchMessage, Error>),
    /// A message of the catch-up watch.
    CatchUp(Result<WatchMessage, Error>),
}

/// What the threads need.
pub struct Watches {
    pub client: Arc<Client>,
    /// A key whose read tells etcd's current revision (cheap: one key, no value).
    pub probe: Vec<u8>,
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

/// Starts the lasting watch's reader, which first opens the catch-up if the state is older
/// than where the lasting watch starts.
pub fn spawn(w: Watches) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("etcd-watch".into())
        .spawn(move || lasting(w))
        .map(|_| ())
}

fn lasting(w: Watches) {
    let now = match w.client.count(&w.probe, None) {
        Ok(r) => r.revision,
        Err(e) => {
            let _ = w.tx.send(Heard::Lasting(Err(e)));
            return;
        }
    };
    // From just after it: a watch that starts at or after the proxy's shared broadcast's next
    // revision joins it at once (unless an event came between this read and the watch's
    // creation); one from now (revision 0) would wait with others for a broadcast of its own.
    let through = now.max(w.from - 1);
    let catch_up = w.from <= through;
    if w.tx.send(Heard::Joined { through, catch_up }).is_err() {
        return;
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
            return;
        }
    }
    let mut watch = match w.client.watch_ranges(&w.lasting, through + 1) {
        Ok(watch) => watch,
        Err(e) => {
            let _ = w.tx.send(Heard::Lasting(Err(e)));
            return;
        }
    };
    w.keepalive.watch_endpoint.store(watch.endpoint(), Relaxed);
    while !w.stop.load(Relaxed) {
        let Some(m) = watch.next_message_within(STOP_POLL).transpose() else {
            continue;
        };
        let ended = m.is_err();
        if w.stop.load(Relaxed) || w.tx.send(Heard::Lasting(m)).is_err() || ended {
            return;
        }
    }
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
        match watch.next_message_within(STOP_POLL) {
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
