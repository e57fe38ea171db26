//! Consistency check and repair (`ch-img check`): a thin dispatcher to
//! the check of the format the image's first bytes claim (the
//! registry's drivers).
//!
//! A path enters; a [`CheckReport`] leaves with qemu-img's counters and
//! messages. A format without a check (raw, and NBD exports, which open
//! as raw) gets `Unsupported { feature: "checks" }` from
//! [`check_image`], which `ch-img` prints as qemu-img does; qcow2 images
//! are checked by `formats::qcow2::check`.

use std::path::Path;

use crate::error::BlockError;
pub use crate::formats::check_report::{CheckReport, Repair};
use crate::formats::driver::PROBE_BYTES;
use crate::formats::registry::FORMATS;

/// Checks the image at `path` (and repairs it when asked).
pub fn check_image(path: &Path, repair: Option<Repair>) -> Result<CheckReport, BlockError> {
    use std::os::unix::fs::FileExt;
    if block_engines::nbd::is_nbd_path(path) {
        // An NBD export opens as raw, which has nothing to check.
        return Err(BlockError::Unsupported {
            path: path.to_owned(),
            feature: "checks".into(),
        });
    }
    let file = std::fs::File::open(path).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    let mut magic = [0u8; PROBE_BYTES];
    let n = file
        .read_at(&mut magic, 0)
        .map_err(|source| BlockError::MetadataRead {
            what: "image header".into(),
            source,
        })?;
    match FORMATS.probe(&magic[..n]).check {
        Some(check) => check(path, repair),
        None => Err(BlockError::Unsupported {
            path: path.to_owned(),
            feature: "checks".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_images_have_no_checks() {
        let path = std::env::temp_dir().join(format!("ch-check-raw-{}.raw", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let answer = check_image(&path, None);
        let _ = std::fs::remove_file(&path);
        match answer {
            Err(BlockError::Unsupported { feature, .. }) => assert_eq!(feature, "checks"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
