//! `check -r all` when counting is not enough: new refcount structures
//! built from scratch when a refcount block or the table is lost or
//! unusable, dropping a snapshot table that cannot be read, and
//! rewriting one whose entries lack version 3's extra data (what
//! qemu-img's repair does in these cases).
//!
//! The references the check counted (every reachable structure but the
//! old refcount table and blocks) enter; a fresh refcount table and
//! blocks are written at the end of the file and synced, and only then
//! does the header point at them (so a crash in between leaves the old,
//! still damaged, structures in place: nothing worse).

use std::fs::File;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{sync, write_at, MetaIo, MetaKind};
use crate::formats::qcow2::on_disk::header::{
    clear_unknown_autoclear, read_header, read_header_with, Header, OFF_REFTABLE,
};
use crate::formats::qcow2::on_disk::refcount::max_refcount;
use crate::formats::qcow2::tools::refcount_layout::RefcountLayout;
use crate::formats::qcow2::tools::snapshot_ops::Snapshotter;

/// Header fields nb_snapshots (u32 at 60) and snapshots_offset (u64 at 64).
const OFF_SNAPSHOT_FIELDS: u64 = 60;

/// Writes new refcount blocks and a new table after everything in the
/// file, holding `references[c]` for each cluster `c` (and 1 for
/// themselves), then switches the header to them.
pub(super) fn rebuild_refcounts(
    file: &File,
    header: &Header,
    references: &[u32],
    file_size: u64,
    messages: &mut Vec<String>,
) -> Result<(), BlockError> {
    messages.push("Rebuilding refcount structure".into());
    let cs = header.cluster_size();
    let order = header.refcount_order;
    let max = max_refcount(order);
    let used = references
        .iter()
        .rposition(|r| *r > 0)
        .map_or(1, |i| i as u64 + 1);
    // New structures start after every cluster of the file.
    let start = file_size.div_ceil(cs).max(used);
    for (c, count) in references.iter().enumerate() {
        if u64::from(*count) > max {
            messages.push(format!(
                "ERROR cluster {c} has {count} references, more than refcount_order {order} can store"
            ));
        }
    }
    let layout = RefcountLayout::fit(start, header.cluster_bits, order)?;
    let mut count = |c: u64| {
        Ok(references
            .get(c as usize)
            .map_or(0, |r| u64::from(*r).min(max)))
    };
    layout.write(file, &mut count, &mut |_, _| {})?;
    sync(file)?;
    let table_at = layout.table_offset();
    let table = layout.table_clusters;
    let mut fields = [0u8; 12];
    fields[..8].copy_from_slice(&table_at.to_be_bytes());
    fields[8..].copy_from_slice(&(table as u32).to_be_bytes());
    write_at(file, MetaKind::Header, OFF_REFTABLE, &fields)?;
    sync(file)
}

/// Forgets every internal snapshot (their clusters become leaks, which
/// the next repair pass frees), as qemu-img does with a table it cannot
/// read.
pub(super) fn drop_snapshot_table(
    file: &File,
    messages: &mut Vec<String>,
) -> Result<(), BlockError> {
    messages.push("Discarding the unreadable snapshot table".into());
    write_at(file, MetaKind::Header, OFF_SNAPSHOT_FIELDS, &[0u8; 12])?;
    sync(file)
}

/// Rewrites the snapshot table (entries get qemu's full extra data)
/// once the image is otherwise usable: not dirty, not marked corrupt.
/// Returns whether it did. The image is opened the way a read-write open
/// would find it (unknown autoclear bits cleared; refused with an
/// external data file, as snapshots are), but only its tables are loaded:
/// the snapshot table is all this changes.
pub(super) fn rewrite_snapshot_table(
    path: &Path,
    messages: &mut Vec<String>,
) -> Result<bool, BlockError> {
    let file = File::open(path).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    let (header, _) = read_header_with(&file, path, false)?;
    if header.dirty() || header.corrupt() {
        messages
            .push("Leaving the incomplete snapshot table: the image is not yet consistent".into());
        return Ok(false);
    }
    messages.push("Repairing the snapshot table (entries without version 3's extra data)".into());
    let file = super::image_file::open_image(path, true)?;
    let (mut header, file_size) = read_header(&file, path)?;
    clear_unknown_autoclear(&file, path, &mut header, false)?;
    let file = Arc::new(file);
    let io = Arc::clone(&file) as Arc<dyn MetaIo>;
    let mut meta = MetaState::load(&header, file, io, path.to_owned(), file_size)?;
    let size = AtomicU64::new(header.size);
    Snapshotter::begin(&mut meta, &size)?.rewrite_table()?;
    meta.flush_dirty()?;
    meta.trim_reserve()?;
    Ok(true)
}
