//! Opening a qcow2 image and its chain: [`open_qcow2`].
//!
//! Options and the image's opened descriptor enter; a [`Qcow2Image`]
//! leaves. In order:
//! 1. the lock (qemu's, see [`crate::lock`]) and a buffered descriptor
//!    for metadata; the header (`read_header`), the bitmap directory
//!    and the snapshot table, each refused where qemu refuses them;
//! 2. a read-write open refuses a corrupt image and O_DIRECT writes to
//!    clusters smaller than a page; an image left dirty by a crash with
//!    lazy refcounts is repaired (`check -r all` rebuilds its refcounts
//!    and clears the dirty bit) and its header read again, all before
//!    the image is built; unknown autoclear bits are cleared;
//! 3. the external data file, then the backing chain (`backing` finds
//!    and checks each backing file and opens it with its format's driver
//!    from the formats it is given; a qcow2 one comes back here, through
//!    `driver`, one level down);
//! 4. the tables (`MetaState`), the image, and for a read-only open of
//!    an internal snapshot, the snapshot's tables in place of the active
//!    ones (`snapshot_view`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use super::backing::{find_backing, resolve, Backing};
use super::chain::Chain;
use super::check::check_qcow2;
use super::image::{new_image_id, Qcow2Image};
use super::state::State;
use crate::error::BlockError;
use crate::formats::check_report::Repair;
use crate::formats::driver::Formats;
use crate::formats::qcow2::bitmaps::bitmap_directory::bitmaps_of;
use crate::formats::qcow2::metadata::meta::guard::REPAIR_HINT;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaIo;
use crate::formats::qcow2::on_disk::header::{clear_unknown_autoclear, read_header, Header};
use crate::formats::qcow2::on_disk::snapshot_table::{read_snapshot_table, TableLocation};
use crate::formats::qcow2::tools::snapshot_view::view_snapshot;
use crate::formats::{FileId, ImageFiles};
use crate::options::DiskOptions;

/// The smallest unit the page cache tracks; a cluster smaller than this
/// shares its page with other clusters.
const PAGE_SIZE: u64 = 4096;

/// Opens the top image of a chain; `file` was opened with `opts`. Its
/// backing images may have any of `formats`.
pub fn open_qcow2(
    opts: &DiskOptions,
    file: File,
    formats: &Formats,
) -> Result<Qcow2Image, BlockError> {
    let canon = opts
        .path
        .canonicalize()
        .map_err(|source| BlockError::Open {
            path: opts.path.clone(),
            source,
        })?;
    open_chain(opts, file, &mut vec![canon], formats)
}

/// Opens one image of a chain; `chain` holds the canonical paths of the
/// images above it and this one (cycle and depth check).
pub(crate) fn open_chain(
    opts: &DiskOptions,
    file: File,
    chain: &mut Vec<PathBuf>,
    formats: &Formats,
) -> Result<Qcow2Image, BlockError> {
    open_chain_over(opts, file, chain, formats, None)
}

/// As [`open_chain`]; with `given`, the image's backing file is that
/// already opened image instead of one found and opened from the header
/// (an overlay made on a running disk, `super::overlay`).
pub(crate) fn open_chain_over(
    opts: &DiskOptions,
    file: File,
    chain: &mut Vec<PathBuf>,
    formats: &Formats,
    given: Option<Backing>,
) -> Result<Qcow2Image, BlockError> {
    let path = opts.path.clone();
    let lock = (opts.lock)
        .then(|| crate::lock::lock_image(&file, &path, opts.lock_mode()))
        .transpose()?;
    let meta_file = OpenOptions::new()
        .read(true)
        .write(!opts.readonly)
        .open(&path)
        .map_err(|source| BlockError::Open {
            path: path.clone(),
            source,
        })?;
    let (mut header, mut file_size) = read_header(&meta_file, &path)?;
    // As qemu, refuse a bitmap directory it would refuse to load.
    bitmaps_of(&meta_file, &header, file_size).map_err(|reason| BlockError::InvalidImage {
        path: path.clone(),
        reason,
    })?;
    // As qemu, refuse a snapshot table beyond its limits (the count,
    // the table's size, each entry's extra data).
    read_snapshot_table(&meta_file, TableLocation::of(&header), file_size).map_err(|reason| {
        BlockError::InvalidImage {
            path: path.clone(),
            reason,
        }
    })?;
    if !opts.readonly {
        check_writable_open(&path, &header)?;
        check_direct_writes(opts, &header)?;
        if header.dirty() {
            repair_dirty(&path)?;
            (header, file_size) = read_header(&meta_file, &path)?;
            check_writable_open(&path, &header)?;
            if header.dirty() {
                return Err(BlockError::InvalidImage {
                    path,
                    reason: "image is still dirty after repairing its refcounts".into(),
                });
            }
        }
        let keep_bitmaps = opts.keep_persistent_bitmaps || opts.records_bitmaps;
        clear_unknown_autoclear(&meta_file, &path, &mut header, keep_bitmaps)?;
    }
    let mut files = vec![Arc::new(file)];
    let meta_file = Arc::new(meta_file);
    let mut cow_files = vec![Arc::clone(&meta_file)];
    let mut data_file = FileId(0);
    let mut data_file_lock = None;
    if let Some(name) = header.data_file.clone() {
        let dpath = resolve(&path, &name);
        let mut o = OpenOptions::new();
        o.read(true).write(!opts.readonly);
        if opts.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let f = o.open(&dpath).map_err(|source| BlockError::Open {
            path: dpath.clone(),
            source,
        })?;
        let b = File::open(&dpath).map_err(|source| BlockError::Open {
            path: dpath.clone(),
            source,
        })?;
        data_file_lock = (opts.lock)
            .then(|| crate::lock::lock_image(&f, &dpath, opts.lock_mode()))
            .transpose()?;
        data_file = FileId(files.len() as u16);
        files.push(Arc::new(f));
        cow_files.push(Arc::new(b));
    }
    let backing_base = files.len() as u16;
    let backing = match header.backing_file.clone() {
        Some(_) if given.is_some() => given,
        None if given.is_some() => {
            return Err(BlockError::InvalidImage {
                path,
                reason: "the image has no backing file to open over".into(),
            })
        }
        Some(name) if !opts.no_backing => Some(find_backing(
            &path,
            &name,
            header.backing_format.as_deref(),
            opts,
            chain,
            formats,
        )?),
        _ => None,
    };
    let mut remote = Vec::new();
    if let Some(b) = &backing {
        if files.len() + b.image.files().len() > usize::from(u16::MAX) {
            return Err(BlockError::InvalidImage {
                path,
                reason: "too many files in the chain".into(),
            });
        }
        // The backing image's remote files stay after all local ones.
        files.extend(b.image.files().local().iter().cloned());
        remote.extend(b.image.files().remote_files().iter().cloned());
        cow_files.extend(b.cow_files.iter().cloned());
    }
    let backing_unopened = opts.no_backing && !opts.readonly && header.backing_file.is_some();
    let io = Arc::clone(&meta_file) as Arc<dyn MetaIo>;
    let mut meta = MetaState::load(&header, meta_file, io, path.clone(), file_size)?;
    // cache=unsafe skips every flush, the ordering barriers between
    // dependent metadata writes and at close included, as QEMU's
    // BDRV_O_NO_FLUSH does: a crash may then leave anything.
    meta.set_barriers(opts.cache.flushes());
    let size = AtomicU64::new(header.size);
    if let Some(which) = &opts.snapshot {
        if !opts.readonly {
            return Err(BlockError::Unsupported {
                path,
                feature: "opening a snapshot read-write".into(),
            });
        }
        view_snapshot(&mut meta, &size, which)?;
    }
    Ok(Qcow2Image {
        id: new_image_id(),
        size,
        compressed_cached: AtomicBool::new(false),
        state: Mutex::new(State::new(meta, header.incompatible)),
        chain: Chain {
            path,
            files: ImageFiles::new(files, remote),
            cow_files,
            backing,
            backing_base,
            data_file,
            buffered_data: !opts.direct,
            header,
        },
        readonly: opts.readonly,
        // An owner that records writes in the bitmaps may let them through.
        keeps_bitmaps: opts.keep_persistent_bitmaps && !opts.records_bitmaps,
        _lock: lock,
        _data_file_lock: data_file_lock,
        backing_unopened,
    })
}

/// Read-write opens refuse images whose metadata cannot be trusted.
fn check_writable_open(path: &Path, h: &Header) -> Result<(), BlockError> {
    if h.corrupt() {
        return Err(BlockError::InvalidImage {
            path: path.to_owned(),
            reason: format!("refusing a read-write open: {REPAIR_HINT}"),
        });
    }
    Ok(())
}

/// Refuses O_DIRECT writes to an image whose clusters are smaller than
/// a page and whose data lives in the image file itself. Metadata goes
/// through a buffered descriptor; with such clusters an L2 table or a
/// refcount block can share a page with guest data written directly.
/// A direct write that lands while that page is dirty in the page cache
/// cannot drop the cached copy: Linux fails the next fdatasync with EIO
/// and may later write the stale cached bytes back over the new data
/// (seen in the replay test, docs/qcow2.md). Refusing is the only safe
/// answer that does not change the cache mode behind the user's back.
fn check_direct_writes(opts: &DiskOptions, header: &Header) -> Result<(), BlockError> {
    if opts.direct && header.data_file.is_none() && header.cluster_size() < PAGE_SIZE {
        return Err(BlockError::Unsupported {
            path: opts.path.clone(),
            feature: format!(
                "writing with O_DIRECT (direct=on, cache=none or directsync) to an image with {}-byte clusters (smaller than a {PAGE_SIZE}-byte page, so metadata and data share pages); open it with a buffered cache mode (writeback, writethrough, unsafe) or read-only",
                header.cluster_size()
            ),
        });
    }
    Ok(())
}

/// Rebuilds the refcounts of an image left dirty by a crash with lazy
/// refcounts (from its L1/L2 tables, as qemu does on open), which also
/// clears the dirty bit. We already hold the writer's lock.
fn repair_dirty(path: &Path) -> Result<(), BlockError> {
    let report = check_qcow2(path, Some(Repair::All))?;
    if report.corruptions != 0 || report.check_errors != 0 {
        return Err(BlockError::InvalidImage {
            path: path.to_owned(),
            reason: format!(
                "image is dirty and repairing its refcounts left {} corruptions and {} check errors; \
                 run qemu-img check -r all",
                report.corruptions, report.check_errors
            ),
        });
    }
    log::warn!(
        "{}: image was not closed cleanly (lazy refcounts); rebuilt its refcounts \
         ({} corruptions and {} leaks fixed) and cleared the dirty bit",
        path.display(),
        report.corruptions_fixed,
        report.leaks_fixed
    );
    Ok(())
}
