//! Creating, applying and deleting internal snapshots (`ch-img snapshot
//! -c / -a / -d`): [`Snapshotter`], over the image's locked tables and its
//! disk size.
//!
//! qcow2 counts a cluster once for every L1 tree (the active one and each
//! snapshot's) that reaches it, whether or not an L2 table on the way is
//! shared. So:
//!
//! Create: flush; add one reference to every L2 table and every cluster
//! the active tree maps (after checking none would overflow) and make
//! that durable; clear OFLAG_COPIED in the active L1 and L2 entries
//! (nothing is exclusively owned any more, so every later write copies
//! first); write a copy of the active L1 table; then a new snapshot table
//! (old entries plus the new one) in new clusters, a barrier, the
//! header's (nb_snapshots, snapshots_offset) in one write, a barrier, and
//! the old table freed.
//!
//! Apply (by id or name, as qemu-img does): add a reference to the
//! snapshot's tree, make it durable, make the snapshot's L1 entries the
//! active ones, then drop the old active tree's references and set
//! OFLAG_COPIED again wherever a refcount is back to one. A snapshot taken
//! at another disk size brings that size back, written last (a crash
//! before leaves the old size over the snapshot's tables: entries past a
//! smaller snapshot's end are zero, and a larger one's tail is simply not
//! visible yet).
//!
//! Delete (by name, first match, as qemu-img does): write the table
//! without the entry and switch the header to it first, so nothing names
//! the snapshot any more; then drop the references its tree held (L2
//! tables, clusters, the L1 copy), and restore OFLAG_COPIED in the active
//! tree (qemu-img check requires it where a refcount is one).
//!
//! References are always added before anything names them and dropped
//! after nothing does, so a crash on the way leaks clusters and nothing
//! worse. It can also leave OFLAG_COPIED out of step with a refcount, as
//! in QEMU (the flag and the refcount live in different clusters, so no
//! order of writes keeps them in step), but only where one tree reaches
//! the cluster: set where leaked references raised the refcount (create),
//! or missing where the refcount just fell to one (apply, delete). The
//! first writes in place into a cluster nothing else reads; the second
//! copies a cluster needlessly. The flag is cleared on disk before any
//! snapshot table names a shared cluster, and set only where the refcount
//! is one. `qemu-img check` counts such a flag as an error; `check -r
//! all` (qemu-img's or ours) repairs it; block/tests/crash_snapshot.rs
//! checks all of this after SIGKILLs at random moments. Only
//! for tools that own the image; queues must not be running. Entries are
//! rewritten with qemu's 24 bytes of extra data (VM state size, disk size,
//! instruction count); longer extra data of future qemu versions is not
//! kept.

use std::sync::atomic::{AtomicU64, Ordering};

use super::tree::{begin_tree_op, load_table, read_l1, tree_references, TreeOp};
use crate::error::BlockError;
use crate::formats::holes::file_size;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{be64_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::{OFFSET_MASK, OFLAG_COMPRESSED, OFLAG_COPIED};
use crate::formats::qcow2::on_disk::snapshot_table::{
    read_snapshot_table, SnapshotInfo, TableLocation,
};

/// Bytes of extra data per entry qemu writes: 64-bit VM state size,
/// virtual disk size, instruction count.
const EXTRA_DATA: usize = 24;

/// See the module docs: the image's tables (locked) and its disk size
/// (which applying a snapshot may change).
pub(crate) struct Snapshotter<'a> {
    meta: &'a mut MetaState,
    size: &'a AtomicU64,
}

impl<'a> Snapshotter<'a> {
    /// Refuses an image with an external data file and makes everything
    /// cached durable, then hands out the snapshotter.
    pub fn begin(meta: &'a mut MetaState, size: &'a AtomicU64) -> Result<Self, BlockError> {
        begin_tree_op(meta)?;
        Ok(Snapshotter { meta, size })
    }

    /// Rewrites the snapshot table as it is, every entry with qemu's full
    /// extra data (`check -r all` for a version 3 image whose entries
    /// lack it).
    pub fn rewrite_table(&mut self) -> Result<(), BlockError> {
        let (entries, old_len) = self.current_table()?;
        let size = self.size.load(Ordering::Acquire);
        let meta = &mut *self.meta;
        replace_table(meta, old_len, &entries, size)?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(())
    }

    /// Adds snapshot `name` of the current disk; `date` is (seconds,
    /// nanoseconds) since the epoch.
    pub fn create(&mut self, name: &str, date: (u32, u32)) -> Result<(), BlockError> {
        let (mut entries, old_len) = self.current_table()?;
        let meta = &mut *self.meta;
        if name.len() > u16::MAX as usize {
            return Err(meta.invalid("snapshot name too long"));
        }
        let active = meta.l1().to_vec();
        // A cluster reached twice (several compressed clusters in one host
        // cluster) can still overflow below; that leaks, nothing worse.
        tree_references(meta, &active, TreeOp::CheckRoom)?;
        tree_references(meta, &active, TreeOp::Add)?;
        meta.barrier()?;
        // Every refcount is now at least two: this clears OFLAG_COPIED.
        self.restore_copied()?;
        let meta = &mut *self.meta;
        let l1_copy = copy_l1(meta)?;
        meta.write_l1_table()?;
        let id = entries
            .iter()
            .filter_map(|e| e.id.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let size = self.size.load(Ordering::Acquire);
        entries.push(SnapshotInfo {
            id: id.to_string(),
            name: name.to_string(),
            l1_offset: l1_copy,
            l1_size: meta.l1().len() as u32,
            date_sec: date.0,
            date_nsec: date.1,
            vm_clock_nsec: 0,
            vm_state_size: 0,
            disk_size: Some(size),
            icount: Some(0),
        });
        replace_table(meta, old_len, &entries, size)?;
        meta.rebuild_metadata_map();
        Ok(())
    }

    /// Deletes the first snapshot named `name`. `Ok(false)`: none is.
    pub fn delete(&mut self, name: &str) -> Result<bool, BlockError> {
        let (mut entries, old_len) = self.current_table()?;
        let meta = &mut *self.meta;
        let Some(at) = entries.iter().position(|e| e.name == name) else {
            return Ok(false);
        };
        let gone = entries.remove(at);
        let size = self.size.load(Ordering::Acquire);
        replace_table(meta, old_len, &entries, size)?;
        let gone_l1 = read_l1(meta, &gone)?;
        tree_references(meta, &gone_l1, TreeOp::Drop)?;
        if gone.l1_size > 0 {
            let clusters = (u64::from(gone.l1_size) * 8).div_ceil(meta.geometry().cluster_size);
            meta.change_refcounts(gone.l1_offset >> meta.geometry().cluster_bits, clusters, -1)?;
        }
        self.restore_copied()?;
        let meta = &mut *self.meta;
        meta.write_l1_table()?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(true)
    }

    /// Makes the snapshot with id or name `name` the active disk.
    /// `Ok(false)`: there is none.
    pub fn apply(&mut self, name: &str) -> Result<bool, BlockError> {
        let (entries, _) = self.current_table()?;
        let meta = &mut *self.meta;
        let Some(sn) = entries
            .iter()
            .find(|e| e.id == name)
            .or_else(|| entries.iter().find(|e| e.name == name))
        else {
            return Ok(false);
        };
        let size = self.size.load(Ordering::Acquire);
        // A snapshot taken at another size brings its size back (as
        // qemu-img does); one without a recorded size keeps the current.
        let new_size = sn.disk_size.unwrap_or(size);
        let sn_l1 = read_l1(meta, sn)?;
        if new_size != size {
            let covered = (sn_l1.len() as u64).saturating_mul(meta.geometry().l2_coverage());
            if !new_size.is_multiple_of(512) || new_size > covered {
                return Err(meta.invalid(format!(
                    "snapshot {} has a disk size of {new_size} bytes that its L1 table of {} entries does not fit",
                    sn.id,
                    sn_l1.len()
                )));
            }
            if meta.geometry().data_file || meta.geometry().version < 3 {
                // qemu-img cannot resize these either.
                return Err(BlockError::Unsupported {
                    path: meta.path().to_path_buf(),
                    feature: "applying a snapshot taken at another disk size to a version 2 \
                              image or one with a data file"
                        .into(),
                });
            }
        }
        tree_references(meta, &sn_l1, TreeOp::CheckRoom)?;
        tree_references(meta, &sn_l1, TreeOp::Add)?;
        meta.barrier()?;
        meta.grow_l1(sn_l1.len())?;
        let old = meta.l1().to_vec();
        for i in 0..meta.l1().len() {
            meta.stage_l1_entry(i, sn_l1.get(i).copied().unwrap_or(0) & !OFLAG_COPIED);
        }
        meta.write_l1_table()?;
        meta.barrier()?;
        tree_references(meta, &old, TreeOp::Drop)?;
        self.restore_copied()?;
        let meta = &mut *self.meta;
        meta.write_l1_table()?;
        if new_size != size {
            // Last: the L1 table already maps the snapshot's whole disk.
            meta.write_disk_size(new_size)?;
            self.size.store(new_size, Ordering::Release);
        }
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(true)
    }

    /// The entries of the snapshot table where it is now, and its length.
    fn current_table(&self) -> Result<(Vec<SnapshotInfo>, u64), BlockError> {
        let meta = &*self.meta;
        let file_size = file_size(meta.file()).map_err(|source| BlockError::Open {
            path: meta.path().to_path_buf(),
            source,
        })?;
        read_snapshot_table(meta.io(), meta.snapshot_table(), file_size)
            .map_err(|r| meta.invalid(r))
    }

    /// Sets OFLAG_COPIED in the active L1 and L2 entries exactly where
    /// the table or cluster has refcount one (compressed clusters never),
    /// and clears it elsewhere; rewrites the L2 tables that change (the
    /// caller writes the L1 table).
    fn restore_copied(&mut self) -> Result<(), BlockError> {
        let meta = &mut *self.meta;
        let cb = meta.geometry().cluster_bits;
        for i in 0..meta.l1().len() {
            let Some((off, _)) = meta.l2_table(i)? else {
                continue;
            };
            let owned_table = meta.refcount(off >> cb)? == 1;
            let table = load_table(meta, off)?;
            let mut new = table.clone();
            let words = meta.geometry().l2_entry_size as usize / 8;
            for j in 0..meta.geometry().l2_entries as usize {
                let raw = be64_at(&table, j * words);
                let e = meta.decode_l2(raw)?;
                let owned = match meta.geometry().references(e) {
                    Some((first, 1)) if owned_table && raw & OFLAG_COMPRESSED == 0 => {
                        meta.refcount(first)? == 1
                    }
                    _ => false,
                };
                let want = if owned {
                    raw | OFLAG_COPIED
                } else {
                    raw & !OFLAG_COPIED
                };
                new[j * words * 8..j * words * 8 + 8].copy_from_slice(&want.to_be_bytes());
            }
            if new != table {
                meta.write_l2_table(off, new)?;
            }
            let raw = meta.l1()[i];
            meta.stage_l1_entry(
                i,
                if owned_table {
                    raw | OFLAG_COPIED
                } else {
                    raw & !OFLAG_COPIED
                },
            );
        }
        Ok(())
    }
}

/// A copy of the active L1 table in new clusters; returns its offset.
fn copy_l1(meta: &mut MetaState) -> Result<u64, BlockError> {
    let bytes: Vec<u8> = meta.l1().iter().flat_map(|e| e.to_be_bytes()).collect();
    let clusters = (bytes.len() as u64)
        .div_ceil(meta.geometry().cluster_size)
        .max(1);
    let off = meta.alloc_clusters(clusters)?;
    let mut padded = bytes;
    padded.resize((clusters * meta.geometry().cluster_size) as usize, 0);
    meta.write(MetaKind::SnapshotL1, off, &padded)?;
    Ok(off)
}

/// Writes `entries` as the new snapshot table and points the header (and
/// `MetaState`'s snapshot table) at it (see the module docs for the order), then
/// frees the old table, `old_len` bytes long.
fn replace_table(
    meta: &mut MetaState,
    old_len: u64,
    entries: &[SnapshotInfo],
    disk_size: u64,
) -> Result<(), BlockError> {
    let cs = meta.geometry().cluster_size;
    let bytes = encode_table(entries, disk_size);
    let new_off = if bytes.is_empty() {
        0
    } else {
        let clusters = (bytes.len() as u64).div_ceil(cs);
        let off = meta.alloc_clusters(clusters)?;
        let mut padded = bytes;
        padded.resize((clusters * cs) as usize, 0);
        meta.write(MetaKind::SnapshotTable, off, &padded)?;
        off
    };
    meta.barrier()?;
    let mut fields = (entries.len() as u32).to_be_bytes().to_vec();
    fields.extend_from_slice(&new_off.to_be_bytes());
    meta.write(MetaKind::Header, 60, &fields)?;
    meta.barrier()?;
    let old = meta.move_snapshot_table(TableLocation {
        count: entries.len() as u32,
        offset: new_off,
    });
    if old.count > 0 {
        meta.change_refcounts(old.offset / cs, old_len.div_ceil(cs).max(1), -1)?;
    }
    Ok(())
}

/// The table's bytes: per entry the fixed part, qemu's 24 bytes of extra
/// data, the id, the name, padding to 8 bytes.
fn encode_table(entries: &[SnapshotInfo], disk_size: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for e in entries {
        b.extend_from_slice(&(e.l1_offset & OFFSET_MASK).to_be_bytes());
        b.extend_from_slice(&e.l1_size.to_be_bytes());
        b.extend_from_slice(&(e.id.len() as u16).to_be_bytes());
        b.extend_from_slice(&(e.name.len() as u16).to_be_bytes());
        b.extend_from_slice(&e.date_sec.to_be_bytes());
        b.extend_from_slice(&e.date_nsec.to_be_bytes());
        b.extend_from_slice(&e.vm_clock_nsec.to_be_bytes());
        b.extend_from_slice(&(e.vm_state_size.min(u64::from(u32::MAX)) as u32).to_be_bytes());
        b.extend_from_slice(&(EXTRA_DATA as u32).to_be_bytes());
        b.extend_from_slice(&e.vm_state_size.to_be_bytes());
        b.extend_from_slice(&e.disk_size.unwrap_or(disk_size).to_be_bytes());
        b.extend_from_slice(&e.icount.unwrap_or(u64::MAX).to_be_bytes());
        b.extend_from_slice(e.id.as_bytes());
        b.extend_from_slice(e.name.as_bytes());
        b.resize(b.len().div_ceil(8) * 8, 0);
    }
    b
}
