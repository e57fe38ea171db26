//! A mirror's target: checked, created (unless it exists already) and
//! opened, before the job copies anything into it.
//!
//! [`TargetSpec`] and the running source [`Disk`] enter
//! [`open_target`]; a [`MirrorTarget`] leaves: the target opened as the
//! disk will run on it after a complete (the source's cache mode, engine
//! and locking), with the file removed again when it was created here
//! and the job never completes ([`MirrorTarget::keep`]).
//!
//! Refused before anything is written: a target that is the running
//! image or one of its backing files (compared by device and inode, so
//! another name of the same file is caught), a new target whose path
//! exists, an existing one that is missing or whose size is not the
//! disk's, a raw target of `sync=top` over a backing chain (a raw image
//! cannot read the rest from a backing file), a format that is not raw or
//! qcow2. A target named by an NBD URI is an existing raw export.
//!
//! `sync=top` makes a qcow2 target with the source's backing file as its
//! own (QEMU's `mode=absolute-paths`): after the switch the disk reads
//! what the top never held from the same backing chain.

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

/// What a mirror copies (QEMU's `sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Everything the disk reads: the whole backing chain.
    Full,
    /// What the top image holds; the target gets the same backing file.
    Top,
    /// What the layers above depth N of the chain hold (an active
    /// commit into the layer at depth N, which is the target); the rest
    /// the target holds already.
    Above(u32),
}

/// Where and how a mirror writes.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// A local path or an NBD URI.
    pub path: PathBuf,
    /// `"qcow2"` or `"raw"`; `None`: qcow2 for a new target, probed for
    /// an existing one.
    pub format: Option<String>,
    /// The target exists (made by the user); otherwise it is created.
    pub existing: bool,
    pub sync: SyncMode,
}

/// Why a mirror's target was refused or could not be made.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error("the target {0} is the disk's running image")]
    IsSource(PathBuf),
    #[error("the target {0} is a backing file of the disk's image")]
    InChain(PathBuf),
    #[error("the target {0} exists already (say \"existing\": true to mirror into it)")]
    Exists(PathBuf),
    #[error("the target {0} does not exist (\"existing\" says it does)")]
    Missing(PathBuf),
    #[error("the target {path} has {target} bytes, the disk {disk}; they must be equal")]
    SizeDiffers {
        path: PathBuf,
        target: u64,
        disk: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot create the target {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
    #[error("cannot open the target {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
}

impl TargetError {
    /// Whether the request was wrong (rather than the storage failing).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, TargetError::Create { .. } | TargetError::Open { .. })
    }

    /// Whether the refusal is a conflict with what exists (409).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            TargetError::IsSource(_) | TargetError::InChain(_) | TargetError::Exists(_)
        )
    }
}

/// An opened mirror target (see the module docs).
pub struct MirrorTarget {
    pub image: ExclusiveImage,
    /// The file this module created (removed unless kept).
    created: Option<PathBuf>,
    /// A new target reads zeroes everywhere until written.
    pub reads_zero: bool,
}

impl MirrorTarget {
    pub fn path(&self) -> &Path {
        &self.image.disk().options().path
    }

    /// The target stays whatever happens to the job (it completed, or the
    /// user asked for a copy as of a cancel at ready).
    pub fn keep(&mut self) {
        self.created = None;
    }

    /// Closes the target cleanly; a target this module created is then
    /// removed unless kept.
    pub fn close(self) -> Result<(), BlockError> {
        let MirrorTarget { image, created, .. } = self;
        let r = image.close();
        if let Some(path) = created {
            if let Err(e) = std::fs::remove_file(&path) {
                log::warn!("cannot remove the mirror target {}: {e}", path.display());
            }
        }
        r
    }

    /// A target its caller opened and that holds the disk's data already
    /// where the job copies nothing (an active commit's base, opened
    /// beside the running chain): never removed, never zeroed beyond
    /// what the job copies.
    pub fn opened(image: ExclusiveImage) -> MirrorTarget {
        MirrorTarget {
            image,
            created: None,
            reads_zero: false,
        }
    }

    /// The file this module created for the job, if it did (and it is
    /// not kept yet).
    pub fn created(&self) -> Option<&Path> {
        self.created.as_deref()
    }

    /// The image, for the disk to run on (the job completed).
    pub fn into_image(mut self) -> ExclusiveImage {
        self.keep();
        self.image
    }
}

/// Checks, creates and opens the target of a mirror of `source` (see the
/// module docs). Nothing is written when an error comes back.
pub fn open_target(source: &Disk, spec: &TargetSpec) -> Result<MirrorTarget, TargetError> {
    let path = &spec.path;
    let nbd = is_nbd_path(path);
    let format: Option<&'static str> = match spec.format.as_deref() {
        None => None,
        Some("qcow2") => Some("qcow2"),
        Some("raw") => Some("raw"),
        Some(other) => {
            return Err(TargetError::Invalid(format!(
                "a mirror target is qcow2 or raw, not '{other}'"
            )))
        }
    };
    if nbd && format == Some("qcow2") {
        return Err(TargetError::Invalid(
            "an NBD target is a raw export (leave out the format, or say raw)".into(),
        ));
    }
    let backing = source.format().info().full_backing_filename;
    if spec.sync == SyncMode::Top && backing.is_some() && (nbd || format == Some("raw")) {
        return Err(TargetError::Invalid(
            "sync=top over a backing chain needs a qcow2 target (a raw one cannot read the \
             rest from the backing file)"
                .into(),
        ));
    }
    let chain: Vec<FileIdentity> = source
        .format()
        .files()
        .local()
        .iter()
        .filter_map(|f| FileIdentity::of(f).ok())
        .collect();
    if !nbd {
        if let Ok(id) = FileIdentity::of_path(path) {
            if chain.first() == Some(&id) {
                return Err(TargetError::IsSource(path.clone()));
            }
            if chain.contains(&id) {
                return Err(TargetError::InChain(path.clone()));
            }
        }
        if path == &source.options().path {
            return Err(TargetError::IsSource(path.clone()));
        }
    }
    let existing = spec.existing || nbd;
    let mut created = None;
    if !existing {
        created = Some(create_target(
            source,
            spec,
            format.unwrap_or("qcow2"),
            &chain,
        )?);
    } else if !nbd && path.symlink_metadata().is_err() {
        return Err(TargetError::Missing(path.clone()));
    }
    // From here a file we created is removed if the open fails.
    let guard = RemoveOnDrop(created.clone());
    let image_type = match (format, existing) {
        (Some(f), _) => FORMATS.image_type(f).unwrap_or(ImageType::Auto),
        (None, false) => ImageType::Format("qcow2"),
        (None, true) if nbd => ImageType::Format("raw"),
        (None, true) => ImageType::Auto,
    };
    let opts = DiskOptions {
        path: path.clone(),
        image_type,
        readonly: false,
        snapshot: None,
        no_backing: false,
        keep_persistent_bitmaps: false,
        ..source.options().clone()
    };
    let image = ExclusiveImage::open(&opts).map_err(|source| TargetError::Open {
        path: path.clone(),
        source,
    })?;
    let size = image.disk().size();
    if size != source.size() {
        return Err(TargetError::SizeDiffers {
            path: path.clone(),
            target: size,
            disk: source.size(),
        });
    }
    std::mem::forget(guard);
    Ok(MirrorTarget {
        image,
        created,
        reads_zero: !existing,
    })
}

/// Creates a new target image: refused if the path exists (another
/// process's file is never replaced), made with the disk's size, with
/// the source's backing file for `sync=top`.
fn create_target(
    source: &Disk,
    spec: &TargetSpec,
    format: &'static str,
    chain: &[FileIdentity],
) -> Result<PathBuf, TargetError> {
    let path = &spec.path;
    if path.symlink_metadata().is_ok() {
        return Err(TargetError::Exists(path.clone()));
    }
    if let Err(e) = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(path)
    {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            return Err(TargetError::Exists(path.clone()));
        }
        return Err(TargetError::Create {
            path: path.clone(),
            source: BlockError::Open {
                path: path.clone(),
                source: e,
            },
        });
    }
    let guard = RemoveOnDrop(Some(path.clone()));
    let info = source.format().info();
    let (backing_file, backing_fmt) = match spec.sync {
        SyncMode::Top => (
            info.full_backing_filename.clone(),
            info.backing_filename_format
                .as_deref()
                .and_then(|f| FORMATS.image_type(f)),
        ),
        SyncMode::Full | SyncMode::Above(_) => (None, None),
    };
    let opts = CreateOptions {
        path: path.clone(),
        format: ImageType::Format(format),
        size: source.size(),
        unsafe_backing: backing_file.is_some(),
        backing_file,
        backing_fmt,
        sources: chain.to_vec(),
        ..Default::default()
    };
    create_image(&opts).map_err(|source| TargetError::Create {
        path: path.clone(),
        source,
    })?;
    std::mem::forget(guard);
    Ok(path.clone())
}

/// Removes a file made here when a later step fails.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            if let Err(e) = std::fs::remove_file(p) {
                log::warn!("cannot remove {}: {e}", p.display());
            }
        }
    }
}
