//! Which /dev/fuse queue threads take requests: the first always, the
//! others ("helpers") only while the export is loaded.
//!
//! Every queue thread's descriptor reads the same kernel queue, and
//! EPOLLEXCLUSIVE wakes one *sleeping* waiter per request. At queue depth 1
//! the thread that has just answered is usually still on its way back to
//! epoll when the application's next request arrives (the reply woke the
//! application, often on that thread's CPU), so the kernel wakes the
//! sleeping sibling, which mostly finds the request already taken by the
//! first thread back in epoll: a wake-up on the other vCPU for nothing, for
//! 675 of 1000 fio reads at depth 1. Measured on the quiet 2-CPU machine
//! (docs/performance.md, "What explains the limits"): at (1,1)
//! one queue thread took 94-99 us per I/O and 1.3-1.4 sleeps, two took
//! 106-113 us and 2.0 sleeps; at (1,64) two threads were about 10 % faster
//! than one.
//!
//! So a helper reads /dev/fuse only after the first thread has seen
//! [`ARM_AT`] requests in flight across the export, and stops once it has
//! had nothing of its own in flight and the load has stayed below
//! [`DISARM_BELOW`] for [`QUIET_FOR`]. A deep queue's load dips below 2
//! between bursts (the daemon holds only what the application has
//! submitted and the kernel has passed on): disarming at the first dip
//! re-armed the helper 1837 times in 4 s at (1,64) and cost 12 % there.
//! The first thread never stops reading, so a request never waits for a
//! helper: a helper armed late or disarmed early costs speed, never a
//! request.
//!
//! Enters as load changes ([`ReaderGate::submitted`],
//! [`ReaderGate::completed`]) and the first thread's look after each batch
//! it reads ([`ReaderGate::arm_helpers_if_loaded`], which kicks the
//! helpers' eventfds); leaves as each helper's answer to "read /dev/fuse
//! now?" ([`ReaderGate::helper_should_read`]). The end of the connection
//! kicks every helper ([`ReaderGate::close`]) so a helper that is not
//! reading still sees it. The gate also carries the first thread's CPU
//! ([`ReaderGate::note_primary_cpu`]), which a reading helper keeps off
//! ([`super::helper_cpu`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::helper_cpu::current_cpu;

/// Requests in flight across the export at which the helpers start
/// reading. One application thread at depth 1 never has more than one in
/// flight, and is served best by one reader; four jobs at depth 1 are
/// served better by two (with a first version that armed at 8, four jobs
/// at depth 1 took 162-166 us per I/O against 146-158 with every thread
/// reading).
pub const ARM_AT: usize = 3;
/// Requests in flight below which an idle helper stops reading...
pub const DISARM_BELOW: usize = 2;
/// ...once the load has stayed there this long (seen at its wake-ups).
pub const QUIET_FOR: Duration = Duration::from_millis(20);

/// A helper's own view of how long the export has looked quiet.
#[derive(Debug, Default)]
pub struct QuietSince(Option<Instant>);

/// One helper thread's switch.
struct Helper {
    /// The helper should read /dev/fuse.
    armed: AtomicBool,
    /// Written when `armed` turns on (or the connection ends); the helper
    /// waits on it while it does not read.
    kick: EventFd,
}

/// The export-wide load and the helpers' switches (shared by every
/// /dev/fuse queue thread).
pub struct ReaderGate {
    in_flight: AtomicUsize,
    /// Helpers armed by a kick, for the log line at the end.
    kicks: AtomicUsize,
    closing: AtomicBool,
    helpers: Vec<Helper>,
    /// The CPU the first thread last ran on ([`NO_CPU`]: not known yet).
    primary_cpu: AtomicUsize,
}

/// [`ReaderGate::primary_cpu`] before the first thread has said.
const NO_CPU: usize = usize::MAX;

impl ReaderGate {
    /// A gate for one first thread and `helpers` helpers.
    pub fn new(helpers: usize) -> std::io::Result<Self> {
        let helpers = (0..helpers)
            .map(|_| {
                Ok(Helper {
                    armed: AtomicBool::new(false),
                    kick: EventFd::new(EFD_NONBLOCK)?,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ReaderGate {
            in_flight: AtomicUsize::new(0),
            kicks: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            helpers,
            primary_cpu: AtomicUsize::new(NO_CPU),
        })
    }

    /// `n` requests went to a disk queue.
    pub fn submitted(&self, n: usize) {
        self.in_flight.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` requests came back from a disk queue.
    pub fn completed(&self, n: usize) {
        // Never below zero, whatever the order of the threads' updates.
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// How many times a helper was armed by the load (the log line).
    pub fn kicks(&self) -> usize {
        self.kicks.load(Ordering::Relaxed)
    }

    /// Requests in flight across the export.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The first thread, after a batch: arms and kicks every helper that
    /// is not reading when the export is loaded.
    pub fn arm_helpers_if_loaded(&self) {
        if self.in_flight() < ARM_AT {
            return;
        }
        for h in &self.helpers {
            if !h.armed.swap(true, Ordering::AcqRel) {
                self.kicks.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = h.kick.write(1) {
                    log::debug!("fuse: kicking a queue helper: {e}");
                }
            }
        }
    }

    /// The connection is gone: every helper must look at /dev/fuse to
    /// see it (and then end); [`Self::helper_should_read`] says yes to all
    /// from now on, and the kick wakes those that are not reading.
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        for h in &self.helpers {
            let _ = h.kick.write(1);
        }
    }

    /// Helper `i`'s kick eventfd (to wait on while it does not read).
    pub fn kick_fd(&self, i: usize) -> Option<&EventFd> {
        self.helpers.get(i).map(|h| &h.kick)
    }

    /// Helper `i`, before it waits at `now` with `own_in_flight` requests
    /// of its own: whether it reads /dev/fuse during this wait. An idle
    /// helper whose export has stayed quiet for [`QUIET_FOR`] disarms
    /// itself here.
    pub fn helper_should_read(
        &self,
        i: usize,
        own_in_flight: usize,
        quiet: &mut QuietSince,
        now: Instant,
    ) -> bool {
        let Some(h) = self.helpers.get(i) else {
            return true;
        };
        if self.closing.load(Ordering::Acquire) {
            return true;
        }
        if own_in_flight == 0 && self.in_flight() < DISARM_BELOW {
            let since = *quiet.0.get_or_insert(now);
            if now.duration_since(since) >= QUIET_FOR {
                // Only the helper turns its own switch off; the first
                // thread may turn it on again at any time (then the kick
                // wakes it).
                let _ = h
                    .armed
                    .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire);
                quiet.0 = None;
            }
        } else {
            quiet.0 = None;
        }
        h.armed.load(Ordering::Acquire)
    }

    /// The first thread, after a batch: notes the CPU it runs on, which
    /// armed helpers keep off ([`super::helper_cpu`]). Without helpers
    /// nobody reads it, so nothing is asked.
    pub fn note_primary_cpu(&self) {
        if self.helpers.is_empty() {
            return;
        }
        let cpu = current_cpu().unwrap_or(NO_CPU);
        self.primary_cpu.store(cpu, Ordering::Relaxed);
    }

    /// The first thread's CPU as last noted.
    pub fn primary_cpu(&self) -> Option<usize> {
        Some(self.primary_cpu.load(Ordering::Relaxed)).filter(|&c| c != NO_CPU)
    }

    /// Clears helper `i`'s kick (after it woke on it).
    pub fn take_kick(&self, i: usize) {
        if let Some(h) = self.helpers.get(i) {
            let _ = h.kick.read();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_read_only_under_load_and_stop_when_it_stays_gone() {
        let gate = ReaderGate::new(2).unwrap();
        let t0 = Instant::now();
        let (mut q0, mut q1) = (QuietSince::default(), QuietSince::default());
        // Idle export: no helper reads, nothing kicks them.
        assert!(!gate.helper_should_read(0, 0, &mut q0, t0));
        gate.submitted(ARM_AT - 1);
        gate.arm_helpers_if_loaded();
        assert!(!gate.helper_should_read(1, 0, &mut q1, t0));
        assert_eq!(gate.kick_fd(0).unwrap().read().ok(), None);
        // Loaded: both are armed and kicked once.
        gate.submitted(1);
        gate.arm_helpers_if_loaded();
        gate.arm_helpers_if_loaded();
        assert_eq!(gate.kick_fd(0).unwrap().read().unwrap(), 1);
        assert_eq!(gate.kick_fd(1).unwrap().read().unwrap(), 1);
        assert_eq!(gate.kicks(), 2);
        assert!(gate.helper_should_read(0, 0, &mut q0, t0));
        // The load falls but not below DISARM_BELOW: they keep reading.
        gate.completed(ARM_AT - DISARM_BELOW);
        assert!(gate.helper_should_read(0, 0, &mut q0, t0));
        // Below it: a helper with I/O of its own keeps reading; an idle
        // one keeps reading through a short dip...
        gate.completed(1);
        assert!(gate.helper_should_read(0, 3, &mut q0, t0));
        assert!(gate.helper_should_read(1, 0, &mut q1, t0));
        assert!(gate.helper_should_read(1, 0, &mut q1, t0 + QUIET_FOR / 2));
        // ...which a busy moment ends (the quiet time starts again)...
        gate.submitted(5);
        assert!(gate.helper_should_read(1, 0, &mut q1, t0 + QUIET_FOR));
        gate.completed(5);
        assert!(gate.helper_should_read(1, 0, &mut q1, t0 + QUIET_FOR * 3 / 2));
        // ...and stops once the quiet has lasted QUIET_FOR.
        assert!(!gate.helper_should_read(1, 0, &mut q1, t0 + QUIET_FOR * 5 / 2));
        assert!(gate.helper_should_read(0, 3, &mut q0, t0 + QUIET_FOR * 5 / 2));
        // Completions never take the count below zero.
        gate.completed(100);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn the_end_of_the_connection_kicks_and_arms_every_helper() {
        let gate = ReaderGate::new(3).unwrap();
        gate.close();
        let now = Instant::now();
        for i in 0..3 {
            assert!(gate.helper_should_read(i, 0, &mut QuietSince::default(), now));
            assert_eq!(gate.kick_fd(i).unwrap().read().unwrap(), 1);
        }
        // Not a helper: the first thread always reads.
        assert!(gate.helper_should_read(7, 0, &mut QuietSince::default(), now));
    }
}
