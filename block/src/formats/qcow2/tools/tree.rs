//! Walking an L1 tree (the active one or a snapshot's) and the tables it
//! names: the reference every L2 table and cluster of a tree holds
//! ([`tree_references`]), reading an L2 table or a snapshot's L1 table,
//! writing the active L1 table, and the start every operation that
//! changes whole trees shares ([`begin_tree_op`]).
//!
//! Snapshots, shrinking, emptying the disk (`commit`) and the version
//! downgrade's zero-cluster expansion call in here with the image's
//! locked tables; tables come from the L2 cache or the file, through the
//! metadata-I/O seam.

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{be64_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::decode_l1;
use crate::formats::qcow2::on_disk::refcount::max_refcount;
use crate::formats::qcow2::on_disk::snapshot_table::SnapshotInfo;

/// What [`tree_references`] does to every cluster of a tree.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TreeOp {
    /// Fail if any could not take one more reference; change nothing.
    CheckRoom,
    Add,
    Drop,
}

/// The start of an operation that changes whole trees (snapshots,
/// emptying the disk): refused for an image with an external data file
/// (qemu has no internal snapshots there), and everything cached made
/// durable first.
pub(crate) fn begin_tree_op(meta: &mut MetaState) -> Result<(), BlockError> {
    if meta.geometry().data_file {
        return Err(BlockError::Unsupported {
            path: meta.path().to_path_buf(),
            feature: "internal snapshots of an image with an external data file".into(),
        });
    }
    meta.flush_dirty()?;
    meta.barrier()
}

/// Applies `op` to every L2 table `l1` names and every cluster those
/// tables map.
pub(crate) fn tree_references(
    meta: &mut MetaState,
    l1: &[u64],
    op: TreeOp,
) -> Result<(), BlockError> {
    let cb = meta.geometry().cluster_bits;
    let max = max_refcount(meta.geometry().refcount_order);
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
            decode_l1(raw, meta.geometry().cluster_size).map_err(|r| meta.invalid(r))?
        else {
            continue;
        };
        meta.check_table(off, "L2 table")?;
        let table = load_table(meta, off)?;
        let words = meta.geometry().l2_entry_size as usize / 8;
        for j in 0..meta.geometry().l2_entries as usize {
            let e = meta.decode_l2(be64_at(&table, j * words))?;
            if let Some((first, n)) = meta.geometry().references(e) {
                apply(meta, first, n)?;
            }
        }
        apply(meta, off >> cb, 1)?;
        if op == TreeOp::Drop && meta.refcount(off >> cb)? == 0 {
            meta.forget_l2_table(off);
        }
    }
    Ok(())
}

pub(crate) fn load_table(meta: &mut MetaState, off: u64) -> Result<Vec<u8>, BlockError> {
    meta.load_l2(off)?;
    meta.cached_l2_table(off)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| meta.invalid("L2 cache lost a table"))
}

/// A snapshot's L1 entries, read from its table.
pub(crate) fn read_l1(meta: &MetaState, sn: &SnapshotInfo) -> Result<Vec<u64>, BlockError> {
    let bytes = u64::from(sn.l1_size) * 8;
    if bytes > crate::formats::qcow2::on_disk::layout::MAX_L1_BYTES {
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
