//! The persistent dirty bitmaps a qcow2 v3 image lists: the bitmaps
//! header extension and the bitmap directory it points at.
//!
//! The image's first cluster enters [`find_extension`] (where the
//! directory is); the directory's bytes enter [`parse_directory`] (one
//! [`BitmapEntry`] per bitmap). `check` follows the entries' tables to
//! count references; `ch-img measure` sizes a copy of them
//! ([`persistent_bitmaps`]). The block layer itself does not maintain
//! bitmaps: like qemu, a bitmap only counts while the header's "bitmaps"
//! autoclear bit says the extension is consistent, and a read-write open
//! clears that bit.

use std::fs::File;
use std::path::Path;

use super::features::AUTOCLEAR_BITMAPS;
use super::header::Header;
use super::image::read_header;
use super::meta_io::{read_at, MetaKind};
use crate::error::BlockError;

/// The bitmaps header extension's type.
pub const EXT_BITMAPS: u32 = 0x2385_2875;
/// qemu's limits for the bitmaps extension.
pub const MAX_BITMAPS: u32 = 65535;
pub const MAX_DIRECTORY: u64 = 64 << 20;
/// Fixed fields of a directory entry, before its extra data and name.
const ENTRY_HEADER: usize = 24;

/// Flag bits of a directory entry.
pub const FLAG_IN_USE: u32 = 1;
pub const FLAG_AUTO: u32 = 2;

/// One bitmap of the directory (the fields the tools use).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapEntry {
    /// Where the bitmap table is.
    pub table_offset: u64,
    /// Entries of the bitmap table.
    pub table_entries: u32,
    /// [`FLAG_IN_USE`], [`FLAG_AUTO`] and reserved bits.
    pub flags: u32,
    /// One bit covers `1 << granularity_bits` bytes of the disk.
    pub granularity_bits: u8,
    /// Bytes of the bitmap's name.
    pub name_len: u16,
    /// The bitmap's type (1: dirty tracking, the only one defined).
    pub bitmap_type: u8,
    /// Bytes of extra data before the name.
    pub extra_data_size: u32,
    /// The name (invalid UTF-8 replaced).
    pub name: String,
}

impl BitmapEntry {
    /// The flags as qemu-img names them, in bit order.
    pub fn flag_names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.flags & FLAG_IN_USE != 0 {
            names.push("in-use");
        }
        if self.flags & FLAG_AUTO != 0 {
            names.push("auto");
        }
        names
    }
}

/// Where the directory is: (bitmaps, directory size, directory offset)
/// from the extension area of the image's first cluster, which starts at
/// `header_length`. `None` without a (complete) bitmaps extension.
pub fn find_extension(first: &[u8], header_length: usize) -> Option<(u32, u64, u64)> {
    let mut at = header_length;
    loop {
        let (kind, len) = (be32(first, at)?, be32(first, at + 4)? as usize);
        let data = at + 8;
        match kind {
            0 => return None,
            EXT_BITMAPS => {
                let ext = first.get(data..data + len)?;
                return Some((be32(ext, 0)?, be64(ext, 8)?, be64(ext, 16)?));
            }
            _ => at = data + len.next_multiple_of(8),
        }
    }
}

/// Where the directory is, (bitmaps, size, offset), when `header` says the
/// bitmaps extension is consistent and the image's first cluster holds
/// one; `None` for a v2 image, a cleared autoclear bit or no extension.
pub(crate) fn locate_directory(
    file: &File,
    header: &Header,
    file_size: u64,
) -> Result<Option<(u32, u64, u64)>, BlockError> {
    if header.version < 3 || header.autoclear & AUTOCLEAR_BITMAPS == 0 {
        return Ok(None);
    }
    let mut first = vec![0u8; header.cluster_size().min(file_size) as usize];
    read_at(file, MetaKind::Header, 0, &mut first)?;
    Ok(find_extension(&first, header.header_length as usize))
}

/// The first `count` entries of a directory, and the index of the entry
/// that runs past its end, if one does (the entries before it are
/// returned).
pub fn parse_directory(dir: &[u8], count: u32) -> (Vec<BitmapEntry>, Option<u32>) {
    let mut out = Vec::new();
    let mut at = 0usize;
    for n in 0..count {
        let fields = (
            be64(dir, at),
            be32(dir, at + 8),
            be32(dir, at + 12),
            dir.get(at + 16).copied(),
            dir.get(at + 17).copied(),
            be16(dir, at + 18),
            be32(dir, at + 20),
        );
        let (
            Some(table_offset),
            Some(table_entries),
            Some(flags),
            Some(bitmap_type),
            Some(granularity_bits),
            Some(name_len),
            Some(extra),
        ) = fields
        else {
            return (out, Some(n));
        };
        let name_at = at + ENTRY_HEADER + extra as usize;
        let len = (ENTRY_HEADER + extra as usize + usize::from(name_len)).next_multiple_of(8);
        let Some(name) = dir.get(name_at..name_at + usize::from(name_len)) else {
            return (out, Some(n));
        };
        if dir.len() < at + len {
            return (out, Some(n));
        }
        out.push(BitmapEntry {
            table_offset,
            table_entries,
            flags,
            granularity_bits,
            name_len,
            bitmap_type,
            extra_data_size: extra,
            name: String::from_utf8_lossy(name).into_owned(),
        });
        at += len;
    }
    (out, None)
}

/// The persistent bitmaps of the qcow2 image at `path`, in directory
/// order: none for a v2 image, one without the extension or one whose
/// autoclear bit says the bitmaps are inconsistent; an error for a
/// directory beyond qemu's limits or one that is cut short.
pub fn persistent_bitmaps(path: &Path) -> Result<Vec<BitmapEntry>, BlockError> {
    let file = File::open(path).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    bitmaps_in(&file, path)
}

/// [`persistent_bitmaps`] of an open image file (`path` names it in
/// errors). The header is read again: a read-write open clears the
/// autoclear bit after the header was parsed.
pub(crate) fn bitmaps_in(file: &File, path: &Path) -> Result<Vec<BitmapEntry>, BlockError> {
    let (header, file_size) = read_header(file, path)?;
    let Some((count, dir_size, dir_offset)) = locate_directory(file, &header, file_size)? else {
        return Ok(Vec::new());
    };
    let corrupt = |reason: String| BlockError::InvalidImage {
        path: path.to_owned(),
        reason,
    };
    if count > MAX_BITMAPS || dir_size > MAX_DIRECTORY {
        return Err(corrupt(format!(
            "bitmap directory of {count} bitmaps and {dir_size} bytes is beyond the limits"
        )));
    }
    let mut dir = vec![0u8; dir_size as usize];
    read_at(file, MetaKind::BitmapDirectory, dir_offset, &mut dir)?;
    match parse_directory(&dir, count) {
        (entries, None) => Ok(entries),
        (_, Some(n)) => Err(corrupt(format!("bitmap directory entry {n} is truncated"))),
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, granularity_bits: u8, extra: usize) -> Vec<u8> {
        let mut e = vec![0u8; ENTRY_HEADER];
        e[0..8].copy_from_slice(&0x5_0000u64.to_be_bytes());
        e[8..12].copy_from_slice(&3u32.to_be_bytes());
        e[12..16].copy_from_slice(&FLAG_AUTO.to_be_bytes());
        e[16] = 1;
        e[17] = granularity_bits;
        e[18..20].copy_from_slice(&(name.len() as u16).to_be_bytes());
        e[20..24].copy_from_slice(&(extra as u32).to_be_bytes());
        e.extend(std::iter::repeat_n(0, extra));
        e.extend_from_slice(name.as_bytes());
        e.resize(e.len().next_multiple_of(8), 0);
        e
    }

    #[test]
    fn directory_entries_and_where_one_is_cut_short() {
        let mut dir = entry("b1", 16, 0);
        dir.extend(entry("a-longer-name", 9, 4));
        let want = |name: &str, granularity_bits, extra_data_size| BitmapEntry {
            table_offset: 0x5_0000,
            table_entries: 3,
            flags: FLAG_AUTO,
            granularity_bits,
            name_len: name.len() as u16,
            bitmap_type: 1,
            extra_data_size,
            name: name.into(),
        };
        let (b1, long) = (want("b1", 16, 0), want("a-longer-name", 9, 4));
        assert_eq!(parse_directory(&dir, 2), (vec![b1.clone(), long], None));
        assert_eq!(b1.flag_names(), ["auto"]);
        // The second entry's name runs past a directory shorter than the
        // count says: the first is still returned.
        assert_eq!(
            parse_directory(&dir[..dir.len() - 8], 2),
            (vec![b1], Some(1))
        );
        assert_eq!(parse_directory(&dir[..10], 1), (vec![], Some(0)));
    }

    #[test]
    fn extension_is_found_after_others_and_not_after_the_end() {
        let mut first = vec![0u8; 16];
        // An unknown 5-byte extension, padded to 8.
        first.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        first.extend_from_slice(&5u32.to_be_bytes());
        first.extend_from_slice(&[0; 8]);
        first.extend_from_slice(&EXT_BITMAPS.to_be_bytes());
        first.extend_from_slice(&24u32.to_be_bytes());
        first.extend_from_slice(&3u32.to_be_bytes());
        first.extend_from_slice(&[0; 4]);
        first.extend_from_slice(&96u64.to_be_bytes());
        first.extend_from_slice(&0x30000u64.to_be_bytes());
        assert_eq!(find_extension(&first, 16), Some((3, 96, 0x30000)));
        let mut ended = vec![0u8; 24];
        ended.extend_from_slice(&first[16..]);
        assert_eq!(find_extension(&ended, 16), None);
        // A length running past the cluster: no extension, no panic.
        let mut long = first.clone();
        long[36..40].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(find_extension(&long, 16), None);
    }
}
