//! Reading an image as one of its internal snapshots (`ch-img convert
//! -l`, qemu-img's `bdrv_snapshot_load_tmp`).
//!
//! A read-only open with [`crate::DiskOptions::snapshot`] set enters
//! after the image's tables are loaded (`view_snapshot`); the snapshot
//! is looked up in the table ([`find`]), its L1 table read and checked,
//! and the image then maps the snapshot's tree in place of the active one
//! and has the snapshot's disk size. Nothing is written: the open is
//! read-only, and the snapshot's tables are only read.

use std::sync::atomic::{AtomicU64, Ordering};

use super::tree::read_l1;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::on_disk::snapshot_table::{read_snapshot_table, SnapshotInfo};
pub use crate::options::SnapshotRef;

/// The snapshot of `entries` that `which` names, if there is one.
pub fn find<'a>(which: &SnapshotRef, entries: &'a [SnapshotInfo]) -> Option<&'a SnapshotInfo> {
    match which {
        SnapshotRef::IdOrName(s) => entries
            .iter()
            .find(|e| &e.id == s)
            .or_else(|| entries.iter().find(|e| &e.name == s)),
        SnapshotRef::Fields { id, name } => entries.iter().find(|e| {
            id.as_ref().is_none_or(|id| &e.id == id) && name.as_ref().is_none_or(|n| &e.name == n)
        }),
    }
}

/// Makes the tables `meta` of a read-only image, whose disk size is
/// `size`, read as snapshot `which`.
pub(crate) fn view_snapshot(
    meta: &mut MetaState,
    size: &AtomicU64,
    which: &SnapshotRef,
) -> Result<(), BlockError> {
    let (entries, _) = read_snapshot_table(meta.io(), meta.snapshot_table(), meta.file_size())
        .map_err(|r| meta.invalid(r))?;
    let Some(sn) = find(which, &entries) else {
        return Err(BlockError::NoSuchSnapshot {
            path: meta.path().to_path_buf(),
        });
    };
    let l1 = read_l1(meta, sn)?;
    let disk = sn.disk_size.unwrap_or(size.load(Ordering::Acquire));
    let covered = (l1.len() as u64).saturating_mul(meta.geometry().l2_coverage());
    if disk > covered {
        return Err(meta.invalid(format!(
            "snapshot {} has a disk of {disk} bytes but an L1 table of {} entries",
            sn.id,
            l1.len()
        )));
    }
    meta.view_tree(l1, sn.l1_offset);
    size.store(disk, Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, name: &str) -> SnapshotInfo {
        SnapshotInfo {
            id: id.into(),
            name: name.into(),
            l1_offset: 0,
            l1_size: 0,
            date_sec: 0,
            date_nsec: 0,
            vm_clock_nsec: 0,
            vm_state_size: 0,
            disk_size: None,
            icount: None,
        }
    }

    #[test]
    fn ids_come_before_names_and_fields_must_all_match() {
        let entries = [entry("1", "2"), entry("2", "a"), entry("3", "a")];
        let find = |r: SnapshotRef| find(&r, &entries).map(|e| e.id.clone());
        assert_eq!(find(SnapshotRef::IdOrName("2".into())), Some("2".into()));
        assert_eq!(find(SnapshotRef::IdOrName("a".into())), Some("2".into()));
        let fields = |id: Option<&str>, name: Option<&str>| SnapshotRef::Fields {
            id: id.map(String::from),
            name: name.map(String::from),
        };
        assert_eq!(find(fields(None, Some("2"))), Some("1".into()));
        assert_eq!(find(fields(Some("3"), Some("a"))), Some("3".into()));
        assert_eq!(find(fields(Some("1"), Some("a"))), None);
        assert_eq!(find(SnapshotRef::IdOrName("b".into())), None);
    }
}
