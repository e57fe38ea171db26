//! [`RawImage`]: an opened raw image, whose virtual disk is its file,
//! byte for byte.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::amendment::{AmendProgress, Amendment};
use crate::formats::dirty_bits::{BitmapAction, DirtyBits};
use crate::formats::identity::IdentityMap;
use crate::formats::lacking::Lacking;
use crate::formats::tools::{
    Amendable, BackingEdits, CompressedWrites, FailureUndo, PersistentBitmaps, Resizable, Snapshots,
};
use crate::formats::{
    BlockStatus, Compression, FileId, Format, ImageFiles, ImageInfo, ReadPlan, Waker, WriteCommit,
    WriteOutcome,
};
use crate::lock::ImageLock;

use crate::formats::holes::{file_size, DataExtentCache};

const IMAGE: FileId = FileId(0);

pub struct RawImage {
    path: PathBuf,
    files: ImageFiles,
    size: AtomicU64,
    map: IdentityMap,
    probed: bool,
    /// The last data run of the file `block_status` found.
    data_run: DataExtentCache,
    /// Released when the image is dropped (see [`crate::lock`]).
    _lock: Option<ImageLock>,
}

impl RawImage {
    /// `probed`: the format was guessed, not given (see
    /// [`Format::guards_first_sector`]).
    pub fn new(
        path: &Path,
        file: Arc<File>,
        readonly: bool,
        probed: bool,
    ) -> Result<Self, BlockError> {
        let size = file_size(&file).map_err(|source| BlockError::Open {
            path: path.to_owned(),
            source,
        })?;
        Ok(RawImage {
            path: path.to_owned(),
            files: ImageFiles::new(vec![file], Vec::new()),
            size: AtomicU64::new(size),
            map: IdentityMap {
                file: IMAGE,
                readonly,
            },
            probed,
            data_run: DataExtentCache::default(),
            _lock: None,
        })
    }

    /// Holds `lock` (this image's locks) until the image is dropped.
    pub(crate) fn with_lock(mut self, lock: Option<ImageLock>) -> Self {
        self._lock = lock;
        self
    }
}

impl Format for RawImage {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
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
        may_unmap: bool,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        // A punched hole reads as zeroes and frees the space; do that only
        // when the guest allows unmapping, else keep the range allocated.
        self.map
            .plan_write_zeroes(self.size(), offset, len, may_unmap)
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
        // Holes of the file read as zeroes; qemu-img map reports them so.
        let (hole, until) = self
            .data_run
            .extent_at(&self.files.local()[0], offset)
            .unwrap_or((false, u64::MAX));
        Ok(BlockStatus {
            len: len.min(until - offset),
            depth: 0,
            present: true,
            zero: hole,
            data: !hole,
            compressed: false,
            offset: Some(offset),
            file: Some(IMAGE),
        })
    }

    fn info(&self) -> ImageInfo {
        ImageInfo {
            format: "raw",
            virtual_size: self.size(),
            // qemu-img shows a raw file's dirty flag (never set).
            dirty: Some(false),
            ..Default::default()
        }
    }

    fn close(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "raw"
    }

    fn guards_first_sector(&self) -> bool {
        self.probed && !self.map.readonly
    }
}

impl Resizable for RawImage {
    /// The file's length is the disk's size: set it (a sparse grow).
    fn resize(&self, new_size: u64) -> Result<(), BlockError> {
        if self.map.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.files.local()[0]
            .set_len(new_size)
            .map_err(|e| BlockError::Resize(format!("{}: {e}", self.path.display())))?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn backing_size(&self) -> Option<u64> {
        None
    }
}

impl FailureUndo for RawImage {
    /// A raw tool operation only changes the file's length (resizing,
    /// preallocating the grown area): a failed one gets its old length
    /// back.
    fn undo_on_failure(
        &self,
        op: &mut dyn FnMut() -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        let old = self.size.load(Ordering::Acquire);
        let result = op();
        if result.is_err() && !self.map.readonly && self.size.load(Ordering::Acquire) != old {
            if let Err(e) = self.files.local()[0].set_len(old) {
                log::error!(
                    "{}: could not undo a failed resize: {e}",
                    self.path.display()
                );
            } else {
                self.size.store(old, Ordering::Release);
            }
        }
        result
    }
}

impl RawImage {
    /// The refusals of the capabilities a raw image lacks, naming it.
    fn lacking(&self) -> Lacking {
        Lacking {
            image: self.path.display().to_string(),
            format: "raw",
        }
    }
}

impl Snapshots for RawImage {
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

impl Amendable for RawImage {
    fn check_amendment(&self, _amendment: &Amendment) -> Result<(), BlockError> {
        Err(self.lacking().amendment())
    }

    fn amend(&self, amendment: &Amendment, _progress: AmendProgress<'_>) -> Result<(), BlockError> {
        self.check_amendment(amendment)
    }
}

impl PersistentBitmaps for RawImage {
    fn read_bitmap(&self, name: &str) -> Result<DirtyBits, BlockError> {
        Err(self.lacking().read_bitmap(name))
    }

    /// Raw images have no bitmaps: every action fails, as in qemu-img.
    fn change_bitmap(&self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError> {
        self.lacking().change_bitmap(name, actions)
    }
}

impl BackingEdits for RawImage {
    fn set_backing_file(&self, _name: Option<&str>, _fmt: Option<&str>) -> Result<(), BlockError> {
        Err(self.lacking().backing_file())
    }

    fn make_empty(&self) -> Result<(), BlockError> {
        Err(self.lacking().backing_file())
    }
}

impl CompressedWrites for RawImage {
    fn compression(&self) -> Option<Compression> {
        None
    }

    fn write_compressed(&self, _offset: u64, _data: &[u8]) -> Result<bool, BlockError> {
        Err(self.lacking().compression())
    }

    fn write_compressed_packed(&self, _offset: u64, _packed: &[u8]) -> Result<(), BlockError> {
        Err(self.lacking().compression())
    }

    /// Raw images have no compressed clusters: nothing to cache.
    fn set_compressed_cache(&self, _host_clusters: usize) {}
}
