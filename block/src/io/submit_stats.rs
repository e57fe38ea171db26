//! How long the submitting thread spends inside the kernel's submit call
//! (`io_submit` for the aio engine, `io_uring_enter` for the uring
//! engine): what makes native AIO unsafe on sparse images is that this
//! call blocks while the file system allocates.
//!
//! Off by default (one relaxed atomic load per call). A benchmark turns it
//! on with [`enable`], runs, and takes the samples with [`take`]; engines
//! report each call's duration with [`record`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ENABLED: AtomicBool = AtomicBool::new(false);
static SAMPLES: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// At most this many samples are kept (16 MiB); later calls are dropped.
const MAX_SAMPLES: usize = 4 << 20;

/// Starts recording (and clears what was recorded).
pub fn enable() {
    let mut s = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    s.clear();
    ENABLED.store(true, Ordering::Relaxed);
}

/// A start time when recording is on.
pub fn start() -> Option<Instant> {
    ENABLED.load(Ordering::Relaxed).then(Instant::now)
}

/// Records the call that began at `start` (no-op when `None`).
pub fn record(start: Option<Instant>) {
    let Some(t) = start else {
        return;
    };
    let ns = u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX);
    let mut s = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    if s.len() < MAX_SAMPLES {
        s.push(ns);
    }
}

/// Percentiles of the recorded calls.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SubmitTimes {
    pub calls: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// Stops recording and returns the percentiles of what was recorded.
pub fn take() -> SubmitTimes {
    ENABLED.store(false, Ordering::Relaxed);
    let mut s = std::mem::take(&mut *SAMPLES.lock().unwrap_or_else(|p| p.into_inner()));
    if s.is_empty() {
        return SubmitTimes::default();
    }
    s.sort_unstable();
    let at = |q: f64| {
        let i = ((s.len() - 1) as f64 * q).round() as usize;
        Duration::from_nanos(u64::from(s[i.min(s.len() - 1)]))
    };
    SubmitTimes {
        calls: s.len(),
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_while_enabled() {
        record(start());
        enable();
        for _ in 0..10 {
            record(start());
        }
        let t = take();
        assert!(t.calls >= 10, "{t:?}");
        assert!(t.p50 <= t.p99 && t.p99 <= t.max);
        assert!(start().is_none());
    }
}
