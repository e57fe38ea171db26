//! The tool capabilities of a qcow2 image (`crate::formats::tools`: what
//! only the owner of an exclusive open may do), each a thin front over
//! the type that does the work: [`Snapshotter`] (`snapshot_ops`),
//! [`BackingRewrite`] (`backing_rewrite`), [`CompressedWriter`]
//! (`compress_write`), [`Resize`] (`resize`), [`Amender`] (`amend`),
//! [`BitmapEditor`] (`bitmap_write`) and [`UndoLog`] (`undo`).
//!
//! Each method checks what the open allows (read-only, opened without
//! its backing chain), takes the image's lock and hands the locked state
//! (and the disk size, where the operation reads or changes it) to its
//! type. Queues must not be running meanwhile (`ExclusiveImage`).

use std::sync::atomic::Ordering;

use super::amend::Amender;
use super::backing_rewrite::BackingRewrite;
use super::resize::Resize;
use super::snapshot_ops::Snapshotter;
use super::undo::UndoLog;
use crate::error::BlockError;
use crate::formats::amendment::{AmendProgress, Amendment};
use crate::formats::dirty_bits::{BitmapAction, DirtyBits, PersistedBitmap};
use crate::formats::qcow2::bitmaps::bitmap_write::BitmapEditor;
use crate::formats::qcow2::compression::compress_write::{
    check_compressed_write, compress_cluster, CompressedWriter,
};
use crate::formats::qcow2::image::Qcow2Image;
use crate::formats::tools::{
    Amendable, BackingEdits, CompressedWrites, FailureUndo, PersistentBitmaps, Resizable, Snapshots,
};
use crate::formats::Compression;

impl Snapshots for Qcow2Image {
    /// Adds snapshot `name` of the current disk; `date` is (seconds,
    /// nanoseconds) since the epoch.
    fn snapshot_create(&self, name: &str, date: (u32, u32)) -> Result<(), BlockError> {
        let mut st = self.lock_writable()?;
        Snapshotter::begin(&mut st.meta, &self.size)?.create(name, date)
    }

    /// Deletes the first snapshot named `name`. `Ok(false)`: none is.
    fn snapshot_delete(&self, name: &str) -> Result<bool, BlockError> {
        let mut st = self.lock_writable()?;
        Snapshotter::begin(&mut st.meta, &self.size)?.delete(name)
    }

    /// Makes the snapshot with id or name `name` the active disk.
    /// `Ok(false)`: there is none.
    fn snapshot_apply(&self, name: &str) -> Result<bool, BlockError> {
        let mut st = self.lock_writable()?;
        Snapshotter::begin(&mut st.meta, &self.size)?.apply(name)
    }
}

impl BackingEdits for Qcow2Image {
    fn set_backing_file(&self, name: Option<&str>, format: Option<&str>) -> Result<(), BlockError> {
        let mut st = self.lock_writable()?;
        BackingRewrite { meta: &mut st.meta }.set_backing_file(name, format)
    }

    fn make_empty(&self) -> Result<(), BlockError> {
        let mut st = self.lock_writable()?;
        BackingRewrite { meta: &mut st.meta }.make_empty()
    }
}

impl CompressedWrites for Qcow2Image {
    fn compression(&self) -> Option<Compression> {
        Some(self.chain.header.compression)
    }

    fn write_compressed(&self, guest: u64, data: &[u8]) -> Result<bool, BlockError> {
        let size = self.size.load(Ordering::Acquire);
        check_compressed_write(&self.chain, self.readonly, size, guest, data.len() as u64)?;
        let Some(packed) = compress_cluster(self.chain.header.compression, data)? else {
            return Ok(false);
        };
        self.write_compressed_packed(guest, &packed)?;
        Ok(true)
    }

    fn write_compressed_packed(&self, guest: u64, packed: &[u8]) -> Result<(), BlockError> {
        let size = self.size.load(Ordering::Acquire);
        let cs = self.chain.header.cluster_size();
        check_compressed_write(&self.chain, self.readonly, size, guest, cs)?;
        CompressedWriter {
            chain: &self.chain,
            st: &mut self.lock(),
            cached: &self.compressed_cached,
        }
        .write(guest, packed)
    }

    /// How many complete host clusters the compressed-cluster write cache
    /// holds before it writes them (64 by default); 0 writes every
    /// compressed cluster at once, without the cache.
    fn set_compressed_cache(&self, host_clusters: usize) {
        self.lock().compressed.set_capacity(host_clusters);
    }
}

impl Resizable for Qcow2Image {
    fn resize(&self, new_size: u64) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.check_backing_opened()?;
        self.write_out_compressed()?;
        Resize {
            st: &mut self.lock(),
            size: &self.size,
        }
        .to(new_size)
    }

    fn backing_size(&self) -> Option<u64> {
        self.chain.backing.as_ref().map(|b| b.image.size())
    }
}

impl Amendable for Qcow2Image {
    fn check_amendment(&self, amendment: &Amendment) -> Result<(), BlockError> {
        Amender {
            st: &mut *self.lock_writable()?,
            size: &self.size,
        }
        .plan(amendment)
        .map(|_| ())
    }

    /// Undone when it fails (see `amend`).
    fn amend(&self, amendment: &Amendment, progress: AmendProgress<'_>) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.undo_on_failure(&mut || {
            Amender {
                st: &mut self.lock(),
                size: &self.size,
            }
            .apply(amendment, &mut *progress)
        })
    }
}

impl PersistentBitmaps for Qcow2Image {
    fn read_bitmap(&self, name: &str) -> Result<DirtyBits, BlockError> {
        BitmapEditor {
            meta: &mut self.lock().meta,
            disk_size: self.size.load(Ordering::Acquire),
        }
        .read(name)
    }

    /// Undone when it fails (see `bitmap_write`).
    fn change_bitmap(&self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.undo_on_failure(&mut || {
            BitmapEditor {
                meta: &mut self.lock().meta,
                disk_size: self.size.load(Ordering::Acquire),
            }
            .change(name, actions)
        })
    }

    fn load_bitmaps(&self) -> Result<Vec<PersistedBitmap>, BlockError> {
        BitmapEditor {
            meta: &mut self.lock().meta,
            disk_size: self.size.load(Ordering::Acquire),
        }
        .load_all()
    }

    /// Undone when it fails (see `bitmap_write`).
    fn store_bitmaps(&self, bitmaps: &[PersistedBitmap]) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.undo_on_failure(&mut || {
            BitmapEditor {
                meta: &mut self.lock().meta,
                disk_size: self.size.load(Ordering::Acquire),
            }
            .store_all(bitmaps)
        })
    }
}

impl FailureUndo for Qcow2Image {
    fn undo_on_failure(
        &self,
        op: &mut dyn FnMut() -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        if self.readonly {
            return op();
        }
        self.write_out_compressed()?;
        let log = UndoLog::start(&mut self.lock().meta)?;
        let result = op();
        log.finish(&mut self.lock(), &self.size, result.is_err());
        result
    }
}
