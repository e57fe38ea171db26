//! Image formats: where a guest range lives, and the metadata that says so.
//!
//! Two surfaces, so the types say who may do what:
//! - [`Format`] (this file) is queue-facing: size, files, plan
//!   read/write/discard/write-zeroes, commit/abort, flush metadata, block
//!   status, plus `info`, `name`, `close`. [`crate::Disk`],
//!   [`crate::DiskQueue`] and the executor hold only an `Arc<dyn Format>`.
//! - [`tools`] holds the image-tool capabilities ([`Snapshots`],
//!   [`BackingEdits`], [`CompressedWrites`], [`Resizable`], together
//!   [`ImageTools`]), reachable only from the owner's open,
//!   [`crate::ExclusiveImage`] (or [`open_image_tools`]).
//!
//! A format turns a guest range into a plan ([`ReadPlan`], [`WritePlan`])
//! of host extents in the files of the image chain, identified by
//! [`FileId`] (an index into [`Format::files`]). The engine executes the
//! plan's data I/O; the format only does metadata I/O (headers, L1/L2
//! tables, refcounts) itself, inline and write-through.
//!
//! Writes that allocate return a [`WriteCommit`]: the engine runs the data
//! writes, and only when every one has completed successfully calls
//! [`Format::commit`] (which publishes the L2 entries), or
//! [`Format::abort`] when one failed. A write that overlaps an allocation
//! still in flight gets [`WriteOutcome::Blocked`]; the format wakes the
//! given [`Waker`] when that allocation commits or aborts, and the engine
//! plans the write again.
//!
//! What an image says about itself leaves through [`Format::info`] as an
//! [`ImageInfo`], whose internal snapshots ([`SnapshotInfo`]) and
//! persistent bitmaps ([`BitmapEntry`]) are named here, beside the
//! snapshot an open may read in place of the disk ([`SnapshotRef`]):
//! front ends need no path into a format's modules for them.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;

pub mod amendment;
pub mod dirty_bits;
pub mod holes;
pub(crate) mod identity;
pub(crate) mod lacking;
pub mod open;
pub mod plan_cache;
pub mod probe;
pub mod qcow2;
pub mod raw;
pub mod tools;

pub use amendment::{AmendProgress, AmendStep, Amendment};
pub use block_engines::{FileId, ImageFiles};
pub use dirty_bits::{BitmapAction, DirtyBits};
pub use open::open_format;
pub use plan_cache::PlanCache;
pub use qcow2::bitmap_directory::BitmapEntry;
pub use qcow2::compress_write::compress_cluster;
pub use qcow2::snapshot_table::SnapshotInfo;
pub use qcow2::snapshot_view::SnapshotRef;
pub use tools::{
    open_image_tools, Amendable, BackingEdits, CompressedWrites, FailureUndo, ImageTools,
    PersistentBitmaps, Resizable, Snapshots,
};

/// Compression algorithm of a compressed cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw deflate (no zlib header), qcow2's compression_type 0.
    Deflate,
    Zstd,
}

/// A compressed cluster; the engine reads `compressed_len` bytes at
/// `host_offset` (the tail may lie past EOF: read as zeroes), inflates them
/// to `cluster_size` bytes and copies out `offset_in_cluster..+len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressedExtent {
    pub file: FileId,
    pub host_offset: u64,
    pub compressed_len: u64,
    pub algorithm: Compression,
    pub cluster_size: u32,
    pub offset_in_cluster: u32,
}

/// Bytes the format holds in memory, not (yet) in a file: a compressed
/// cluster still in qcow2's compressed-cluster write cache, inflated. The
/// engine copies `bytes[offset..offset + piece len]` into the request.
#[derive(Clone, PartialEq, Eq)]
pub struct MemoryExtent {
    pub bytes: Arc<Vec<u8>>,
    pub offset: usize,
}

impl std::fmt::Debug for MemoryExtent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryExtent")
            .field("bytes", &format_args!("[{} bytes]", self.bytes.len()))
            .field("offset", &self.offset)
            .finish()
    }
}

impl MemoryExtent {
    /// The `len` bytes the piece reads, `None` when they run past `bytes`.
    pub fn slice(&self, len: u64) -> Option<&[u8]> {
        let len = usize::try_from(len).ok()?;
        self.bytes.get(self.offset..self.offset.checked_add(len)?)
    }
}

/// Where one piece of a guest range lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadSource {
    /// Bytes at `offset` in `file`; reading past its end yields zeroes.
    Host {
        file: FileId,
        offset: u64,
    },
    /// Reads as zeroes, no I/O.
    Zero,
    Compressed(CompressedExtent),
    /// Bytes already in memory, no I/O.
    Memory(MemoryExtent),
}

/// Consecutive pieces covering the guest range, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    pub len: u64,
    pub source: ReadSource,
}

pub type ReadPlan = Vec<ReadPiece>;

/// Where the bytes of one part of a host write come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteData {
    /// `len` bytes of the request's memory starting at `offset` (relative
    /// to the request's first byte).
    Request { offset: u64, len: u64 },
    /// Bytes the format produced (copy-on-write from a backing image or an
    /// old cluster).
    Owned(Arc<Vec<u8>>),
    /// `len` zero bytes.
    Zeroes(u64),
}

impl WriteData {
    pub fn len(&self) -> u64 {
        match self {
            WriteData::Request { len, .. } | WriteData::Zeroes(len) => *len,
            WriteData::Owned(v) => v.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One host operation of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostWrite {
    /// Write the parts, back to back, at `offset` (one pwritev / SQE).
    Data {
        file: FileId,
        offset: u64,
        parts: Vec<WriteData>,
    },
    /// Deallocate (fallocate PUNCH_HOLE|KEEP_SIZE); a hint that may fail
    /// with EOPNOTSUPP, which the engine ignores.
    PunchHole { file: FileId, offset: u64, len: u64 },
    /// Make the range read as zeroes (fallocate ZERO_RANGE, or a written
    /// zero buffer where the file system lacks it).
    ZeroRange { file: FileId, offset: u64, len: u64 },
}

/// Opaque handle of metadata work that waits for a plan's data writes.
#[derive(Debug, PartialEq, Eq)]
pub struct WriteCommit(pub u64);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct WritePlan {
    /// Independent host operations; they may run in any order.
    pub ops: Vec<HostWrite>,
    /// Set when metadata must be published after every op succeeded.
    pub commit: Option<WriteCommit>,
    /// The commit drops references to host clusters (a cluster replaced by
    /// a new allocation, unmapped by a discard, ...). A write planned
    /// earlier may still be landing in such a cluster, so the engine runs
    /// the commit only once every write begun before this plan has ended;
    /// otherwise the freed cluster could be handed to another guest
    /// cluster and overwritten by the late write.
    pub frees_clusters: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Ready(WritePlan),
    /// Overlaps an allocation in flight; plan again once the waker fires.
    Blocked,
}

/// Wakes a queue whose write was [`WriteOutcome::Blocked`] (the queue's
/// completion eventfd).
pub type Waker = Arc<EventFd>;

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
/// file, size); those are the tool capabilities of [`tools`].
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
