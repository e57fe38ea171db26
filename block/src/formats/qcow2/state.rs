//! What changes after an image is opened, behind the image's one lock:
//! the metadata tables and caches (`meta`), the allocations in flight, the
//! incompatible feature bits as they are on disk, and the
//! compressed-cluster write cache.
//!
//! Plans, commits, flushes and tool operations take the lock for their
//! metadata work only, never across data I/O; queues read allocated
//! clusters without it (`queue_view`). [`lock`] is the one way to take it.
//! The dirty bit of a lazy-refcounts image is set before the first
//! metadata change ([`State::mark_dirty`]) and cleared after a clean
//! close ([`State::mark_clean`]).

use std::sync::{Mutex, MutexGuard};

use crate::error::BlockError;
use crate::formats::qcow2::compression::compressed_cache::CompressedCache;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::features::INCOMPAT_DIRTY;
use crate::formats::qcow2::on_disk::header::OFF_INCOMPAT;
use crate::formats::qcow2::planning::inflight::InFlight;

/// See the module docs.
pub(crate) struct State {
    pub meta: MetaState,
    pub inflight: InFlight,
    /// Incompatible feature bits as currently on disk.
    pub incompatible: u64,
    /// Whether the image looks metadata-preallocated (decided on the
    /// first block-status query; see `prealloc_detect`).
    pub metadata_prealloc: Option<bool>,
    /// Compressed clusters packed into host clusters, not yet written.
    pub compressed: CompressedCache,
}

/// Takes the image's lock. A panic while holding it cannot leave the
/// metadata half written in memory (every update is written through
/// first), so a poisoned lock is still usable.
pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// A freshly opened image's state.
    pub fn new(meta: MetaState, incompatible: u64) -> Self {
        State {
            meta,
            inflight: InFlight::default(),
            incompatible,
            metadata_prealloc: None,
            compressed: CompressedCache::default(),
        }
    }

    /// Sets the dirty bit before the first metadata change of a
    /// lazy-refcounts image.
    pub fn mark_dirty(&mut self, lazy_refcounts: bool) -> Result<(), BlockError> {
        if !lazy_refcounts || self.incompatible & INCOMPAT_DIRTY != 0 {
            return Ok(());
        }
        let v = self.incompatible | INCOMPAT_DIRTY;
        self.meta
            .write(MetaKind::Header, OFF_INCOMPAT, &v.to_be_bytes())?;
        ordering_sync(&self.meta)?;
        self.incompatible = v;
        Ok(())
    }

    /// Clears the dirty bit after everything reached the disk.
    pub fn mark_clean(&mut self, readonly: bool) -> Result<(), BlockError> {
        // A corrupt image keeps its bits for `check -r all` to clear.
        if self.incompatible & INCOMPAT_DIRTY == 0 || readonly || self.meta.is_corrupt() {
            return Ok(());
        }
        ordering_sync(&self.meta)?;
        let v = self.incompatible & !INCOMPAT_DIRTY;
        self.meta
            .write(MetaKind::Header, OFF_INCOMPAT, &v.to_be_bytes())?;
        ordering_sync(&self.meta)?;
        self.incompatible = v;
        Ok(())
    }
}

/// An fdatasync that orders metadata writes, skipped when barriers are
/// off (cache=unsafe, benchmarks).
fn ordering_sync(meta: &MetaState) -> Result<(), BlockError> {
    if meta.barriers() {
        meta.sync()?;
    }
    Ok(())
}
