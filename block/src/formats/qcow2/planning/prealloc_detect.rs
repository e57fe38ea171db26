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

use crate::formats::holes;
use crate::formats::qcow2::metadata::meta::MetaState;

/// At most this many refcount entries are read by the detection (about
/// a second): a hostile or huge image is then taken as not preallocated
/// rather than keeping `map` busy for hours.
const SCAN_BUDGET: u64 = 1 << 26;

/// Whether the image whose metadata is `meta` (in `file`) looks
/// metadata-preallocated (step 1 of the module docs). As in qemu, any
/// failure (unreadable size or refcounts) means "no": the answer only
/// refines `map`'s zero flags.
pub(crate) fn looks_metadata_preallocated(meta: &mut MetaState, file: &File) -> bool {
    let Ok(md) = file.metadata() else {
        return false;
    };
    if !md.file_type().is_file() {
        return false;
    }
    let cs = meta.geometry().cluster_size;
    let rbe = meta.geometry().rb_entries;
    let real_clusters = md.blocks().saturating_mul(512) / cs;
    let threshold = (real_clusters.saturating_mul(10) / 9).max(real_clusters + 2);
    let file_clusters = md.len().div_ceil(cs);
    let blocks = meta.refcount_table().0.len() as u64;
    let mut budget = SCAN_BUDGET;
    let mut in_use = 0u64;
    let mut c = 0u64;
    while c < file_clusters && in_use < threshold {
        let block = c / rbe;
        if block >= blocks {
            break;
        }
        let next_block = (block + 1).saturating_mul(rbe);
        match meta.refblock(block) {
            Ok(Some(_)) => {}
            // No refcount block: every cluster it would cover is free.
            Ok(None) => {
                c = next_block;
                continue;
            }
            Err(_) => return false,
        }
        let end = next_block.min(file_clusters);
        while c < end && in_use < threshold {
            if budget == 0 {
                return false;
            }
            budget -= 1;
            match meta.refcount(c) {
                Ok(0) => {}
                Ok(_) => in_use += 1,
                Err(_) => return false,
            }
            c += 1;
        }
    }
    in_use >= threshold
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
