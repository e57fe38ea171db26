//! [`LiveState`]: what a disk's queues share to find the write seam's
//! filters (a generation and the current [`Filters`]), the owner's named
//! bitmaps beside them, and where persistent ones go at close.
//!
//! The owner changes it (through [`LiveState::bitmaps`], whose guard
//! publishes the recording bitmaps as the new filter set when dropped)
//! while the queues are quiesced; queues read the generation once per
//! batch and the filters only when it moved (`queue_filters`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::bitmaps::BitmapRegistry;
use super::dirty_bitmap::DirtyBitmap;
use super::sink::BitmapSink;
use super::write_hook::{CompletionHook, WriteHook};
use crate::error::BlockError;

/// The filters active on a disk, as its queues read them when the
/// generation moves (docs/live-operations.md); the queues build their
/// per-queue handles from it.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    /// Marked when a write-like request completes.
    pub bitmaps: Vec<Arc<DirtyBitmap>>,
    /// Acts before a write-like request goes down: copy-before-write
    /// while a point-in-time view is active (`cbw.rs`).
    pub cbw: Option<Arc<dyn WriteHook>>,
    /// Acts on completions before they leave: a write-blocking mirror
    /// (`crate::jobs::write_blocking`) sends each write to its target.
    pub mirror: Option<Arc<dyn CompletionHook>>,
}

impl Filters {
    /// Whether any filter is active.
    pub fn is_empty(&self) -> bool {
        self.bitmaps.is_empty() && self.cbw.is_none() && self.mirror.is_none()
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
            let mut filters = (*now).clone();
            filters.bitmaps = recording;
            self.live.set_filters(filters);
        }
    }
}

impl LiveState {
    /// Installs (or with `None` removes) the write hook; the other
    /// filters stay. The disk's queues must be quiesced
    /// (docs/live-operations.md, "One instant").
    pub(super) fn set_write_hook(&self, hook: Option<Arc<dyn WriteHook>>) {
        let (_, now) = self.filters();
        let mut filters = (*now).clone();
        filters.cbw = hook;
        self.set_filters(filters);
    }

    /// Installs (or with `None` removes) the completion hook of a
    /// write-blocking mirror; the other filters stay. The disk's queues
    /// should be quiesced; where they are not, a queue may still run
    /// its old handle on the completions it is handing out, which the
    /// hook itself must then allow for.
    pub fn set_completion_hook(&self, hook: Option<Arc<dyn CompletionHook>>) {
        let (_, now) = self.filters();
        let mut filters = (*now).clone();
        filters.mirror = hook;
        self.set_filters(filters);
    }

    /// The write hook installed now, if any.
    pub(super) fn write_hook(&self) -> Option<Arc<dyn WriteHook>> {
        self.filters().1.cbw.clone()
    }

    pub(super) fn set_sink(&self, sink: BitmapSink) {
        *lock(&self.sink) = Some(sink);
    }

    /// This disk no longer stores its persistent bitmaps at its close:
    /// its image was reopened and the new open stores them
    /// (`persist::adopt`).
    pub fn forget_sink(&self) {
        lock(&self.sink).take();
    }

    /// The disk now has `size` bytes (its queues quiesced): every bitmap
    /// follows ([`DirtyBitmap::resized`]), and the image's persistent
    /// ones are rewritten at the new size, still in use, so that tables
    /// and disk agree if the VMM dies before the close.
    pub fn resize(&self, size: u64) -> Result<(), BlockError> {
        let bitmaps = {
            let mut registry = self.bitmaps();
            registry.resize(size);
            registry.list().to_vec()
        };
        match lock(&self.sink).as_ref() {
            Some(sink) => sink.store_in_use(&bitmaps),
            None => Ok(()),
        }
    }

    /// Moves every named bitmap of `old` here (a running disk switched
    /// from `old` to this image; both disks' queues quiesced): they go on
    /// recording the disk's writes. Persistent ones stay persistent where
    /// this image can store them, and are then written to it at once,
    /// marked in use (as at an open), so a crash leaves them
    /// inconsistent rather than gone; `old` drops them from its image at
    /// its close. Where this image cannot store them they live on in
    /// memory, and the log says so.
    pub fn take_bitmaps_from(&self, old: &LiveState) -> Result<(), BlockError> {
        let moved = old.bitmaps().take_all();
        if moved.is_empty() {
            return Ok(());
        }
        let list = {
            let mut registry = self.bitmaps();
            for mut b in moved {
                if b.persistent {
                    if let Some(why) = registry.no_persistence() {
                        log::warn!(
                            "dirty bitmap '{}' is kept in memory only from now on: {why}",
                            b.name
                        );
                        b.persistent = false;
                    }
                }
                let name = b.name.clone();
                if registry.insert(b).is_err() {
                    log::error!("dirty bitmap '{name}' is in both images; the new image's is kept");
                }
            }
            registry.list().to_vec()
        };
        if !list.iter().any(|b| b.persistent) {
            return Ok(());
        }
        match lock(&self.sink).as_ref() {
            Some(sink) => sink.store_in_use(&list),
            None => Ok(()),
        }
    }

    /// Stores the persistent bitmaps in the image they were loaded from
    /// (once: the disk is closing; later calls do nothing). The queues
    /// must be stopped.
    pub fn store_persistent(&self) -> Result<(), BlockError> {
        let Some(sink) = lock(&self.sink).take() else {
            return Ok(());
        };
        let bitmaps = self.bitmaps().list().to_vec();
        sink.store(&bitmaps)
    }
}

/// A disk dropped without [`crate::Disk::close`] (a failed boot, an owner
/// that gave up) still stores its persistent bitmaps, as the qcow2 image
/// still writes its cached metadata when dropped: no queue is left (each
/// holds this state), and what they recorded is complete.
impl Drop for LiveState {
    fn drop(&mut self) {
        if let Err(e) = self.store_persistent() {
            log::error!("cannot store the persistent dirty bitmaps ({e}); they stay marked in use");
        }
    }
}

/// A poisoned lock only means a thread panicked while holding it; the
/// values behind these locks are replaced whole, so they stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
