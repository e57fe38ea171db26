//! Images made with `preallocation=metadata`: every cluster is mapped in
//! the L2 tables but most of the file is holes. `qemu-img map` reports
//! such mapped-but-hole ranges as `"zero": true`, and so do we.
//!
//! The flow, as in qemu (block status only; reads and writes do not care):
//! 1. Once per open image, on the first block-status query, decide whether
//!    the image looks metadata-preallocated: count the host clusters that
//!    have a non-zero refcount, stopping at a threshold of
//!    `max(real * 10 / 9, real + 2)`, where `real` is the number of
//!    clusters the file really occupies on disk (`st_blocks`). Reaching
//!    the threshold means far more clusters are in use than stored.
//! 2. If so, a run of allocated data clusters is looked up in the data
//!    file with SEEK_DATA/SEEK_HOLE: it is cut at the first hole/data
//!    boundary and, inside a hole (or past the file's end), reads as zero.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use super::meta::MetaState;
use crate::error::BlockError;
use crate::formats::holes;

/// Whether the image whose metadata is `meta` (in `file`) looks
/// metadata-preallocated (step 1 of the module docs). A file whose size
/// or allocation cannot be read is taken as not preallocated.
pub(crate) fn looks_metadata_preallocated(
    meta: &mut MetaState,
    file: &File,
) -> Result<bool, BlockError> {
    let Ok(md) = file.metadata() else {
        return Ok(false);
    };
    if !md.file_type().is_file() {
        return Ok(false);
    }
    let cs = meta.g.cluster_size;
    let real_clusters = md.blocks().saturating_mul(512) / cs;
    let threshold = (real_clusters.saturating_mul(10) / 9).max(real_clusters + 2);
    let file_clusters = md.len().div_ceil(cs);
    let mut in_use = 0u64;
    for c in 0..file_clusters {
        if in_use >= threshold {
            break;
        }
        if meta.refcount(c)? != 0 {
            in_use += 1;
        }
    }
    Ok(in_use >= threshold)
}

/// Step 2 of the module docs for a data run of `len` bytes at host offset
/// `host` of `file`: the run's length cut at the first hole/data boundary,
/// and whether it reads as zero. A file system that cannot tell leaves
/// the run as it is (data).
pub(crate) fn file_extent(file: &File, host: u64, len: u64) -> (u64, bool) {
    match holes::extent_at(file, host) {
        Some((hole, end)) if end > host => ((end - host).min(len), hole),
        _ => (len, false),
    }
}
