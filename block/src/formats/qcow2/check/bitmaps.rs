//! References held by persistent dirty bitmaps (the qcow2 bitmaps header
//! extension): the bitmap directory, each bitmap table and each bitmap
//! data cluster.
//!
//! The image's first cluster (extensions) and file enter; references are
//! added to the [`Walker`]'s counts and malformed structures become
//! findings. Like qemu, the extension only counts while the "bitmaps"
//! autoclear bit says it is consistent; otherwise its clusters are leaks.

use super::references::Walker;
use crate::error::BlockError;
use crate::formats::qcow2::bitmap_directory::{
    locate_directory, parse_directory, MAX_BITMAPS, MAX_DIRECTORY,
};
use crate::formats::qcow2::meta_io::{be64_at, read_at, MetaKind};

/// A bitmap table may not be larger than this many entries (qemu: 1 << 26).
const MAX_TABLE_ENTRIES: u64 = 1 << 26;
const ENTRY_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// Counts the references of every persistent bitmap.
pub(super) fn walk_bitmaps(w: &mut Walker<'_>) -> Result<(), BlockError> {
    let Some((count, dir_size, dir_offset)) = locate_directory(w.file, w.header, w.file_size)?
    else {
        return Ok(());
    };
    let cs = w.header.cluster_size();
    if count > MAX_BITMAPS
        || dir_size > MAX_DIRECTORY
        || !dir_offset.is_multiple_of(cs)
        || dir_offset
            .checked_add(dir_size)
            .is_none_or(|e| e > w.file_size)
    {
        w.findings.corruptions += 1;
        w.findings.messages.push(format!(
            "ERROR: bitmap directory ({count} bitmaps, {dir_size} bytes at {dir_offset:#x}) is invalid"
        ));
        return Ok(());
    }
    w.refs.add(dir_offset, dir_size, &mut w.findings);
    let mut dir = vec![0u8; dir_size as usize];
    read_at(w.file, MetaKind::BitmapDirectory, dir_offset, &mut dir)?;
    let (entries, cut) = parse_directory(&dir, count);
    if let Some(n) = cut {
        w.findings.corruptions += 1;
        w.findings
            .messages
            .push(format!("ERROR: bitmap directory entry {n} is truncated"));
    }
    for (n, e) in entries.iter().enumerate() {
        let (table, size) = (e.table_offset, e.table_entries);
        let bytes = u64::from(size) * 8;
        if u64::from(size) > MAX_TABLE_ENTRIES
            || !table.is_multiple_of(cs)
            || table.checked_add(bytes).is_none_or(|e| e > w.file_size)
        {
            w.findings.corruptions += 1;
            w.findings.messages.push(format!(
                "ERROR: bitmap {n} has an invalid table at {table:#x}"
            ));
            continue;
        }
        w.refs.add(table, bytes, &mut w.findings);
        let mut t = vec![0u8; bytes as usize];
        read_at(w.file, MetaKind::BitmapDirectory, table, &mut t)?;
        for i in 0..size as usize {
            let data = be64_at(&t, i) & ENTRY_OFFSET_MASK;
            if data != 0 {
                w.refs.add(data, cs, &mut w.findings);
            }
        }
    }
    Ok(())
}
