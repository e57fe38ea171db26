//! The named operations through which the image tools (resize,
//! snapshots, rebase, amend's zero expansion, `convert -l`) change whole
//! tables of [`MetaState`] under the image lock, and queue commits hand
//! over the clusters they release.
//!
//! L1 entries are staged in memory ([`MetaState::stage_l1_entry`],
//! [`MetaState::replace_l1`]) and reach the file with
//! [`MetaState::write_l1_table`], which writes pending refcounts first
//! (nothing on disk may point at a cluster whose refcount is not); a
//! whole L2 table is written, then its cached copy replaced
//! ([`MetaState::write_l2_table`]), so the cache never holds what the
//! file does not. The caller orders its barriers around these steps as
//! each tool's module doc says.

use super::MetaState;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::metadata::published::Snapshot;
use crate::formats::qcow2::on_disk::snapshot_table::TableLocation;

impl MetaState {
    /// Changes active L1 entry `i` in memory only; the caller writes the
    /// table with [`MetaState::write_l1_table`].
    pub fn stage_l1_entry(&mut self, i: usize, raw: u64) {
        self.l1[i] = raw;
    }

    /// Replaces every active L1 entry in memory (same length); returns
    /// the old entries. The caller writes the table.
    pub fn replace_l1(&mut self, entries: Vec<u64>) -> Vec<u64> {
        std::mem::replace(&mut *self.l1, entries)
    }

    /// Writes the active L1 table (as staged) to its place, after the
    /// pending refcounts.
    pub fn write_l1_table(&mut self) -> Result<(), BlockError> {
        self.write_refcounts()?;
        let bytes: Vec<u8> = self.l1.iter().flat_map(|e| e.to_be_bytes()).collect();
        self.write(MetaKind::L1Table, self.l1_offset, &bytes)
    }

    /// A read-only image reads as one of its snapshots: its L1 table
    /// (`l1`, read from `l1_offset`) becomes the active one, in memory.
    pub fn view_tree(&mut self, l1: Vec<u64>, l1_offset: u64) {
        self.l1_offset = l1_offset;
        *self.l1 = l1;
    }

    /// The cached L2 table at `off` (read by [`MetaState::load_l2`]).
    pub fn cached_l2_table(&mut self, off: u64) -> Option<&[u8]> {
        self.l2_cache.get(off)
    }

    /// A handle on the cached L2 table at `off` for a queue to read
    /// without the lock.
    #[inline]
    pub fn l2_table_snapshot(&mut self, off: u64) -> Option<Snapshot<Vec<u8>>> {
        self.l2_cache.snapshot(off)
    }

    /// Writes the whole L2 table at `off`, then caches it.
    pub fn write_l2_table(&mut self, off: u64, table: Vec<u8>) -> Result<(), BlockError> {
        self.write(MetaKind::L2Table, off, &table)?;
        self.l2_cache.insert(off, table);
        Ok(())
    }

    /// Drops the L2 table at `off` from the cache (its cluster was
    /// freed).
    pub fn forget_l2_table(&mut self, off: u64) {
        self.l2_cache.remove(off);
    }

    /// The snapshot table is at `new` now (the header already says so);
    /// returns where it was.
    pub fn move_snapshot_table(&mut self, new: TableLocation) -> TableLocation {
        std::mem::replace(&mut self.snapshots, new)
    }

    /// Host cluster runs `(first, count)` that lose a reference once the
    /// L2 entries published with them are durable (at the next
    /// [`MetaState::flush_dirty`]).
    #[inline]
    pub fn release_after_flush(&mut self, runs: &[(u64, u64)]) {
        self.deferred_release.extend(runs.iter().copied());
    }
}
