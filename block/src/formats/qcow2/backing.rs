//! Opening a backing image: resolving its name against the overlay's
//! folder, choosing its format, refusing cycles, over-deep chains and
//! directories, and keeping buffered descriptors for copy-on-write reads.
//!
//! A backing name that is an NBD URI opens the export as a raw backing
//! image ([`crate::formats::nbd_image`]), with the overlay's `reconnect_delay`.
//!
//! A backing name (untrusted, from the overlay's header), the overlay's
//! options and the formats a backing image may have enter
//! [`find_backing`]; an opened read-only [`Backing`] leaves, whose files
//! the overlay appends to its own `files()` table. Its format's driver
//! opens it (a qcow2 one one level down the chain, like the top image).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::driver::{BackingOpen, Formats, PROBE_BYTES};
use crate::formats::{Format, ReadPlan};
use crate::options::{DiskOptions, ImageType};
use block_engines::nbd::is_nbd_path;

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
        crate::formats::qcow2::planning::plan_exec::execute_read(
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
    if is_nbd_path(p) {
        return p.to_owned();
    }
    if p.is_absolute() {
        p.to_owned()
    } else {
        overlay.parent().unwrap_or(Path::new(".")).join(p)
    }
}

/// Finds and checks the backing image `name` of `overlay` and opens it
/// with the driver of its format (`fmt`, or probed) from `formats`.
/// `chain` holds the canonical paths of the images above it (cycle and
/// depth check).
pub(crate) fn find_backing(
    overlay: &Path,
    name: &str,
    fmt: Option<&str>,
    opts: &DiskOptions,
    chain: &mut Vec<PathBuf>,
    formats: &Formats,
) -> Result<Backing, BlockError> {
    if is_nbd_path(Path::new(name)) {
        let image = crate::formats::nbd_image::open_backing(name, fmt, opts, formats)?;
        return Ok(Backing {
            image,
            cow_files: Vec::new(),
            layers: 1,
        });
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
        records_bitmaps: false,
        force_share: opts.force_share,
        snapshot: None,
        reconnect_delay: opts.reconnect_delay,
    };
    let file = bopts.open_file()?;
    let buffered = File::open(&path).map_err(|source| BlockError::Open {
        path: path.clone(),
        source,
    })?;
    let driver = match fmt {
        Some(name) => formats
            .by_name(name)
            .ok_or_else(|| BlockError::Unsupported {
                path: overlay.to_owned(),
                feature: format!("backing format '{name}'"),
            })?,
        None => {
            let mut magic = [0u8; PROBE_BYTES];
            crate::formats::qcow2::metadata::meta_io::read_at(
                &buffered,
                crate::formats::qcow2::metadata::meta_io::MetaKind::Header,
                0,
                &mut magic,
            )?;
            formats.probe(&magic)
        }
    };
    let opened = (driver.open_backing)(BackingOpen {
        opts: bopts,
        file,
        buffered,
        probed: fmt.is_none(),
        canon,
        chain,
        formats,
    })?;
    Ok(Backing {
        image: opened.image,
        cow_files: opened.buffered,
        layers: opened.layers,
    })
}
