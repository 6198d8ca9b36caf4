//! The delay line: frames waiting for their departure, bounded in frames and bytes so the
//! forwarder's memory cannot grow without bound whatever arrives. FIFO when departures are
//! monotonic (no reordering), a heap ordered by departure when reordering is allowed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::schedule::Nanos;

/// What the delay line bounds by: a frame's length.
pub trait Weight {
    fn size(&self) -> usize;
}

impl Weight for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }
}

struct Entry<T> {
    depart: Nanos,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.depart, self.seq) == (o.depart, o.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.depart, self.seq).cmp(&(o.depart, o.seq))
    }
}

enum Store<T> {
    Fifo(VecDeque<Entry<T>>),
    Heap(BinaryHeap<Reverse<Entry<T>>>),
}

pub struct DelayLine<T> {
    store: Store<T>,
    limit_packets: usize,
    limit_bytes: usize,
    bytes: usize,
    seq: u64,
    /// The most frames ever held at once.
    pub high_water: usize,
}

impl<T: Weight> DelayLine<T> {
    pub fn new(reorder: bool, limit_packets: usize, limit_bytes: usize) -> Self {
        DelayLine {
            store: if reorder {
                Store::Heap(BinaryHeap::new())
            } else {
                Store::Fifo(VecDeque::new())
            },
            limit_packets,
            limit_bytes,
            bytes: 0,
            seq: 0,
            high_water: 0,
        }
    }

    pub fn len(&self) -> usize {
        match &self.store {
            Store::Fifo(q) => q.len(),
            Store::Heap(h) => h.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Queues `item` to leave at `depart`; gives it back when either limit would be passed. In
    /// FIFO mode `depart` must not be earlier than the last one queued (the schedule ensures
    /// it; an earlier one would simply leave behind its predecessor).
    pub fn push(&mut self, depart: Nanos, item: T) -> Result<(), T> {
        let size = item.size();
        if self.len() >= self.limit_packets || self.bytes + size > self.limit_bytes {
            return Err(item);
        }
        self.seq += 1;
        let e = Entry {
            depart,
            seq: self.seq,
            item,
        };
        match &mut self.store {
            Store::Fifo(q) => q.push_back(e),
            Store::Heap(h) => h.push(Reverse(e)),
        }
        self.bytes += size;
        self.high_water = self.high_water.max(self.len());
        Ok(())
    }

    /// The departure time of the next frame.
    pub fn next_departure(&self) -> Option<Nanos> {
        match &self.store {
            Store::Fifo(q) => q.front().map(|e| e.depart),
            Store::Heap(h) => h.peek().map(|Reverse(e)| e.depart),
        }
    }

    /// The next frame if its time has come, with its scheduled departure.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, T)> {
        if self.next_departure()? > now {
            return None;
        }
        let e = match &mut self.store {
            Store::Fifo(q) => q.pop_front()?,
            Store::Heap(h) => h.pop()?.0,
        };
        self.bytes -= e.item.size();
        Some((e.depart, e.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: usize) -> Vec<u8> {
        vec![0; n]
    }

    #[test]
    fn fifo_releases_in_time() {
        let mut q = DelayLine::new(false, 10, 10_000);
        q.push(10, f(100)).unwrap();
        q.push(20, f(200)).unwrap();
        assert_eq!(q.next_departure(), Some(10));
        assert!(q.pop_due(9).is_none());
        assert_eq!(q.pop_due(10).map(|(d, x)| (d, x.len())), Some((10, 100)));
        assert!(q.pop_due(15).is_none());
        assert_eq!(q.pop_due(25).map(|(d, x)| (d, x.len())), Some((20, 200)));
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn bounded_in_frames_and_bytes() {
        let mut q = DelayLine::new(false, 3, 1000);
        for _ in 0..3 {
            q.push(0, f(10)).unwrap();
        }
        assert!(q.push(0, f(10)).is_err(), "4th frame over the frame limit");
        q.pop_due(0).unwrap();
        assert!(q.push(0, f(991)).is_err(), "bytes: 20 + 991 > 1000");
        q.push(0, f(980)).unwrap();
        assert_eq!(q.bytes(), 1000);
        assert_eq!(q.high_water, 3);
    }

    #[test]
    fn heap_orders_by_departure_then_arrival() {
        let mut q = DelayLine::new(true, 10, 10_000);
        q.push(30, f(3)).unwrap();
        q.push(10, f(1)).unwrap();
        q.push(20, f(2)).unwrap();
        q.push(10, f(4)).unwrap();
        let out: Vec<usize> = std::iter::from_fn(|| q.pop_due(100).map(|(_, x)| x.len())).collect();
        assert_eq!(out, vec![1, 4, 2, 3]);
    }
}
