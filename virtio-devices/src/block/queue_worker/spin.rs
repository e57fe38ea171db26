//! The spin before a queue worker sleeps: for an adaptive time (see
//! [`ch_util::adaptive_poll`]) the worker looks for its next event without
//! sleeping, the disk's completions (reaped without a system call) and
//! chains the driver posted, yielding the CPU between looks.
//!
//! The event loop (`mod.rs`) calls [`WorkerState::poll_before_sleep`]
//! before each sleep and learns how the spin ended ([`Spin`]); a spin
//! that catches work has done it (completed, or taken chains off the
//! ring) before it returns. Completions reaped here leave the completion
//! eventfd signalled (`signal_stale`); the loop clears it before it
//! sleeps.

use std::time::Instant;

use super::state::WorkerState;
use ch_util::adaptive_poll::{yield_cpu, WaitKind};

/// How a spin before a sleep ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Spin {
    /// It found work (and did it).
    Caught,
    /// Its budget ran out (or it had none).
    Expired,
    /// Other threads wanted the CPU (see `poll_before_sleep`).
    Contended,
    /// It did not spin: one request in flight (see `poll_before_sleep`).
    Skipped,
}

impl WorkerState {
    /// What the worker waits for now: completions of requests in flight,
    /// or (nothing in flight) the driver's next request.
    pub(super) fn wait_kind(&self) -> WaitKind {
        if self.pending.is_empty() && self.w.disk.in_flight() == 0 {
            WaitKind::Request
        } else {
            WaitKind::Completion
        }
    }

    /// The adaptive spin before a sleep (`BlockDeviceConfig::poll_us` is
    /// its ceiling): for up to the budget of this kind of wait, look at
    /// the disk's completions and the avail ring without sleeping,
    /// yielding the CPU between looks. The ring is polled with nothing in
    /// flight too: at queue depth 1 the driver posts its next chain right
    /// after taking a completion, and catching it here saves the wake-up
    /// its kick would cost (as QEMU's iothread polls its virtqueues). The
    /// budget grows while waits end within the ceiling and shrinks (to
    /// zero) while they do not, so an idle queue does not spin at all.
    /// A yield that takes longer than the whole budget means other
    /// threads wanted this CPU: the spin stops and the budget shrinks
    /// (`AdaptivePoll::contended`).
    ///
    /// With one request in flight the worker does not spin for its
    /// completion: that wait is the device's whole latency, not the gap
    /// between completions of many requests, and a spin that misses it
    /// costs more than its CPU: on the development VM it made queue-depth-1
    /// reads slower than no polling at all (docs/performance.md, "What
    /// explains the limits"). Such a wait is
    /// not recorded either, so it does not shrink the budget that the
    /// deeper waits of the same kind use. Says how the spin ended.
    pub(super) fn poll_before_sleep(&mut self, wait: WaitKind, start: Instant) -> Spin {
        if wait == WaitKind::Completion && self.w.disk.in_flight() <= 1 {
            return Spin::Skipped;
        }
        let budget = self.poll.budget(wait);
        // A throttled queue with nothing in flight waits for its timer.
        if budget.is_zero() || (self.throttled && wait == WaitKind::Request) {
            return Spin::Expired;
        }
        // One clock read per look: the time after a yield serves both
        // to judge the yield and as the time of the next look.
        let mut look_at = start;
        loop {
            if self.found_work() {
                self.poll.record(wait, look_at - start, true);
                return Spin::Caught;
            }
            if look_at - start >= budget {
                return Spin::Expired;
            }
            yield_cpu();
            let after_yield = Instant::now();
            if after_yield - look_at > budget {
                self.poll.contended(wait);
                return Spin::Contended;
            }
            look_at = after_yield;
        }
    }

    /// One look of the spin: completions (reaped without a system call
    /// unless some are there) and chains the driver posted.
    fn found_work(&mut self) -> bool {
        let mut found = self.w.disk.in_flight() > 0 && self.reap_finished() > 0;
        if !self.throttled && self.avail_pending() {
            self.process_available();
            found = true;
        }
        found
    }
}
