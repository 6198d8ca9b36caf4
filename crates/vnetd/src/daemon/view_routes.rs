//! The view's routes, kept up to date by the owner change by change at O(log n) each.
//!
//! Why not a persistent vector changed at the changed positions: taking an element out of the
//! middle of an RRB vector (`imbl::Vector::remove`) splits and joins it, rebalancing and
//! copying nodes the published view still shares, and at 8,000 routes that cost the owner
//! more than the rest of a route event together (a `route replace` is one removal and one
//! append). Here the routes sit in slots as `vnet_control::Routes` keeps them: a removed
//! route leaves its slot empty (a write at one index: the path to it copied, nothing
//! rebalanced), a new one takes a new slot at the end, and a Fenwick tree over the slots
//! finds the slot of the route at a position (the `at` of a `RouteChange`). When the empty
//! slots outnumber the routes the owner lays the list out anew from the configuration (O(n)
//! once per n removals).
//!
//! Pure: no I/O.

use std::sync::Arc;

use vnet_control::Route;

/// The routes in the order of the configuration, as readers see them (shared between views).
#[derive(Clone, Default)]
pub struct ViewRoutes {
    slots: imbl::Vector<Option<Arc<Route>>>,
}

impl ViewRoutes {
    /// The routes in order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> + '_ {
        self.slots.iter().flatten()
    }
}

/// The owner's side: the view's routes and where each position's route sits.
#[derive(Default)]
pub struct RouteSlots {
    routes: ViewRoutes,
    /// One count per slot (1: a route, 0: empty), as a Fenwick tree.
    tree: Vec<u32>,
    live: usize,
}

fn lowbit(i: usize) -> usize {
    i & i.wrapping_neg()
}

impl RouteSlots {
    /// The routes of `routes`, in order, each in a slot of its own.
    pub fn from_routes<'a>(routes: impl Iterator<Item = &'a Route>) -> RouteSlots {
        let mut s = RouteSlots::default();
        for r in routes {
            s.push(r);
        }
        s
    }

    /// What the view holds (a clone shares every node).
    pub fn view(&self) -> ViewRoutes {
        self.routes.clone()
    }

    /// A route appended at the end of the list.
    pub fn push(&mut self, r: &Route) {
        self.routes.slots.push_back(Some(Arc::new(r.clone())));
        let i = self.tree.len() + 1;
        let below = self.before(i - 1) - self.before(i - lowbit(i));
        self.tree.push(1 + below);
        self.live += 1;
    }

    /// Takes out the route at position `at`, which must be `route`. False when it is not
    /// (an undo, a list out of step): the caller lays the list out anew.
    pub fn remove(&mut self, at: usize, route: &Route) -> bool {
        if at >= self.live {
            return false;
        }
        let slot = self.slot_of(at);
        match self.routes.slots.get(slot) {
            Some(Some(r)) if **r == *route => {}
            _ => return false,
        }
        self.routes.slots.set(slot, None);
        let mut i = slot + 1;
        while i <= self.tree.len() {
            self.tree[i - 1] -= 1;
            i += lowbit(i);
        }
        self.live -= 1;
        true
    }

    /// Whether the empty slots outnumber the routes (time to lay the list out anew).
    pub fn sparse(&self) -> bool {
        self.tree.len() > 64 && self.tree.len() > 2 * self.live
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

    /// The slot of the route at position `k` (below the number of routes).
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

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_control::{DestKind, DestRef};
    use vnet_core::MacMatch;

    fn route(i: u8) -> Route {
        Route {
            src: MacMatch::Any,
            dst: MacMatch::Exact(vnet_wire::MacAddr([0x52, 0x54, 0, 0, 0, i])),
            to: DestRef {
                kind: DestKind::Link,
                name: format!("l{i}"),
            },
        }
    }

    /// Random pushes and removals at random positions against a plain vector: the same
    /// routes in the same order, and a view taken earlier unchanged.
    #[test]
    fn follows_a_plain_list() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut want: Vec<Route> = (0..50).map(route).collect();
        let mut s = RouteSlots::from_routes(want.iter());
        for step in 0..2000 {
            let earlier = s.view();
            let earlier_list: Vec<Route> = earlier.iter().map(|r| (**r).clone()).collect();
            if want.is_empty() || next() % 2 == 0 {
                let r = route((next() % 250) as u8);
                s.push(&r);
                want.push(r);
            } else {
                let at = (next() % want.len() as u64) as usize;
                let r = want.remove(at);
                assert!(s.remove(at, &r), "step {step}: the route at {at}");
            }
            let got: Vec<Route> = s.view().iter().map(|r| (**r).clone()).collect();
            assert_eq!(got, want, "step {step}");
            let still: Vec<Route> = earlier.iter().map(|r| (**r).clone()).collect();
            assert_eq!(still, earlier_list, "a published view does not change");
            if s.sparse() {
                s = RouteSlots::from_routes(want.iter());
            }
        }
        assert!(!s.remove(want.len(), &route(1)), "a position past the end");
    }
}
