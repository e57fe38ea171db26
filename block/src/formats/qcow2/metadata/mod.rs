//! The live metadata of an open qcow2 image and the one way it reaches
//! the file.
//!
//! - `meta`: [`meta::MetaState`], the L1 and refcount tables, the L2 and
//!   refcount-block caches and the bookkeeping that orders their writes;
//!   its children are the rest of its methods: `alloc` (refcounts and
//!   cluster allocation), `reserve` (the file's size headroom), `guard`
//!   (every metadata read, write and barrier, checked against the
//!   metadata map);
//! - `cache`, `published`: the bounded table cache and the tables queues
//!   read without the image lock;
//! - `overlap`: the map of which host clusters hold metadata;
//! - `meta_io`, `meta_faults`: the metadata-I/O seam every metadata read,
//!   write, barrier and size change goes through, and its fault-injecting
//!   version for tests.
//!
//! Data enters as guest offsets to look up or publish, clusters to
//! allocate and refcounts to change (from `planning` and `tools`); it
//! leaves as raw table entries (decoded by `on_disk`) and as metadata
//! writes through the seam, in the order `meta`'s doc states.

pub(crate) mod cache;
pub(crate) mod meta;
pub mod meta_faults;
pub mod meta_io;
pub(crate) mod overlap;
pub(crate) mod published;
