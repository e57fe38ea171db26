//! Consistency check and repair (`ch-img check`), with qemu-img's counts.
//!
//! A path enters; a [`CheckReport`] leaves with qemu-img's counters and
//! messages. Raw images have nothing to check ([`check_image`] answers
//! `Unsupported { feature: "checks" }`, which `ch-img` prints as qemu-img
//! does). qcow2 images are walked by [`qcow2`]: every reference from the
//! header, L1/L2 tables, snapshots and refcount structures is counted and
//! compared with the stored refcounts; `-r leaks`/`-r all` rewrite the
//! refcounts (and COPIED flags) that are wrong.

use std::path::Path;

use crate::error::BlockError;

mod bitmaps;
mod qcow2;
mod references;
#[cfg(test)]
mod tests;

/// `-r leaks` or `-r all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    Leaks,
    All,
}

/// What `qemu-img check --output=json` reports. After a repair,
/// `corruptions` and `leaks` count what is left (the re-check), and the
/// `*_fixed` fields what was repaired.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub filename: String,
    pub format: String,
    pub check_errors: u64,
    pub corruptions: u64,
    pub leaks: u64,
    pub corruptions_fixed: u64,
    pub leaks_fixed: u64,
    pub image_end_offset: Option<u64>,
    pub total_clusters: Option<u64>,
    pub allocated_clusters: Option<u64>,
    pub fragmented_clusters: Option<u64>,
    pub compressed_clusters: Option<u64>,
    /// Human-readable findings, one per line, as qemu-img prints them.
    pub messages: Vec<String>,
}

/// Checks the image at `path` (and repairs it when asked).
pub fn check_image(path: &Path, repair: Option<Repair>) -> Result<CheckReport, BlockError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    let mut magic = [0u8; 4];
    let n = file
        .read_at(&mut magic, 0)
        .map_err(|source| BlockError::MetadataRead {
            what: "image header".into(),
            source,
        })?;
    match crate::formats::probe::probe_image_type(&magic[..n]) {
        crate::options::ImageType::Qcow2 => qcow2::check(path, repair),
        _ => Err(BlockError::Unsupported {
            path: path.to_owned(),
            feature: "checks".into(),
        }),
    }
}
