//! [`DiskShared`]: what every queue's executor of one disk shares (the
//! partial-block locks of unaligned O_DIRECT writes, the writes in flight
//! that discards wait for, the cache of inflated compressed clusters).
//!
//! The disk makes it once and hands an `Arc` of it to each queue's
//! executor; the executor's parts (accounting, compressed reads) borrow it.

use std::sync::Mutex;

use super::barrier::WriteTracker;
use super::rmw::RmwLocks;
use crate::executor::inflate::InflateCache;

/// State shared by every queue of one disk.
#[derive(Default)]
pub struct DiskShared {
    /// Partial-block locks of unaligned O_DIRECT writes.
    pub rmw: RmwLocks,
    /// Every queue's writes in flight, for discard barriers.
    pub writes: WriteTracker,
    /// Recently inflated compressed clusters, for every queue.
    pub inflated: Mutex<InflateCache>,
    /// `cache=unsafe`: flushes complete at once without touching the disk.
    pub ignore_flushes: bool,
}
