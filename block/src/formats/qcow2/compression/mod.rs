//! Compressed clusters: reading and writing them.
//!
//! - `compressed`: a compressed cluster's descriptor (how many bytes to
//!   read) and inflating it (deflate or zstd);
//! - `compress_write`: writing a whole guest cluster compressed
//!   (`ch-img convert -c`), as qemu-img does;
//! - `compressed_cache`: packing compressed clusters per host cluster in
//!   memory and writing them as aligned whole clusters.
//!
//! Guest clusters enter (to compress) or compressed host bytes (to
//! inflate); what leaves is inflated data for the read path, or clusters
//! written and L2 entries set through `metadata::meta`.

pub(crate) mod compress_write;
pub(crate) mod compressed;
pub(crate) mod compressed_cache;
