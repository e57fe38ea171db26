//! Image-tool capabilities: what only the owner of an exclusive open may
//! do to an image (`ch-img snapshot`, `rebase`, `commit`, `convert -c`,
//! `resize`, the storage daemon growing its FUSE export).
//!
//! Queues never see these. [`Format`] is all a [`crate::Disk`], a
//! [`crate::DiskQueue`] and the executor hold, and it has no way to reach
//! the traits here (no downcast, no accessor). The object that has them is
//! an [`ImageTools`], which only [`crate::ExclusiveImage`] (and
//! [`super::open_image_tools`], for tests that drive a format without a disk)
//! hands out: whoever opened the image owns it, creates its queues, and
//! decides when no request is in flight.
//!
//! One capability per trait, each implemented once per format (qcow2's
//! all in `qcow2/tools/capabilities.rs`, each a thin front over the type in the file
//! that owns its logic):
//!
//! | trait | methods | qcow2 | raw |
//! |---|---|---|---|
//! | [`Snapshots`] | `snapshot_create/delete/apply` | `Snapshotter`, `qcow2/tools/snapshot_ops.rs` | refused (`lacking.rs`) |
//! | [`BackingEdits`] | `set_backing_file`, `make_empty` | `BackingRewrite`, `qcow2/tools/backing_rewrite.rs` | refused |
//! | [`CompressedWrites`] | `write_compressed(_packed)`, `compression`, `set_compressed_cache` | `CompressedWriter`, `qcow2/compression/compress_write.rs` | refused |
//! | [`Resizable`] | `resize`, `backing_size` | `Resize`, `qcow2/tools/resize.rs` | `raw.rs` |
//! | [`Amendable`] | `check_amendment`, `amend` | `Amender`, `qcow2/tools/amend.rs` (under the undo) | refused |
//! | [`PersistentBitmaps`] | `read_bitmap`, `change_bitmap` | `BitmapEditor`, `qcow2/bitmaps/bitmap_write.rs` (changes under the undo) | refused |
//! | [`FailureUndo`] | `undo_on_failure` | `UndoLog`, `qcow2/tools/undo.rs` | `raw.rs` |
//!
//! Resizing a disk whose queues are running is the one capability an
//! owner may lend out: [`crate::Resizer`] (see its docs for why it is
//! safe beside queues, and what a shrink asks of the caller).

use super::amendment::{AmendProgress, Amendment};
use super::dirty_bits::{BitmapAction, DirtyBits, PersistedBitmap};
use super::{Compression, Format};
use crate::error::BlockError;

/// Internal snapshots. Each call flushes cached metadata first and leaves
/// the image consistent on disk; no request may be in flight meanwhile.
pub trait Snapshots {
    /// Adds an internal snapshot `name` of the disk as it is now, dated
    /// (seconds, nanoseconds) since the epoch.
    fn snapshot_create(&self, name: &str, date: (u32, u32)) -> Result<(), BlockError>;

    /// Deletes the first internal snapshot named `name`; `Ok(false)` when
    /// there is none.
    fn snapshot_delete(&self, name: &str) -> Result<bool, BlockError>;

    /// Makes the internal snapshot with id or name `name` the active
    /// disk; `Ok(false)` when there is none.
    fn snapshot_apply(&self, name: &str) -> Result<bool, BlockError>;
}

/// Edits of the image's place in its backing chain (`rebase -u`, `commit`).
pub trait BackingEdits {
    /// Points the image's header at backing file `name` (format `format`)
    /// or at none, without copying any data. The open image keeps its old
    /// chain until reopened.
    fn set_backing_file(&self, name: Option<&str>, format: Option<&str>) -> Result<(), BlockError>;

    /// Unmaps every cluster so the disk reads through to its backing file
    /// (`commit` without `-d`).
    fn make_empty(&self) -> Result<(), BlockError>;
}

/// Writing whole clusters compressed (`convert -c`).
pub trait CompressedWrites {
    /// The algorithm compressed clusters of this image use (`None`: the
    /// format has no compressed clusters).
    fn compression(&self) -> Option<Compression>;

    /// Writes the whole cluster at `offset` (cluster aligned, `data` one
    /// cluster long, zero-padded past the disk's end) compressed, into an
    /// unallocated cluster. `Ok(false)`: compression would not shrink it,
    /// nothing was written, write it normally.
    fn write_compressed(&self, offset: u64, data: &[u8]) -> Result<bool, BlockError>;

    /// Like [`CompressedWrites::write_compressed`] for a cluster already
    /// compressed with [`super::compress_cluster`] and this image's
    /// [`CompressedWrites::compression`] (so a tool can compress on many
    /// threads and write in order).
    fn write_compressed_packed(&self, offset: u64, packed: &[u8]) -> Result<(), BlockError>;

    /// How many complete host clusters of compressed data are kept in
    /// memory before they are written (64 unless set; 0: none, every
    /// compressed cluster is written at once). Set it before the first
    /// compressed write; formats without compressed clusters ignore it.
    fn set_compressed_cache(&self, host_clusters: usize);
}

/// Changing the virtual size.
pub trait Resizable {
    /// Grows (or, where supported, shrinks) the virtual disk. A grown
    /// area is left unmapped: where the backing file is longer than the
    /// old size ([`Resizable::backing_size`]) its data shows through
    /// there; [`crate::Resizer::resize`] writes zeroes over it, as
    /// qemu-img does.
    fn resize(&self, new_size: u64) -> Result<(), BlockError>;

    /// The virtual size of the opened backing image, if there is one.
    fn backing_size(&self) -> Option<u64>;
}

/// Changing the image's format options in place (`ch-img amend`).
pub trait Amendable {
    /// Refuses, in qemu-img's words, an amendment the image cannot take
    /// (the first reason qemu-img would meet); changes nothing.
    fn check_amendment(&self, amendment: &Amendment) -> Result<(), BlockError>;

    /// Checks, then applies the amendment (not the size: the caller
    /// resizes). When it fails the image keeps its header, its contents
    /// and its refcounts; the handle is then only good for closing.
    fn amend(&self, amendment: &Amendment, progress: AmendProgress<'_>) -> Result<(), BlockError>;
}

/// Persistent dirty bitmaps (`ch-img bitmap`). The image must be open
/// with `keep_persistent_bitmaps`.
pub trait PersistentBitmaps {
    /// The bits of bitmap `name` (to merge them into another image's);
    /// a missing or inconsistent bitmap is refused in qemu-img's words.
    fn read_bitmap(&self, name: &str) -> Result<DirtyBits, BlockError>;

    /// Runs `actions` on bitmap `name` in order, then stores the result
    /// at once. When an action is refused (qemu-img's words) or a write
    /// fails, the image keeps its bitmaps as they were.
    fn change_bitmap(&self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError>;

    /// Every persistent bitmap, with the bits of the consistent ones
    /// (an owner that records writes loads them at open). Formats
    /// without persistent bitmaps have none.
    fn load_bitmaps(&self) -> Result<Vec<PersistedBitmap>, BlockError> {
        Ok(Vec::new())
    }

    /// Makes `bitmaps` the image's persistent bitmaps, in that order
    /// (those not listed are removed); undone when it fails. Formats
    /// without persistent bitmaps refuse.
    fn store_bitmaps(&self, bitmaps: &[PersistedBitmap]) -> Result<(), BlockError> {
        let _ = bitmaps;
        Err(BlockError::Refused(
            "this image format has no persistent dirty bitmaps".into(),
        ))
    }
}

/// Running a tool operation so that its failure leaves the file as it was
/// (`ch-img`'s verbs: a failed command changes nothing).
pub trait FailureUndo {
    /// Runs `op` (tool calls and requests on this image); if it fails,
    /// puts the image file back as it was before and returns the error.
    /// No request may be in flight when it is called, and only `op`'s
    /// while it runs: an undo would drop what others wrote meanwhile.
    fn undo_on_failure(
        &self,
        op: &mut dyn FnMut() -> Result<(), BlockError>,
    ) -> Result<(), BlockError>;
}

/// An opened image with every capability: the queue-facing [`Format`]
/// and all the tool traits above. Only the owner of an exclusive open
/// holds one.
pub trait ImageTools:
    Format
    + Snapshots
    + BackingEdits
    + CompressedWrites
    + Resizable
    + Amendable
    + PersistentBitmaps
    + FailureUndo
{
}

impl<T> ImageTools for T where
    T: Format
        + Snapshots
        + BackingEdits
        + CompressedWrites
        + Resizable
        + Amendable
        + PersistentBitmaps
        + FailureUndo
{
}
