//! What the rest of the driver reads of [`MetaState`] (its geometry,
//! file, seam, tables' places and settings, all read-only) and the few
//! settings and hand-overs it may change: the ordering switches, the
//! metadata-I/O seam, the bitmap directory, and refusing every later
//! write.
//!
//! Read accessors return copies or shared borrows, so nothing outside the
//! `meta` module can change a field behind its invariants; each setter
//! here changes one field that no invariant ties to another.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use super::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaIo;
use crate::formats::qcow2::metadata::published::Snapshot;
use crate::formats::qcow2::on_disk::geometry::ImageGeometry;
use crate::formats::qcow2::on_disk::snapshot_table::TableLocation;

impl MetaState {
    /// The image's fixed layout facts.
    #[inline]
    pub fn geometry(&self) -> &ImageGeometry {
        &self.g
    }

    /// The image file's path (for messages).
    #[inline]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The image's buffered descriptor (its length, the undo log's
    /// restore; metadata transfers go through [`MetaState::io`]).
    #[inline]
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The metadata-I/O seam, for reads of metadata that lives outside
    /// the tables kept here (header cluster, snapshot and bitmap tables,
    /// copy-on-write sources, compressed clusters).
    #[inline]
    pub fn io(&self) -> &Arc<dyn MetaIo> {
        &self.io
    }

    /// The file's size as allocation has grown it (without the headroom
    /// `reserve` adds).
    #[inline]
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// The active L1 table's entries.
    #[inline]
    pub fn l1(&self) -> &[u64] {
        &self.l1
    }

    /// A handle on the current L1 table for a queue to read without the
    /// lock (taken under it).
    #[inline]
    pub fn l1_snapshot(&self) -> Snapshot<Vec<u64>> {
        self.l1.snapshot()
    }

    /// The refcount table's entries and its offset.
    pub fn refcount_table(&self) -> (&[u64], u64) {
        (&self.rt, self.rt_offset)
    }

    /// Offsets of every refcount block the refcount table names.
    pub fn refcount_blocks(&self) -> &HashSet<u64> {
        &self.refblocks
    }

    /// Where the internal snapshot table is now.
    #[inline]
    pub fn snapshot_table(&self) -> TableLocation {
        self.snapshots
    }

    /// End of the last compressed cluster written (0: none), where the
    /// next may be packed.
    #[inline]
    pub fn compressed_tail(&self) -> u64 {
        self.compressed_tail
    }

    /// How many L2 tables the cache holds at most.
    #[inline]
    pub fn l2_cache_capacity(&self) -> usize {
        self.l2_cache.capacity()
    }

    /// Whether dependent metadata writes are separated by fdatasync.
    #[inline]
    pub fn barriers(&self) -> bool {
        self.barriers
    }

    /// Whether every commit writes its L2 entries at once.
    #[inline]
    pub fn l2_write_through(&self) -> bool {
        self.l2_write_through
    }

    /// Turns the fdatasync barriers between dependent metadata writes on
    /// or off (off keeps process-crash ordering, loses power-loss
    /// ordering).
    pub fn set_barriers(&mut self, on: bool) {
        self.barriers = on;
    }

    /// Writes L2 entries at every commit instead of at the next flush.
    pub fn set_l2_write_through(&mut self, on: bool) {
        self.l2_write_through = on;
    }

    /// Turns the metadata overlap checks on or off.
    pub fn set_overlap_checks(&mut self, on: bool) {
        self.overlap_checks = on;
    }

    /// Takes the three settings above from `other` (tables reloaded from
    /// the file keep the open image's settings).
    pub fn copy_settings_from(&mut self, other: &MetaState) {
        self.barriers = other.barriers;
        self.overlap_checks = other.overlap_checks;
        self.l2_write_through = other.l2_write_through;
    }

    /// Puts `io` in front of every later metadata transfer; returns the
    /// seam it replaces.
    pub fn replace_io(&mut self, io: Arc<dyn MetaIo>) -> Arc<dyn MetaIo> {
        std::mem::replace(&mut self.io, io)
    }

    /// The bitmap directory (offset, bytes) after a bitmap change wrote a
    /// new one (`None`: no bitmaps).
    pub fn set_bitmap_directory(&mut self, directory: Option<(u64, u64)>) {
        self.bitmap_directory = directory;
    }

    /// After a failed undo the file is in an unknown state: the image
    /// refuses every later write (as a corrupt one does) and claims no
    /// headroom past the size it knows.
    pub fn refuse_writes(&mut self) {
        self.corrupt.set(true);
        self.reserved_end = self.file_size;
    }
}
