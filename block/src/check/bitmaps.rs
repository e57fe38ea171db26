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
use crate::formats::qcow2::meta_io::{be64_at, read_at};

const EXT_BITMAPS: u32 = 0x2385_2875;
const AUTOCLEAR_BITMAPS: u64 = 1;
/// qemu's limits for the bitmaps extension.
const MAX_BITMAPS: u32 = 65535;
const MAX_DIRECTORY: u64 = 64 << 20;
/// A bitmap table may not be larger than this many entries (qemu: 1 << 26).
const MAX_TABLE_ENTRIES: u64 = 1 << 26;
const ENTRY_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

fn be32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

/// Where the bitmap directory is: (entries, offset, size), if the image
/// has a consistent bitmaps extension.
fn find_extension(w: &Walker<'_>) -> Result<Option<(u32, u64, u64)>, BlockError> {
    let h = w.header;
    if h.version < 3 || h.autoclear & AUTOCLEAR_BITMAPS == 0 {
        return Ok(None);
    }
    let mut first = vec![0u8; h.cluster_size().min(w.file_size) as usize];
    read_at(w.file, 0, &mut first, "header extensions")?;
    let mut off = h.header_length as usize;
    while let (Some(ty), Some(len)) = (be32(&first, off), be32(&first, off + 4)) {
        let data = off + 8;
        if ty == 0 {
            break;
        }
        if ty == EXT_BITMAPS {
            let ext = first.get(data..data + len as usize).unwrap_or(&[]);
            return Ok(match (be32(ext, 0), be64(ext, 8), be64(ext, 16)) {
                (Some(n), Some(size), Some(offset)) => Some((n, offset, size)),
                _ => None,
            });
        }
        off = data + (len as usize).div_ceil(8) * 8;
    }
    Ok(None)
}

/// Counts the references of every persistent bitmap.
pub(super) fn walk_bitmaps(w: &mut Walker<'_>) -> Result<(), BlockError> {
    let Some((count, dir_offset, dir_size)) = find_extension(w)? else {
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
    read_at(w.file, dir_offset, &mut dir, "bitmap directory")?;
    let mut pos = 0usize;
    for n in 0..count {
        let entry = (
            be64(&dir, pos),
            be32(&dir, pos + 8),
            be16(&dir, pos + 18),
            be32(&dir, pos + 20),
        );
        let (Some(table), Some(size), Some(name_len), Some(extra)) = entry else {
            w.findings.corruptions += 1;
            w.findings
                .messages
                .push(format!("ERROR: bitmap directory entry {n} is truncated"));
            return Ok(());
        };
        pos += (24 + extra as usize + usize::from(name_len)).div_ceil(8) * 8;
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
        read_at(w.file, table, &mut t, "bitmap table")?;
        for i in 0..size as usize {
            let data = be64_at(&t, i) & ENTRY_OFFSET_MASK;
            if data != 0 {
                w.refs.add(data, cs, &mut w.findings);
            }
        }
    }
    Ok(())
}
