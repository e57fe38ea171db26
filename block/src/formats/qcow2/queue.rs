//! The queue-facing [`Format`] of a qcow2 image: what a running queue
//! calls (plans, commit/abort, flush, block status) plus `info`, `name`
//! and `close`. Each method is implemented here, once, over the planner
//! types that do the work: `ReadPlanner` (`read`), `QueueView`
//! (`queue_view`), `WritePlanner` (`write`), `ZeroPlanner` (`zero`) and
//! `StatusWalker` (`status`).
//!
//! Guest ranges enter and leave as plans of host extents or block status;
//! the metadata changes a plan needs are made under the image lock before
//! it returns, and published by `commit` once the plan's data is written.
//! A compressed cluster still in the compressed-write cache is written
//! out before any plan that touches it (see `compressed_cache`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::image::Qcow2Image;
use super::image::UpdateStart;
use crate::error::BlockError;
use crate::formats::holes::file_size;
use crate::formats::qcow2::bitmaps::bitmap_directory::bitmaps_in;
use crate::formats::qcow2::on_disk::features::{COMPAT_LAZY_REFCOUNTS, INCOMPAT_DIRTY};
use crate::formats::qcow2::on_disk::snapshot_table::read_snapshot_table;
use crate::formats::qcow2::planning::plan_builder::{PlanBuilder, Source};
use crate::formats::qcow2::planning::queue_view::QueueView;
use crate::formats::qcow2::planning::read::ReadPlanner;
use crate::formats::qcow2::planning::status::StatusWalker;
use crate::formats::qcow2::planning::write::WritePlanner;
use crate::formats::qcow2::planning::zero::ZeroPlanner;
use crate::formats::{
    BlockStatus, Compression, FileId, Format, ImageFiles, ImageInfo, PlanCache, ReadPlan, Waker,
    WriteCommit, WriteOutcome,
};

impl Format for Qcow2Image {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn files(&self) -> &ImageFiles {
        &self.chain.files
    }

    fn flush_files(&self) -> Vec<FileId> {
        if self.readonly {
            Vec::new()
        } else if self.chain.data_file != FileId(0) {
            vec![FileId(0), self.chain.data_file]
        } else {
            vec![FileId(0)]
        }
    }

    fn plan_read(&self, offset: u64, len: u64, plan: &mut ReadPlan) -> Result<(), BlockError> {
        self.check_range(offset, len)?;
        // Cached compressed clusters are read from memory (see `read`).
        ReadPlanner::new(&self.chain).plan(&self.state, offset, len, plan)
    }

    /// Allocated clusters are looked up in the queue's snapshots of the
    /// tables, without the image lock (see `queue_view`).
    fn plan_read_cached(
        &self,
        cache: &mut PlanCache,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        if self.compressed_cached.load(Ordering::Acquire) {
            return self.plan_read(offset, len, plan);
        }
        self.check_range(offset, len)?;
        let planner = ReadPlanner::new(&self.chain);
        QueueView::plan_read(cache, self.id, &planner, &self.state, offset, len, plan)
    }

    fn plan_write(&self, offset: u64, len: u64, waker: &Waker) -> Result<WriteOutcome, BlockError> {
        self.write_out_compressed_in(offset, len)?;
        let mut st = match self.begin_update(offset, len, waker)? {
            UpdateStart::Locked(st) => st,
            UpdateStart::Decided(outcome) => return Ok(outcome),
        };
        let mut b = PlanBuilder::default();
        WritePlanner {
            chain: &self.chain,
            meta: &mut st.meta,
        }
        .write_range(offset, len, Source::Request(0), &mut b)?;
        self.finish_plan(st, b)
    }

    /// A discarded range of a qcow2 image reads as zeroes: write-zeroes
    /// with unmapping allowed.
    fn plan_discard(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.plan_write_zeroes(offset, len, true, waker)
    }

    fn plan_write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.write_out_compressed_in(offset, len)?;
        let mut st = match self.begin_update(offset, len, waker)? {
            UpdateStart::Locked(st) => st,
            UpdateStart::Decided(outcome) => return Ok(outcome),
        };
        let mut b = PlanBuilder::default();
        ZeroPlanner {
            chain: &self.chain,
            meta: &mut st.meta,
        }
        .zero_range(offset, len, may_unmap, &mut b)?;
        self.finish_plan(st, b)
    }

    fn plan_populate(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.plan_populate_range(offset, len, waker)
    }

    fn backing(&self) -> Option<Arc<dyn Format>> {
        self.chain.backing.as_ref().map(|b| Arc::clone(&b.image))
    }

    fn commit(&self, c: WriteCommit) -> Result<(), BlockError> {
        let mut st = self.lock();
        let Some(p) = st.inflight.take(&c) else {
            return Err(st.meta.invalid(format!("commit {} is not pending", c.0)));
        };
        // The data writes completed. The new entries are visible at once
        // (cache) and reach the disk at the next flush, after a barrier;
        // the clusters they replace are released after that.
        let res = (|| {
            for (guest, raw, bitmap) in &p.publish {
                st.meta.publish_l2_entry(*guest, *raw, *bitmap)?;
            }
            st.meta.release_after_flush(&p.release);
            if st.meta.l2_write_through() || st.meta.should_flush() {
                st.meta.flush_dirty()?;
            }
            Ok(())
        })();
        st.inflight.finish(&p);
        res
    }

    fn abort(&self, c: WriteCommit) {
        let mut st = self.lock();
        let Some(p) = st.inflight.take(&c) else {
            return;
        };
        // Nothing points at the new clusters yet: give them back. A failure
        // here only leaks them.
        for (first, count) in &p.allocated {
            if let Err(e) = st.meta.free_clusters(*first, *count) {
                log::warn!(
                    "{}: leaking clusters after a failed write: {e}",
                    self.chain.path.display()
                );
            }
        }
        st.inflight.finish(&p);
    }

    fn flush_metadata(&self) -> Result<(), BlockError> {
        // The engine's fdatasync of flush_files() afterwards covers the
        // metadata descriptor too (same inode).
        if self.readonly {
            return Ok(());
        }
        self.write_out_compressed()?;
        self.lock().meta.flush_dirty()
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
        self.check_range(offset, len)?;
        StatusWalker::new(&self.chain).status(&self.state, offset, len)
    }

    fn info(&self) -> ImageInfo {
        let h = &self.chain.header;
        let (incompatible, snapshots_at, marked_corrupt, io) = {
            let st = self.lock();
            let io = Arc::clone(st.meta.io());
            (
                st.incompatible,
                st.meta.snapshot_table(),
                st.meta.is_corrupt(),
                io,
            )
        };
        // Read through the metadata-I/O seam; a file whose size cannot be
        // read lists no snapshots or bitmaps.
        let file_size = file_size(&self.chain.cow_files[0]).ok();
        let v3 = h.version >= 3;
        ImageInfo {
            format: "qcow2",
            virtual_size: self.size.load(Ordering::Acquire),
            cluster_size: Some(h.cluster_size()),
            compat: Some(if v3 { "1.1" } else { "0.10" }.into()),
            refcount_bits: Some(1 << h.refcount_order),
            lazy_refcounts: Some(h.compatible & COMPAT_LAZY_REFCOUNTS != 0),
            corrupt: Some(h.corrupt() || marked_corrupt),
            extended_l2: Some(h.extended_l2()),
            compression_type: Some(match h.compression {
                Compression::Deflate => "zlib",
                Compression::Zstd => "zstd",
            }),
            backing_filename: h.backing_file.clone(),
            full_backing_filename: h.backing_file.as_ref().map(|name| {
                super::backing::resolve(&self.chain.path, name)
                    .display()
                    .to_string()
            }),
            backing_filename_format: h.backing_format.clone(),
            data_file: h.data_file.clone(),
            dirty: Some(incompatible & INCOMPAT_DIRTY != 0),
            // An unreadable table lists nothing here; `check` reports it.
            snapshots: file_size
                .and_then(|len| read_snapshot_table(&*io, snapshots_at, len).ok())
                .map(|(entries, _)| entries)
                .unwrap_or_default(),
            // Likewise a bad bitmap directory lists nothing.
            bitmaps: file_size
                .and_then(|len| bitmaps_in(&*io, len, &self.chain.path).ok())
                .unwrap_or_default(),
        }
    }

    fn close(&self) -> Result<(), BlockError> {
        self.write_out_compressed()?;
        if self.readonly {
            return Ok(());
        }
        let mut st = self.lock();
        st.meta.flush_dirty()?;
        st.meta.trim_reserve()?;
        if st.inflight.pending_count() > 0 {
            log::warn!(
                "{}: closing with writes in flight; leaving the image dirty",
                self.chain.path.display()
            );
            return Ok(());
        }
        st.mark_clean(self.readonly)
    }

    fn name(&self) -> &'static str {
        "qcow2"
    }
}
