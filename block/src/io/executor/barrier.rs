//! Write tracking shared by all queues of a disk, so that a cluster freed
//! by a discard is not reused while a write planned before the discard
//! can still land in it.
//!
//! Every request that writes takes a sequence number ([`WriteTracker::begin`])
//! before the format plans it and gives it back ([`WriteTracker::end`])
//! once its ops have finished. A request that may free host clusters
//! (discard, write-zeroes, and any write whose plan says
//! `frees_clusters`: a partial write of a zero-flagged cluster that kept
//! its host cluster allocates a new one and drops the old) records
//! [`WriteTracker::barrier`] right after its plan: every write that could
//! have been planned into the clusters it frees holds a smaller number. Its commit (which drops the
//! refcounts) waits until [`WriteTracker::passed`] says all of those have
//! ended; the waiting queue's waker fires when the last one does.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::formats::Waker;

/// See the module docs.
#[derive(Default)]
pub struct WriteTracker {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    in_flight: BTreeSet<u64>,
    /// (barrier, waker) of commits waiting for older writes.
    waiters: Vec<(u64, Waker)>,
}

impl WriteTracker {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent across a panic elsewhere.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a write about to be planned; returns its number.
    pub fn begin(&self) -> u64 {
        let mut g = self.lock();
        let seq = g.next;
        g.next += 1;
        g.in_flight.insert(seq);
        seq
    }

    /// The write numbered `seq` has finished (or was never planned).
    pub fn end(&self, seq: u64) {
        let woken: Vec<Waker> = {
            let mut g = self.lock();
            g.in_flight.remove(&seq);
            let oldest = g.in_flight.first().copied().unwrap_or(u64::MAX);
            let (ready, waiting) = std::mem::take(&mut g.waiters)
                .into_iter()
                .partition(|(barrier, _)| *barrier <= oldest);
            g.waiters = waiting;
            ready.into_iter().map(|(_, w)| w).collect()
        };
        for w in woken {
            // Only fails on counter overflow, when a wake-up is pending anyway.
            let _ = w.write(1);
        }
    }

    /// Every write begun so far has a smaller number than this.
    pub fn barrier(&self) -> u64 {
        self.lock().next
    }

    /// Whether every write numbered below `barrier` has ended; if not,
    /// `waker` fires once they have.
    pub fn passed(&self, barrier: u64, waker: &Waker) -> bool {
        let mut g = self.lock();
        if g.in_flight.first().is_none_or(|&oldest| oldest >= barrier) {
            return true;
        }
        let known = g
            .waiters
            .iter()
            .any(|(b, w)| *b == barrier && Arc::ptr_eq(w, waker));
        if !known {
            g.waiters.push((barrier, waker.clone()));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn a_barrier_waits_only_for_older_writes() {
        let t = WriteTracker::default();
        let w = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let a = t.begin();
        let b = t.begin();
        let barrier = t.barrier();
        let c = t.begin();
        assert!(!t.passed(barrier, &w));
        t.end(b);
        assert!(w.read().is_err(), "a is still in flight");
        assert!(!t.passed(barrier, &w));
        t.end(a);
        assert_eq!(
            w.read().unwrap(),
            1,
            "woken when the last older write ended"
        );
        assert!(t.passed(barrier, &w), "c is newer than the barrier");
        t.end(c);
        assert!(t.passed(t.barrier(), &w));
    }
}
