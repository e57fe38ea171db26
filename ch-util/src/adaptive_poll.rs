//! Adaptive busy-polling before a queue thread sleeps (QEMU's iothread
//! polling, `poll-max-ns`): a thread about to wait for its next event
//! first looks for it without sleeping, for a bounded time, because a
//! sleeping thread costs a wake-up (on a virtual machine an
//! inter-processor interrupt and a halted vCPU's exit) on the request's
//! path. Used by the virtio-blk queue workers and the storage daemon's
//! FUSE queue threads.
//!
//! How long to spin adapts per kind of wait ([`WaitKind`]): waiting for
//! the next request with nothing in flight (the guest's or application's
//! own turn-around, a few microseconds at queue depth 1) is a different
//! wait from waiting for image I/O (the device's latency). As in QEMU's
//! `util/aio-posix.c`: a wait the spin would have caught had it been
//! longer (it ended within `max`) doubles the budget, starting at 4 us
//! and capped at `max`; a wait longer than `max` shrinks it (QEMU resets
//! it to 0 by default; we halve it, down to 0 below 4 us); a wait the
//! spin caught leaves it alone. So a thread spins only where spinning
//! keeps paying off, a device slower than `max` is never spun for, and an
//! idle thread, whose waits are all long, does not spin at all. A spin
//! whose yield took longer than its whole budget (other threads wanted
//! the CPU) shrinks the budget too ([`AdaptivePoll::contended`]): polling
//! pays only on a CPU nobody else is waiting for.
//!
//! Enters as the time each wait took and whether the spin caught the
//! event ([`AdaptivePoll::record`]); leaves as the spin budget of the next
//! wait of the same kind ([`AdaptivePoll::budget`]). A caller either
//! waits through [`AdaptivePoll::wait`], giving it its own look for
//! events, or runs its own spin and sleep and reports them to `record`.

use std::time::{Duration, Instant};

/// Between two looks of a spin: lets a thread that waits for this CPU
/// run (the application about to send the next request is often woken
/// on the CPU the queue thread spins on; without the yield it would
/// wait for the spin to end). Returns at once when nobody waits.
pub fn yield_cpu() {
    // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

/// The first budget after a wait that spinning would have caught.
const START: Duration = Duration::from_micros(4);

/// What a queue thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// Nothing in flight: the next request from the driver.
    Request,
    /// Block I/O in flight: its completion (or another request).
    Completion,
}

/// Spin budgets of one queue thread, one per [`WaitKind`].
#[derive(Clone, Debug)]
pub struct AdaptivePoll {
    max: Duration,
    budgets: [Duration; 2],
    /// Waits, and waits the spin caught (for the log line at exit).
    pub waits: u64,
    pub caught: u64,
}

fn slot(kind: WaitKind) -> usize {
    match kind {
        WaitKind::Request => 0,
        WaitKind::Completion => 1,
    }
}

impl AdaptivePoll {
    /// `max` zero turns polling off.
    pub fn new(max: Duration) -> Self {
        AdaptivePoll {
            max,
            budgets: [Duration::ZERO; 2],
            waits: 0,
            caught: 0,
        }
    }

    /// How long to spin before the next wait of `kind`.
    pub fn budget(&self, kind: WaitKind) -> Duration {
        self.budgets[slot(kind)]
    }

    /// Waits for an event of `kind`: `check(false)` looks without
    /// sleeping (`None`: nothing yet) for up to the spin budget, yielding
    /// the CPU between looks; then `check(true)` sleeps until there is
    /// one. Records how the wait went.
    pub fn wait<T>(
        &mut self,
        kind: WaitKind,
        mut check: impl FnMut(bool) -> std::io::Result<Option<T>>,
    ) -> std::io::Result<Option<T>> {
        if self.max.is_zero() {
            return check(true);
        }
        let budget = self.budget(kind);
        let start = Instant::now();
        if !budget.is_zero() {
            loop {
                if let Some(found) = check(false)? {
                    self.record(kind, start.elapsed(), true);
                    return Ok(Some(found));
                }
                if start.elapsed() >= budget {
                    break;
                }
                let before_yield = Instant::now();
                yield_cpu();
                if before_yield.elapsed() > budget {
                    self.contended(kind);
                    return check(true);
                }
            }
        }
        let found = check(true)?;
        self.record(kind, start.elapsed(), false);
        Ok(found)
    }

    /// A spin of `kind` was cut short because the CPU was wanted by
    /// other threads (a yield took longer than the whole budget): polling
    /// does not pay on a CPU others need, so the budget halves as for a
    /// wait longer than `max`. The caller does not also `record` the sleep
    /// that follows.
    pub fn contended(&mut self, kind: WaitKind) {
        self.waits += 1;
        self.shrink(kind);
    }

    fn shrink(&mut self, kind: WaitKind) {
        let budget = &mut self.budgets[slot(kind)];
        *budget /= 2;
        if *budget < START {
            *budget = Duration::ZERO;
        }
    }

    /// Folds in one wait of `kind` that took `waited` (spin and sleep);
    /// `caught` when the event came while spinning.
    pub fn record(&mut self, kind: WaitKind, waited: Duration, caught: bool) {
        self.waits += 1;
        if caught {
            self.caught += 1;
            return;
        }
        if waited > self.max {
            self.shrink(kind);
            return;
        }
        let budget = &mut self.budgets[slot(kind)];
        if *budget < self.max {
            *budget = (*budget * 2).max(START).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn short_waits_grow_the_budget_up_to_max() {
        let mut p = AdaptivePoll::new(32 * US);
        assert_eq!(p.budget(WaitKind::Request), Duration::ZERO);
        p.record(WaitKind::Request, 10 * US, false);
        assert_eq!(p.budget(WaitKind::Request), START);
        for _ in 0..10 {
            p.record(WaitKind::Request, 10 * US, false);
        }
        assert_eq!(p.budget(WaitKind::Request), 32 * US);
        // The other kind is untouched.
        assert_eq!(p.budget(WaitKind::Completion), Duration::ZERO);
    }

    #[test]
    fn long_waits_shrink_it_to_zero_and_caught_ones_keep_it() {
        let mut p = AdaptivePoll::new(32 * US);
        for _ in 0..4 {
            p.record(WaitKind::Completion, 10 * US, false);
        }
        assert_eq!(p.budget(WaitKind::Completion), 32 * US);
        p.record(WaitKind::Completion, 5 * US, true);
        assert_eq!(p.budget(WaitKind::Completion), 32 * US);
        p.record(WaitKind::Completion, 100 * US, false);
        assert_eq!(p.budget(WaitKind::Completion), 16 * US);
        for _ in 0..3 {
            p.record(WaitKind::Completion, 100 * US, false);
        }
        assert_eq!(p.budget(WaitKind::Completion), Duration::ZERO);
        assert_eq!((p.waits, p.caught), (9, 1));
    }

    #[test]
    fn a_contended_spin_shrinks_the_budget() {
        let mut p = AdaptivePoll::new(32 * US);
        for _ in 0..4 {
            p.record(WaitKind::Completion, 10 * US, false);
        }
        assert_eq!(p.budget(WaitKind::Completion), 32 * US);
        p.contended(WaitKind::Completion);
        assert_eq!(p.budget(WaitKind::Completion), 16 * US);
        for _ in 0..3 {
            p.contended(WaitKind::Completion);
        }
        assert_eq!(p.budget(WaitKind::Completion), Duration::ZERO);
    }

    #[test]
    fn zero_max_never_polls() {
        let mut p = AdaptivePoll::new(Duration::ZERO);
        for _ in 0..4 {
            p.record(WaitKind::Request, Duration::ZERO, false);
        }
        assert_eq!(p.budget(WaitKind::Request), Duration::ZERO);
    }
}
