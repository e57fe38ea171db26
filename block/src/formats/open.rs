//! Opening an image: the file (O_DIRECT, read-only), the lock, the format
//! probe, and the format's own open (which opens its backing chain).
//!
//! An NBD URI opens as a raw disk over the export ([`super::nbd_image`]).
//!
//! Options enter; an opened image leaves, its files locked the way qemu
//! locks them when `opts.lock` is set (see [`crate::lock`]): as the
//! queue-facing [`Format`] ([`open_format`], what a [`crate::Disk`] holds)
//! or with its tool capabilities (`open_image`, for the owner of an
//! exclusive open, see [`super::tools`]).

use std::fs::File;
use std::sync::Arc;

use super::lacking::Lacking;
use super::probe::probe_image_type;
use super::raw::RawImage;
use super::tools::ImageTools;
use super::Format;
use crate::error::BlockError;
use crate::options::{DiskOptions, ImageType};

/// Opens `opts.path` as the format it names (or probes), queue-facing.
pub fn open_format(opts: &DiskOptions) -> Result<Arc<dyn Format>, BlockError> {
    Ok(open_image(opts)?)
}

/// Opens `opts.path` with its tool capabilities, for a caller that drives
/// the format itself (tests, fuzzing); tools that also do I/O use
/// [`crate::ExclusiveImage::open`].
pub fn open_image_tools(opts: &DiskOptions) -> Result<Arc<dyn ImageTools>, BlockError> {
    open_image(opts)
}

/// Opens `opts.path` with every capability (the owner's open).
pub(crate) fn open_image(opts: &DiskOptions) -> Result<Arc<dyn ImageTools>, BlockError> {
    if block_engines::nbd::is_nbd_path(&opts.path) {
        return Ok(crate::formats::nbd_image::open_image(opts)?);
    }
    let file = open_file(opts)?;
    let (image_type, probed) = match opts.image_type {
        ImageType::Auto => (probe_file(&file, opts)?, true),
        given => (given, false),
    };
    match image_type {
        ImageType::Raw | ImageType::Auto if opts.snapshot.is_some() => Err(Lacking {
            image: opts.path.display().to_string(),
            format: "raw",
        }
        .snapshot_view()),
        ImageType::Raw | ImageType::Auto => {
            let lock = (opts.lock)
                .then(|| crate::lock::lock_image(&file, &opts.path, opts.lock_mode()))
                .transpose()?;
            Ok(Arc::new(
                RawImage::new(&opts.path, Arc::new(file), opts.readonly, probed)?.with_lock(lock),
            ))
        }
        // Qcow2Image locks its own file and its backing chain.
        ImageType::Qcow2 => Ok(Arc::new(super::qcow2::open_qcow2(opts, file)?)),
    }
}

/// Opens one file of an image chain with the options' access mode
/// ([`DiskOptions::open_file`]).
pub fn open_file(opts: &DiskOptions) -> Result<File, BlockError> {
    opts.open_file()
}

fn probe_file(file: &File, opts: &DiskOptions) -> Result<ImageType, BlockError> {
    use std::os::unix::fs::FileExt;
    // Read through a separate buffered descriptor: O_DIRECT would need an
    // aligned buffer for a 4-byte peek.
    let _ = file;
    let peek = File::open(&opts.path).map_err(|source| BlockError::Open {
        path: opts.path.clone(),
        source,
    })?;
    let mut magic = [0u8; 4];
    let n = peek
        .read_at(&mut magic, 0)
        .map_err(|source| BlockError::MetadataRead {
            what: "image header".into(),
            source,
        })?;
    Ok(probe_image_type(&magic[..n]))
}
