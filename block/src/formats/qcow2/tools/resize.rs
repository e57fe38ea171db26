//! Resizing a qcow2 image (`Resizable`: `ch-img resize`, the storage
//! daemon's growable FUSE export): [`Resize`], over the image's locked
//! state and its disk size.
//!
//! Growing only adds unmapped L1 entries and writes the new size into the
//! header, after a barrier. Shrinking (`--shrink`): the new size enters;
//! every cluster wholly past it is unmapped: L2
//! tables past it are dropped from the L1 table, and in the table that
//! straddles the new end the entries past it are cleared. That table may
//! be shared with internal snapshots (refcount above one): then the
//! active tree gets a copy of it with the entries cleared, and the
//! snapshots keep the original, as qemu-img does. The tables are written
//! and made durable first (a copy's refcount before the L1 entry that
//! points at it); only then are the references those entries and tables
//! held dropped (a crash in between leaks clusters, nothing worse), and
//! last the header's size is written. The L1 table keeps its length, and
//! the file is not truncated (its freed clusters are reused by later
//! allocations).
//!
//! Unlike qemu-img 7.2, the bytes of the last kept cluster past the new
//! end read as zeroes afterwards when that cluster is a plain data
//! cluster, so growing the image again later cannot bring back data the
//! shrink cut off: zeroed in place when the active disk alone owns the
//! cluster, or, when a snapshot shares it, in a copy the active table
//! points at instead (the snapshot keeps its bytes).

use std::sync::atomic::{AtomicU64, Ordering};

use super::tree::{load_table, tree_references, TreeOp};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{be64_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::{L2Entry, OFFSET_MASK, OFLAG_COPIED};
use crate::formats::qcow2::state::State;

/// See the module docs.
pub(crate) struct Resize<'a> {
    pub st: &'a mut State,
    pub size: &'a AtomicU64,
}

impl Resize<'_> {
    /// Grows or shrinks the disk to `new_size` bytes; the caller has
    /// checked the image is writable with its backing chain, and written
    /// out the compressed-cluster cache.
    pub fn to(&mut self, new_size: u64) -> Result<(), BlockError> {
        let st = &mut *self.st;
        let old = self.size.load(Ordering::Acquire);
        if !new_size.is_multiple_of(512) {
            return Err(BlockError::InvalidResize(
                "size must be a multiple of 512 bytes".into(),
            ));
        }
        if st.meta.geometry().data_file {
            return Err(BlockError::InvalidResize(
                "images with a data file cannot be resized".into(),
            ));
        }
        // Snapshots keep their own tables and sizes: growing only adds
        // unmapped L1 entries, and shrinking copies a table it shares
        // with them before changing it (see `unmap_past`). Version 2 snapshot
        // entries need not record their disk size, so a snapshot could
        // not bring its size back (qemu-img refuses too).
        if st.meta.geometry().version < 3 && st.meta.snapshot_table().count > 0 {
            return Err(BlockError::InvalidResize(
                "a version 2 image with snapshots cannot be resized".into(),
            ));
        }
        if new_size < old {
            // A write planned into the cut range and still in flight would
            // land in a cluster the shrink frees (see `crate::Resizer`).
            if st.inflight.pending_count() > 0 {
                return Err(BlockError::InvalidResize(
                    "cannot shrink while allocating writes are in flight".into(),
                ));
            }
            unmap_past(&mut st.meta, new_size)?;
        }
        let l1_needed = new_size.div_ceil(st.meta.geometry().l2_coverage());
        let l1_needed = usize::try_from(l1_needed)
            .map_err(|_| BlockError::InvalidResize("size too large".into()))?;
        st.meta.grow_l1(l1_needed)?;
        st.meta.write_disk_size(new_size)?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }
}

/// Unmaps everything past `new_size` (see the module docs); the caller
/// writes the header's size afterwards.
fn unmap_past(meta: &mut MetaState, new_size: u64) -> Result<(), BlockError> {
    meta.flush_dirty()?;
    meta.barrier()?;
    let cs = meta.geometry().cluster_size;
    let cov = meta.geometry().l2_coverage();
    let cb = meta.geometry().cluster_bits;
    let words = meta.geometry().l2_entry_size as usize / 8;
    let first_gone = new_size.div_ceil(cs) * cs;
    let first_table = first_gone.div_ceil(cov) as usize;
    let mut dropped_tables = Vec::new();
    for i in first_table..meta.l1().len() {
        let e = meta.l1()[i];
        if e != 0 {
            dropped_tables.push(e);
            meta.stage_l1_entry(i, 0);
        }
    }
    // References the active tree gives up, once its tables no longer
    // hold them; and the new contents of the tables that change.
    let mut dropped = Vec::new();
    let mut edits: Vec<(usize, u64, Vec<u8>)> = Vec::new();
    let k = (first_gone / cov) as usize;
    if !first_gone.is_multiple_of(cov) && k < meta.l1().len() {
        if let Some((off, _)) = meta.l2_table(k)? {
            let table = load_table(meta, off)?;
            let mut new = table.clone();
            for j in ((first_gone % cov) / cs) as usize..meta.geometry().l2_entries as usize {
                let raw = be64_at(&table, j * words);
                let e = meta.decode_l2(raw)?;
                if let Some(refs) = meta.geometry().references(e) {
                    dropped.push(refs);
                }
                new[j * words * 8..(j + 1) * words * 8].fill(0);
            }
            if new != table {
                edits.push((k, off, new));
            }
        }
    }
    if !new_size.is_multiple_of(cs) {
        cut_last_cluster(meta, new_size, &mut edits, &mut dropped)?;
    }
    // Tables a snapshot shares are copied for the active tree.
    let mut released_tables = Vec::new();
    let mut in_place = Vec::new();
    for (i, off, content) in edits {
        if meta.refcount(off >> cb)? == 1 {
            in_place.push((off, content));
        } else {
            let copy = meta.alloc_clusters(1)?;
            meta.write_l2_table(copy, content)?;
            meta.stage_l1_entry(i, copy | OFLAG_COPIED);
            released_tables.push(off >> cb);
        }
    }
    // New clusters' refcounts are durable before anything points at
    // them.
    meta.write_refcounts()?;
    meta.barrier()?;
    for (off, content) in in_place {
        meta.write_l2_table(off, content)?;
    }
    meta.write_l1_table()?;
    meta.barrier()?;
    for (first, n) in dropped {
        meta.change_refcounts(first, n, -1)?;
    }
    for table in released_tables {
        meta.change_refcounts(table, 1, -1)?;
    }
    tree_references(meta, &dropped_tables, TreeOp::Drop)?;
    meta.barrier()?;
    meta.rebuild_metadata_map();
    Ok(())
}

/// Zeroes the bytes past `new_size` in the last kept cluster when it
/// is a plain data cluster. One the active disk alone owns is zeroed
/// in place; one a snapshot shares is copied first (the copy's start
/// and then zeroes, in a new cluster the active table entry is
/// edited to point at, recorded in `edits`; the old cluster's
/// reference goes to `dropped`), so the snapshot keeps its bytes.
fn cut_last_cluster(
    meta: &mut MetaState,
    new_size: u64,
    edits: &mut Vec<(usize, u64, Vec<u8>)>,
    dropped: &mut Vec<(u64, u64)>,
) -> Result<(), BlockError> {
    let cs = meta.geometry().cluster_size;
    let cov = meta.geometry().l2_coverage();
    let cb = meta.geometry().cluster_bits;
    let words = meta.geometry().l2_entry_size as usize / 8;
    let i = (new_size / cov) as usize;
    let Some((off, _)) = meta.l2_table(i)? else {
        return Ok(());
    };
    let at = edits.iter().position(|(t, _, _)| *t == i);
    let mut content = match at {
        Some(a) => edits[a].2.clone(),
        None => load_table(meta, off)?,
    };
    let j = ((new_size % cov) / cs) as usize;
    let raw = be64_at(&content, j * words);
    let e = meta.decode_l2(raw)?;
    let L2Entry::Normal { host, .. } = e else {
        return Ok(());
    };
    if host == 0 {
        return Ok(());
    }
    let tail = (new_size % cs) as usize;
    if meta.refcount(host >> cb)? == 1 {
        let zeros = vec![0u8; cs as usize - tail];
        return meta.write(MetaKind::GuestData, host + tail as u64, &zeros);
    }
    let mut data = vec![0u8; cs as usize];
    meta.read(MetaKind::GuestData, host, &mut data[..tail])?;
    let copy = meta.alloc_clusters(1)?;
    meta.write(MetaKind::GuestData, copy, &data)?;
    let new_raw = (raw & !OFFSET_MASK) | copy | OFLAG_COPIED;
    content[j * words * 8..j * words * 8 + 8].copy_from_slice(&new_raw.to_be_bytes());
    dropped.push((host >> cb, 1));
    match at {
        Some(a) => edits[a].2 = content,
        None => edits.push((i, off, content)),
    }
    Ok(())
}
