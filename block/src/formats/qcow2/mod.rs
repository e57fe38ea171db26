//! The qcow2 image format (versions 2 and 3), read and write.
//!
//! Layout of this folder, one job per file:
//! - `header`, `features`: the header, its extensions and feature bits;
//! - `l2_entry`, `refcount`: decoding table entries (reused by `check`);
//! - `cache`, `meta`, `alloc`: the metadata tables, their bounded caches,
//!   refcounts and cluster allocation;
//! - `meta_io`, `meta_faults`: the metadata-I/O seam every metadata read,
//!   write and barrier goes through, and its fault-injecting version;
//! - `overlap`, `guard`: the map of metadata clusters and the check of
//!   every write against it (refusal sets the corrupt bit);
//! - `check`: `ch-img check` and its repairs;
//! - `compressed`: compressed-cluster descriptors and inflating;
//! - `compress_write`, `compressed_cache`: writing compressed clusters,
//!   packed per host cluster in memory before they are written;
//! - `inflight`: allocations whose L2 entries wait for their data;
//! - `cow`: copy-on-write sources, read outside the metadata lock;
//! - `reserve`: the file's size kept ahead of allocation;
//! - `backing`, `image`: opening an image and its chain;
//! - `read`, `write`, `zero`, `status`: the `Format` operations;
//! - `create`: new images with qemu-img's defaults;
//! - `plan_exec`: executing a read plan inline (COW sources, tests).
//!
//! Data enters as guest ranges and leaves as plans of host extents; the
//! format itself only reads and writes metadata: allocations, refcounts,
//! new tables and discards are written through at once, while the L2
//! entries that publish completed writes are batched until the next flush
//! (after a barrier), in the order docs/qcow2.md describes.

use std::fs::File;
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::{
    BlockStatus, Compression, FileId, Format, ImageInfo, ReadPlan, Waker, WriteCommit, WriteOutcome,
};

pub(crate) mod alloc;
pub(crate) mod backing;
pub(crate) mod backing_rewrite;
pub mod bitmap_directory;
pub(crate) mod cache;
pub mod check;
pub mod compress_write;
pub(crate) mod compressed;
pub(crate) mod compressed_cache;
pub(crate) mod cow;
pub mod create;
pub(crate) mod features;
pub(crate) mod guard;
pub(crate) mod header;
pub mod image;
pub(crate) mod inflight;
pub(crate) mod l2_entry;
pub(crate) mod meta;
pub mod meta_faults;
pub mod meta_io;
pub(crate) mod overlap;
pub(crate) mod plan_exec;
pub(crate) mod prealloc_detect;
pub(crate) mod read;
pub(crate) mod refcount;
pub(crate) mod reserve;
pub(crate) mod shrink;
pub(crate) mod snapshot_ops;
pub mod snapshot_table;
pub(crate) mod status;
pub(crate) mod write;
pub(crate) mod zero;

pub use image::Qcow2Image;

impl Format for Qcow2Image {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    fn files(&self) -> &[Arc<File>] {
        &self.files
    }

    fn flush_files(&self) -> Vec<FileId> {
        if self.readonly {
            Vec::new()
        } else if self.data_file != FileId(0) {
            vec![FileId(0), self.data_file]
        } else {
            vec![FileId(0)]
        }
    }

    fn plan_read(&self, offset: u64, len: u64, plan: &mut ReadPlan) -> Result<(), BlockError> {
        // Cached compressed clusters are read from memory (see `read`).
        self.plan_read_impl(offset, len, plan)
    }

    fn plan_write(&self, offset: u64, len: u64, waker: &Waker) -> Result<WriteOutcome, BlockError> {
        self.write_out_compressed_in(offset, len)?;
        self.plan_write_impl(offset, len, waker)
    }

    fn plan_discard(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.write_out_compressed_in(offset, len)?;
        self.plan_write_zeroes_impl(offset, len, true, waker)
    }

    fn plan_write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.write_out_compressed_in(offset, len)?;
        self.plan_write_zeroes_impl(offset, len, may_unmap, waker)
    }

    fn commit(&self, commit: WriteCommit) -> Result<(), BlockError> {
        self.commit_impl(commit)
    }

    fn abort(&self, commit: WriteCommit) {
        self.abort_impl(commit)
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
        self.block_status_impl(offset, len)
    }

    fn info(&self) -> ImageInfo {
        self.info_impl()
    }

    fn resize(&self, new_size: u64) -> Result<(), BlockError> {
        self.write_out_compressed()?;
        self.resize_impl(new_size)
    }

    fn backing_size(&self) -> Option<u64> {
        self.backing.as_ref().map(|b| b.image.size())
    }

    fn close(&self) -> Result<(), BlockError> {
        self.write_out_compressed()?;
        self.close_impl()
    }

    fn name(&self) -> &'static str {
        "qcow2"
    }

    fn write_compressed(&self, offset: u64, data: &[u8]) -> Result<bool, BlockError> {
        self.write_compressed_impl(offset, data)
    }

    fn compression(&self) -> Option<Compression> {
        Some(self.header.compression)
    }

    fn write_compressed_packed(&self, offset: u64, packed: &[u8]) -> Result<(), BlockError> {
        self.write_packed_impl(offset, packed)
    }

    fn set_compressed_cache(&self, host_clusters: usize) {
        self.set_compressed_cache_impl(host_clusters)
    }

    fn snapshot_create(&self, name: &str, date: (u32, u32)) -> Result<(), BlockError> {
        self.snapshot_create_impl(name, date)
    }

    fn snapshot_delete(&self, name: &str) -> Result<bool, BlockError> {
        self.snapshot_delete_impl(name)
    }

    fn snapshot_apply(&self, name: &str) -> Result<bool, BlockError> {
        self.snapshot_apply_impl(name)
    }

    fn set_backing_file(&self, name: Option<&str>, format: Option<&str>) -> Result<(), BlockError> {
        self.set_backing_impl(name, format)
    }

    fn make_empty(&self) -> Result<(), BlockError> {
        self.make_empty_impl()
    }
}
