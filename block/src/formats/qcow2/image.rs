//! `Qcow2Image`: an open qcow2 image (`opener` opens it): its fixed
//! `Chain` (files, backing image, header) and its `State` behind one
//! mutex, held only while planning or committing, never during data I/O.
//!
//! Its methods are in three places: here, what every caller shares
//! (locking, range and writability checks, the start and the finish of a
//! metadata-changing plan, writing out the compressed-cluster cache, the
//! test and benchmark switches); `queue`, the queue-facing `Format`; and
//! `tools`, the owner's tool capabilities. The work itself is done by
//! types that borrow the chain and the locked tables: the planners
//! (`read`, `write`, `zero`, `status`, `queue_view`, `cow`) and the tool
//! operations (`snapshot_ops`, `resize`, `compress_write`, `amend`,
//! `bitmap_write`, `backing_rewrite`, `undo`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::chain::Chain;
use super::state::{lock, State};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::MetaIo;
use crate::formats::qcow2::on_disk::features::COMPAT_LAZY_REFCOUNTS;
use crate::formats::qcow2::planning::cow::CowReader;
use crate::formats::qcow2::planning::plan_builder::PlanBuilder;
use crate::formats::{Format, Waker, WriteOutcome, WritePlan};
use crate::lock::ImageLock;

/// Numbers images, so a view is only ever used with the image it was
/// made for.
static NEXT_IMAGE_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh image id (taken when an image is opened).
pub(crate) fn new_image_id() -> u64 {
    NEXT_IMAGE_ID.fetch_add(1, Ordering::Relaxed)
}

pub struct Qcow2Image {
    /// Tells this open image from any other (queue views are bound to it).
    pub(crate) id: u64,
    /// Its files, backing image and header: fixed after open.
    pub(crate) chain: Chain,
    pub(crate) readonly: bool,
    /// Opened to keep the persistent bitmaps valid: guest writes refused
    /// (`DiskOptions::keep_persistent_bitmaps`).
    pub(crate) keeps_bitmaps: bool,
    pub(crate) size: AtomicU64,
    pub(crate) state: Mutex<State>,
    /// Whether `State::compressed` may hold data (read without the lock
    /// on every read and write plan).
    pub(crate) compressed_cached: AtomicBool,
    /// This file's locks and its data file's, released when the image is
    /// dropped (after the `Drop` below has written what it must; see
    /// [`crate::lock`]).
    pub(crate) _lock: Option<ImageLock>,
    pub(crate) _data_file_lock: Option<ImageLock>,
    /// Opened writable without its backing chain (`DiskOptions::no_backing`,
    /// for header edits such as `rebase -u`): guest writes and resizing
    /// are refused, since they would need the backing data.
    pub(crate) backing_unopened: bool,
}

impl Drop for Qcow2Image {
    /// Publishes committed writes whose L2 entries are still only cached,
    /// so dropping without `close` loses nothing the guest saw complete.
    fn drop(&mut self) {
        if self.readonly {
            return;
        }
        let mut st = self.lock();
        if let Err(e) = st.meta.flush_dirty() {
            log::error!(
                "{}: writing cached L2 entries failed: {e}",
                self.chain.path.display()
            );
        }
        if let Err(e) = st.meta.trim_reserve() {
            log::warn!("{}: {e}", self.chain.path.display());
        }
    }
}

/// How a metadata-changing plan starts (see [`Qcow2Image::begin_update`]).
pub(crate) enum UpdateStart<'a> {
    /// Plan under this lock.
    Locked(MutexGuard<'a, State>),
    /// Nothing to plan: the outcome is already known.
    Decided(WriteOutcome),
}

impl Qcow2Image {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Sets the dirty bit before the first metadata change of a
    /// lazy-refcounts image.
    pub(crate) fn mark_dirty(&self, st: &mut State) -> Result<(), BlockError> {
        st.mark_dirty(self.chain.header.compatible & COMPAT_LAZY_REFCOUNTS != 0)
    }

    /// Replaces the image's metadata-I/O seam: `wrap` gets the current
    /// implementation and returns the new one (tests install
    /// `meta_faults::FaultyMetaIo` this way). Copy-on-write reads planned
    /// afterwards use it too.
    pub fn wrap_meta_io(&self, wrap: impl FnOnce(Arc<dyn MetaIo>) -> Arc<dyn MetaIo>) {
        let mut st = self.lock();
        let current = Arc::clone(st.meta.io());
        st.meta.replace_io(wrap(current));
    }

    /// Turns the metadata overlap checks off or on (benchmarks measure
    /// their cost this way; QEMU's `overlap-check=none`). On by default.
    pub fn set_overlap_checks(&self, on: bool) {
        self.lock().meta.set_overlap_checks(on);
    }

    /// Writes L2 entries at every commit (one fdatasync per allocating
    /// write) instead of batching them until the next flush.
    pub fn set_l2_write_through(&self, on: bool) {
        self.lock().meta.set_l2_write_through(on);
    }

    /// Turns off fdatasync barriers between dependent metadata writes
    /// (keeps process-crash ordering, loses power-loss ordering).
    pub fn set_write_barriers(&self, on: bool) {
        self.lock().meta.set_barriers(on);
    }

    /// The common start of every metadata-changing plan (write,
    /// write-zeroes, discard): the range is checked, an empty range is
    /// done, a range overlapping an allocation in flight is blocked (the
    /// waker is kept), and otherwise the image is marked dirty and the
    /// locked state is handed to the planner.
    pub(crate) fn begin_update(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<UpdateStart<'_>, BlockError> {
        self.check_writable(offset, len)?;
        if len == 0 {
            return Ok(UpdateStart::Decided(WriteOutcome::Ready(
                WritePlan::default(),
            )));
        }
        let mut st = self.lock();
        if self.blocked(&mut st, offset, len, waker) {
            return Ok(UpdateStart::Decided(WriteOutcome::Blocked));
        }
        self.mark_dirty(&mut st)?;
        Ok(UpdateStart::Locked(st))
    }

    /// Registers `waker` and says so when the range overlaps an allocation
    /// in flight.
    fn blocked(&self, st: &mut State, offset: u64, len: u64, waker: &Waker) -> bool {
        let cb = self.chain.header.cluster_bits;
        let (first, last) = (offset >> cb, (offset + len - 1) >> cb);
        if st.inflight.overlaps(first, last) {
            st.inflight.wait(waker);
            return true;
        }
        false
    }

    /// Registers the plan's pending commit (its clusters become busy),
    /// then, without the metadata lock, reads the copy-on-write sources
    /// and adds their data writes; a failed read aborts the commit.
    pub(crate) fn finish_plan(
        &self,
        mut st: MutexGuard<'_, State>,
        mut b: PlanBuilder,
    ) -> Result<WriteOutcome, BlockError> {
        // Nothing overwrites metadata (a hostile L2 entry, wrong refcounts):
        // refused before anything is queued; the clusters allocated for
        // the plan leak (the image is now marked corrupt).
        st.meta.check_plan(&b.ops, &b.cow, self.chain.data_file)?;
        let jobs = std::mem::take(&mut b.cow);
        let frees_clusters = !b.pending.release.is_empty();
        let commit = if b.pending.is_empty() {
            None
        } else {
            Some(st.inflight.start(std::mem::take(&mut b.pending)))
        };
        drop(st);
        if let Err(e) = CowReader::new(&self.chain).fill(jobs, &mut b) {
            if let Some(c) = commit {
                Format::abort(self, c);
            }
            return Err(e);
        }
        Ok(WriteOutcome::Ready(WritePlan {
            ops: b.ops,
            commit,
            frees_clusters,
        }))
    }

    /// Writes every cached compressed cluster (padded) and publishes their
    /// L2 entries; before a flush, a close or a resize.
    pub(crate) fn write_out_compressed(&self) -> Result<(), BlockError> {
        if !self.compressed_cached.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut st = self.lock();
        let State {
            meta, compressed, ..
        } = &mut *st;
        compressed.write_out(meta, &self.chain.files.local()[0], true)
    }

    /// Writes the cache out when guest clusters in `offset..offset+len`
    /// still have their compressed data only there (a write or a discard
    /// of them must see it mapped; reads take the cached bytes instead).
    pub(crate) fn write_out_compressed_in(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        if !self.compressed_cached.load(Ordering::Acquire) {
            return Ok(());
        }
        let cs = self.chain.header.cluster_size();
        let mut st = self.lock();
        if !st.compressed.overlaps(offset, len, cs) {
            return Ok(());
        }
        let State {
            meta, compressed, ..
        } = &mut *st;
        compressed.write_out(meta, &self.chain.files.local()[0], true)
    }

    /// The lock of an image a tool may change (refused on read-only
    /// opens).
    pub(crate) fn lock_writable(&self) -> Result<MutexGuard<'_, State>, BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        Ok(self.lock())
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        let size = self.size.load(Ordering::Acquire);
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BlockError::OutOfRange { offset, len, size }),
        }
    }

    /// Writes are refused on read-only opens, on opens that keep the
    /// persistent bitmaps (nothing would record the write in them), and on
    /// writable opens without the backing chain (a partial write would copy
    /// zeroes where the backing data belongs).
    pub(crate) fn check_writable(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        if self.readonly || self.keeps_bitmaps {
            return Err(BlockError::ReadOnly);
        }
        self.check_backing_opened()?;
        self.check_range(offset, len)
    }

    /// Refuses what needs the backing chain on an image opened without it.
    pub(crate) fn check_backing_opened(&self) -> Result<(), BlockError> {
        if self.backing_unopened {
            return Err(BlockError::Unsupported {
                path: self.chain.path.clone(),
                feature: "changing the disk of an image opened without its backing chain".into(),
            });
        }
        Ok(())
    }
}
