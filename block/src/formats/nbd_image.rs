//! [`NbdImage`]: a raw disk whose bytes are an NBD export (the guest
//! view a qemu-nbd, qemu-storage-daemon or nbdkit serves), and opening
//! an export as an image: the disk itself (`open_image`), a qcow2
//! overlay's read-only raw backing file (`open_backing`), or the
//! output of `create -f raw` (`create_on_export`). The export is an
//! [`NbdFile`], the remote file the engines' NBD client reaches through
//! its connections. An image of another format inside an export is
//! refused: whether the export holds one is asked of the formats the
//! caller gives (the registry's).
//!
//! It plans like a raw file, but its one file is remote: its
//! [`Format::files`] are the export alone, so every planned op is file
//! 0, a remote file, and goes to the queue's NBD engine. Discards become TRIM (a hint),
//! write-zeroes WRITE_ZEROES (the server may punch holes: NBD's NO_HOLE
//! is not sent, as the block layer's plan does not carry the guest's
//! "keep allocated"), flushes FLUSH. Block status is the export's
//! `base:allocation`, asked inline (as `qemu-img map` over NBD does).
//! The tool capabilities (snapshots, backing edits, compressed writes,
//! resize, amend, persistent bitmaps) are refused, in qemu-img's words
//! where it has them (`lacking.rs`; a resize to another
//! size: "Cannot resize NBD nodes"): an export's shape is its server's
//! business; a failed tool operation has nothing to undo.

use std::sync::Arc;
use std::time::Duration;

use crate::error::BlockError;
use crate::formats::amendment::{AmendProgress, Amendment};
use crate::formats::create_options::CreateOptions;
use crate::formats::dirty_bits::{BitmapAction, DirtyBits};
use crate::formats::driver::{Formats, PROBE_BYTES};
use crate::formats::identity::IdentityMap;
use crate::formats::lacking::Lacking;
use crate::formats::tools::{
    Amendable, BackingEdits, CompressedWrites, FailureUndo, PersistentBitmaps, Resizable, Snapshots,
};
use crate::formats::{
    BlockStatus, Compression, FileId, Format, ImageFiles, ImageInfo, ReadPlan, Waker, WriteCommit,
    WriteOutcome,
};
use crate::options::{DiskOptions, ImageType};
use crate::prealloc::Preallocation;
use block_engines::nbd::NbdFile;
use nbd::wire::consts::state;

/// The export: the first (and only) remote file.
const EXPORT: FileId = FileId(0);
const NAME: &str = "raw (over NBD)";

/// qemu's NBD driver's refusal of any size but the export's.
const CANNOT_RESIZE: &str = "Cannot resize NBD nodes";

pub struct NbdImage {
    file: Arc<NbdFile>,
    /// The export as the image's one file (remote file 0).
    files: ImageFiles,
    map: IdentityMap,
}

impl NbdImage {
    /// The refusals of the capabilities an export lacks, naming it.
    fn lacking(&self) -> Lacking {
        Lacking {
            image: self.file.name(),
            format: NAME,
        }
    }

    fn new(file: Arc<NbdFile>, readonly: bool) -> Self {
        NbdImage {
            files: ImageFiles::new(Vec::new(), vec![file.clone()]),
            file,
            map: IdentityMap {
                file: EXPORT,
                readonly,
            },
        }
    }
}

impl Format for NbdImage {
    fn size(&self) -> u64 {
        self.file.size()
    }

    fn files(&self) -> &ImageFiles {
        &self.files
    }

    fn flush_files(&self) -> Vec<FileId> {
        self.map.flush_files()
    }

    fn plan_read(&self, offset: u64, len: u64, plan: &mut ReadPlan) -> Result<(), BlockError> {
        self.map.plan_read(self.size(), offset, len, plan)
    }

    fn plan_write(
        &self,
        offset: u64,
        len: u64,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.map.plan_write(self.size(), offset, len)
    }

    fn plan_discard(
        &self,
        offset: u64,
        len: u64,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.map.plan_discard(self.size(), offset, len)
    }

    fn plan_write_zeroes(
        &self,
        offset: u64,
        len: u64,
        _may_unmap: bool,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        // WRITE_ZEROES without NO_HOLE: the server may punch a hole.
        self.map.plan_write_zeroes(self.size(), offset, len, false)
    }

    fn commit(&self, _commit: WriteCommit) -> Result<(), BlockError> {
        Ok(())
    }

    fn abort(&self, _commit: WriteCommit) {}

    fn flush_metadata(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
        self.map.check_range(self.size(), offset, len)?;
        let (len, flags) = if self.file.has_block_status() && len > 0 {
            let e = self.file.block_status(offset, len)?;
            let first = e[0];
            (u64::from(first.len).clamp(1, len), first.flags)
        } else {
            (len, 0)
        };
        let zero = flags & state::ZERO != 0;
        let data = flags & state::HOLE == 0;
        Ok(BlockStatus {
            len,
            depth: 0,
            present: data || zero,
            zero,
            data,
            compressed: false,
            offset: Some(offset),
            file: Some(EXPORT),
        })
    }

    fn info(&self) -> ImageInfo {
        ImageInfo {
            format: "raw",
            virtual_size: self.size(),
            ..Default::default()
        }
    }

    fn close(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "raw"
    }
}

impl Resizable for NbdImage {
    /// Only to the size it has (as qemu's NBD driver allows).
    fn resize(&self, new_size: u64) -> Result<(), BlockError> {
        if new_size == self.size() {
            return Ok(());
        }
        Err(BlockError::CannotDo {
            image: self.file.name(),
            reason: CANNOT_RESIZE.into(),
        })
    }

    fn backing_size(&self) -> Option<u64> {
        None
    }
}

impl Snapshots for NbdImage {
    fn snapshot_create(&self, _name: &str, _date: (u32, u32)) -> Result<(), BlockError> {
        Err(self.lacking().snapshots())
    }

    fn snapshot_delete(&self, _name: &str) -> Result<bool, BlockError> {
        Err(self.lacking().snapshots())
    }

    fn snapshot_apply(&self, _name: &str) -> Result<bool, BlockError> {
        Err(self.lacking().snapshots())
    }
}

impl BackingEdits for NbdImage {
    fn set_backing_file(&self, _name: Option<&str>, _fmt: Option<&str>) -> Result<(), BlockError> {
        Err(self.lacking().backing_file())
    }

    fn make_empty(&self) -> Result<(), BlockError> {
        Err(self.lacking().backing_file())
    }
}

impl CompressedWrites for NbdImage {
    fn compression(&self) -> Option<Compression> {
        None
    }

    fn write_compressed(&self, _offset: u64, _data: &[u8]) -> Result<bool, BlockError> {
        Err(self.lacking().compression())
    }

    fn write_compressed_packed(&self, _offset: u64, _packed: &[u8]) -> Result<(), BlockError> {
        Err(self.lacking().compression())
    }

    fn set_compressed_cache(&self, _host_clusters: usize) {}
}

impl Amendable for NbdImage {
    fn check_amendment(&self, _amendment: &Amendment) -> Result<(), BlockError> {
        Err(self.lacking().amendment())
    }

    fn amend(&self, amendment: &Amendment, _progress: AmendProgress<'_>) -> Result<(), BlockError> {
        self.check_amendment(amendment)
    }
}

impl PersistentBitmaps for NbdImage {
    fn read_bitmap(&self, name: &str) -> Result<DirtyBits, BlockError> {
        Err(self.lacking().read_bitmap(name))
    }

    fn change_bitmap(&self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError> {
        self.lacking().change_bitmap(name, actions)
    }
}

impl FailureUndo for NbdImage {
    /// Every tool operation on an export is refused before it changes
    /// anything, so there is nothing to put back.
    fn undo_on_failure(
        &self,
        op: &mut dyn FnMut() -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        op()
    }
}

fn nbd_error(path: &str, reason: impl Into<String>) -> BlockError {
    BlockError::Nbd {
        uri: path.to_string(),
        reason: reason.into(),
    }
}

fn connect(path: &str, opts: &DiskOptions) -> Result<Arc<NbdFile>, BlockError> {
    NbdFile::connect(path, Duration::from_secs(opts.reconnect_delay))
}

/// The refusal of an export whose first bytes are a `name` image.
fn image_inside(path: &str, name: &str) -> BlockError {
    nbd_error(
        path,
        format!(
            "holds a {name} image: {name} inside an NBD export is not supported; \
             export its guest view (qemu-nbd -f {name}, qemu-storage-daemon) instead"
        ),
    )
}

/// The format other than raw that the export's first bytes claim.
fn claimed_by(file: &NbdFile, formats: &Formats) -> Result<Option<&'static str>, BlockError> {
    if file.size() < PROBE_BYTES as u64 {
        return Ok(None);
    }
    let mut magic = [0u8; PROBE_BYTES];
    file.read_at(0, &mut magic)?;
    let driver = formats.probe(&magic);
    Ok(driver.probe.is_some().then_some(driver.name))
}

/// Opens the export `opts.path` names as a raw disk; an image of another
/// of `formats` inside it (named, or probed) is refused.
pub(crate) fn open_image(
    opts: &DiskOptions,
    formats: &Formats,
) -> Result<Arc<NbdImage>, BlockError> {
    let path = opts.path.to_string_lossy().into_owned();
    if opts.snapshot.is_some() {
        return Err(Lacking {
            image: path,
            format: "raw",
        }
        .snapshot_view());
    }
    let raw = formats.fallback().name;
    if let Some(name) = opts.image_type.name().filter(|n| *n != raw) {
        return Err(nbd_error(
            &path,
            format!("image_type={name}: {name} inside an NBD export is not supported"),
        ));
    }
    let file = connect(&path, opts)?;
    if !opts.readonly && file.read_only() {
        return Err(nbd_error(
            &path,
            "the export is read-only; open it with readonly=on",
        ));
    }
    if opts.image_type == ImageType::Auto {
        if let Some(name) = claimed_by(&file, formats)? {
            return Err(image_inside(&path, name));
        }
    }
    Ok(Arc::new(NbdImage::new(file, opts.readonly)))
}

/// An image "created" on an NBD export, as qemu-img creates one there: a
/// raw image is the export itself (it keeps its size, must be large
/// enough, and its first sector is zeroed); an image of another format
/// inside an export is not supported (our client opens an export as
/// raw), and an export cannot be preallocated (qemu-img's words).
pub(crate) fn create_on_export(opts: &CreateOptions, formats: &Formats) -> Result<(), BlockError> {
    let image = opts.path.to_string_lossy().into_owned();
    let cannot = |reason: String| BlockError::CannotDo {
        image: image.clone(),
        reason,
    };
    match opts.format.name() {
        Some(name) if name == formats.fallback().name => {}
        Some(name) => {
            return Err(cannot(format!(
                "{name} inside an NBD export is not supported (an export opens as raw); \
                 create the image elsewhere and export its guest view"
            )))
        }
        None => return Err(opts.invalid("format", format!("give {}", formats.names_or()))),
    }
    crate::formats::raw::check_options(opts)?;
    if opts.preallocation != Preallocation::Off {
        return Err(cannot(format!(
            "Unsupported preallocation mode '{}'",
            opts.preallocation
        )));
    }
    create_raw(&image, opts.size)
}

/// What `qemu-img create -f raw` does on an export (also the output of
/// `dd` and `convert`): the export keeps its size, which must be at least
/// `size` (qemu's "Cannot grow NBD nodes"), and its first sector is
/// zeroed, so an old image header there is not probed again.
fn create_raw(path: &str, size: u64) -> Result<(), BlockError> {
    let file = connect(path, &DiskOptions::new(path))?;
    if file.read_only() {
        return Err(nbd_error(path, "the export is read-only"));
    }
    if size > file.size() {
        return Err(BlockError::CannotDo {
            image: path.to_string(),
            reason: "Cannot grow NBD nodes".into(),
        });
    }
    let first = vec![0u8; size.min(512) as usize];
    if !first.is_empty() {
        file.write_at(0, &first)?;
    }
    file.flush()
}

/// Opens the export `name` as the read-only raw backing image of an
/// overlay opened with `opts`; a backing format other than raw, or an
/// image of another of `formats` inside the export, is refused.
pub(crate) fn open_backing(
    name: &str,
    format: Option<&str>,
    opts: &DiskOptions,
    formats: &Formats,
) -> Result<Arc<NbdImage>, BlockError> {
    let raw = formats.fallback().name;
    if let Some(f) = format.filter(|f| *f != raw) {
        return Err(nbd_error(
            name,
            format!("backing format '{f}': an NBD backing file is raw"),
        ));
    }
    let file = connect(name, opts)?;
    if format.is_none() {
        if let Some(inside) = claimed_by(&file, formats)? {
            return Err(image_inside(name, inside));
        }
    }
    Ok(Arc::new(NbdImage::new(file, true)))
}
