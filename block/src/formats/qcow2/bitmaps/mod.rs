//! Persistent dirty bitmaps of a qcow2 v3 image.
//!
//! - `bitmap_directory`: the bitmap directory the bitmaps header
//!   extension points at, parsed and validated as qemu validates it
//!   (`info` lists it, `check` uses it);
//! - `bitmap_store`: every bitmap of an open image as a value (directory
//!   entry and bitmap table), read through the metadata-I/O seam;
//! - `bitmap_write`: `ch-img bitmap`'s changes (add, remove, clear,
//!   enable, disable, merge).
//!
//! The directory's bytes enter from the file through the seam; the
//! changed directory, tables and header extension leave through it.

pub(crate) mod bitmap_directory;
mod bitmap_live;
pub(crate) mod bitmap_store;
pub(crate) mod bitmap_write;
