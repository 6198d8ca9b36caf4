//! Lookups of a configuration's interfaces and links by name without a scan of the list
//! (issue #19: a `route replace` looks its destination up by name, and at 1,000 links a scan
//! was a measurable share of vnetd's cost per route event).
//!
//! The lists are public fields of [`crate::Config`], which code outside this crate changes
//! too, so an index of them cannot be kept exact. [`NameHints`] is a hint instead: where each
//! name was seen, checked on every use (the entry at the hinted place must carry the name)
//! and rebuilt, from a scan, when it was wrong. A name is unique within its list
//! (`Config::apply` refuses a second one), so a checked hint gives what a scan gives; a name
//! that is not there costs the scan it always cost.
//!
//! Pure: no I/O.

use std::sync::Mutex;

use vnet_core::{FastMap, LockRecover};

/// Where each name was last seen in one list.
#[derive(Debug, Default)]
pub(crate) struct NameHints {
    at: Mutex<FastMap<String, usize>>,
}

impl NameHints {
    /// The item of `items` named `name` (the first, as a scan finds it).
    pub fn find<'a, T>(
        &self,
        items: &'a [T],
        name: &str,
        name_of: impl Fn(&T) -> &str,
    ) -> Option<&'a T> {
        let mut at = self.at.lock_or_recover();
        if let Some(x) = at.get(name).and_then(|&i| items.get(i)) {
            if name_of(x) == name {
                return Some(x);
            }
        }
        let x = items.iter().find(|x| name_of(x) == name)?;
        // Found where the hints did not say: they are stale (the list changed), all of them.
        at.clear();
        // The first of each name, as a scan finds it (names are unique, but the lists are
        // public).
        for (i, x) in items.iter().enumerate() {
            at.entry(name_of(x).to_string()).or_insert(i);
        }
        Some(x)
    }
}

/// A copy starts with no hints (they fill on its first lookups).
impl Clone for NameHints {
    fn clone(&self) -> NameHints {
        NameHints::default()
    }
}

/// Hints are not part of what a configuration is.
impl PartialEq for NameHints {
    fn eq(&self, _: &NameHints) -> bool {
        true
    }
}

impl Eq for NameHints {}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_lookup_finds_what_a_scan_finds_whatever_the_list_did() {
        let h = NameHints::default();
        fn by(s: &String) -> &str {
            s
        }
        let mut v = names(&["a", "b", "c", "d"]);
        assert_eq!(h.find(&v, "c", by).map(String::as_str), Some("c"));
        assert_eq!(h.find(&v, "x", by), None);
        // Changed behind the hints' back: removals shift, insertions shift, a name moves.
        v.remove(0);
        assert_eq!(h.find(&v, "c", by).map(String::as_str), Some("c"));
        v.insert(0, "x".into());
        assert_eq!(h.find(&v, "x", by).map(String::as_str), Some("x"));
        assert_eq!(h.find(&v, "d", by).map(String::as_str), Some("d"));
        v = names(&["d", "c"]);
        for n in ["a", "b", "c", "d", "x"] {
            assert_eq!(h.find(&v, n, by), v.iter().find(|x| x.as_str() == n), "{n}");
        }
        assert_eq!(h.clone().find(&v, "c", by).map(String::as_str), Some("c"));
        // A name twice (the lists are public): the first, as a scan finds it, also once the
        // hints were rebuilt by another lookup.
        let v = names(&["a", "b", "a"]);
        let h = NameHints::default();
        assert!(h.find(&v, "b", by).is_some_and(|x| std::ptr::eq(x, &v[1])));
        assert!(h.find(&v, "a", by).is_some_and(|x| std::ptr::eq(x, &v[0])));
    }
}
