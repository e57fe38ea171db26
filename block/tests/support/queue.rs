//! Waiting for a queue's completions with a deadline: a test that waits
//! on a stalled queue fails, saying how far it got, instead of blocking
//! the test run.
//!
//! [`wait_completions_within`] sleeps in poll(2) on the queue's
//! completion eventfd (every completion signals it, as the device's
//! worker relies on), then calls [`DiskQueue::wait_completions`], which
//! then has a completion to return.

use std::os::fd::AsRawFd;
use std::time::Duration;

use block::{Completion, DiskQueue};

/// How long a test waits for the next completion of a queue.
pub const QUEUE_LIMIT: Duration = Duration::from_secs(120);

/// Waits up to `ms` for the queue's completion eventfd; whether it fired.
pub fn completion_signalled(q: &DiskQueue, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: q.completion_eventfd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// [`DiskQueue::wait_completions`] (at least one completion, or none in
/// flight), failing the test when none is signalled within `limit`.
#[track_caller]
pub fn wait_completions_within(q: &mut DiskQueue, out: &mut Vec<Completion>, limit: Duration) {
    if q.in_flight() > 0 {
        let ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
        assert!(
            completion_signalled(q, ms),
            "no completion within {limit:?} ({} requests in flight, {} completions so far)",
            q.in_flight(),
            out.len()
        );
    }
    q.wait_completions(out).unwrap();
}
