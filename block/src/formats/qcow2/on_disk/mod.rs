//! The qcow2 file format's structures as values: what the bytes on disk
//! mean, with no open image behind them.
//!
//! - `header` (with `header/bitmaps`), `header_cluster`, `features`: the
//!   header, its extensions and feature bits, parsed and rewritten;
//! - `layout`: the layout arithmetic (L1 and L2 tables per disk, the
//!   refcount structures' fixed point, bytes of a fully allocated image,
//!   qemu's table limits) over a `LayoutParams` (the cluster size,
//!   refcount width and L2 entry size a new image's options choose),
//!   shared by `create`, `check`, `amend` and `ch-img measure`;
//! - `geometry`: an open image's fixed layout facts (`ImageGeometry`,
//!   read from its header at open: sizes, version, compression, data
//!   file), and what they decide about one table entry;
//! - `l2_entry`, `refcount`: decoding L1/L2 entries and refcount entries;
//! - `snapshot_table`: the internal snapshot table's entries.
//!
//! Bytes (or a header) enter; typed values and checked offsets leave.
//! What is read or written goes through the helpers of
//! `metadata::meta_io` on the seam the caller hands over (an open
//! image's, for `header_cluster::current_header`).

pub(crate) mod features;
pub(crate) mod geometry;
pub(crate) mod header;
pub(crate) mod header_cluster;
pub(crate) mod l2_entry;
pub mod layout;
pub(crate) mod refcount;
pub(crate) mod snapshot_table;
