//! Opening an image: the protocol (an NBD URI opens as a raw disk over
//! the export, [`super::nbd_image`]), else the file (O_DIRECT,
//! read-only), its format (named, or probed from its first bytes), and
//! the format's own open (which takes the image's locks and opens its
//! backing chain).
//!
//! Options and a set of formats enter ([`open_with`]; the registry's
//! entry points pass every registered format); an opened image with
//! every capability leaves, its files locked the way qemu locks them when
//! `opts.lock` is set (see [`crate::lock`]).

use std::fs::File;
use std::sync::Arc;

use super::driver::{Formats, OpenContext, PROBE_BYTES};
use super::tools::ImageTools;
use crate::error::BlockError;
use crate::options::DiskOptions;
use block_engines::nbd::is_nbd_path;

/// Opens `opts.path` with every capability, as one of `formats`.
pub fn open_with(formats: &Formats, opts: &DiskOptions) -> Result<Arc<dyn ImageTools>, BlockError> {
    if is_nbd_path(&opts.path) {
        return Ok(super::nbd_image::open_image(opts, formats)?);
    }
    let file = open_file(opts)?;
    let (driver, probed) = match opts.image_type.name() {
        None => (formats.probe(&peek(opts)?), true),
        Some(name) => (
            formats
                .by_name(name)
                .ok_or_else(|| BlockError::Unsupported {
                    path: opts.path.clone(),
                    feature: format!("image format '{name}'"),
                })?,
            false,
        ),
    };
    (driver.open)(opts, file, OpenContext { probed, formats })
}

/// Opens one file of an image chain with the options' access mode
/// ([`DiskOptions::open_file`]).
pub fn open_file(opts: &DiskOptions) -> Result<File, BlockError> {
    opts.open_file()
}

/// The image's first bytes, for the probe.
fn peek(opts: &DiskOptions) -> Result<Vec<u8>, BlockError> {
    use std::os::unix::fs::FileExt;
    // Read through a separate buffered descriptor: O_DIRECT would need an
    // aligned buffer for a 4-byte peek.
    let peek = File::open(&opts.path).map_err(|source| BlockError::Open {
        path: opts.path.clone(),
        source,
    })?;
    let mut magic = vec![0u8; PROBE_BYTES];
    let n = peek
        .read_at(&mut magic, 0)
        .map_err(|source| BlockError::MetadataRead {
            what: "image header".into(),
            source,
        })?;
    magic.truncate(n);
    Ok(magic)
}
