//! Opening a backing image: resolving its name against the overlay's
//! folder, choosing its format, refusing cycles, over-deep chains and
//! directories, and keeping buffered descriptors for copy-on-write reads.
//!
//! A backing name that is an NBD URI opens the export as a raw backing
//! image ([`crate::formats::nbd_image`]), with the overlay's `reconnect_delay`.
//!
//! A backing name (untrusted, from the overlay's header) and the overlay's
//! options enter [`find_backing`]; an opened read-only [`Backing`] (raw
//! or NBD) leaves, whose files the overlay appends to its own `files()`
//! table, or for a qcow2 backing file the checked path and descriptor the
//! opener opens it from (one level down the chain, like the top image).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::probe::probe_image_type;
use crate::formats::raw::RawImage;
use crate::formats::{Format, ReadPlan};
use crate::options::{DiskOptions, ImageType};

/// Longest backing chain we follow (images below the top one).
pub(crate) const MAX_CHAIN_DEPTH: usize = 16;

pub(crate) struct Backing {
    pub image: Arc<dyn Format>,
    /// Buffered read-only descriptors, indexed like `image.files()`.
    pub cow_files: Vec<Arc<File>>,
    /// Images in this backing chain (1 for a raw or a qcow2 without backing).
    pub layers: u32,
}

impl Backing {
    /// Reads `buf.len()` bytes at guest `offset` (zeroes past the end).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let size = self.image.size();
        let avail = size.saturating_sub(offset).min(buf.len() as u64) as usize;
        buf[avail..].fill(0);
        if avail == 0 {
            return Ok(());
        }
        let mut plan = ReadPlan::new();
        self.image.plan_read(offset, avail as u64, &mut plan)?;
        super::plan_exec::execute_read(
            &self.cow_files,
            self.image.files(),
            &plan,
            &mut buf[..avail],
        )
    }
}

fn refuse(path: &Path, reason: impl Into<String>) -> BlockError {
    BlockError::InvalidImage {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Where a backing name points, relative to the overlay's folder (an NBD
/// URI is taken as it is).
pub(crate) fn resolve(overlay: &Path, name: &str) -> PathBuf {
    let p = Path::new(name);
    if block_engines::nbd::is_nbd_path(p) {
        return p.to_owned();
    }
    if p.is_absolute() {
        p.to_owned()
    } else {
        overlay.parent().unwrap_or(Path::new(".")).join(p)
    }
}

/// What [`find_backing`] found.
pub(crate) enum BackingFile {
    /// A raw file or an NBD export, opened.
    Opened(Backing),
    /// A qcow2 image for the opener: its options (read-only, the
    /// overlay's cache mode and locking), its descriptor opened with them,
    /// and its canonical path (for the chain's cycle check).
    Qcow2 {
        opts: DiskOptions,
        file: File,
        canon: PathBuf,
    },
}

/// Finds and checks the backing image `name` of `overlay`. `chain` holds
/// the canonical paths of the images above it (cycle and depth check).
pub(crate) fn find_backing(
    overlay: &Path,
    name: &str,
    fmt: Option<&str>,
    opts: &DiskOptions,
    chain: &[PathBuf],
) -> Result<BackingFile, BlockError> {
    if block_engines::nbd::is_nbd_path(Path::new(name)) {
        let image = crate::formats::nbd_image::open_backing(name, fmt, opts)?;
        return Ok(BackingFile::Opened(Backing {
            image,
            cow_files: Vec::new(),
            layers: 1,
        }));
    }
    if name.contains("://") || name.starts_with("json:") {
        return Err(BlockError::Unsupported {
            path: overlay.to_owned(),
            feature: format!("backing file protocol in '{name}'"),
        });
    }
    let path = resolve(overlay, name);
    let meta = std::fs::metadata(&path).map_err(|source| BlockError::Open {
        path: path.clone(),
        source,
    })?;
    if meta.is_dir() {
        return Err(refuse(
            overlay,
            format!("backing file {} is a directory", path.display()),
        ));
    }
    let canon = path.canonicalize().map_err(|source| BlockError::Open {
        path: path.clone(),
        source,
    })?;
    if chain.contains(&canon) {
        return Err(refuse(
            overlay,
            format!("backing chain has a cycle through {}", path.display()),
        ));
    }
    if chain.len() > MAX_CHAIN_DEPTH {
        return Err(refuse(
            overlay,
            format!("backing chain deeper than {MAX_CHAIN_DEPTH} images"),
        ));
    }
    let bopts = DiskOptions {
        path: path.clone(),
        readonly: true,
        direct: opts.direct,
        cache: opts.cache,
        image_type: ImageType::Auto,
        engine: opts.engine,
        lock: opts.lock,
        no_backing: false,
        keep_persistent_bitmaps: false,
        force_share: opts.force_share,
        snapshot: None,
        reconnect_delay: opts.reconnect_delay,
    };
    let file = bopts.open_file()?;
    let buffered = File::open(&path).map_err(|source| BlockError::Open {
        path: path.clone(),
        source,
    })?;
    let kind = match fmt {
        Some("qcow2") => ImageType::Qcow2,
        Some("raw") => ImageType::Raw,
        Some(other) => {
            return Err(BlockError::Unsupported {
                path: overlay.to_owned(),
                feature: format!("backing format '{other}'"),
            })
        }
        None => {
            let mut magic = [0u8; 4];
            super::meta_io::read_at(&buffered, super::meta_io::MetaKind::Header, 0, &mut magic)?;
            probe_image_type(&magic)
        }
    };
    if kind == ImageType::Qcow2 {
        return Ok(BackingFile::Qcow2 {
            opts: bopts,
            file,
            canon,
        });
    }
    let lock = (bopts.lock)
        .then(|| crate::lock::lock_image(&file, &path, bopts.lock_mode()))
        .transpose()?;
    let img = RawImage::new(&path, Arc::new(file), true, fmt.is_none())?.with_lock(lock);
    Ok(BackingFile::Opened(Backing {
        image: Arc::new(img),
        cow_files: vec![Arc::new(buffered)],
        layers: 1,
    }))
}
