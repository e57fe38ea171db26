//! [`Format`]: one opened image format as running queues see it, with
//! what it says about a range ([`BlockStatus`]) and about itself
//! ([`ImageInfo`]).

use block_engines::{FileId, ImageFiles};

use super::plan::{ReadPlan, Waker, WriteCommit, WriteOutcome};
use super::plan_cache::PlanCache;
use super::qcow2::bitmaps::bitmap_directory::BitmapEntry;
use super::qcow2::on_disk::snapshot_table::SnapshotInfo;
use crate::error::BlockError;

/// What `qemu-img map` reports for one extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockStatus {
    pub len: u64,
    /// Index in the backing chain of the image that decided the status
    /// (0 = this image), as `qemu-img map` reports it: where the data was
    /// found, or the first layer that knows the range reads as zeroes
    /// (e.g. 0 past the end of a shorter backing image).
    pub depth: u32,
    /// Allocated somewhere in the chain.
    pub present: bool,
    /// Reads as zeroes.
    pub zero: bool,
    /// Has data (not a zero cluster or hole).
    pub data: bool,
    pub compressed: bool,
    /// Host offset in the file holding the data, when it has one.
    pub offset: Option<u64>,
    /// The file holding the data (for `map`'s "filename").
    pub file: Option<FileId>,
}

/// The [`Format::block_status`] of the extent at `pos`, cut at `end`
/// (at most `end`): one step of a walk over `pos..end`. An extent of no
/// bytes is an error, so such a walk always ends.
pub fn status_within(format: &dyn Format, pos: u64, end: u64) -> Result<BlockStatus, BlockError> {
    let mut status = format.block_status(pos, end - pos)?;
    if status.len == 0 {
        return Err(BlockError::OutOfRange {
            offset: pos,
            len: 0,
            size: end,
        });
    }
    status.len = status.len.min(end - pos);
    Ok(status)
}

/// Facts `ch-img info` prints.
#[derive(Clone, Debug, Default)]
pub struct ImageInfo {
    pub format: &'static str,
    pub virtual_size: u64,
    pub cluster_size: Option<u64>,
    /// "0.10" or "1.1" for qcow2.
    pub compat: Option<String>,
    pub refcount_bits: Option<u32>,
    pub lazy_refcounts: Option<bool>,
    pub corrupt: Option<bool>,
    pub extended_l2: Option<bool>,
    pub compression_type: Option<&'static str>,
    pub backing_filename: Option<String>,
    pub full_backing_filename: Option<String>,
    pub backing_filename_format: Option<String>,
    pub data_file: Option<String>,
    pub dirty: Option<bool>,
    /// Internal snapshots (qcow2), in table order.
    pub snapshots: Vec<SnapshotInfo>,
    /// Persistent dirty bitmaps (qcow2 v3, while the header says they are
    /// consistent), in directory order.
    pub bitmaps: Vec<BitmapEntry>,
}

/// One opened image format (with its backing chain), as running queues
/// see it: no method here changes the image's shape (snapshots, backing
/// file, size); those are the tool capabilities of [`super::tools`].
///
/// Plans take `&self`: implementations keep their metadata behind a lock
/// whose read path is short, so queues on several threads plan at once.
pub trait Format: Send + Sync {
    /// Virtual disk size in bytes.
    fn size(&self) -> u64;

    /// Every file of the chain, indexed by [`FileId`]: the image's own
    /// first, local or remote (which engine a file's ops go to is the
    /// engines' business). A queue's engine opens them.
    fn files(&self) -> &ImageFiles;

    /// Files a flush must fdatasync (the writable ones).
    fn flush_files(&self) -> Vec<FileId>;

    /// Appends to `plan` the pieces covering `offset..offset+len`.
    fn plan_read(&self, offset: u64, len: u64, plan: &mut ReadPlan) -> Result<(), BlockError>;

    /// [`Format::plan_read`] for a queue that keeps `cache` from one read
    /// to the next: the format may keep per-queue state there so that
    /// reads of allocated data take no lock and write nothing shared
    /// (qcow2: snapshots of its tables). The plan is the same either way.
    fn plan_read_cached(
        &self,
        cache: &mut PlanCache,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let _ = cache;
        self.plan_read(offset, len, plan)
    }

    /// Plans a write of `len` bytes of request data at `offset`. May
    /// allocate (refcounts written before this returns).
    fn plan_write(&self, offset: u64, len: u64, waker: &Waker) -> Result<WriteOutcome, BlockError>;

    fn plan_discard(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError>;

    fn plan_write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError>;

    /// Plans writing the request's `len` bytes of backing data at
    /// `offset` into the clusters of this image that are still
    /// unallocated, and only those: a cluster the guest allocated first
    /// keeps the guest's data (a stream job; qcow2's
    /// `planning/populate.rs`). `offset` is cluster aligned and `len`
    /// whole clusters. Formats without a backing file refuse.
    fn plan_populate(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        let _ = (offset, len, waker);
        Err(BlockError::Refused(format!(
            "a {} image has no backing file to populate from",
            self.name()
        )))
    }

    /// The opened backing image, if there is one (a job walks the chain
    /// to find its layers).
    fn backing(&self) -> Option<std::sync::Arc<dyn Format>> {
        None
    }

    /// Publishes the metadata of a plan whose ops all succeeded.
    fn commit(&self, commit: WriteCommit) -> Result<(), BlockError>;

    /// Releases a plan whose ops failed; may leak clusters, never corrupts.
    fn abort(&self, commit: WriteCommit);

    /// Writes cached metadata (the engine then fdatasyncs `flush_files`).
    fn flush_metadata(&self) -> Result<(), BlockError>;

    /// Allocation status of the extent starting at `offset` (at most `len`).
    fn block_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError>;

    /// Facts about the image (`ch-img info`); reads only.
    fn info(&self) -> ImageInfo;

    /// Flushes metadata and marks the image clean (qcow2 dirty bit); the
    /// last call of whoever owns the image, after its queues are idle.
    fn close(&self) -> Result<(), BlockError>;

    /// The format's name ("raw", "qcow2").
    fn name(&self) -> &'static str;

    /// True for a raw image whose format was probed, not given: the engine
    /// must refuse writes to its first sector that carry another format's
    /// magic (see [`crate::formats::probe::looks_like_image_header`]).
    fn guards_first_sector(&self) -> bool {
        false
    }
}
