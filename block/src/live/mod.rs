//! The write seam of a running disk (docs/live-operations.md): the
//! filters every guest write, write-zeroes and discard passes through,
//! and the state the disk's queues share to find them.
//!
//! [`LiveState`] belongs to a [`crate::Disk`] (all its queues share it):
//! a generation counter and the current [`Filters`], plus the named dirty
//! bitmaps the owner manages ([`LiveState::bitmaps`], `bitmaps.rs`).
//! Every change to it is made by the owner while the disk's queues are
//! quiesced, and bumps the generation. Each [`crate::DiskQueue`] holds a
//! [`QueueFilters`]: the generation it last saw and its own handles on the
//! filters; it reads the generation once per batch (one relaxed atomic
//! load, the whole cost of the seam when no filter is active) and marks
//! the dirty bitmaps with the completions it hands out.
//!
//! Persistent bitmaps of a qcow2 image are loaded into the registry and
//! marked in use by [`attach`] (the owner's open,
//! `ExclusiveImage::attach_persistent_bitmaps`) and stored back by
//! [`LiveState::store_persistent`] when the disk closes (`persist.rs`).
//!
//! This floor reaches formats only through their traits; virtio, the VMM
//! and the API reach it through `Disk::live`.

mod bitmaps;
mod dirty_bitmap;
mod persist;
mod queue_filters;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use bitmaps::{BitmapInfo, BitmapRegistry, Checkpoint, LiveError, NamedBitmap};
pub use dirty_bitmap::{
    check_granularity, DirtyBitmap, DEFAULT_GRANULARITY, MAX_GRANULARITY, MIN_GRANULARITY,
};
pub use persist::{attach, BitmapSink};
pub use queue_filters::QueueFilters;

/// The filters active on a disk, as its queues read them when the
/// generation moves. Copy-before-write and mirror targets join this set
/// (docs/live-operations.md); the queues build their per-queue handles
/// from it.
#[derive(Debug, Default)]
pub struct Filters {
    /// Marked when a write-like request completes.
    pub bitmaps: Vec<Arc<DirtyBitmap>>,
}

impl Filters {
    /// Whether any filter is active.
    pub fn is_empty(&self) -> bool {
        self.bitmaps.is_empty()
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct LiveState {
    generation: AtomicU64,
    filters: Mutex<Arc<Filters>>,
    /// The owner's named bitmaps; queues never lock this.
    bitmaps: Mutex<BitmapRegistry>,
    /// Where the persistent ones go when the disk closes (`persist`).
    sink: Mutex<Option<BitmapSink>>,
}

impl LiveState {
    /// The generation now (queues compare it with the one they saw).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The filters now and their generation.
    pub fn filters(&self) -> (u64, Arc<Filters>) {
        let f = lock(&self.filters);
        (self.generation.load(Ordering::Acquire), f.clone())
    }

    /// Installs a new filter set and bumps the generation. The disk's
    /// queues must be quiesced (or the caller accepts that requests in
    /// flight complete under the old set).
    pub fn set_filters(&self, filters: Filters) {
        let mut f = lock(&self.filters);
        *f = Arc::new(filters);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The named bitmaps, for the owner to change; dropping the guard
    /// publishes the enabled ones as the filter set
    /// ([`BitmapGuard`]). The disk's queues must be quiesced.
    pub fn bitmaps(&self) -> BitmapGuard<'_> {
        BitmapGuard {
            live: self,
            registry: lock(&self.bitmaps),
        }
    }
}

/// The owner's hold on a disk's named bitmaps; when it is dropped the
/// bitmaps that record writes become the disk's filter set.
pub struct BitmapGuard<'a> {
    live: &'a LiveState,
    registry: MutexGuard<'a, BitmapRegistry>,
}

impl std::ops::Deref for BitmapGuard<'_> {
    type Target = BitmapRegistry;
    fn deref(&self) -> &BitmapRegistry {
        &self.registry
    }
}

impl std::ops::DerefMut for BitmapGuard<'_> {
    fn deref_mut(&mut self) -> &mut BitmapRegistry {
        &mut self.registry
    }
}

impl Drop for BitmapGuard<'_> {
    fn drop(&mut self) {
        let recording = self.registry.recording();
        let (_, now) = self.live.filters();
        let same = now.bitmaps.len() == recording.len()
            && now
                .bitmaps
                .iter()
                .zip(&recording)
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if !same {
            self.live.set_filters(Filters { bitmaps: recording });
        }
    }
}

/// A poisoned lock only means a thread panicked while holding it; the
/// values behind these locks are replaced whole, so they stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
