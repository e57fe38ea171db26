//! The qcow2 image format (versions 2 and 3), read and write.
//!
//! Layout of this folder, one folder per job:
//! - the image itself, at the top: [`Qcow2Image`] (`image`), an open
//!   image: its fixed `chain` (files, backing image, the header it was
//!   opened with) and its `state` (the tables and caches, behind one
//!   lock); its methods are in `image` (what every caller shares),
//!   `queue` (the queue-facing [`crate::formats::Format`]) and
//!   `tools::capabilities` (the tool capabilities of
//!   [`crate::formats::tools`]), each a thin front over the folders
//!   below; `opener` ([`open_qcow2`]: the checks at open, the data file
//!   and the backing chain, which `backing` finds, checks and opens with
//!   each file's format driver); `driver`: qcow2's entry in the format
//!   registry ([`DRIVER`]);
//! - `on_disk`: the format's structures as values (header, extensions,
//!   feature bits, table entries, the snapshot table, the layout
//!   arithmetic, an open image's fixed geometry);
//! - `metadata`: the live tables of an open image (`MetaState`), their
//!   caches, refcounts and allocation, the metadata map and the
//!   metadata-I/O seam every metadata read and write goes through;
//! - `planning`: guest requests to plans of host operations (reads,
//!   writes, zeroes, discards, block status) and the allocations in
//!   flight;
//! - `compression`: compressed clusters, inflated and written;
//! - `bitmaps`: persistent dirty bitmaps;
//! - `tools`: the image tools' operations (snapshots, resize, rebase,
//!   amend, create, measure, undoing a failed one);
//! - `check`: `ch-img check` and its repairs.
//!
//! Each folder's module doc says its job and how data enters and leaves
//! it.
//!
//! Module cycles are found by the workspace's checker (`module-cycles/`).
//!
//! Data enters as guest ranges and leaves as plans of host extents; the
//! format itself only reads and writes metadata: allocations, refcounts,
//! new tables and discards are written through at once, while the L2
//! entries that publish completed writes are batched until the next flush
//! (after a barrier), in the order docs/qcow2.md describes.

pub(crate) mod backing;
pub(crate) mod bitmaps;
pub(crate) mod chain;
pub(crate) mod check;
pub(crate) mod compression;
pub(crate) mod driver;
pub mod image;
pub mod metadata;
pub mod on_disk;
pub mod opener;
pub(crate) mod overlay;
pub(crate) mod planning;
pub(crate) mod queue;
pub(crate) mod state;
pub(crate) mod tools;

pub use driver::DRIVER;
pub use image::Qcow2Image;
pub use opener::open_qcow2;
