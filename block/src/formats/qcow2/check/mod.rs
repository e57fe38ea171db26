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
use crate::formats::check_report::{CheckReport, Repair};

mod bitmaps;
mod image_file;
mod l2_sharing;
mod rebuild;
mod refcounts;
mod references;
#[cfg(test)]
mod tests;

/// Checks the qcow2 image at `path` (and repairs it when asked).
pub fn check_qcow2(path: &Path, repair: Option<Repair>) -> Result<CheckReport, BlockError> {
    refcounts::check(path, repair)
}
