//! Allocations in flight: guest clusters whose new mapping waits for its
//! data writes, the pending commits that will publish them, and the queues
//! waiting for them.
//!
//! A plan registers the guest clusters it allocates and a
//! [`PendingCommit`]; it gets a `WriteCommit` id back. A later write that
//! overlaps a busy cluster registers its waker and is told `Blocked`.
//! `commit`/`abort` take the pending work out again, free the clusters and
//! wake every waiter (each then plans again; a spurious wake-up costs one
//! re-plan).

// foldhash: keys are guest cluster indices of writes in flight (bounded by
// the queues' depth); SipHash's DoS resistance buys nothing here.
use foldhash::{HashMap, HashSet};
use std::sync::Arc;

use crate::formats::{Waker, WriteCommit};

/// Metadata work a plan leaves for `commit`.
#[derive(Debug, Default)]
pub(crate) struct PendingCommit {
    /// (guest offset of a cluster, new raw L2 entry, subcluster bitmap)
    /// to publish.
    pub publish: Vec<(u64, u64, u64)>,
    /// Host cluster runs (first index, count) that lose one reference.
    pub release: Vec<(u64, u64)>,
    /// Host cluster runs allocated by the plan (freed again on abort).
    pub allocated: Vec<(u64, u64)>,
    /// Guest cluster indices held busy until commit/abort.
    pub busy: Vec<u64>,
}

impl PendingCommit {
    /// Records a run of host clusters to release, merged with the last
    /// run when adjacent (a discard of a large range stays small).
    pub fn release_clusters(&mut self, (first, count): (u64, u64)) {
        if let Some((f, c)) = self.release.last_mut() {
            if *f + *c == first {
                *c += count;
                return;
            }
        }
        self.release.push((first, count));
    }

    pub fn is_empty(&self) -> bool {
        self.publish.is_empty()
            && self.release.is_empty()
            && self.allocated.is_empty()
            && self.busy.is_empty()
    }
}

#[derive(Default)]
pub(crate) struct InFlight {
    busy: HashSet<u64>,
    waiters: Vec<Waker>,
    pending: HashMap<u64, PendingCommit>,
    next_id: u64,
}

impl InFlight {
    /// Whether any guest cluster in `first..=last` is being allocated.
    pub fn overlaps(&self, first: u64, last: u64) -> bool {
        if self.busy.is_empty() {
            return false;
        }
        if last - first < self.busy.len() as u64 {
            (first..=last).any(|c| self.busy.contains(&c))
        } else {
            self.busy.iter().any(|c| (first..=last).contains(c))
        }
    }

    pub fn wait(&mut self, waker: &Waker) {
        if !self.waiters.iter().any(|w| Arc::ptr_eq(w, waker)) {
            self.waiters.push(Arc::clone(waker));
        }
    }

    pub fn start(&mut self, commit: PendingCommit) -> WriteCommit {
        self.busy.extend(commit.busy.iter().copied());
        self.next_id += 1;
        self.pending.insert(self.next_id, commit);
        WriteCommit(self.next_id)
    }

    /// Takes a pending commit out; its clusters stay busy until `finish`.
    pub fn take(&mut self, id: &WriteCommit) -> Option<PendingCommit> {
        self.pending.remove(&id.0)
    }

    /// Releases the clusters and wakes every waiting queue.
    pub fn finish(&mut self, commit: &PendingCommit) {
        for c in &commit.busy {
            self.busy.remove(c);
        }
        for w in self.waiters.drain(..) {
            // A failed wake-up leaves the queue to its next kick; nothing
            // better can be done from here.
            let _ = w.write(1);
        }
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn busy_clusters_block_and_wake() {
        let mut f = InFlight::default();
        let id = f.start(PendingCommit {
            busy: vec![5, 6],
            ..Default::default()
        });
        assert!(f.overlaps(0, 5));
        assert!(f.overlaps(6, 1000));
        assert!(!f.overlaps(7, 9));
        let w: Waker = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        f.wait(&w);
        f.wait(&w);
        assert!(w.read().is_err(), "not woken yet");
        let c = f.take(&id).unwrap();
        f.finish(&c);
        assert_eq!(w.read().unwrap(), 1);
        assert!(!f.overlaps(0, 10));
        assert!(f.take(&id).is_none());
    }
}
