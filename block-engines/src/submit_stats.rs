//! How long the submitting thread spends inside the kernel's submit call
//! (`io_submit` for the aio engine, `io_uring_enter` for the uring
//! engine): what makes native AIO unsafe on sparse images is that this
//! call blocks while the file system allocates.
//!
//! Off by default (one relaxed atomic load per call). A benchmark turns it
//! on with [`enable`], runs, and takes the samples with [`take`]; engines
//! report each call's duration and how many entries (control blocks or
//! SQEs) it handed over with [`record`]. [`take`] returns the percentiles
//! of the wall time per call and, by batch size ([`SizeClass`]), the same
//! for each size class, so a slow p99 can be traced to the calls that
//! carried many entries or to calls that blocked with few.
//!
//! Each thread records into its own buffer (a thread-local), handed to the
//! shared list only when the thread ends or calls [`take`]: queue threads
//! measuring their submissions write nothing that another queue writes
//! (a shared list behind one lock, locked on every submit call, made the
//! benchmark itself a point where the queues met).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Bumped by [`enable`]: a thread's buffer from an earlier recording is
/// dropped instead of being merged into this one.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Samples handed over by threads that ended: one per call, nanoseconds in
/// the low 32 bits, entries in the high 32.
static SAMPLES: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// At most this many samples are kept (32 MiB); later calls are dropped.
const MAX_SAMPLES: usize = 4 << 20;

/// One thread's samples, handed to [`SAMPLES`] when the thread ends.
struct LocalSamples {
    generation: u64,
    samples: Vec<u64>,
}

impl LocalSamples {
    /// Moves this thread's samples to the shared list (if they belong to
    /// the recording in progress).
    fn hand_over(&mut self) {
        let samples = std::mem::take(&mut self.samples);
        if samples.is_empty() || self.generation != GENERATION.load(Ordering::Relaxed) {
            return;
        }
        let mut shared = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
        let room = MAX_SAMPLES.saturating_sub(shared.len());
        shared.extend(samples.into_iter().take(room));
    }
}

impl Drop for LocalSamples {
    fn drop(&mut self) {
        self.hand_over();
    }
}

thread_local! {
    static LOCAL: RefCell<LocalSamples> = const {
        RefCell::new(LocalSamples { generation: 0, samples: Vec::new() })
    };
}

/// Upper bounds (inclusive) of the batch-size classes of [`SubmitTimes::by_size`].
const SIZE_BOUNDS: [u32; 6] = [1, 4, 8, 16, 32, 64];

/// Starts recording (and clears what was recorded).
pub fn enable() {
    let mut s = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    s.clear();
    GENERATION.fetch_add(1, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
}

/// A start time when recording is on.
pub fn start() -> Option<Instant> {
    ENABLED.load(Ordering::Relaxed).then(Instant::now)
}

/// Records the call that began at `start` and handed `entries` to the
/// kernel (no-op when `start` is `None`).
pub fn record(start: Option<Instant>, entries: usize) {
    let Some(t) = start else {
        return;
    };
    let ns = u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX);
    push(ns, entries);
}

/// Records a call of `took` that handed `entries` to the kernel, timed by
/// the engine itself (no-op while recording is off).
pub fn record_duration(took: Duration, entries: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let ns = u32::try_from(took.as_nanos()).unwrap_or(u32::MAX);
    push(ns, entries);
}

fn push(ns: u32, entries: usize) {
    let entries = u32::try_from(entries).unwrap_or(u32::MAX);
    let generation = GENERATION.load(Ordering::Relaxed);
    // A thread being torn down has no buffer left: its sample is dropped.
    let _ = LOCAL.try_with(|local| {
        let mut local = local.borrow_mut();
        if local.generation != generation {
            local.generation = generation;
            local.samples.clear();
        }
        if local.samples.len() < MAX_SAMPLES {
            local.samples.push(u64::from(entries) << 32 | u64::from(ns));
        }
    });
}

/// Percentiles of the wall time of a set of calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub calls: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Percentiles {
    /// Of the call times `ns` (sorted here).
    fn of(ns: &mut [u32]) -> Self {
        if ns.is_empty() {
            return Percentiles::default();
        }
        ns.sort_unstable();
        let at = |q: f64| {
            let i = ((ns.len() - 1) as f64 * q).round() as usize;
            Duration::from_nanos(u64::from(ns[i.min(ns.len() - 1)]))
        };
        Percentiles {
            calls: ns.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// The calls that handed over `min_entries..=max_entries` entries.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SizeClass {
    pub min_entries: u32,
    pub max_entries: u32,
    pub times: Percentiles,
}

/// What [`take`] returns: every call, the entries per call, and the calls
/// by batch size (only classes that had calls).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SubmitTimes {
    pub calls: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Median and largest number of entries one call handed over.
    pub entries_p50: u32,
    pub entries_max: u32,
    pub by_size: Vec<SizeClass>,
}

/// Stops recording and returns the percentiles of what was recorded by
/// the calling thread and by the threads that have ended since
/// [`enable`] (a thread still running keeps its samples).
pub fn take() -> SubmitTimes {
    ENABLED.store(false, Ordering::Relaxed);
    let _ = LOCAL.try_with(|local| local.borrow_mut().hand_over());
    let s = std::mem::take(&mut *SAMPLES.lock().unwrap_or_else(|p| p.into_inner()));
    summarize(&s)
}

fn summarize(samples: &[u64]) -> SubmitTimes {
    if samples.is_empty() {
        return SubmitTimes::default();
    }
    let ns_of = |v: u64| (v & u64::from(u32::MAX)) as u32;
    let entries_of = |v: u64| (v >> 32) as u32;
    let mut all: Vec<u32> = samples.iter().map(|&v| ns_of(v)).collect();
    let times = Percentiles::of(&mut all);
    let mut entries: Vec<u32> = samples.iter().map(|&v| entries_of(v)).collect();
    entries.sort_unstable();
    let mut by_size = Vec::new();
    let mut lo = 0u32;
    for hi in SIZE_BOUNDS.into_iter().chain([u32::MAX]) {
        let mut ns: Vec<u32> = samples
            .iter()
            .filter(|&&v| (lo..=hi).contains(&entries_of(v)))
            .map(|&v| ns_of(v))
            .collect();
        if !ns.is_empty() {
            by_size.push(SizeClass {
                min_entries: lo,
                max_entries: hi,
                times: Percentiles::of(&mut ns),
            });
        }
        lo = hi.saturating_add(1);
    }
    SubmitTimes {
        calls: times.calls,
        p50: times.p50,
        p99: times.p99,
        max: times.max,
        entries_p50: entries[(entries.len() - 1) / 2],
        entries_max: entries[entries.len() - 1],
        by_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recording is process-wide: tests that enable it take turns.
    static TURN: Mutex<()> = Mutex::new(());

    #[test]
    fn records_only_while_enabled() {
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        record(start(), 1);
        enable();
        for i in 0..10 {
            record(start(), i);
        }
        let t = take();
        assert!(t.calls >= 10, "{t:?}");
        assert!(t.p50 <= t.p99 && t.p99 <= t.max);
        assert!(start().is_none());
    }

    #[test]
    fn samples_of_ended_threads_are_taken() {
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        enable();
        std::thread::spawn(|| {
            for i in 0..5 {
                record_duration(Duration::from_micros(7), i);
            }
        })
        .join()
        .unwrap();
        let t = take();
        assert!(t.calls >= 5, "{t:?}");
        assert!(t.entries_max >= 4, "{t:?}");
    }

    #[test]
    fn calls_are_split_by_batch_size() {
        let sample = |entries: u64, us: u64| entries << 32 | (us * 1000);
        let mut s: Vec<u64> = (0..99).map(|_| sample(1, 10)).collect();
        s.push(sample(40, 500));
        let t = summarize(&s);
        assert_eq!(t.calls, 100);
        assert_eq!(t.entries_p50, 1);
        assert_eq!(t.entries_max, 40);
        assert_eq!(t.max, Duration::from_micros(500));
        assert_eq!(t.by_size.len(), 2, "{t:?}");
        assert_eq!((t.by_size[0].min_entries, t.by_size[0].max_entries), (0, 1));
        assert_eq!(t.by_size[0].times.max, Duration::from_micros(10));
        assert_eq!(
            (t.by_size[1].min_entries, t.by_size[1].max_entries),
            (33, 64)
        );
        assert_eq!(t.by_size[1].times.calls, 1);
    }
}
