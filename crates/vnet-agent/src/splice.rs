//! A session's watch in two parts, joined without a gap or a step back (issue #19). Pure, so
//! the joining rules are tested without etcd.
//!
//! Why: etcd's gRPC proxy shares one watch on etcd among its clients' identical watches, but
//! only among those that start at or after the shared one's next revision; a watch that
//! starts in the past gets a watch of its own on etcd, which then attracts later ones, and two
//! shared watches of 5 or more clients each are never merged again (`maxCoalesceReceivers`).
//! An agent that watched on from its snapshot's revision (often one the proxy had cached, from
//! before the last registrations) started in the past every time, so after a cold start of
//! 1,000 hosts etcd sent each event to 16 watchers in some runs and to 94 in others.
//!
//! So a session's lasting watch starts just after etcd's current revision (`through`, read
//! first), where the proxy's shared watch is, and what happened between the state the agent
//! holds (`resume`) and `through` comes from a second, short watch (the catch-up) over a
//! different key range, so that the proxy never mixes the two kinds. The catch-up ends as soon as it has delivered an event at or past `through`
//! (etcd delivers a watch's events in revision order, a revision's events in one message).
//!
//! While both run, an event can come from either, in any interleaving: the lasting watch's
//! events are applied as they come and their keys are its own from then on; the catch-up's
//! are applied only up to `through` and only to keys the lasting watch has not touched. The
//! state then ends where a single watch would have left it. The point a next session resumes
//! from stays at the catch-up's progress until it ends (a resumed session replays from there,
//! in order, so nothing is lost by resuming early).

use std::collections::BTreeSet;

/// What the lasting watch has applied while the catch-up runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    through: i64,
    touched: BTreeSet<Vec<u8>>,
}

impl Splice {
    /// A catch-up of every event up to revision `through` (the lasting watch's events start
    /// after it).
    pub fn new(through: i64) -> Splice {
        Splice {
            through,
            touched: BTreeSet::new(),
        }
    }

    pub fn through(&self) -> i64 {
        self.through
    }

    /// An event of the lasting watch on `key`, applied: the catch-up leaves the key alone
    /// from now on (whatever it still brings for it is older).
    pub fn lasting(&mut self, key: &[u8]) {
        if !self.touched.contains(key) {
            self.touched.insert(key.to_vec());
        }
    }

    /// Whether the catch-up's event on `key` at `revision` is to be applied.
    pub fn catch_up(&self, key: &[u8], revision: i64) -> bool {
        revision <= self.through && !self.touched.contains(key)
    }

    /// Whether a catch-up message whose last event is at `revision` completes the catch-up.
    pub fn completed_by(&self, revision: i64) -> bool {
        revision >= self.through
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// An event: key, revision, value (None: deleted).
    type Ev = (u8, i64, Option<u8>);

    fn apply(state: &mut BTreeMap<u8, u8>, (k, _, v): Ev) {
        match v {
            Some(v) => state.insert(k, v),
            None => state.remove(&k),
        };
    }

    /// Joins a catch-up (every event) and a lasting watch (events after `after`; the agent
    /// starts it after `through`, but the rules hold for one that starts earlier too) in the
    /// interleaving `order` (true: the next message is the lasting watch's), the catch-up
    /// arriving in messages of one revision each.
    fn join(
        start: &BTreeMap<u8, u8>,
        events: &[Ev],
        (after, through): (i64, i64),
        order: &[bool],
    ) -> BTreeMap<u8, u8> {
        let mut state = start.clone();
        let mut s = Some(Splice::new(through));
        let lasting: Vec<Ev> = events.iter().copied().filter(|e| e.1 > after).collect();
        let (mut li, mut ci) = (0, 0);
        let mut order = order.iter().copied().chain(std::iter::repeat(true));
        while li < lasting.len() || (s.is_some() && ci < events.len()) {
            let from_lasting = order.next().unwrap_or(true);
            if (from_lasting || s.is_none() || ci >= events.len()) && li < lasting.len() {
                let e = lasting[li];
                li += 1;
                if let Some(s) = s.as_mut() {
                    s.lasting(&[e.0]);
                }
                apply(&mut state, e);
            } else if let Some(sp) = s.as_ref() {
                let e = events[ci];
                ci += 1;
                if sp.catch_up(&[e.0], e.1) {
                    apply(&mut state, e);
                }
                if sp.completed_by(e.1) {
                    s = None;
                }
            } else {
                break;
            }
        }
        state
    }

    #[test]
    fn the_join_ends_where_one_watch_would_in_every_interleaving() {
        // Keys 1..4 changed at revisions 11..=20 (deletes among them), the lasting watch
        // starting after 15 (or earlier): every interleaving of the two, 2^12 of them.
        let start: BTreeMap<u8, u8> = [(1, 0), (2, 0), (3, 0)].into();
        let events: Vec<Ev> = vec![
            (1, 11, Some(1)),
            (2, 12, None),
            (4, 13, Some(1)),
            (1, 14, Some(2)),
            (3, 15, Some(1)),
            (2, 16, Some(2)),
            (1, 17, None),
            (4, 18, Some(3)),
            (3, 19, Some(4)),
            (1, 20, Some(5)),
        ];
        let mut want = start.clone();
        for e in &events {
            apply(&mut want, *e);
        }
        for starts in [(15, 15), (13, 15), (10, 15), (10, 10), (20, 20)] {
            for bits in 0u32..(1 << 12) {
                let order: Vec<bool> = (0..12).map(|i| bits >> i & 1 == 1).collect();
                let got = join(&start, &events, starts, &order);
                assert_eq!(got, want, "starts {starts:?}, order {bits:012b}");
            }
        }
    }

    #[test]
    fn an_event_past_the_join_ends_the_catch_up_and_is_the_lasting_watchs() {
        let mut s = Splice::new(15);
        assert!(s.catch_up(b"a", 15));
        assert!(!s.catch_up(b"a", 16));
        assert!(!s.completed_by(14));
        assert!(s.completed_by(15) && s.completed_by(16));
        s.lasting(b"a");
        s.lasting(b"a");
        assert!(!s.catch_up(b"a", 12));
        assert!(s.catch_up(b"b", 12));
        assert_eq!(s.through(), 15);
    }
}
