//! The one log of failed requests, for every front end (virtio-blk, the
//! FUSE export, NBD): each failed request is logged at its error's own
//! level ([`BlockError::log_level`]), and the lines a guest or client can
//! cause in bulk (host I/O errors on every request of a failing disk) are
//! rate-limited: at most [`LINES_PER_SECOND`] a second for the whole
//! process, then one line saying how many were dropped.
//!
//! The window is process-wide state written by every queue thread, but
//! only when a request fails: the success path never touches it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::BlockError;

/// Most warn/error lines about failed requests per second.
pub const LINES_PER_SECOND: u64 = 10;

/// The current second and how many lines were logged (and dropped) in it.
static WINDOW: AtomicU64 = AtomicU64::new(0);
static LOGGED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Logs that `request` (e.g. "virtio-blk queue 0: request 0x12") failed
/// with `e`: at debug for the asker's mistakes and what is not offered,
/// rate-limited at warn or error for the rest, with the error's causes.
pub fn log_failed_request(request: fmt::Arguments<'_>, e: &BlockError) {
    let level = e.log_level();
    if level >= log::Level::Debug {
        log::debug!("{request} failed: {e}");
    } else if let Some(dropped) = may_log(now_secs()) {
        if dropped > 0 {
            log::warn!("{dropped} failed-request messages dropped (rate limit)");
        }
        log::log!(level, "{request} failed: {}", ch_log::error_chain(e));
    }
}

/// `Some(dropped before this)` when a line may be logged in second `now`.
fn may_log(now: u64) -> Option<u64> {
    if WINDOW.swap(now, Ordering::Relaxed) != now {
        LOGGED.store(0, Ordering::Relaxed);
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        LOGGED.fetch_add(1, Ordering::Relaxed);
        return Some(dropped);
    }
    if LOGGED.fetch_add(1, Ordering::Relaxed) < LINES_PER_SECOND {
        Some(0)
    } else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        None
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_limit_per_second_then_the_drop_count() {
        // A second far from the present, so the live clock cannot race it.
        let base = 1u64 << 40;
        let allowed = (0..LINES_PER_SECOND + 5)
            .filter(|_| may_log(base).is_some())
            .count() as u64;
        assert_eq!(allowed, LINES_PER_SECOND);
        assert_eq!(may_log(base + 1), Some(5));
    }

    #[test]
    fn the_chain_names_the_errno() {
        let e = BlockError::Read {
            offset: 0,
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        assert!(
            ch_log::error_chain(&e).contains("Input/output error"),
            "{}",
            ch_log::error_chain(&e)
        );
    }
}
