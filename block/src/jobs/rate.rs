//! A job's rate limit: bytes per second over a window, as QEMU's block
//! jobs take `speed`. The job reports every chunk it copied
//! ([`RateLimit::account`]) and waits as long as it is told to (a
//! virtual clock of when the bytes so far are due); `0` means no limit.
//! The limit may change while the job runs.
//!
//! By hand because it is a few lines: the crates for it (`governor`,
//! `ratelimit`) count cells per period and bring more than this needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far behind the limit may fall before it stops counting (a job
/// idle for a while does not then burst past its speed).
const SLACK: Duration = Duration::from_millis(100);

/// See the module docs.
#[derive(Debug)]
pub struct RateLimit {
    speed: AtomicU64,
    /// When the bytes accounted so far are due at `speed`.
    due: Mutex<Instant>,
}

impl RateLimit {
    pub fn new(speed: u64) -> RateLimit {
        RateLimit {
            speed: AtomicU64::new(speed),
            due: Mutex::new(Instant::now()),
        }
    }

    pub fn get(&self) -> u64 {
        self.speed.load(Ordering::Relaxed)
    }

    pub fn set(&self, speed: u64) {
        self.speed.store(speed, Ordering::Relaxed);
    }

    /// `bytes` were moved: how long to wait before moving more.
    pub fn account(&self, bytes: u64) -> Option<Duration> {
        let speed = self.get();
        if speed == 0 {
            return None;
        }
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let from = (*due).max(now.checked_sub(SLACK).unwrap_or(now));
        *due = from + Duration::from_secs_f64(bytes as f64 / speed as f64);
        (*due > now).then(|| *due - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_never_waits() {
        let r = RateLimit::new(0);
        assert_eq!(r.account(1 << 30), None);
    }

    #[test]
    fn waits_for_what_the_speed_allows() {
        let r = RateLimit::new(10 << 20);
        // 2 MiB at 10 MiB/s: 200 ms, less the slack of an idle limit.
        let w = r.account(2 << 20).expect("a wait");
        assert!(
            w > Duration::from_millis(90) && w <= Duration::from_millis(200),
            "{w:?}"
        );
        // The next MiB is due 100 ms after those.
        let w = r.account(1 << 20).expect("a wait");
        assert!(w > Duration::from_millis(190), "{w:?}");
        r.set(0);
        assert_eq!(r.account(1 << 20), None);
    }
}
