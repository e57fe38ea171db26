//! Per-disk I/O counters for `vm.counters`, kept per queue so the request
//! path never writes what another queue writes.
//!
//! Each queue worker owns one [`QueueCounters`] (its own 128-byte aligned
//! block, so two queues never share a cache line) and is its only writer:
//! it updates the counters with relaxed loads and stores, no atomic
//! read-modify-write, once per completed request. A reader on another
//! thread ([`DiskCounters::totals`], for the API) loads them with relaxed
//! ordering and sums the queues; a total may be a request behind, never
//! torn within one counter.
//!
//! Latencies are in microseconds, from the moment the worker submitted
//! the request to the moment it saw the completion (Cloud Hypervisor
//! counts the same span, in the same unit). Reads and writes are counted
//! on success; a request that ends with an error status counts in
//! `errors` only.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// What a completed request was, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountedOp {
    Read,
    Write,
    Flush,
    /// Discard and write-zeroes.
    Discard,
    /// GET_ID and the like: counted only when it fails.
    Other,
}

impl From<block::RequestOp> for CountedOp {
    fn from(op: block::RequestOp) -> Self {
        use block::RequestOp as R;
        match op {
            R::Read => CountedOp::Read,
            R::Write => CountedOp::Write,
            R::Flush => CountedOp::Flush,
            R::Discard { .. } | R::WriteZeroes { .. } => CountedOp::Discard,
        }
    }
}

/// Latency statistics of one direction, in microseconds.
#[derive(Default)]
struct Latency {
    min: AtomicU64,
    max: AtomicU64,
    sum: AtomicU64,
}

/// One queue's counters; written by that queue's worker only.
#[derive(Default)]
#[repr(align(128))]
pub struct QueueCounters {
    read_ops: AtomicU64,
    read_bytes: AtomicU64,
    write_ops: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
    read_latency: Latency,
    write_latency: Latency,
}

/// Adds to a counter this thread alone writes.
fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}

impl Latency {
    /// Records one sample; `first` when it is the direction's first op.
    fn record(&self, us: u64, first: bool) {
        if first || us < self.min.load(Relaxed) {
            self.min.store(us, Relaxed);
        }
        if us > self.max.load(Relaxed) {
            self.max.store(us, Relaxed);
        }
        bump(&self.sum, us);
    }
}

impl QueueCounters {
    /// A request that completed successfully after `latency`, having
    /// moved `bytes` bytes of data.
    pub fn completed(&self, op: CountedOp, bytes: u64, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        match op {
            CountedOp::Read => {
                self.read_latency
                    .record(us, self.read_ops.load(Relaxed) == 0);
                bump(&self.read_ops, 1);
                bump(&self.read_bytes, bytes);
            }
            CountedOp::Write => {
                self.write_latency
                    .record(us, self.write_ops.load(Relaxed) == 0);
                bump(&self.write_ops, 1);
                bump(&self.write_bytes, bytes);
            }
            CountedOp::Flush => bump(&self.flushes, 1),
            CountedOp::Discard => bump(&self.discards, 1),
            CountedOp::Other => {}
        }
    }

    /// A request answered with an error status.
    pub fn failed(&self) {
        bump(&self.errors, 1);
    }

    /// The number of requests the worker has taken and not completed.
    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.store(n as u64, Relaxed);
    }
}

/// Every counter of a disk, summed over its queues (what `vm.counters`
/// reports; names as Cloud Hypervisor's plus ours).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterTotals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// Microseconds; 0 while no read has completed.
    pub read_latency_min: u64,
    pub read_latency_max: u64,
    pub read_latency_avg: u64,
    pub write_latency_min: u64,
    pub write_latency_max: u64,
    pub write_latency_avg: u64,
    pub discards: u64,
    pub flushes: u64,
    pub errors: u64,
    pub in_flight: u64,
}

impl CounterTotals {
    /// `(name, value)` in a fixed order, for JSON maps and logs.
    pub fn entries(&self) -> [(&'static str, u64); 14] {
        [
            ("read_bytes", self.read_bytes),
            ("write_bytes", self.write_bytes),
            ("read_ops", self.read_ops),
            ("write_ops", self.write_ops),
            ("read_latency_min", self.read_latency_min),
            ("read_latency_max", self.read_latency_max),
            ("read_latency_avg", self.read_latency_avg),
            ("write_latency_min", self.write_latency_min),
            ("write_latency_max", self.write_latency_max),
            ("write_latency_avg", self.write_latency_avg),
            ("discards", self.discards),
            ("flushes", self.flushes),
            ("errors", self.errors),
            ("in_flight", self.in_flight),
        ]
    }
}

/// The counters of every queue of one disk; cheap to clone and read from
/// any thread.
#[derive(Clone)]
pub struct DiskCounters {
    queues: Arc<[QueueCounters]>,
}

impl DiskCounters {
    pub fn new(num_queues: u16) -> Self {
        DiskCounters {
            queues: (0..num_queues).map(|_| QueueCounters::default()).collect(),
        }
    }

    /// Queue `index`'s block (a device with fewer queues than `index`
    /// never asks).
    pub fn queue(&self, index: u16) -> Option<&QueueCounters> {
        self.queues.get(usize::from(index))
    }

    /// A handle on queue `index`'s block for its worker.
    pub fn queue_handle(&self, index: u16) -> Option<QueueCounterHandle> {
        (usize::from(index) < self.queues.len()).then(|| QueueCounterHandle {
            disk: self.clone(),
            index: usize::from(index),
        })
    }

    /// Sums the queues.
    pub fn totals(&self) -> CounterTotals {
        let mut t = CounterTotals::default();
        let (mut read_sum, mut write_sum) = (0u64, 0u64);
        for q in self.queues.iter() {
            let read_ops = q.read_ops.load(Relaxed);
            let write_ops = q.write_ops.load(Relaxed);
            t.read_ops += read_ops;
            t.write_ops += write_ops;
            t.read_bytes += q.read_bytes.load(Relaxed);
            t.write_bytes += q.write_bytes.load(Relaxed);
            t.flushes += q.flushes.load(Relaxed);
            t.discards += q.discards.load(Relaxed);
            t.errors += q.errors.load(Relaxed);
            t.in_flight += q.in_flight.load(Relaxed);
            merge(
                &mut t.read_latency_min,
                &mut t.read_latency_max,
                &q.read_latency,
                read_ops,
            );
            merge(
                &mut t.write_latency_min,
                &mut t.write_latency_max,
                &q.write_latency,
                write_ops,
            );
            read_sum = read_sum.wrapping_add(q.read_latency.sum.load(Relaxed));
            write_sum = write_sum.wrapping_add(q.write_latency.sum.load(Relaxed));
        }
        t.read_latency_avg = read_sum.checked_div(t.read_ops).unwrap_or(0);
        t.write_latency_avg = write_sum.checked_div(t.write_ops).unwrap_or(0);
        t
    }
}

/// Folds one queue's min/max into the totals (a queue without ops has
/// none to give).
fn merge(min: &mut u64, max: &mut u64, l: &Latency, ops: u64) {
    if ops == 0 {
        return;
    }
    let (qmin, qmax) = (l.min.load(Relaxed), l.max.load(Relaxed));
    *min = if *max == 0 && *min == 0 {
        qmin
    } else {
        (*min).min(qmin)
    };
    *max = (*max).max(qmax);
}

/// One queue's counters as its worker holds them.
#[derive(Clone)]
pub struct QueueCounterHandle {
    disk: DiskCounters,
    index: usize,
}

impl std::ops::Deref for QueueCounterHandle {
    type Target = QueueCounters;

    fn deref(&self) -> &QueueCounters {
        // `queue_handle` checked the index.
        &self.disk.queues[self.index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_sum_and_latencies_fold() {
        let d = DiskCounters::new(2);
        assert_eq!(d.totals(), CounterTotals::default());
        let q0 = d.queue_handle(0).unwrap();
        let q1 = d.queue_handle(1).unwrap();
        assert!(d.queue_handle(2).is_none());
        q0.completed(CountedOp::Read, 4096, Duration::from_micros(10));
        q0.completed(CountedOp::Read, 512, Duration::from_micros(30));
        q1.completed(CountedOp::Read, 1024, Duration::from_micros(5));
        q1.completed(CountedOp::Write, 8192, Duration::from_micros(100));
        q1.completed(CountedOp::Flush, 0, Duration::from_micros(1));
        q0.completed(CountedOp::Discard, 0, Duration::from_micros(1));
        q0.completed(CountedOp::Other, 20, Duration::from_micros(1));
        q1.failed();
        q0.set_in_flight(3);
        let t = d.totals();
        assert_eq!((t.read_ops, t.read_bytes), (3, 5632));
        assert_eq!((t.write_ops, t.write_bytes), (1, 8192));
        assert_eq!(
            (t.read_latency_min, t.read_latency_max, t.read_latency_avg),
            (5, 30, 15)
        );
        assert_eq!(
            (
                t.write_latency_min,
                t.write_latency_max,
                t.write_latency_avg
            ),
            (100, 100, 100)
        );
        assert_eq!((t.flushes, t.discards, t.errors, t.in_flight), (1, 1, 1, 3));
        assert_eq!(t.entries()[0], ("read_bytes", 5632));
    }

    #[test]
    fn each_queue_has_its_own_cache_lines() {
        assert!(std::mem::align_of::<QueueCounters>() >= 128);
        assert_eq!(std::mem::size_of::<QueueCounters>() % 128, 0);
    }
}
