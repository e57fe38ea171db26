//! Creating, applying and deleting internal snapshots (`ch-img snapshot
//! -c / -a / -d`).
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

use std::sync::MutexGuard;

use super::image::Qcow2Image;
use super::state::State;
use super::l2_entry::{decode_l1, decode_l2, OFFSET_MASK, OFLAG_COMPRESSED, OFLAG_COPIED};
use super::meta::MetaState;
use super::meta_io::{be64_at, MetaKind};
use super::refcount::max_refcount;
use super::snapshot_table::{read_snapshot_table, SnapshotInfo, TableLocation};
use crate::error::BlockError;
use crate::formats::Snapshots;

/// Bytes of extra data per entry qemu writes: 64-bit VM state size,
/// virtual disk size, instruction count.
const EXTRA_DATA: usize = 24;

/// What [`Qcow2Image::tree_references`] does to every cluster of a tree.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum TreeOp {
    /// Fail if any could not take one more reference; change nothing.
    CheckRoom,
    Add,
    Drop,
}

impl Qcow2Image {
    /// Rewrites the snapshot table as it is, every entry with qemu's full
    /// extra data (`check -r all` for a version 3 image whose entries
    /// lack it).
    pub(crate) fn rewrite_snapshot_table(&self) -> Result<(), BlockError> {
        let mut st = self.begin_snapshot_op()?;
        let meta = &mut st.meta;
        let (entries, old_len) = self.current_table(meta)?;
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        replace_table(meta, old_len, &entries, size)?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(())
    }

    /// Checks the image may take snapshot operations, locks it, and makes
    /// everything cached durable first.
    pub(super) fn begin_snapshot_op(&self) -> Result<MutexGuard<'_, State>, BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        if self.chain.header.has_data_file() {
            return Err(BlockError::Unsupported {
                path: self.chain.path.clone(),
                feature: "internal snapshots of an image with an external data file".into(),
            });
        }
        let mut st = self.lock();
        st.meta.flush_dirty()?;
        st.meta.barrier()?;
        Ok(st)
    }

    /// The entries of the snapshot table where it is now, and its length.
    fn current_table(&self, meta: &MetaState) -> Result<(Vec<SnapshotInfo>, u64), BlockError> {
        let file_size =
            crate::formats::raw::file_size(&meta.file).map_err(|source| BlockError::Open {
                path: meta.path.clone(),
                source,
            })?;
        read_snapshot_table(&*meta.io, meta.snapshots, file_size).map_err(|r| meta.invalid(r))
    }

    /// Applies `op` to every L2 table `l1` names and every cluster those
    /// tables map.
    pub(super) fn tree_references(
        &self,
        meta: &mut MetaState,
        l1: &[u64],
        op: TreeOp,
    ) -> Result<(), BlockError> {
        let cb = meta.g.cluster_bits;
        let max = max_refcount(meta.g.refcount_order);
        let apply = |meta: &mut MetaState, first: u64, count: u64| -> Result<(), BlockError> {
            match op {
                TreeOp::CheckRoom => {
                    for c in first..first + count {
                        if meta.refcount(c)? >= max {
                            return Err(meta.invalid(format!(
                                "cluster {c} cannot take another reference (refcount_bits allow {max})"
                            )));
                        }
                    }
                    Ok(())
                }
                TreeOp::Add => meta.change_refcounts(first, count, 1),
                TreeOp::Drop => meta.change_refcounts(first, count, -1),
            }
        };
        for &raw in l1 {
            let Some((off, _)) =
                decode_l1(raw, meta.g.cluster_size).map_err(|r| meta.invalid(r))?
            else {
                continue;
            };
            meta.check_table(off, "L2 table")?;
            let table = load_table(meta, off)?;
            let words = meta.g.l2_entry_size as usize / 8;
            for j in 0..meta.g.l2_entries as usize {
                let e = decode_l2(
                    be64_at(&table, j * words),
                    cb,
                    self.chain.header.version,
                    meta.g.extended_l2,
                )
                .map_err(|r| meta.invalid(r))?;
                if let Some((first, n)) = meta.g.references(e) {
                    apply(meta, first, n)?;
                }
            }
            apply(meta, off >> cb, 1)?;
            if op == TreeOp::Drop && meta.refcount(off >> cb)? == 0 {
                meta.l2_cache.remove(off);
            }
        }
        Ok(())
    }

    /// Sets OFLAG_COPIED in the active L1 and L2 entries exactly where
    /// the table or cluster has refcount one (compressed clusters never),
    /// and clears it elsewhere; rewrites the L2 tables that change (the
    /// caller writes the L1 table).
    fn restore_copied(&self, meta: &mut MetaState) -> Result<(), BlockError> {
        let cb = meta.g.cluster_bits;
        for i in 0..meta.l1.len() {
            let Some((off, _)) = meta.l2_table(i)? else {
                continue;
            };
            let owned_table = meta.refcount(off >> cb)? == 1;
            let table = load_table(meta, off)?;
            let mut new = table.clone();
            let words = meta.g.l2_entry_size as usize / 8;
            for j in 0..meta.g.l2_entries as usize {
                let raw = be64_at(&table, j * words);
                let e = decode_l2(raw, cb, self.chain.header.version, meta.g.extended_l2)
                    .map_err(|r| meta.invalid(r))?;
                let owned = match meta.g.references(e) {
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
                meta.write(MetaKind::L2Table, off, &new)?;
                meta.l2_cache.insert(off, new);
            }
            meta.l1[i] = if owned_table {
                meta.l1[i] | OFLAG_COPIED
            } else {
                meta.l1[i] & !OFLAG_COPIED
            };
        }
        Ok(())
    }
}

pub(super) fn load_table(meta: &mut MetaState, off: u64) -> Result<Vec<u8>, BlockError> {
    meta.load_l2(off)?;
    meta.l2_cache
        .get(off)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| meta.invalid("L2 cache lost a table"))
}

/// A snapshot's L1 entries, read from its table.
pub(super) fn read_l1(meta: &MetaState, sn: &SnapshotInfo) -> Result<Vec<u64>, BlockError> {
    let bytes = u64::from(sn.l1_size) * 8;
    if bytes > super::header::MAX_L1_BYTES {
        return Err(meta.invalid(format!(
            "snapshot {} has an L1 table of {} entries",
            sn.id, sn.l1_size
        )));
    }
    if sn.l1_size > 0 {
        meta.check_table(sn.l1_offset, "snapshot L1 table")?;
    }
    let mut buf = vec![0u8; bytes as usize];
    meta.read(MetaKind::SnapshotL1, sn.l1_offset, &mut buf)?;
    Ok((0..sn.l1_size as usize).map(|i| be64_at(&buf, i)).collect())
}

/// Writes the active L1 table (as `meta.l1` holds it) to its place.
pub(super) fn write_l1(meta: &mut MetaState) -> Result<(), BlockError> {
    meta.write_refcounts()?;
    let bytes: Vec<u8> = meta.l1.iter().flat_map(|e| e.to_be_bytes()).collect();
    meta.write(MetaKind::L1Table, meta.l1_offset, &bytes)
}

/// A copy of the active L1 table in new clusters; returns its offset.
fn copy_l1(meta: &mut MetaState) -> Result<u64, BlockError> {
    let bytes: Vec<u8> = meta.l1.iter().flat_map(|e| e.to_be_bytes()).collect();
    let clusters = (bytes.len() as u64).div_ceil(meta.g.cluster_size).max(1);
    let off = meta.alloc_clusters(clusters)?;
    let mut padded = bytes;
    padded.resize((clusters * meta.g.cluster_size) as usize, 0);
    meta.write(MetaKind::SnapshotL1, off, &padded)?;
    Ok(off)
}

/// Writes `entries` as the new snapshot table and points the header (and
/// `meta.snapshots`) at it (see the module docs for the order), then
/// frees the old table, `old_len` bytes long.
fn replace_table(
    meta: &mut MetaState,
    old_len: u64,
    entries: &[SnapshotInfo],
    disk_size: u64,
) -> Result<(), BlockError> {
    let cs = meta.g.cluster_size;
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
    let old = std::mem::replace(
        &mut meta.snapshots,
        TableLocation {
            count: entries.len() as u32,
            offset: new_off,
        },
    );
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

impl Snapshots for Qcow2Image {
    /// Adds snapshot `name` of the current disk; `date` is (seconds,
    /// nanoseconds) since the epoch.
    fn snapshot_create(&self, name: &str, date: (u32, u32)) -> Result<(), BlockError> {
        let mut st = self.begin_snapshot_op()?;
        let meta = &mut st.meta;
        let (mut entries, old_len) = self.current_table(meta)?;
        if name.len() > u16::MAX as usize {
            return Err(meta.invalid("snapshot name too long"));
        }
        let active = meta.l1.clone();
        // A cluster reached twice (several compressed clusters in one host
        // cluster) can still overflow below; that leaks, nothing worse.
        self.tree_references(meta, &active, TreeOp::CheckRoom)?;
        self.tree_references(meta, &active, TreeOp::Add)?;
        meta.barrier()?;
        // Every refcount is now at least two: this clears OFLAG_COPIED.
        self.restore_copied(meta)?;
        let l1_copy = copy_l1(meta)?;
        write_l1(meta)?;
        let id = entries
            .iter()
            .filter_map(|e| e.id.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        entries.push(SnapshotInfo {
            id: id.to_string(),
            name: name.to_string(),
            l1_offset: l1_copy,
            l1_size: meta.l1.len() as u32,
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
    fn snapshot_delete(&self, name: &str) -> Result<bool, BlockError> {
        let mut st = self.begin_snapshot_op()?;
        let meta = &mut st.meta;
        let (mut entries, old_len) = self.current_table(meta)?;
        let Some(at) = entries.iter().position(|e| e.name == name) else {
            return Ok(false);
        };
        let gone = entries.remove(at);
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        replace_table(meta, old_len, &entries, size)?;
        let gone_l1 = read_l1(meta, &gone)?;
        self.tree_references(meta, &gone_l1, TreeOp::Drop)?;
        if gone.l1_size > 0 {
            let clusters = (u64::from(gone.l1_size) * 8).div_ceil(meta.g.cluster_size);
            meta.change_refcounts(gone.l1_offset >> meta.g.cluster_bits, clusters, -1)?;
        }
        self.restore_copied(meta)?;
        write_l1(meta)?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(true)
    }

    /// Makes the snapshot with id or name `name` the active disk.
    /// `Ok(false)`: there is none.
    fn snapshot_apply(&self, name: &str) -> Result<bool, BlockError> {
        let mut st = self.begin_snapshot_op()?;
        let meta = &mut st.meta;
        let (entries, _) = self.current_table(meta)?;
        let Some(sn) = entries
            .iter()
            .find(|e| e.id == name)
            .or_else(|| entries.iter().find(|e| e.name == name))
        else {
            return Ok(false);
        };
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        // A snapshot taken at another size brings its size back (as
        // qemu-img does); one without a recorded size keeps the current.
        let new_size = sn.disk_size.unwrap_or(size);
        let sn_l1 = read_l1(meta, sn)?;
        if new_size != size {
            let covered = (sn_l1.len() as u64).saturating_mul(meta.g.l2_coverage());
            if !new_size.is_multiple_of(512) || new_size > covered {
                return Err(meta.invalid(format!(
                    "snapshot {} has a disk size of {new_size} bytes that its L1 table of {} entries does not fit",
                    sn.id,
                    sn_l1.len()
                )));
            }
            if self.chain.header.has_data_file() || self.chain.header.version < 3 {
                // qemu-img cannot resize these either.
                return Err(BlockError::Unsupported {
                    path: self.chain.path.clone(),
                    feature: "applying a snapshot taken at another disk size to a version 2 \
                              image or one with a data file"
                        .into(),
                });
            }
        }
        self.tree_references(meta, &sn_l1, TreeOp::CheckRoom)?;
        self.tree_references(meta, &sn_l1, TreeOp::Add)?;
        meta.barrier()?;
        meta.grow_l1(sn_l1.len())?;
        let old = meta.l1.clone();
        for (i, e) in meta.l1.iter_mut().enumerate() {
            *e = sn_l1.get(i).copied().unwrap_or(0) & !OFLAG_COPIED;
        }
        write_l1(meta)?;
        meta.barrier()?;
        self.tree_references(meta, &old, TreeOp::Drop)?;
        self.restore_copied(meta)?;
        write_l1(meta)?;
        if new_size != size {
            // Last: the L1 table already maps the snapshot's whole disk.
            meta.write_disk_size(new_size)?;
            self.size
                .store(new_size, std::sync::atomic::Ordering::Release);
        }
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(true)
    }
}
