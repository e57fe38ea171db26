//! A bounded least-recently-used cache of metadata tables (L2 tables and
//! refcount blocks), keyed by host offset.
//!
//! Tables enter after the caller read them from the image; the cache is
//! written by its callers: clean tables are simply dropped on eviction;
//! tables with changes not yet on disk are pinned by the caller and never
//! evicted until unpinned. Memory is bounded by `capacity` tables plus the
//! pinned ones (which the caller bounds).
//!
//! Each table is [`Published`]: a queue may hold a [`Snapshot`] of it and
//! read it without the image lock; changing a table some queue holds
//! copies it first, and a table that leaves the cache is retired (see
//! `published`).

use std::collections::BTreeMap;

// foldhash rather than SipHash: the keys are host offsets of at most
// `capacity` (plus pinned) tables, so a crafted image gains nothing from
// collisions, and hashing was a visible part of every lookup.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::published::{Published, Snapshot};

pub(crate) struct TableCache {
    capacity: usize,
    tick: u64,
    tables: HashMap<u64, (u64, Published<Vec<u8>>)>,
    /// last-use tick -> key, oldest first.
    order: BTreeMap<u64, u64>,
    pinned: HashSet<u64>,
}

impl TableCache {
    pub fn new(capacity: usize) -> Self {
        TableCache {
            capacity: capacity.max(2),
            tick: 0,
            tables: HashMap::new(),
            order: BTreeMap::new(),
            pinned: HashSet::new(),
        }
    }

    /// Marks `key` used now and returns its table: one hash lookup, and
    /// none of the order's bookkeeping when it already is the most
    /// recently used (a run of lookups in one table, the common case).
    fn touch(&mut self, key: u64) -> Option<&mut Published<Vec<u8>>> {
        let (t, table) = self.tables.get_mut(&key)?;
        if *t != self.tick {
            self.order.remove(t);
            self.tick += 1;
            *t = self.tick;
            self.order.insert(self.tick, key);
        }
        Some(table)
    }

    pub fn get(&mut self, key: u64) -> Option<&[u8]> {
        self.touch(key).map(|t| t.as_slice())
    }

    /// The table for changing (copied first if a queue holds a snapshot).
    pub fn get_mut(&mut self, key: u64) -> Option<&mut Vec<u8>> {
        self.touch(key).map(Published::make_mut)
    }

    /// A snapshot of the table for a queue's lock-free lookups.
    pub fn snapshot(&mut self, key: u64) -> Option<Snapshot<Vec<u8>>> {
        self.touch(key).map(|t| t.snapshot())
    }

    /// How many unpinned tables the cache keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn contains(&self, key: u64) -> bool {
        self.tables.contains_key(&key)
    }

    pub fn insert(&mut self, key: u64, table: Vec<u8>) {
        self.remove(key);
        while self.tables.len() >= self.capacity {
            let victim = self
                .order
                .iter()
                .find(|(_, k)| !self.pinned.contains(k))
                .map(|(t, k)| (*t, *k));
            let Some((t, old)) = victim else { break };
            self.order.remove(&t);
            self.tables.remove(&old);
        }
        self.tick += 1;
        self.order.insert(self.tick, key);
        self.tables.insert(key, (self.tick, Published::new(table)));
    }

    /// Keeps `key` cached until [`TableCache::unpin`].
    pub fn pin(&mut self, key: u64) {
        self.pinned.insert(key);
    }

    pub fn unpin(&mut self, key: u64) {
        self.pinned.remove(&key);
    }

    pub fn remove(&mut self, key: u64) {
        self.pinned.remove(&key);
        if let Some((t, _)) = self.tables.remove(&key) {
            self.order.remove(&t);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tables.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut c = TableCache::new(2);
        c.insert(1, vec![1]);
        c.insert(2, vec![2]);
        assert_eq!(c.get(1), Some(&[1u8][..]));
        c.insert(3, vec![3]);
        assert!(c.contains(1));
        assert!(!c.contains(2));
        assert!(c.contains(3));
        assert_eq!(c.len(), 2);
        c.pin(1);
        c.insert(4, vec![4]);
        assert!(c.contains(1), "pinned tables stay");
        assert!(!c.contains(3));
    }
}
