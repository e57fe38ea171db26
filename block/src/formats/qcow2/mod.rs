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
//! - `queue`: the queue-facing [`crate::formats::Format`], each method
//!   implemented there once, on the planners of `read`, `write`, `zero`
//!   and the extent walk of `status`;
//! - the tool capabilities of [`crate::formats::tools`], each in the file
//!   of its logic: `snapshot_ops` (snapshots), `backing_rewrite`
//!   (`rebase -u`, `make_empty`), `compress_write` (compressed clusters),
//!   `resize` (grow and shrink), `amend` (version, refcount width and
//!   feature changes, with `zero_expand`, `refcount_layout` and
//!   `header_cluster`), persistent bitmaps (`bitmap_store` reads them,
//!   `bitmap_write` changes them), `undo` (a failed tool operation puts
//!   the file back); `snapshot_view` reads an internal snapshot in place
//!   of the active disk (`convert -l`);
//! - `create`: new images with qemu-img's defaults;
//! - `plan_exec`: executing a read plan inline (COW sources, tests).
//!
//! Data enters as guest ranges and leaves as plans of host extents; the
//! format itself only reads and writes metadata: allocations, refcounts,
//! new tables and discards are written through at once, while the L2
//! entries that publish completed writes are batched until the next flush
//! (after a barrier), in the order docs/qcow2.md describes.

pub(crate) mod alloc;
pub(crate) mod amend;
pub(crate) mod backing;
pub(crate) mod backing_rewrite;
pub mod bitmap_directory;
pub(crate) mod bitmap_store;
pub(crate) mod bitmap_write;
pub(crate) mod cache;
pub(crate) mod chain;
pub mod check;
pub mod compress_write;
pub(crate) mod compressed;
pub(crate) mod compressed_cache;
pub(crate) mod cow;
pub mod create;
pub(crate) mod features;
pub(crate) mod geometry;
pub(crate) mod guard;
pub(crate) mod header;
pub(crate) mod header_cluster;
pub mod image;
pub(crate) mod inflight;
pub(crate) mod l2_entry;
pub(crate) mod meta;
pub mod meta_faults;
pub mod meta_io;
pub mod opener;
pub(crate) mod overlap;
pub(crate) mod plan_builder;
pub(crate) mod plan_exec;
pub(crate) mod prealloc_detect;
pub(crate) mod published;
pub(crate) mod queue;
pub(crate) mod queue_view;
pub(crate) mod read;
pub(crate) mod refcount;
pub(crate) mod refcount_layout;
pub(crate) mod reserve;
pub(crate) mod resize;
pub(crate) mod snapshot_ops;
pub mod snapshot_table;
pub mod snapshot_view;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod tools;
pub(crate) mod tree;
pub(crate) mod undo;
pub(crate) mod write;
pub(crate) mod zero;
pub(crate) mod zero_expand;

pub use image::Qcow2Image;
pub use opener::open_qcow2;
