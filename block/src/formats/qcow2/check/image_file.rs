//! Opening the image file a check reads (and its repairs write).

use std::path::Path;

use crate::error::BlockError;

/// The image file, opened for reading and, when `write`, for the
/// repairs' writes.
pub(super) fn open_image(path: &Path, write: bool) -> Result<std::fs::File, BlockError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|source| BlockError::Open {
            path: path.to_owned(),
            source,
        })
}
