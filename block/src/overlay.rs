//! A new qcow2 overlay on a running disk's image (an external snapshot):
//! created as `qemu-img create -f qcow2 -b BASE -F FMT OVERLAY` creates
//! it, then opened with the running image's open format as its backing
//! image ([`crate::ExclusiveImage::open_overlay`]).
//!
//! The running [`Disk`] and the overlay's path enter [`NewOverlay::create`];
//! a [`NewOverlay`] leaves, which removes the file it created when it is
//! dropped before [`NewOverlay::keep`] (a later step of the request
//! failed). Refused before anything is written: a path that exists, and
//! in particular one that names the running image or a file of its
//! backing chain (compared by device and inode, so another name of the
//! same file is caught too).
//!
//! After the switch, [`settle_as_backing`] lets other tools read the old
//! top (it keeps a reader's locks only).
//!
//! The overlay records the running image's canonical path (an NBD URI as
//! written) as its backing file, so it opens from any working folder,
//! and the running image's format as the backing format; its size is the
//! disk's. The backing file is not opened to learn them (its writer's
//! lock is held by the running disk): `create -u`'s way.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::create::{create_image, CreateOptions};
use crate::disk::Disk;
use crate::error::BlockError;
use crate::exclusive::ExclusiveImage;
use crate::formats::registry::FORMATS;
use crate::new_file::FileIdentity;
use crate::options::{DiskOptions, ImageType};
use block_engines::nbd::is_nbd_path;

/// Why an overlay was not made.
#[derive(Debug, Error)]
pub enum OverlayError {
    #[error("the overlay {0} is the disk's running image")]
    IsRunningImage(PathBuf),
    #[error("the overlay {0} is a backing file of the disk's image")]
    InChain(PathBuf),
    #[error("the overlay {0} exists already")]
    Exists(PathBuf),
    #[error("an overlay must be a local file, not {0}")]
    NotLocal(PathBuf),
    #[error("cannot create the overlay {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
    #[error("cannot open the overlay {path} over the running image")]
    Open {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
}

/// An overlay file this process created; removed on drop unless kept.
pub struct NewOverlay {
    path: PathBuf,
    kept: bool,
}

impl NewOverlay {
    /// Creates the qcow2 overlay `path` over `running`'s image (see the
    /// module docs). Nothing is written when a refusal comes back.
    pub fn create(path: &Path, running: &Disk) -> Result<NewOverlay, OverlayError> {
        if is_nbd_path(path) {
            return Err(OverlayError::NotLocal(path.to_owned()));
        }
        let chain: Vec<FileIdentity> = running
            .format()
            .files()
            .local()
            .iter()
            .filter_map(|f| FileIdentity::of(f).ok())
            .collect();
        if path.symlink_metadata().is_ok() {
            return Err(refusal(path, running, &chain));
        }
        // O_EXCL: a file that appeared since is refused too, and the one
        // made here is ours to remove.
        if let Err(e) = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(path)
        {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                return Err(refusal(path, running, &chain));
            }
            return Err(OverlayError::Create {
                path: path.to_owned(),
                source: BlockError::Open {
                    path: path.to_owned(),
                    source: e,
                },
            });
        }
        let created = NewOverlay {
            path: path.to_owned(),
            kept: false,
        };
        let base = backing_name(&running.options().path);
        let opts = CreateOptions {
            path: path.to_owned(),
            format: ImageType::Format("qcow2"),
            size: running.size(),
            backing_file: Some(base),
            backing_fmt: FORMATS.image_type(running.format().name()),
            sources: chain,
            unsafe_backing: true,
            ..Default::default()
        };
        create_image(&opts).map_err(|source| OverlayError::Create {
            path: path.to_owned(),
            source,
        })?;
        Ok(created)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the overlay with `running`'s open image as its backing
    /// image, with `running`'s options (cache mode, engine, locking).
    pub fn open(&self, running: &Disk) -> Result<ExclusiveImage, OverlayError> {
        let opts = DiskOptions {
            path: self.path.clone(),
            image_type: ImageType::Format("qcow2"),
            readonly: false,
            snapshot: None,
            no_backing: false,
            ..running.options().clone()
        };
        let open_error = |source| OverlayError::Open {
            path: self.path.clone(),
            source,
        };
        let image = ExclusiveImage::open_overlay(&opts, running).map_err(open_error)?;
        // The overlay (empty: nothing is loaded or written) takes over
        // the running disk's persistent dirty bitmaps at the switch and
        // stores them at its close.
        image.attach_persistent_bitmaps().map_err(open_error)?;
        Ok(image)
    }

    /// The overlay stays (the disk now runs on it).
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for NewOverlay {
    fn drop(&mut self) {
        if !self.kept {
            if let Err(e) = std::fs::remove_file(&self.path) {
                log::warn!(
                    "cannot remove the unused overlay {}: {e}",
                    self.path.display()
                );
            }
        }
    }
}

/// Makes `base` (a running disk's old top, now an overlay's backing
/// image, flushed and closed) a reader's image: its files keep a
/// reader's locks only, so other tools may read it while the disk runs
/// on the overlay (as QEMU reopens a snapshot's base read-only).
pub fn settle_as_backing(base: &Disk) -> Result<(), BlockError> {
    for f in base.format().files().local() {
        crate::lock::give_up_writing(f).map_err(|source| BlockError::Lock {
            path: base.options().path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Why an existing `path` is refused: the running image, a backing file,
/// or just a file that exists.
fn refusal(path: &Path, running: &Disk, chain: &[FileIdentity]) -> OverlayError {
    let id = FileIdentity::of_path(path).ok();
    match id {
        Some(id) if chain.first() == Some(&id) => OverlayError::IsRunningImage(path.to_owned()),
        Some(id) if chain.contains(&id) => OverlayError::InChain(path.to_owned()),
        _ if path == running.options().path => OverlayError::IsRunningImage(path.to_owned()),
        _ => OverlayError::Exists(path.to_owned()),
    }
}

/// The name the overlay records for its backing file: the running
/// image's canonical path (an NBD URI as it is).
fn backing_name(running: &Path) -> String {
    if is_nbd_path(running) {
        return running.display().to_string();
    }
    running
        .canonicalize()
        .unwrap_or_else(|_| running.to_owned())
        .display()
        .to_string()
}
