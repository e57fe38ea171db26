//! Write tracking across the queues of a disk, so that a cluster freed by
//! a discard is not reused while a write planned before the discard can
//! still land in it.
//!
//! Every queue numbers its own writes in its [`WriteLane`]: a request that
//! writes takes a number ([`WriteLane::begin`]) before the format plans it
//! and gives it back ([`WriteLane::end`]) once its ops have finished. A
//! request that may free host clusters (discard, write-zeroes, and any
//! write whose plan says `frees_clusters`: a partial write of a
//! zero-flagged cluster that kept its host cluster allocates a new one
//! and drops the old) takes a [`Barrier`] right after its plan
//! ([`WriteTracker::barrier`]): for every queue's lane, how many writes it
//! had begun. Every write that could have been planned into the clusters
//! it frees is below its lane's mark. Its commit (which drops the
//! refcounts) waits until [`WriteTracker::passed`] says each lane's oldest
//! write still in flight is at or above the mark; the waiting queue's
//! waker fires when the last of them ends.
//!
//! Why lanes: a write is the common case and a freeing commit the rare
//! one, so the common case writes only its own queue's lane (two atomics
//! on cache lines of their own) and reads one shared counter, the number
//! of waiting commits, that only those commits write. Before, every write
//! of every queue locked one mutex twice. The barrier side (a lock on the
//! list of lanes, one load per lane) is paid by freeing commits only.
//!
//! Ordering: a waiter announces itself (`waiting`, sequentially
//! consistent) before it checks the lanes again; a lane publishes its new
//! oldest write (sequentially consistent) before it reads `waiting`. So
//! either the ending write sees the waiter and wakes it, or the waiter's
//! second check sees the write ended.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::formats::Waker;
use crate::padded::CachePadded;

/// What the other queues may read of one queue's writes.
#[derive(Debug)]
struct LaneState {
    /// How many writes this lane has begun (the next one's number).
    begun: AtomicU64,
    /// The lane's oldest write still in flight (`u64::MAX`: none).
    oldest: AtomicU64,
}

type SharedLane = Arc<CachePadded<LaneState>>;

/// See the module docs.
#[derive(Default)]
pub struct WriteTracker {
    /// Every live queue's lane (locked to add one and to take a barrier).
    lanes: Mutex<Vec<Weak<CachePadded<LaneState>>>>,
    /// Commits waiting for older writes, with the barrier each waits for.
    waiters: Mutex<Vec<(Barrier, Waker)>>,
    /// How many entries `waiters` has: what every ending write reads.
    waiting: CachePadded<AtomicUsize>,
    /// Numbers barriers (tells a waiter's repeated checks apart).
    next_barrier: AtomicU64,
}

/// One queue's writes (owned by the queue's executor; see the module docs).
#[derive(Debug)]
pub struct WriteLane {
    state: SharedLane,
    next: u64,
    /// The lane's writes from the oldest in flight on, and whether each
    /// has ended.
    in_flight: VecDeque<(u64, bool)>,
}

/// How many writes each lane had begun when a freeing commit was planned.
#[derive(Clone, Debug)]
pub struct Barrier {
    id: u64,
    marks: Vec<(SharedLane, u64)>,
}

impl Barrier {
    /// Whether every write below the marks has ended.
    fn passed(&self) -> bool {
        self.marks
            .iter()
            .all(|(lane, mark)| lane.oldest.load(Ordering::SeqCst) >= *mark)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The lists stay consistent across a panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WriteTracker {
    /// A new queue's lane.
    pub fn lane(&self) -> WriteLane {
        let state = Arc::new(CachePadded(LaneState {
            begun: AtomicU64::new(0),
            oldest: AtomicU64::new(u64::MAX),
        }));
        let mut lanes = lock(&self.lanes);
        lanes.retain(|l| l.strong_count() > 0);
        lanes.push(Arc::downgrade(&state));
        WriteLane {
            state,
            next: 0,
            in_flight: VecDeque::new(),
        }
    }

    /// Every write begun so far, on any queue, is below this barrier.
    pub fn barrier(&self) -> Barrier {
        let lanes = lock(&self.lanes);
        Barrier {
            id: self.next_barrier.fetch_add(1, Ordering::Relaxed),
            marks: lanes
                .iter()
                .filter_map(Weak::upgrade)
                .map(|l| {
                    let mark = l.begun.load(Ordering::SeqCst);
                    (l, mark)
                })
                .collect(),
        }
    }

    /// Whether every write below `barrier` has ended; if not, `waker`
    /// fires once they have.
    pub fn passed(&self, barrier: &Barrier, waker: &Waker) -> bool {
        if barrier.passed() {
            return true;
        }
        let mut waiters = lock(&self.waiters);
        let known = waiters
            .iter()
            .any(|(b, w)| b.id == barrier.id && Arc::ptr_eq(w, waker));
        if !known {
            waiters.push((barrier.clone(), waker.clone()));
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        // Checked again after announcing the wait (see the module docs).
        if !barrier.passed() {
            return false;
        }
        waiters.retain(|(b, w)| !(b.id == barrier.id && Arc::ptr_eq(w, waker)));
        self.waiting.store(waiters.len(), Ordering::SeqCst);
        true
    }

    /// Wakes the commits whose barriers have passed.
    fn wake_passed(&self) {
        let woken: Vec<Waker> = {
            let mut waiters = lock(&self.waiters);
            let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut *waiters)
                .into_iter()
                .partition(|(b, _)| b.passed());
            *waiters = still;
            self.waiting.store(waiters.len(), Ordering::SeqCst);
            ready.into_iter().map(|(_, w)| w).collect()
        };
        for w in woken {
            // Only fails on counter overflow, when a wake-up is pending anyway.
            let _ = w.write(1);
        }
    }
}

impl WriteLane {
    /// Registers a write about to be planned; returns its number.
    pub fn begin(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        if self.in_flight.is_empty() {
            self.state.oldest.store(seq, Ordering::SeqCst);
        }
        self.in_flight.push_back((seq, false));
        // After `oldest`: a barrier that counts this write finds it in flight.
        self.state.begun.store(self.next, Ordering::SeqCst);
        seq
    }

    /// The write numbered `seq` has finished (or was never planned);
    /// wakes the commits of any queue it was the last to hold back.
    pub fn end(&mut self, seq: u64, tracker: &WriteTracker) {
        let Some(&(front, _)) = self.in_flight.front() else {
            return;
        };
        let Some(entry) = seq
            .checked_sub(front)
            .and_then(|i| self.in_flight.get_mut(usize::try_from(i).ok()?))
        else {
            return;
        };
        entry.1 = true;
        if seq != front {
            return;
        }
        while self.in_flight.front().is_some_and(|e| e.1) {
            self.in_flight.pop_front();
        }
        let oldest = self.in_flight.front().map_or(u64::MAX, |e| e.0);
        self.state.oldest.store(oldest, Ordering::SeqCst);
        if tracker.waiting.load(Ordering::SeqCst) > 0 {
            tracker.wake_passed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn a_barrier_waits_only_for_older_writes() {
        let t = WriteTracker::default();
        let mut lane = t.lane();
        let w = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let a = lane.begin();
        let b = lane.begin();
        let barrier = t.barrier();
        let c = lane.begin();
        assert!(!t.passed(&barrier, &w));
        lane.end(b, &t);
        assert!(w.read().is_err(), "a is still in flight");
        assert!(!t.passed(&barrier, &w));
        lane.end(a, &t);
        assert_eq!(
            w.read().unwrap(),
            1,
            "woken when the last older write ended"
        );
        assert!(t.passed(&barrier, &w), "c is newer than the barrier");
        lane.end(c, &t);
        assert!(t.passed(&t.barrier(), &w));
        assert_eq!(t.waiting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_barrier_covers_every_queue_and_only_live_ones() {
        let t = WriteTracker::default();
        let (mut q0, mut q1) = (t.lane(), t.lane());
        let w = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let x = q1.begin();
        let own = q0.begin();
        let barrier = t.barrier();
        q0.end(own, &t);
        assert!(!t.passed(&barrier, &w), "queue 1's write is older");
        q1.end(x, &t);
        assert_eq!(w.read().unwrap(), 1, "the other queue's end wakes it");
        assert!(t.passed(&barrier, &w));
        // A dropped queue's lane leaves the list (once no barrier holds it).
        drop(q1);
        drop(barrier);
        let _q2 = t.lane();
        assert_eq!(lock(&t.lanes).len(), 2);
        assert_eq!(t.barrier().marks.len(), 2);
    }

    #[test]
    fn racing_ends_never_strand_a_waiter() {
        // One thread ends writes while another waits on barriers: every
        // wait must end (a lost wake-up would hang the waiting loop).
        let t = Arc::new(WriteTracker::default());
        for _ in 0..200 {
            let mut lane = t.lane();
            let seqs: Vec<u64> = (0..4).map(|_| lane.begin()).collect();
            let barrier = t.barrier();
            let ender = {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for s in seqs.into_iter().rev() {
                        lane.end(s, &t);
                    }
                })
            };
            let w = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
            while !t.passed(&barrier, &w) {
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&*w),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
                assert_eq!(r, 1, "a waiter was never woken");
                let _ = w.read();
            }
            ender.join().unwrap();
        }
    }
}
