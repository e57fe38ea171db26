//! Tables that queues read without the image lock: [`Published`] is the
//! image's own copy of a metadata table (the L1 table, each cached L2
//! table), kept under the lock; [`Snapshot`] is a queue's read-only handle
//! on one version of it, taken under the lock and read without it.
//!
//! The rule that makes this safe, enforced by the types: a published table
//! is changed in place only while no snapshot of it exists. Mutable access
//! ([`Published::make_mut`], or `DerefMut`) first checks that the image
//! holds the only reference; if a queue holds a snapshot, the table is
//! copied, the copy becomes the published version, and the old version is
//! marked retired. A table that leaves the image (evicted from the cache,
//! replaced, dropped) is retired too. So a snapshot's bytes never change,
//! and a queue that finds its snapshot not retired reads exactly what the
//! image held when it last looked at the flag: the flag's load is where
//! the lookup takes effect, as taking the lock was before.
//!
//! Ordering: the writer retires a version (a release store) while it
//! holds the image lock and before anything that depends on the change
//! (a request's completion, an unlock) can be seen by another thread; a
//! reader loads the flag with acquire before each lookup. A read that a
//! guest issues after a write's completion therefore sees the write's new
//! mapping. A read concurrent with a change sees the old or the new one,
//! as it could have before (the lock never covered the data I/O).
//!
//! Costs: a lookup through a snapshot is one load of a flag the writers
//! touch only when they replace that very table; no queue writes a shared
//! line. A change to a table some queue holds costs the writer one copy
//! of that table (an L2 table is one cluster), once per change while
//! readers keep taking snapshots of it.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One version of a table, shared by the image and the queues' snapshots.
#[derive(Debug)]
struct Version<T> {
    value: T,
    /// Set once this version is no longer the image's.
    retired: AtomicBool,
}

/// The image's current version of a table (see the module docs).
#[derive(Debug)]
pub(crate) struct Published<T: Clone> {
    current: Arc<Version<T>>,
}

impl<T: Clone> Published<T> {
    pub fn new(value: T) -> Self {
        Published {
            current: Arc::new(Version {
                value,
                retired: AtomicBool::new(false),
            }),
        }
    }

    /// A handle on the current version for a queue to read without the
    /// lock (take it with the image lock held).
    pub fn snapshot(&self) -> Snapshot<T> {
        Snapshot {
            version: Arc::clone(&self.current),
        }
    }

    /// The table for changing: in place when no snapshot of it exists,
    /// else a fresh copy that replaces (and retires) the shared version.
    pub fn make_mut(&mut self) -> &mut T {
        if Arc::get_mut(&mut self.current).is_none() {
            let copy = Published::new(self.current.value.clone());
            // Dropping the old handle retires the version the snapshots hold.
            drop(std::mem::replace(self, copy));
        }
        match Arc::get_mut(&mut self.current) {
            Some(v) => &mut v.value,
            // The copy above has no other reference.
            None => unreachable!("a fresh version is not shared"),
        }
    }
}

impl<T: Clone> Drop for Published<T> {
    /// The version leaves the image: snapshots of it must not be used.
    fn drop(&mut self) {
        self.current.retired.store(true, Ordering::Release);
    }
}

impl<T: Clone> Deref for Published<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.current.value
    }
}

impl<T: Clone> DerefMut for Published<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.make_mut()
    }
}

/// A queue's handle on one version of a published table.
#[derive(Debug)]
pub(crate) struct Snapshot<T> {
    version: Arc<Version<T>>,
}

impl<T> Snapshot<T> {
    /// The table, while it is still the image's current version (`None`
    /// once a change or an eviction retired it).
    pub fn current(&self) -> Option<&T> {
        if self.version.retired.load(Ordering::Acquire) {
            None
        } else {
            Some(&self.version.value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_without_snapshots_stay_in_place() {
        let mut p = Published::new(vec![1u8, 2, 3]);
        let before = p.as_ptr();
        p[0] = 9;
        assert_eq!(p.as_ptr(), before, "no copy while nobody holds it");
        assert_eq!(*p, vec![9, 2, 3]);
    }

    #[test]
    fn a_change_retires_the_snapshots_version_and_keeps_its_bytes() {
        let mut p = Published::new(vec![1u8, 2, 3]);
        let s = p.snapshot();
        assert_eq!(s.current(), Some(&vec![1, 2, 3]));
        p.make_mut()[1] = 7;
        assert_eq!(*p, vec![1, 7, 3]);
        assert!(s.current().is_none(), "the old version is retired");
        assert_eq!(s.version.value, vec![1, 2, 3], "and was not changed");
        let s2 = p.snapshot();
        assert_eq!(s2.current(), Some(&vec![1, 7, 3]));
    }

    #[test]
    fn dropping_or_replacing_retires() {
        let p = Published::new(5u64);
        let s = p.snapshot();
        drop(p);
        assert!(s.current().is_none());
        let mut q = Published::new(1u64);
        let t = q.snapshot();
        q = Published::new(2u64);
        assert!(t.current().is_none());
        assert_eq!(*q, 2);
    }
}
