//! Opening a qcow2 overlay over an image that is already open: the new
//! top of a running disk (an external snapshot), whose backing file is
//! the disk's running image. Opening that file a second time would fail
//! (the running disk holds its writer's lock) and would give a second
//! view of tables the running disk still changes, so the overlay takes
//! the running image's open [`Format`] as its backing image.
//!
//! The overlay's options, the open backing image and the path it was
//! opened from enter [`open_overlay_over`]; the opened [`Qcow2Image`]
//! leaves, after its header was checked to name that path as its
//! backing file. The backing image's copy-on-write reads go through
//! buffered read-only descriptors opened again from its local files
//! (`/proc/self/fd`: a new open file description without O_DIRECT and
//! without a lock of its own).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use super::backing::{resolve, Backing};
use super::image::Qcow2Image;
use super::opener::open_chain_over;
use crate::error::BlockError;
use crate::formats::driver::Formats;
use crate::formats::Format;
use crate::options::DiskOptions;
use block_engines::nbd::is_nbd_path;

/// Opens the qcow2 image `opts.path`, whose header must name
/// `backing_path` as its backing file, with `backing` (that image,
/// already open) as its backing image.
pub(crate) fn open_overlay_over(
    opts: &DiskOptions,
    backing: Arc<dyn Format>,
    backing_path: &Path,
    formats: &Formats,
) -> Result<Qcow2Image, BlockError> {
    let cow_files = backing
        .files()
        .local()
        .iter()
        .map(|f| reopen_buffered(f))
        .collect::<Result<Vec<_>, _>>()?;
    // The depth below the overlay as far as the backing image tells it
    // (only ever reported, never used to bound anything: the running
    // chain was bounded when it was opened).
    let layers = 1 + u32::from(backing.info().backing_filename.is_some());
    let given = Backing {
        image: backing,
        cow_files,
        layers,
    };
    let canon = opts
        .path
        .canonicalize()
        .map_err(|source| BlockError::Open {
            path: opts.path.clone(),
            source,
        })?;
    let file = opts.open_file()?;
    let image = open_chain_over(opts, file, &mut vec![canon], formats, Some(given))?;
    let named = image
        .chain
        .header
        .backing_file
        .as_deref()
        .map(|name| resolve(&opts.path, name));
    match named {
        Some(p) if same_image(&p, backing_path) => Ok(image),
        other => Err(BlockError::InvalidImage {
            path: opts.path.clone(),
            reason: format!(
                "its backing file is {}, not the open image {}",
                other.map_or_else(|| "none".into(), |p| p.display().to_string()),
                backing_path.display()
            ),
        }),
    }
}

/// Whether two names of images name the same one: NBD URIs as written,
/// files by their canonical paths.
fn same_image(a: &Path, b: &Path) -> bool {
    if is_nbd_path(a) || is_nbd_path(b) {
        return a == b;
    }
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A buffered read-only descriptor of the file behind `f`.
fn reopen_buffered(f: &File) -> Result<Arc<File>, BlockError> {
    let proc_path = format!("/proc/self/fd/{}", f.as_raw_fd());
    File::open(&proc_path)
        .map(Arc::new)
        .map_err(|source| BlockError::Open {
            path: proc_path.into(),
            source,
        })
}
