//! The file a new image is written to (`ch-img create`, `convert`):
//! opened or created, locked like a writer, refused when it is one of the
//! files the command reads (by [`FileIdentity`], so another name of the
//! same file is caught too), then truncated.
//!
//! A path and the command's sources enter [`open_for_create`]; the empty
//! file and its lock leave, for the raw or qcow2 creator to fill.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::BlockError;
use crate::lock::ImageLock;

/// A file as the kernel knows it: two names (a path, `./path`, a symbolic
/// or a hard link) of one file have the same identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
}

impl FileIdentity {
    pub fn of(file: &File) -> std::io::Result<FileIdentity> {
        file.metadata().map(|m| FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The identity of the file `path` names (following links).
    pub fn of_path(path: &Path) -> std::io::Result<FileIdentity> {
        std::fs::metadata(path).map(|m| FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Opens (or creates) `path` for a new image: locked like a writer first,
/// so an image some VMM or qemu has open is refused, checked not to be
/// one of `sources` (the files the command reads), then truncated. The
/// caller holds the lock until the image is written; dropping it unlocks
/// the file explicitly. Leaving the locks to go with the file's last
/// descriptor is not enough: a child another thread forks before it
/// execs holds a copy of every descriptor (close-on-exec or not), and the
/// next open of the new image then found it still locked (seen as a
/// flaky `Locked` in block/tests/exclusive_image.rs while other tests ran
/// qemu-img).
pub(crate) fn open_for_create(
    path: &Path,
    sources: &[FileIdentity],
) -> Result<(File, ImageLock), BlockError> {
    let open_err = |source| BlockError::Open {
        path: path.to_owned(),
        source,
    };
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(open_err)?;
    let lock = crate::lock::lock_image(&file, path, crate::lock::LockMode::Writer)?;
    if sources.contains(&FileIdentity::of(&file).map_err(open_err)?) {
        return Err(BlockError::OverwritesSource {
            path: path.to_owned(),
        });
    }
    file.set_len(0).map_err(open_err)?;
    Ok((file, lock))
}
