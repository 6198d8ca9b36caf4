//! A configured [`Route`], and the configuration's routes, [`Routes`]: a list in order (the order of a multi-destination
//! route's targets, and of the configuration as rendered) that a `route replace` or `route
//! del` searches by (source, destination) and takes a route out of, and that a port's removal
//! searches by destination, each in O(log n) rather than by a scan of every route and a shift
//! of the rest (issue #19: vnetd's cost per route event flat in the overlay's size).
//!
//! How: the routes sit in slots in list order; a route taken out leaves its slot empty, and a
//! Fenwick tree over the slots counts the routes before a slot, which is its position in the
//! list (the `at` of a [`crate::RouteChange`]). Two indexes give the slots of the routes with a
//! given (source, destination) and of those to a given port. Empty slots are squeezed out
//! when they outnumber the routes (O(n) once per n removals). A route put back where it was
//! (an undo, newest first) takes the empty slot it left when that is still there, else the
//! slots are laid out anew (O(n)).
//!
//! Pure: no I/O.

use vnet_core::{FastMap, MacMatch};

use crate::command::DestRef;

/// A configured route; its VNI is its destination's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub src: MacMatch,
    pub dst: MacMatch,
    pub to: DestRef,
}

/// Counts of routes per slot (1 or 0), as a Fenwick tree: the count before a slot and the
/// slot of the k-th route, both in O(log n).
#[derive(Debug, Clone, Default)]
struct Fenwick {
    /// `tree[i - 1]` holds the sum of the slots (i - lowbit(i), i], slots numbered from 1.
    tree: Vec<u32>,
}

fn lowbit(i: usize) -> usize {
    i & i.wrapping_neg()
}

impl Fenwick {
    /// A tree of `n` slots, each holding one route.
    fn full(n: usize) -> Fenwick {
        Fenwick {
            tree: (1..=n).map(|i| lowbit(i) as u32).collect(),
        }
    }

    /// The routes in slots `0..slot`.
    fn before(&self, slot: usize) -> u32 {
        let (mut i, mut sum) = (slot, 0);
        while i > 0 {
            sum += self.tree[i - 1];
            i -= lowbit(i);
        }
        sum
    }

    /// Adds `delta` (+1 or -1) at `slot`.
    fn add(&mut self, slot: usize, delta: i32) {
        let mut i = slot + 1;
        while i <= self.tree.len() {
            self.tree[i - 1] = self.tree[i - 1].wrapping_add_signed(delta);
            i += lowbit(i);
        }
    }

    /// Appends a slot holding `count` routes.
    fn push(&mut self, count: u32) {
        let i = self.tree.len() + 1;
        let below = self.before(i - 1) - self.before(i - lowbit(i));
        self.tree.push(count + below);
    }

    /// The slot of the route at position `k` (the (k+1)-th route); `k` must be below the
    /// number of routes.
    fn slot_of(&self, k: usize) -> usize {
        let (mut pos, mut rem) = (0usize, k as u32 + 1);
        let mut step = if self.tree.is_empty() {
            0
        } else {
            1 << (usize::BITS - 1 - self.tree.len().leading_zeros())
        };
        while step > 0 {
            if pos + step <= self.tree.len() && self.tree[pos + step - 1] < rem {
                pos += step;
                rem -= self.tree[pos - 1];
            }
            step >>= 1;
        }
        pos
    }
}

/// The slots of the routes with one key, ascending (list order): one inline (the common
/// case, which a copy of the configuration then copies without an allocation), or several.
#[derive(Debug, Clone)]
enum Slots {
    One(usize),
    Many(Vec<usize>),
}

impl Slots {
    fn as_slice(&self) -> &[usize] {
        match self {
            Slots::One(s) => std::slice::from_ref(s),
            Slots::Many(v) => v,
        }
    }

    fn add(&mut self, slot: usize) {
        match self {
            Slots::One(s) => *self = Slots::Many(vec![slot.min(*s), slot.max(*s)]),
            Slots::Many(v) => {
                let at = v.partition_point(|&s| s < slot);
                v.insert(at, slot);
            }
        }
    }

    /// Takes `slot` out; true when no slot is left.
    fn take(&mut self, slot: usize) -> bool {
        match self {
            Slots::One(s) => *s == slot,
            Slots::Many(v) => {
                if let Ok(at) = v.binary_search(&slot) {
                    v.remove(at);
                }
                match v[..] {
                    [one] => *self = Slots::One(one),
                    [] => return true,
                    _ => {}
                }
                false
            }
        }
    }

    fn renumber(&mut self, to: &[usize]) {
        match self {
            Slots::One(s) => *s = to[*s],
            Slots::Many(v) => v.iter_mut().for_each(|s| *s = to[*s]),
        }
    }
}

/// Slots by key.
type SlotIndex<K> = FastMap<K, Slots>;

fn index_add<K: std::hash::Hash + Eq + Clone>(ix: &mut SlotIndex<K>, key: &K, slot: usize) {
    match ix.get_mut(key) {
        Some(v) => v.add(slot),
        None => {
            ix.insert(key.clone(), Slots::One(slot));
        }
    }
}

fn index_remove<K: std::hash::Hash + Eq>(ix: &mut SlotIndex<K>, key: &K, slot: usize) {
    if ix.get_mut(key).is_some_and(|v| v.take(slot)) {
        ix.remove(key);
    }
}

/// The routes of a configuration, in order, indexed (see the module's documentation). Reads
/// as a list (`iter`, `len`, `get`, `contains`); changes as one (`push`, `remove`, `insert`,
/// `retain`), and by key (`with_key`, `position`, `remove_to`).
#[derive(Clone, Default)]
pub struct Routes {
    slots: Vec<Option<Route>>,
    live: Fenwick,
    len: usize,
    by_key: SlotIndex<(MacMatch, MacMatch)>,
    by_dest: SlotIndex<DestRef>,
}

impl Routes {
    pub fn new() -> Routes {
        Routes::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The routes in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Route> + '_ {
        self.slots.iter().flatten()
    }

    pub fn to_vec(&self) -> Vec<Route> {
        self.iter().cloned().collect()
    }

    /// The route at position `pos`.
    pub fn get(&self, pos: usize) -> Option<&Route> {
        if pos >= self.len {
            return None;
        }
        self.slots[self.live.slot_of(pos)].as_ref()
    }

    fn position_of_slot(&self, slot: usize) -> usize {
        self.live.before(slot) as usize
    }

    /// The routes from `src` to `dst` (whatever their destination port), in order, with their
    /// positions.
    pub fn with_key(&self, src: MacMatch, dst: MacMatch) -> Vec<(usize, &Route)> {
        self.by_key.get(&(src, dst)).map_or_else(Vec::new, |slots| {
            slots
                .as_slice()
                .iter()
                .filter_map(|&s| Some((self.position_of_slot(s), self.slots[s].as_ref()?)))
                .collect()
        })
    }

    fn slots_equal_to<'a>(&'a self, r: &'a Route) -> impl DoubleEndedIterator<Item = usize> + 'a {
        self.by_key
            .get(&(r.src, r.dst))
            .map_or(&[][..], Slots::as_slice)
            .iter()
            .copied()
            .filter(move |&s| self.slots[s].as_ref() == Some(r))
    }

    /// The position of the first route equal to `r`.
    pub fn position(&self, r: &Route) -> Option<usize> {
        let s = self.slots_equal_to(r).next()?;
        Some(self.position_of_slot(s))
    }

    /// The position of the last route equal to `r`.
    pub fn rposition(&self, r: &Route) -> Option<usize> {
        let s = self.slots_equal_to(r).next_back()?;
        Some(self.position_of_slot(s))
    }

    pub fn contains(&self, r: &Route) -> bool {
        self.slots_equal_to(r).next().is_some()
    }

    /// Adds `r` after the other routes.
    pub fn push(&mut self, r: Route) {
        let slot = self.slots.len();
        index_add(&mut self.by_key, &(r.src, r.dst), slot);
        index_add(&mut self.by_dest, &r.to, slot);
        self.slots.push(Some(r));
        self.live.push(1);
        self.len += 1;
    }

    /// Takes the route in `slot` out, leaving the slot empty.
    fn take(&mut self, slot: usize) -> Route {
        let Some(r) = self.slots[slot].take() else {
            unreachable!("slot {slot} holds a route (the indexes say so)")
        };
        self.live.add(slot, -1);
        index_remove(&mut self.by_key, &(r.src, r.dst), slot);
        index_remove(&mut self.by_dest, &r.to, slot);
        self.len -= 1;
        r
    }

    /// Takes out the route at position `pos`, as `Vec::remove` does.
    ///
    /// # Panics
    /// When `pos` is not below [`Routes::len`].
    pub fn remove(&mut self, pos: usize) -> Route {
        assert!(
            pos < self.len,
            "removal position {pos} beyond {} routes",
            self.len
        );
        let r = self.take(self.live.slot_of(pos));
        self.squeeze();
        r
    }

    /// Takes out every route to `to`, first to last, each with its position when it was
    /// taken out (so that removing each at its position, in turn, replays it).
    pub fn remove_to(&mut self, to: &DestRef) -> Vec<(usize, Route)> {
        let slots = self
            .by_dest
            .get(to)
            .map_or_else(Vec::new, |s| s.as_slice().to_vec());
        let out = slots
            .into_iter()
            .map(|s| {
                let at = self.position_of_slot(s);
                (at, self.take(s))
            })
            .collect();
        self.squeeze();
        out
    }

    /// Puts `r` at position `pos`, as `Vec::insert` does.
    ///
    /// # Panics
    /// When `pos` is beyond [`Routes::len`].
    pub fn insert(&mut self, pos: usize, r: Route) {
        assert!(
            pos <= self.len,
            "insertion position {pos} beyond {} routes",
            self.len
        );
        if pos == self.len {
            return self.push(r);
        }
        // The empty slots just before the route now at `pos` lie after the route before it.
        let next = self.live.slot_of(pos);
        if next > 0 && self.slots[next - 1].is_none() {
            let slot = next - 1;
            index_add(&mut self.by_key, &(r.src, r.dst), slot);
            index_add(&mut self.by_dest, &r.to, slot);
            self.slots[slot] = Some(r);
            self.live.add(slot, 1);
            self.len += 1;
        } else {
            let mut v = self.to_vec();
            v.insert(pos, r);
            *self = Routes::from(v);
        }
    }

    /// Keeps the routes `keep` says yes to, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&Route) -> bool) {
        let v: Vec<Route> = std::mem::take(self)
            .slots
            .into_iter()
            .flatten()
            .filter(|r| keep(r))
            .collect();
        *self = Routes::from(v);
    }

    /// Squeezes the empty slots out once they outnumber the routes: the slots, the tree and
    /// the indexes are renumbered in place (no hashing, no allocation but the new slots).
    fn squeeze(&mut self) {
        let empty = self.slots.len() - self.len;
        if empty <= self.len.max(32) {
            return;
        }
        let mut renumber = vec![usize::MAX; self.slots.len()];
        let mut slots = Vec::with_capacity(self.len);
        for (old, r) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            if let Some(r) = r {
                renumber[old] = slots.len();
                slots.push(Some(r));
            }
        }
        for v in self.by_key.values_mut().chain(self.by_dest.values_mut()) {
            v.renumber(&renumber);
        }
        self.live = Fenwick::full(slots.len());
        self.slots = slots;
    }
}

impl From<Vec<Route>> for Routes {
    fn from(v: Vec<Route>) -> Routes {
        let mut by_key: SlotIndex<(MacMatch, MacMatch)> = FastMap::default();
        let mut by_dest: SlotIndex<DestRef> = FastMap::default();
        for (slot, r) in v.iter().enumerate() {
            index_add(&mut by_key, &(r.src, r.dst), slot);
            index_add(&mut by_dest, &r.to, slot);
        }
        Routes {
            live: Fenwick::full(v.len()),
            len: v.len(),
            slots: v.into_iter().map(Some).collect(),
            by_key,
            by_dest,
        }
    }
}

impl FromIterator<Route> for Routes {
    fn from_iter<I: IntoIterator<Item = Route>>(it: I) -> Routes {
        Routes::from(it.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Routes {
    type Item = &'a Route;
    type IntoIter = std::iter::Flatten<std::slice::Iter<'a, Option<Route>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.slots.iter().flatten()
    }
}

/// Equal when the same routes are in the same order (however their slots lie).
impl PartialEq for Routes {
    fn eq(&self, other: &Routes) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for Routes {}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
