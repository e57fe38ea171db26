//! The qcow2 consistency check and repair (`ch-img check`), with
//! qemu-img's counts, messages and exit-code classes.
//!
//! A path enters; a [`CheckReport`] leaves. `references` walks every
//! structure (header, L1/L2 tables, snapshots, bitmaps, refcount table)
//! and counts the references to each host cluster; `refcounts` compares
//! them with the stored refcounts and COPIED flags and, with `-r`,
//! rewrites what is wrong; `rebuild` replaces refcount structures that
//! are lost or unusable. `crate::check::check_image` (the format
//! dispatcher) calls in here; nothing here uses `crate::check`.

use std::path::Path;

use crate::error::BlockError;

mod bitmaps;
mod l2_sharing;
mod rebuild;
mod refcounts;
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

impl CheckReport {
    /// qemu-img check's exit status for a completed check: 0 clean,
    /// 1 check errors, 2 corruptions, 3 leaks only.
    pub fn exit_code(&self) -> u8 {
        if self.check_errors > 0 {
            1
        } else if self.corruptions > 0 {
            2
        } else if self.leaks > 0 {
            3
        } else {
            0
        }
    }
}

/// Checks the qcow2 image at `path` (and repairs it when asked).
pub fn check_qcow2(path: &Path, repair: Option<Repair>) -> Result<CheckReport, BlockError> {
    refcounts::check(path, repair)
}

/// The image file, opened for reading and, when `write`, for the
/// repairs' writes.
fn open_image(path: &Path, write: bool) -> Result<std::fs::File, BlockError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|source| BlockError::Open {
            path: path.to_owned(),
            source,
        })
}
