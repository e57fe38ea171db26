//! [`MetaState`]: the mutable metadata of one open qcow2 image (the L1
//! and refcount tables, the L2 and refcount-block caches, the file's size
//! and headroom, the metadata map) and the only code that changes it: its
//! fields are private to this module and its children, and the rest of
//! the driver reads them through accessors (`access`) and changes them
//! through the named operations below. The fixed layout and the decoding
//! of entries are `on_disk::geometry` and `on_disk::l2_entry`.
//!
//! Guest offsets, cluster counts and refcount changes enter; raw table
//! entries, host offsets and metadata writes through the metadata-I/O
//! seam leave.
//!
//! Invariants it keeps:
//! 1. Nothing on disk points at a cluster whose refcount is not on disk:
//!    pending refcount changes (batched in the refcount-block cache,
//!    `dirty_rb`) are written before every L1/L2 write, barrier and flush.
//! 2. A published L2 entry (`dirty_l2`, its table pinned in the cache)
//!    reaches the disk only after a barrier made the data and refcounts
//!    it depends on durable; clusters it replaced (`deferred_release`)
//!    lose their reference only after the entry is durable.
//! 3. The caches hold what the file holds, or what is queued in (2); a
//!    table that queues read without the lock (`l1`, each cached L2
//!    table) is copied before it changes while a queue holds a snapshot
//!    of it (`published`).
//! 4. The metadata map names every cluster of the active metadata, so
//!    `guard` can refuse (and mark the image corrupt for) a write onto
//!    one; a corrupt image writes nothing more.
//! 5. `file_size` covers every allocated cluster; `reserved_end` (the
//!    file's real length) is at least `file_size`; no cluster below
//!    `free_hint` is free; `compressed_tail` never points into a cluster
//!    freed since it was set (every refcount drop resets it).
//!
//! Which operations change what:
//! - L2 entries: `set_l2_entry` (write-through), `publish_l2_entry`
//!   (batched to `flush_dirty`), `writable_l2` (allocates or copies a
//!   table and sets its L1 entry); here;
//! - whole tables, for the tools: `stage_l1_entry`, `replace_l1`,
//!   `write_l1_table`, `view_tree`, `write_l2_table`,
//!   `forget_l2_table`, `move_snapshot_table`, and `grow_l1` (here) and
//!   `write_disk_size`; `tool_edits`;
//! - refcounts and allocation: `change_refcounts`, `free_clusters`,
//!   `alloc_clusters`, `alloc_compressed_bytes`, `write_refcounts`;
//!   `alloc`;
//! - ordering: `barrier`, `flush_dirty`, `release_after_flush` (a
//!   commit's released clusters); here and `tool_edits`;
//! - file size: `reserve_to`, `trim_reserve`; `reserve`;
//! - metadata I/O and the map: `read`, `write`, `sync`, `check_plan`,
//!   `mark_corrupt`, `rebuild_metadata_map`; `guard`;
//! - settings and hand-overs (no invariant ties them to another field):
//!   barriers, L2 write-through, overlap checks, the seam
//!   (`replace_io`), the bitmap directory, `refuse_writes`; `access`.

mod access;
mod alloc;
pub(crate) mod guard;
mod reserve;
mod tool_edits;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use super::cache::TableCache;
use super::meta_io::{be64_at, read_at, MetaIo, MetaKind};
use super::overlap::MetadataMap;
use super::published::Published;
use crate::error::BlockError;
use crate::formats::qcow2::on_disk::geometry::{checked_entry, raw_entry, ImageGeometry};
use crate::formats::qcow2::on_disk::header::{within, Header};
use crate::formats::qcow2::on_disk::l2_entry::{decode_l1, decode_l2, L2Entry, OFLAG_COPIED};
use crate::formats::qcow2::on_disk::snapshot_table::TableLocation;

/// Bytes of metadata tables the caches may hold, per cache.
const L2_CACHE_BYTES: u64 = 4 << 20;
const RB_CACHE_BYTES: u64 = 1 << 20;
const MIN_CACHED_TABLES: u64 = 8;
/// Deferred L2 entries that trigger a flush from `commit`.
const MAX_DIRTY_ENTRIES: usize = 4096;

pub(crate) struct MetaState {
    g: ImageGeometry,
    path: PathBuf,
    /// Buffered read-write (or read-only) descriptor (file size and
    /// headroom; reads and writes go through `io`).
    file: Arc<File>,
    /// Where every metadata read, write and barrier goes (the seam tests
    /// inject faults at); by default `file` itself.
    io: Arc<dyn MetaIo>,
    /// The file's size, grown by every allocation.
    file_size: u64,
    /// The size the file really has: `file_size` plus the headroom
    /// `reserve` added for allocating writes.
    reserved_end: u64,
    l1_offset: u64,
    /// Queues may hold snapshots of it (see `published`): a change to an
    /// entry copies the table first if one does.
    l1: Published<Vec<u64>>,
    rt_offset: u64,
    rt: Vec<u64>,
    /// Offsets of every refcount block the table names.
    refblocks: HashSet<u64>,
    l2_cache: TableCache,
    rb_cache: TableCache,
    /// No cluster below this index is free.
    free_hint: u64,
    /// Where the internal snapshot table is now.
    snapshots: TableLocation,
    /// End of the last compressed cluster written, where the next may be
    /// packed (0: none). Reset whenever a refcount drops, so it never
    /// points into a cluster that was freed and reused meanwhile.
    compressed_tail: u64,
    /// fdatasync between a refcount/data write and the metadata that
    /// depends on it (power-loss ordering, not just process-crash ordering).
    barriers: bool,
    /// Write L2 entries (after a barrier) at every commit instead of at
    /// the next flush.
    l2_write_through: bool,
    /// L2 entries changed in the cache but not yet on disk: table offset
    /// -> byte positions of the entries. Their tables are pinned.
    dirty_l2: BTreeMap<u64, BTreeSet<usize>>,
    dirty_entries: usize,
    max_dirty_tables: usize,
    /// Host cluster runs losing a reference once the L2 changes that
    /// dropped it are durable.
    deferred_release: Vec<(u64, u64)>,
    /// Refcount blocks changed in the cache but not yet on disk: block
    /// offset -> changed byte range. Their blocks are pinned.
    dirty_rb: BTreeMap<u64, (usize, usize)>,
    max_dirty_rb: usize,
    /// Which host clusters hold metadata (`guard` checks every write
    /// against it).
    metadata_map: MetadataMap,
    /// The bitmap directory (offset, bytes) while its autoclear bit says
    /// it is consistent (read-only opens; read-write opens drop it).
    bitmap_directory: Option<(u64, u64)>,
    /// A write was refused for overlapping metadata: the corrupt bit is
    /// set and nothing more is written.
    corrupt: Cell<bool>,
    /// Off only to measure what the checks cost (QEMU's
    /// `overlap-check=none`).
    overlap_checks: bool,
}

impl MetaState {
    /// The tables of the image whose header is `h`, read through `io`
    /// (the image's metadata-I/O seam on `file`, its buffered descriptor).
    pub fn load(
        h: &Header,
        file: Arc<File>,
        io: Arc<dyn MetaIo>,
        path: PathBuf,
        file_size: u64,
    ) -> Result<Self, BlockError> {
        let g = ImageGeometry::from_header(h);
        let mut l1_bytes = vec![0u8; h.l1_size as usize * 8];
        read_at(&*io, MetaKind::L1Table, h.l1_table_offset, &mut l1_bytes)?;
        let l1 = Published::new(
            (0..h.l1_size as usize)
                .map(|i| be64_at(&l1_bytes, i))
                .collect(),
        );
        let rt_len = (u64::from(h.refcount_table_clusters) * g.cluster_size / 8) as usize;
        let mut rt_bytes = vec![0u8; rt_len * 8];
        read_at(
            &*io,
            MetaKind::RefcountTable,
            h.refcount_table_offset,
            &mut rt_bytes,
        )?;
        let rt: Vec<u64> = (0..rt_len).map(|i| be64_at(&rt_bytes, i)).collect();
        let cs = g.cluster_size;
        let tables = |bytes: u64| (bytes / cs).max(MIN_CACHED_TABLES) as usize;
        let bitmap_directory = h.bitmaps.map(|e| (e.dir_offset, e.dir_size));
        let mut meta = MetaState {
            l2_cache: TableCache::new(tables(L2_CACHE_BYTES)),
            rb_cache: TableCache::new(tables(RB_CACHE_BYTES)),
            g,
            path,
            io,
            file,
            file_size,
            reserved_end: file_size,
            l1_offset: h.l1_table_offset,
            l1,
            rt_offset: h.refcount_table_offset,
            refblocks: rt.iter().map(|e| e & !0x1ff).filter(|o| *o != 0).collect(),
            rt,
            free_hint: 0,
            snapshots: TableLocation::of(h),
            compressed_tail: 0,
            barriers: true,
            l2_write_through: false,
            dirty_l2: BTreeMap::new(),
            dirty_entries: 0,
            max_dirty_tables: (tables(L2_CACHE_BYTES) / 2).max(1),
            deferred_release: Vec::new(),
            dirty_rb: BTreeMap::new(),
            max_dirty_rb: (tables(RB_CACHE_BYTES) / 2).max(1),
            metadata_map: MetadataMap::new(h.cluster_bits),
            bitmap_directory,
            corrupt: Cell::new(false),
            overlap_checks: true,
        };
        meta.rebuild_metadata_map();
        Ok(meta)
    }

    pub fn invalid(&self, reason: impl Into<String>) -> BlockError {
        BlockError::InvalidImage {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// Writes pending refcount changes, then (with barriers on) makes
    /// everything written so far durable.
    pub fn barrier(&mut self) -> Result<(), BlockError> {
        self.write_refcounts()?;
        if self.barriers {
            self.sync()?;
        }
        Ok(())
    }

    /// A table cluster at `offset` must lie inside the file.
    pub fn check_table(&self, offset: u64, what: &str) -> Result<(), BlockError> {
        if offset < self.g.cluster_size || !within(offset, self.g.cluster_size, self.file_size) {
            return Err(self.invalid(format!("{what} at {offset:#x} lies outside the file")));
        }
        Ok(())
    }

    /// The L2 table of L1 index `i`: offset and COPIED flag, if allocated.
    pub fn l2_table(&self, i: usize) -> Result<Option<(u64, bool)>, BlockError> {
        let Some(&raw) = self.l1.get(i) else {
            return Ok(None);
        };
        let t = decode_l1(raw, self.g.cluster_size).map_err(|r| self.invalid(r))?;
        if let Some((off, _)) = t {
            let cs = self.g.cluster_size;
            if off >= cs && !within(off, cs, self.file_size) {
                // Past (or across) the end of the file: everything the
                // table maps is lost, and the error says which range.
                let span = self.g.l2_coverage();
                return Err(BlockError::BeyondEndOfFile {
                    path: self.path.clone(),
                    what: "L2 table",
                    host: off,
                    guest: (i as u64).saturating_mul(span),
                    len: span,
                });
            }
            self.check_table(off, "L2 table")?;
        }
        Ok(t)
    }

    pub fn load_l2(&mut self, off: u64) -> Result<(), BlockError> {
        if !self.l2_cache.contains(off) {
            let mut t = vec![0u8; self.g.cluster_size as usize];
            self.read(MetaKind::L2Table, off, &mut t)?;
            self.l2_cache.insert(off, t);
        }
        Ok(())
    }

    /// (L1 index, L2 index) of a guest offset.
    pub fn indices(&self, guest: u64) -> (usize, usize) {
        let cluster = guest >> self.g.cluster_bits;
        (
            (cluster / self.g.l2_entries) as usize,
            (cluster % self.g.l2_entries) as usize,
        )
    }

    /// Raw L2 entry and subcluster bitmap (0 unless extended L2) of the
    /// cluster holding `guest`.
    pub fn l2_raw(&mut self, guest: u64) -> Result<(u64, u64), BlockError> {
        let (i1, i2) = self.indices(guest);
        let Some((off, _)) = self.l2_table(i1)? else {
            return Ok((0, 0));
        };
        self.load_l2(off)?;
        let path = &self.path;
        let t = self
            .l2_cache
            .get(off)
            .ok_or_else(|| BlockError::InvalidImage {
                path: path.clone(),
                reason: "L2 cache lost a table".into(),
            })?;
        Ok(raw_entry(&self.g, t, i2))
    }

    /// When no L2 table maps `guest`: the bytes from `guest` to the end of
    /// the range that table would map.
    pub fn unmapped_run(&self, guest: u64) -> Result<Option<u64>, BlockError> {
        let (i1, _) = self.indices(guest);
        if self.l2_table(i1)?.is_some() {
            return Ok(None);
        }
        let cover = self.g.l2_coverage();
        Ok(Some(cover - guest % cover))
    }

    /// Decoded entry, with its host offsets checked against the file.
    pub fn l2_entry(&mut self, guest: u64) -> Result<(L2Entry, u64), BlockError> {
        let (raw, bitmap) = self.l2_raw(guest)?;
        checked_entry(&self.g, &self.path, self.file_size, guest, raw, bitmap)
    }

    /// A raw L2 entry of this image's tables, decoded with its geometry
    /// (no check against the file's size: that is [`MetaState::l2_entry`]).
    pub fn decode_l2(&self, raw: u64) -> Result<L2Entry, BlockError> {
        let g = &self.g;
        decode_l2(raw, g.cluster_bits, g.version, g.extended_l2).map_err(|r| self.invalid(r))
    }

    /// Writes L2 entry (standard part) of the cluster holding `guest`,
    /// whose L2 table must exist; write-through.
    /// `bitmap` is the subcluster bitmap of extended L2 entries (ignored
    /// otherwise).
    pub fn set_l2_entry(&mut self, guest: u64, raw: u64, bitmap: u64) -> Result<(), BlockError> {
        let (off, pos) = self.update_l2_cache(guest, raw, bitmap)?;
        let bytes = self.entry_bytes(raw, bitmap);
        // Whatever the entry points at is counted on disk first.
        self.write_refcounts()?;
        self.write(MetaKind::L2Table, off + pos as u64, &bytes)
    }

    fn entry_bytes(&self, raw: u64, bitmap: u64) -> Vec<u8> {
        let mut b = raw.to_be_bytes().to_vec();
        if self.g.extended_l2 {
            b.extend_from_slice(&bitmap.to_be_bytes());
        }
        b
    }

    /// Publishes a new mapping in the cache now and on disk at the next
    /// [`MetaState::flush_dirty`], after a barrier has made the data and
    /// refcounts it depends on durable.
    pub fn publish_l2_entry(
        &mut self,
        guest: u64,
        raw: u64,
        bitmap: u64,
    ) -> Result<(), BlockError> {
        let (off, pos) = self.update_l2_cache(guest, raw, bitmap)?;
        self.l2_cache.pin(off);
        self.dirty_l2.entry(off).or_default().insert(pos);
        self.dirty_entries += 1;
        Ok(())
    }

    /// Whether enough is pending that the caller should flush now.
    pub fn should_flush(&self) -> bool {
        self.dirty_entries >= MAX_DIRTY_ENTRIES
            || self.dirty_l2.len() >= self.max_dirty_tables
            || self.deferred_release.len() >= MAX_DIRTY_ENTRIES
    }

    /// Pending refcounts and barrier, then every deferred L2 entry,
    /// barrier, then the refcount drops that had to wait for those entries
    /// to be durable (written too, for the caller's fdatasync).
    ///
    /// A table or a refcount drop leaves its queue only once written (or
    /// applied): when a write fails, everything not yet on disk stays
    /// queued and the next flush retries it, so a later successful flush
    /// never reports durable what was never written.
    pub fn flush_dirty(&mut self) -> Result<(), BlockError> {
        if self.dirty_l2.is_empty() && self.deferred_release.is_empty() {
            return self.write_refcounts();
        }
        if !self.dirty_l2.is_empty() {
            self.barrier()?;
            self.write_dirty_l2()?;
        }
        if !self.deferred_release.is_empty() {
            self.barrier()?;
            self.apply_deferred_release()?;
        }
        self.write_refcounts()
    }

    /// Writes every dirty L2 table's changed entries (one pwrite per
    /// table, from its first to its last changed entry).
    fn write_dirty_l2(&mut self) -> Result<(), BlockError> {
        let esize = self.g.l2_entry_size as usize;
        while let Some((&off, positions)) = self.dirty_l2.first_key_value() {
            let count = positions.len();
            if let (Some(&lo), Some(&hi)) = (positions.first(), positions.last()) {
                let bytes = self
                    .l2_cache
                    .get(off)
                    .and_then(|t| t.get(lo..hi + esize))
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| self.invalid("a dirty L2 table left the cache"))?;
                self.write(MetaKind::L2Table, off + lo as u64, &bytes)?;
            }
            self.dirty_l2.remove(&off);
            self.dirty_entries = self.dirty_entries.saturating_sub(count);
            self.l2_cache.unpin(off);
        }
        Ok(())
    }

    /// Drops the refcounts queued in `deferred_release`, one refcount
    /// block's worth at a time, each piece leaving the queue once applied
    /// (in the cache; `write_refcounts` then writes it).
    fn apply_deferred_release(&mut self) -> Result<(), BlockError> {
        let rbe = self.g.rb_entries;
        while let Some(&(first, count)) = self.deferred_release.last() {
            let n = count.min(rbe - first % rbe);
            if n > 0 {
                self.change_block_refcounts(first, first + n, -1)?;
            }
            if n >= count {
                self.deferred_release.pop();
            } else if let Some(last) = self.deferred_release.last_mut() {
                *last = (first + n, count - n);
            }
        }
        Ok(())
    }

    fn update_l2_cache(
        &mut self,
        guest: u64,
        raw: u64,
        bitmap: u64,
    ) -> Result<(u64, usize), BlockError> {
        let bytes = self.entry_bytes(raw, bitmap);
        let (i1, i2) = self.indices(guest);
        let Some((off, _)) = self.l2_table(i1)? else {
            return Err(self.invalid("L2 table vanished before its entry was written"));
        };
        self.load_l2(off)?;
        let pos = i2 * self.g.l2_entry_size as usize;
        let path = self.path.clone();
        let t = self
            .l2_cache
            .get_mut(off)
            .ok_or_else(|| BlockError::InvalidImage {
                path,
                reason: "L2 cache lost a table".into(),
            })?;
        t[pos..pos + bytes.len()].copy_from_slice(&bytes);
        Ok((off, pos))
    }

    fn set_l1_entry(&mut self, i: usize, raw: u64) -> Result<(), BlockError> {
        self.write_refcounts()?;
        self.write(
            MetaKind::L1Table,
            self.l1_offset + i as u64 * 8,
            &raw.to_be_bytes(),
        )?;
        self.l1[i] = raw;
        Ok(())
    }

    /// The L2 table covering `guest`, allocated (new tables: refcount,
    /// then the zeroed table, then the L1 entry) or copied if shared with
    /// a snapshot, so that its entries may be changed.
    pub fn writable_l2(&mut self, guest: u64) -> Result<u64, BlockError> {
        let (i1, _) = self.indices(guest);
        if i1 >= self.l1.len() {
            return Err(self.invalid("guest offset beyond the L1 table"));
        }
        let old = self.l2_table(i1)?;
        if let Some((off, true)) = old {
            return Ok(off);
        }
        let table = match old {
            Some((off, _)) => {
                self.load_l2(off)?;
                self.l2_cache
                    .get(off)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            }
            None => vec![0u8; self.g.cluster_size as usize],
        };
        let new = self.alloc_clusters(1)?;
        self.write(MetaKind::L2Table, new, &table)?;
        self.metadata_map
            .add(MetaKind::L2Table, new, self.g.cluster_size);
        self.l2_cache.insert(new, table);
        self.barrier()?;
        self.set_l1_entry(i1, new | OFLAG_COPIED)?;
        if let Some((off, _)) = old {
            // Dirty entries of the old table went out inside the copy,
            // which the barrier above made durable before the L1 entry.
            if let Some(p) = self.dirty_l2.remove(&off) {
                self.dirty_entries -= p.len();
            }
            self.l2_cache.remove(off);
            self.metadata_map
                .remove(MetaKind::L2Table, off, self.g.cluster_size);
            // Its reference drops once the new L1 entry is durable (a
            // snapshot may share it: dropped first, a crash would leave
            // the L1 entry on a table whose refcount no longer counts it).
            self.deferred_release.push((off >> self.g.cluster_bits, 1));
        }
        Ok(new)
    }

    /// Makes everything before durable, then writes `new_size` into the
    /// header (the L1 table must already cover it); the caller then takes
    /// it as the disk's size.
    pub fn write_disk_size(&mut self, new_size: u64) -> Result<(), BlockError> {
        self.barrier()?;
        self.write(
            MetaKind::Header,
            crate::formats::qcow2::on_disk::header::OFF_SIZE,
            &new_size.to_be_bytes(),
        )
    }

    /// Replaces the L1 table (grown to `new_len` entries) at a new place;
    /// header fields are written by the caller through `write_l1_header`.
    pub fn grow_l1(&mut self, new_len: usize) -> Result<(), BlockError> {
        if new_len <= self.l1.len() {
            return Ok(());
        }
        let bytes = new_len as u64 * 8;
        if bytes > crate::formats::qcow2::on_disk::layout::MAX_L1_BYTES {
            return Err(BlockError::InvalidResize(format!(
                "L1 table of {new_len} entries is too large"
            )));
        }
        let clusters = bytes.div_ceil(self.g.cluster_size);
        let new = self.alloc_clusters(clusters)?;
        let mut buf = vec![0u8; (clusters * self.g.cluster_size) as usize];
        for (i, e) in self.l1.iter().enumerate() {
            buf[i * 8..i * 8 + 8].copy_from_slice(&e.to_be_bytes());
        }
        self.write(MetaKind::L1Table, new, &buf)?;
        self.barrier()?;
        let mut hdr = [0u8; 12];
        hdr[..4].copy_from_slice(&(new_len as u32).to_be_bytes());
        hdr[4..].copy_from_slice(&new.to_be_bytes());
        self.write(
            MetaKind::Header,
            crate::formats::qcow2::on_disk::header::OFF_L1_SIZE,
            &hdr,
        )?;
        let old = self.l1_offset;
        let old_clusters = (self.l1.len() as u64 * 8).div_ceil(self.g.cluster_size);
        self.metadata_map
            .remove(MetaKind::L1Table, old, self.l1.len() as u64 * 8);
        self.metadata_map.add(MetaKind::L1Table, new, bytes);
        self.l1_offset = new;
        self.l1.resize(new_len, 0);
        if old_clusters > 0 {
            // Freed once the header naming the new table is durable.
            self.deferred_release
                .push((old >> self.g.cluster_bits, old_clusters));
        }
        Ok(())
    }
}
