//! Creating images (`ch-img create`), with qemu-img's options and defaults.
//!
//! [`CreateOptions`] (user input) enter; they are checked here (each error
//! names the option), then the raw file or the qcow2 layout is written
//! (see `formats::qcow2::create`).
//!
//! A new image never replaces a file someone uses: the file is locked
//! like a writer before it is truncated (an image a VMM or qemu holds is
//! refused), and it must not be one of [`CreateOptions::sources`] (the
//! files the command reads, compared by device and inode, so another name,
//! a symbolic link or a hard link to a source is refused too).

use std::path::PathBuf;

use crate::error::BlockError;
use crate::formats::qcow2::create::{create_qcow2, Qcow2Params};
use crate::new_file::open_for_create;
pub use crate::new_file::FileIdentity;
use crate::options::{DiskOptions, ImageType};
use crate::prealloc::{preallocate_range, Preallocation};

/// qemu-img create's `-f` and `-o` options that we support.
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    pub path: PathBuf,
    /// `Raw` or `Qcow2`.
    pub format: ImageType,
    /// Virtual size in bytes (may be taken from the backing file when 0
    /// and a backing file is given, as qemu-img does).
    pub size: u64,
    /// Default 64 KiB.
    pub cluster_size: Option<u64>,
    /// Stored as given; resolved against the new image's folder on open.
    pub backing_file: Option<String>,
    pub backing_fmt: Option<ImageType>,
    /// "0.10" (v2) or "1.1" (v3, default); "v2"/"v3" accepted too.
    pub compat: Option<String>,
    /// Default 16.
    pub refcount_bits: Option<u32>,
    pub lazy_refcounts: bool,
    pub extended_l2: bool,
    /// Compress clusters with zstd instead of zlib (`compression_type`;
    /// needs compat=1.1).
    pub zstd: bool,
    /// qemu-img's `preallocation=` (raw: off, falloc, full).
    pub preallocation: Preallocation,
    /// Files the new image must not be: the files the command reads
    /// (`convert`'s source chains, the backing file). Checked after the
    /// file is locked, before it is truncated.
    pub sources: Vec<FileIdentity>,
    /// qemu-img's `create -u`: the backing file is recorded without being
    /// opened (it may be missing); the size must then be given.
    pub unsafe_backing: bool,
}

fn bad(opts: &CreateOptions, option: &str, why: impl std::fmt::Display) -> BlockError {
    BlockError::InvalidImage {
        path: opts.path.clone(),
        reason: format!("option {option}: {why}"),
    }
}

/// Creates the image; fails if the options are inconsistent (the message
/// names the option). When writing the new file fails (say, ENOSPC while
/// preallocating), the partial file is removed.
pub fn create_image(opts: &CreateOptions) -> Result<(), BlockError> {
    if block_engines::nbd::is_nbd_path(&opts.path) {
        return create_on_export(opts);
    }
    let r = match opts.format {
        ImageType::Raw => create_raw(opts),
        ImageType::Qcow2 => create_qcow2_image(opts),
        ImageType::Auto => Err(bad(opts, "format", "give raw or qcow2")),
    };
    if let Err(e) = &r {
        // Only errors after the file was opened and truncated as ours; a
        // refused open (locked, bad options) leaves the file alone.
        if matches!(
            e,
            BlockError::Preallocate { .. }
                | BlockError::MetadataWrite { .. }
                | BlockError::Flush(_)
        ) {
            let _ = std::fs::remove_file(&opts.path);
        }
    }
    r
}

/// An image "created" on an NBD export, as qemu-img creates one there: a
/// raw image is the export itself (it keeps its size, must be large
/// enough, and its first sector is zeroed); qcow2 inside an export is
/// not supported (our client opens an export as raw), and an export
/// cannot be preallocated (qemu-img's words).
fn create_on_export(opts: &CreateOptions) -> Result<(), BlockError> {
    let image = opts.path.to_string_lossy().into_owned();
    let cannot = |reason: String| BlockError::CannotDo {
        image: image.clone(),
        reason,
    };
    match opts.format {
        ImageType::Raw => {}
        ImageType::Qcow2 => {
            return Err(cannot(
                "qcow2 inside an NBD export is not supported (an export opens as raw); \
                 create the image elsewhere and export its guest view"
                    .into(),
            ))
        }
        ImageType::Auto => return Err(bad(opts, "format", "give raw or qcow2")),
    }
    check_raw_options(opts)?;
    if opts.preallocation != Preallocation::Off {
        return Err(cannot(format!(
            "Unsupported preallocation mode '{}'",
            opts.preallocation
        )));
    }
    crate::formats::nbd_image::create_raw(&image, opts.size)
}

/// Refuses the options a raw image does not take.
fn check_raw_options(opts: &CreateOptions) -> Result<(), BlockError> {
    if opts.backing_file.is_some() {
        return Err(bad(opts, "backing_file", "raw images have no backing file"));
    }
    for (set, name) in [
        (opts.cluster_size.is_some(), "cluster_size"),
        (opts.compat.is_some(), "compat"),
        (opts.refcount_bits.is_some(), "refcount_bits"),
        (opts.lazy_refcounts, "lazy_refcounts"),
        (opts.extended_l2, "extended_l2"),
        (opts.zstd, "compression_type"),
    ] {
        if set {
            return Err(bad(opts, name, "not a raw image option"));
        }
    }
    if opts.preallocation == Preallocation::Metadata {
        return Err(bad(
            opts,
            "preallocation",
            "metadata is for qcow2; raw images take off, falloc or full",
        ));
    }
    Ok(())
}

fn create_raw(opts: &CreateOptions) -> Result<(), BlockError> {
    check_raw_options(opts)?;
    let (f, _lock) = open_for_create(&opts.path, &opts.sources)?;
    preallocate_range(&f, &opts.path, opts.preallocation, 0, opts.size)?;
    f.sync_all().map_err(BlockError::Flush)
}

fn create_qcow2_image(opts: &CreateOptions) -> Result<(), BlockError> {
    let version = match opts.compat.as_deref() {
        None | Some("1.1") | Some("v3") => 3,
        Some("0.10") | Some("v2") => 2,
        Some(other) => {
            return Err(bad(
                opts,
                "compat",
                format!("'{other}' (expected 0.10 or 1.1)"),
            ))
        }
    };
    let cluster_size = opts.cluster_size.unwrap_or(65536);
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        return Err(bad(
            opts,
            "cluster_size",
            format!("{cluster_size} is not a power of two from 512 to 2M"),
        ));
    }
    let refcount_bits = opts.refcount_bits.unwrap_or(16);
    if !refcount_bits.is_power_of_two() || refcount_bits > 64 {
        return Err(bad(
            opts,
            "refcount_bits",
            format!("{refcount_bits} is not a power of two up to 64"),
        ));
    }
    if version == 2 {
        if refcount_bits != 16 {
            return Err(bad(
                opts,
                "refcount_bits",
                "compat=0.10 images need refcount_bits=16",
            ));
        }
        if opts.lazy_refcounts {
            return Err(bad(opts, "lazy_refcounts", "needs compat=1.1"));
        }
        if opts.extended_l2 {
            return Err(bad(opts, "extended_l2", "needs compat=1.1"));
        }
        if opts.zstd {
            return Err(bad(opts, "compression_type", "zstd needs compat=1.1"));
        }
    }
    if opts.extended_l2 && cluster_size < 16384 {
        return Err(bad(
            opts,
            "extended_l2",
            "needs a cluster size of at least 16 KiB",
        ));
    }
    let backing_format = match opts.backing_fmt {
        None | Some(ImageType::Auto) => None,
        Some(ImageType::Raw) => Some("raw".to_string()),
        Some(ImageType::Qcow2) => Some("qcow2".to_string()),
    };
    if opts.preallocation != Preallocation::Off && opts.backing_file.is_some() && !opts.extended_l2
    {
        // As qemu-img: preallocated clusters would hide the backing data.
        return Err(bad(
            opts,
            "preallocation",
            "a backing file and preallocation need extended_l2=on",
        ));
    }
    if backing_format.is_some() && opts.backing_file.is_none() {
        return Err(bad(opts, "backing_fmt", "given without backing_file"));
    }
    let mut size = opts.size;
    if opts.unsafe_backing && size == 0 {
        return Err(bad(opts, "size", "Image creation needs a size parameter"));
    }
    // The backing chain is a source: the new image must not replace it.
    let mut sources = opts.sources.clone();
    if let Some(name) = opts.backing_file.as_ref().filter(|_| opts.unsafe_backing) {
        let bpath = crate::formats::qcow2::backing::resolve(&opts.path, name);
        sources.extend(FileIdentity::of_path(&bpath).ok());
    }
    if let Some(name) = opts.backing_file.as_ref().filter(|_| !opts.unsafe_backing) {
        // Like qemu-img, open the backing file to check it (and learn the size).
        let bpath = crate::formats::qcow2::backing::resolve(&opts.path, name);
        let bopts = DiskOptions {
            path: bpath,
            readonly: true,
            image_type: opts.backing_fmt.unwrap_or_default(),
            lock: false,
            ..Default::default()
        };
        let backing = crate::formats::open_format(&bopts)
            .map_err(|e| bad(opts, "backing_file", format!("cannot open {name}: {e}")))?;
        if size == 0 {
            size = backing.size();
        }
        sources.extend(
            backing
                .files()
                .local()
                .iter()
                .filter_map(|f| FileIdentity::of(f).ok()),
        );
    }
    let size = size.div_ceil(512) * 512;
    create_qcow2(
        &opts.path,
        &Qcow2Params {
            size,
            cluster_bits: cluster_size.trailing_zeros(),
            version,
            refcount_order: refcount_bits.trailing_zeros(),
            lazy_refcounts: opts.lazy_refcounts,
            extended_l2: opts.extended_l2,
            zstd: opts.zstd,
            backing_file: opts.backing_file.clone(),
            backing_format,
            preallocation: opts.preallocation,
            sources,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// A copy of the creating descriptor that outlives the create (as a
    /// child another thread forked holds one until it execs) must not
    /// keep the new image locked.
    #[test]
    fn a_created_image_is_unlocked_while_a_copy_of_its_descriptor_lives() {
        let dir = std::env::temp_dir().join(format!("create-unlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("new.img");
        let (file, lock) = open_for_create(&path, &[]).unwrap();
        let forked_copy = file.try_clone().unwrap();
        drop(lock);
        drop(file);
        let again = File::options().read(true).write(true).open(&path).unwrap();
        crate::lock::lock_image(&again, &path, crate::lock::LockMode::Writer)
            .expect("the create's lock is gone");
        drop(forked_copy);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A source under another name (here a hard link) is refused after
    /// the lock and before the truncation: its bytes stay.
    #[test]
    fn a_source_is_never_truncated() {
        let dir = std::env::temp_dir().join(format!("create-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("source.img");
        std::fs::write(&source, [7u8; 4096]).unwrap();
        let link = dir.join("link.img");
        std::fs::hard_link(&source, &link).unwrap();
        let id = FileIdentity::of_path(&source).unwrap();
        let err = open_for_create(&link, &[id]).unwrap_err();
        assert!(matches!(err, BlockError::OverwritesSource { .. }), "{err}");
        assert_eq!(std::fs::read(&source).unwrap(), vec![7u8; 4096]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
