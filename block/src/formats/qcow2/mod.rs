//! The qcow2 image format (versions 2 and 3), read and write.
//!
//! Layout of this folder, one job per file:
//! - `image`: [`Qcow2Image`], an open image: its fixed `chain` (files,
//!   backing image, the header it was opened with) and its `state` (the
//!   tables and caches, behind one lock); its methods are in `image`
//!   (what every caller shares), `queue` (the queue-facing
//!   [`crate::formats::Format`]) and `tools` (the tool capabilities of
//!   [`crate::formats::tools`]), each a thin front over the types below;
//! - `opener`: [`open_qcow2`], the checks at open (the dirty-image repair
//!   runs before the image is built), the data file and the backing
//!   chain (`backing` finds and checks each backing file and opens it
//!   with its format's driver);
//! - `header` (with `header/bitmaps`), `header_cluster`, `features`: the
//!   header, its extensions and feature bits, read and rewritten;
//! - `layout`: the layout arithmetic (L1 and L2 tables per disk, the
//!   refcount structures' fixed point, bytes of a fully allocated image,
//!   qemu's table limits), pure and shared by `create`, `check`, `amend`
//!   and `ch-img measure`;
//! - `geometry`, `l2_entry`, `refcount`: an open image's fixed layout facts
//!   and decoding table entries (reused by `check`);
//! - `cache`, `published`, `meta`, `alloc`, `reserve`: the metadata tables,
//!   their bounded caches (whose tables queues may hold snapshots of),
//!   refcounts, cluster allocation and the file's size headroom;
//! - `meta_io`, `meta_faults`: the metadata-I/O seam every metadata read,
//!   write, barrier and size change goes through, and its fault-injecting
//!   version;
//! - `overlap`, `guard`: the map of metadata clusters and the check of
//!   every write against it (refusal sets the corrupt bit);
//! - `check`: `ch-img check` and its repairs;
//! - planning, each a type that borrows the chain and (under the lock)
//!   the tables: `read` (`ReadPlanner`), `queue_view` (a queue's
//!   reads of allocated clusters without the lock), `write`, `zero`
//!   (with the plan under construction in `plan_builder`), `cow` (old
//!   contents read outside the lock), `status` (block status);
//!   `inflight`: allocations whose L2 entries wait for their data;
//! - `compressed`: compressed-cluster descriptors and inflating;
//!   `compress_write`, `compressed_cache`: writing compressed clusters,
//!   packed per host cluster in memory before they are written;
//! - tool operations, each a type over the locked state: `snapshot_ops`
//!   (with the tree walks of `tree`), `snapshot_view` (reading a snapshot
//!   in place of the active disk, `convert -l`), `resize`,
//!   `backing_rewrite` (`rebase -u`, `make_empty`), `amend` (with
//!   `zero_expand` and `refcount_layout`), persistent bitmaps
//!   (`bitmap_store` reads them, `bitmap_write` changes them), `undo`
//!   (a failed tool operation puts the file back);
//! - `driver`: qcow2's entry in the format registry ([`DRIVER`]); `create`
//!   (new images with qemu-img's defaults, from options checked in
//!   `new_image`), `measure` (`ch-img measure -O qcow2`);
//! - `plan_exec`: executing a read plan inline (COW sources, tests).
//!
//! Module cycles are found by the workspace's checker (`module-cycles/`).
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
pub(crate) mod bitmap_directory;
mod bitmap_live;
pub(crate) mod bitmap_store;
pub(crate) mod bitmap_write;
pub(crate) mod cache;
pub(crate) mod chain;
pub(crate) mod check;
pub(crate) mod compress_write;
pub(crate) mod compressed;
pub(crate) mod compressed_cache;
pub(crate) mod cow;
pub(crate) mod create;
pub(crate) mod driver;
pub(crate) mod features;
pub(crate) mod geometry;
pub(crate) mod guard;
pub(crate) mod header;
pub(crate) mod header_cluster;
pub mod image;
pub(crate) mod inflight;
pub(crate) mod l2_entry;
pub mod layout;
pub(crate) mod measure;
pub(crate) mod meta;
pub mod meta_faults;
pub mod meta_io;
pub(crate) mod new_image;
pub mod opener;
pub(crate) mod overlap;
pub(crate) mod overlay;
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
pub(crate) mod snapshot_table;
pub(crate) mod snapshot_view;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod tools;
pub(crate) mod tree;
pub(crate) mod undo;
pub(crate) mod write;
pub(crate) mod zero;
pub(crate) mod zero_expand;

pub use driver::DRIVER;
pub use image::Qcow2Image;
pub use opener::open_qcow2;
