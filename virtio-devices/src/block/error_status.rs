//! How a failed block request is answered and logged.
//!
//! A [`BlockError`] says what it means ([`block::Consequence`]); here that
//! becomes the virtio-blk status byte (UNSUPP for what is not offered,
//! IOERR for everything else) and a log line at the error's own level. The
//! lines a guest can cause in bulk (host I/O errors on every request of a
//! failing disk) are rate-limited: at most [`LINES_PER_SECOND`] a second
//! for the whole process, then one line saying how many were dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use block::BlockError;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP};

/// Most warn/error lines about failed requests per second.
pub const LINES_PER_SECOND: u64 = 10;

/// The current second and how many lines were logged (and dropped) in it.
static WINDOW: AtomicU64 = AtomicU64::new(0);
static LOGGED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// The status byte for a request that failed with `e`, after logging it.
pub fn failed_request_status(queue: u16, user_data: u64, e: &BlockError) -> u8 {
    let level = e.log_level();
    if level >= log::Level::Debug {
        log::debug!("virtio-blk queue {queue}: request {user_data:#x} failed: {e}");
    } else if let Some(dropped) = may_log(now_secs()) {
        if dropped > 0 {
            log::warn!("virtio-blk: {dropped} failed-request messages dropped (rate limit)");
        }
        log::log!(
            level,
            "virtio-blk queue {queue}: request {user_data:#x} failed: {}",
            ch_log::error_chain(e)
        );
    }
    status_of(e)
}

/// UNSUPP for what is not offered, IOERR for everything else.
pub fn status_of(e: &BlockError) -> u8 {
    if e.is_unsupported() {
        VIRTIO_BLK_S_UNSUPP as u8
    } else {
        VIRTIO_BLK_S_IOERR as u8
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
    fn statuses() {
        let unsupp = BlockError::Unsupported {
            path: "x".into(),
            feature: "y".into(),
        };
        assert_eq!(status_of(&unsupp), VIRTIO_BLK_S_UNSUPP as u8);
        assert_eq!(status_of(&BlockError::ReadOnly), VIRTIO_BLK_S_IOERR as u8);
    }

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
