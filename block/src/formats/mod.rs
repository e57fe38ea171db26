//! Image formats: where a guest range lives, and the metadata that says so.
//! This floor knows the files and engines below it (`block_engines`), never
//! the executor or the disk above it.
//!
//! Every format is a folder here with one [`FormatDriver`] (`driver.rs`:
//! probe, open, open as a backing image, create, check, measure, `-o
//! help`), listed once in the registry, [`FORMATS`] (`registry.rs`),
//! which the entry points that open, create and check images by their
//! options go through: raw (`raw/`), qcow2 (`qcow2/`), and a raw disk
//! over an NBD export (`nbd_image.rs`, which the protocol of a path picks,
//! not a probe).
//!
//! Two surfaces, so the types say who may do what:
//! - [`Format`] (`format.rs`, with its plans in `plan.rs`) is queue-facing: size, files, plan
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
//! [`FileId`] (an index into [`Format::files`], which names no kind of
//! file: a file is local or remote as the engines see it). The engine
//! executes the
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

pub mod amendment;
pub mod check_report;
pub mod create_options;
pub mod dirty_bits;
pub mod driver;
pub mod format;
pub mod holes;
pub(crate) mod identity;
pub(crate) mod lacking;
pub mod measure;
pub mod nbd_image;
pub mod open;
pub mod plan;
pub mod plan_cache;
pub mod probe;
pub mod qcow2;
pub mod raw;
pub mod registry;
pub mod tools;

pub use amendment::{AmendProgress, AmendStep, Amendment};
pub use block_engines::{FileId, ImageFiles};
pub use dirty_bits::{BitmapAction, DirtyBits};
pub use driver::{FormatDriver, Formats, OptionDoc};
pub use format::{BlockStatus, Format, ImageInfo};
pub use measure::{Measure, MeasureError, Measurement};
pub use plan::{
    CompressedExtent, Compression, HostWrite, MemoryExtent, ReadPiece, ReadPlan, ReadSource, Waker,
    WriteCommit, WriteData, WriteOutcome, WritePlan,
};
pub use plan_cache::PlanCache;
pub use qcow2::bitmaps::bitmap_directory::BitmapEntry;
pub use qcow2::compression::compress_write::compress_cluster;
pub use qcow2::on_disk::snapshot_table::SnapshotInfo;
pub use qcow2::tools::snapshot_view::SnapshotRef;
pub use registry::{open_format, open_image_tools, FORMATS};
pub use tools::{
    Amendable, BackingEdits, CompressedWrites, FailureUndo, ImageTools, PersistentBitmaps,
    Resizable, Snapshots,
};
