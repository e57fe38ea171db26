//! The persistent dirty bitmaps a qcow2 v3 image lists: the bitmap
//! directory the bitmaps header extension points at (parsed with the
//! header, `header::bitmaps`), validated as qemu validates it when it
//! opens an image.
//!
//! The directory's bytes enter [`load_directory`] when the image is opened or checked (every entry
//! against qemu's constraints, every bitmap table's entries, as qemu's
//! `qcow2_load_dirty_bitmaps`). One [`BitmapEntry`] per bitmap leaves.
//! Errors are qemu's words, so `ch-img` refuses what `qemu-img` refuses.
//!
//! Everything read is bounded by the file, not by the counts the image
//! claims: the directory (at most 64 MiB, qemu's limit) and every table
//! must lie inside the file, and the tables together may not be larger
//! than the file (tables of a real image never overlap), so a hostile
//! image costs at most a few reads of its own size.
//!
//! `check` counts the entries' references; `info` lists them
//! ([`bitmaps_in`]), and `ch-img measure` sizes a copy of them from that
//! list. The block layer itself does not
//! maintain bitmaps: like qemu, a bitmap only counts while the autoclear
//! bit is set, and a read-write open clears that bit.

use std::path::Path;

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::{be64_at, read_at, MetaIo, MetaKind};
use crate::formats::qcow2::on_disk::header::bitmaps::BitmapsExtension;
pub use crate::formats::qcow2::on_disk::header::bitmaps::{
    EXT_BITMAPS, MAX_BITMAPS, MAX_DIRECTORY,
};
use crate::formats::qcow2::on_disk::header::{read_header_in, Header};
use crate::formats::qcow2::on_disk::layout::BitmapShape;

/// Fixed fields of a directory entry, before its extra data and name.
const ENTRY_HEADER: usize = 24;
/// qemu's constraints on one directory entry (`qcow2-bitmap.c`).
const MAX_TABLE_ENTRIES: u32 = 0x800_0000;
const MAX_PHYS_BYTES: u64 = 0x2000_0000;
const GRANULARITY_BITS: std::ops::RangeInclusive<u8> = 9..=31;
const MAX_NAME: u16 = 1023;
const TYPE_DIRTY_TRACKING: u8 = 1;
const RESERVED_FLAGS: u32 = 0xffff_fffc;
/// Bitmap table entries: reserved bits, the data cluster's offset.
const TABLE_RESERVED: u64 = 0xff00_0000_0000_01fe;
pub(crate) const TABLE_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const TABLE_ALL_ONES: u64 = 1;

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
    /// The bitmap's type (1: dirty tracking, the only one qemu knows).
    pub bitmap_type: u8,
    /// Bytes of extra data before the name (0: qemu refuses others).
    pub extra_data_size: u32,
    /// The name (invalid UTF-8 replaced).
    pub name: String,
}

impl BitmapEntry {
    /// What `qcow2::on_disk::layout` needs to size a copy of this bitmap.
    pub fn shape(&self) -> BitmapShape {
        BitmapShape {
            granularity_bits: self.granularity_bits,
            name_len: self.name_len,
        }
    }
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

/// What [`load_directory`] needs to know about the image.
pub(crate) struct ImageFacts {
    pub cluster_size: u64,
    pub disk_size: u64,
    pub file_size: u64,
}

/// Reads the directory `ext` points at and checks it as qemu does when
/// it loads the bitmaps: every entry's fields, the entry count, and the
/// tables of the bitmaps not marked in use (each entry's reserved bits
/// and alignment, and the table's size for the disk). The error names
/// the problem in qemu's words.
pub(crate) fn load_directory(
    io: &dyn MetaIo,
    ext: &BitmapsExtension,
    image: &ImageFacts,
) -> Result<Vec<BitmapEntry>, String> {
    if ext.dir_size == 0 {
        return Err("Requested bitmap directory size is zero".into());
    }
    if ext
        .dir_offset
        .checked_add(ext.dir_size)
        .is_none_or(|end| end > image.file_size)
    {
        return Err("bitmap directory lies outside the file".into());
    }
    let mut dir = vec![0u8; ext.dir_size as usize];
    read_at(io, MetaKind::BitmapDirectory, ext.dir_offset, &mut dir)
        .map_err(|e| format!("Failed to read bitmap directory: {e}"))?;
    let entries = parse_entries(&dir, ext.count, image)?;
    let table_bytes: u64 = entries.iter().map(|e| u64::from(e.table_entries) * 8).sum();
    if table_bytes > image.file_size {
        return Err("the bitmap tables together are larger than the file".into());
    }
    for e in entries.iter().filter(|e| e.flags & FLAG_IN_USE == 0) {
        check_table(io, e, image)?;
    }
    Ok(entries)
}

/// The directory's entries, each checked (qemu's `bitmap_list_load` and
/// `check_dir_entry`).
pub(crate) fn parse_entries(
    dir: &[u8],
    count: u32,
    image: &ImageFacts,
) -> Result<Vec<BitmapEntry>, String> {
    const BROKEN: &str = "Broken bitmap directory";
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < dir.len() {
        let Some(fixed) = dir.get(at..at + ENTRY_HEADER) else {
            return Err(BROKEN.into());
        };
        if out.len() as u32 >= count {
            return Err("More bitmaps found than specified in header extension".into());
        }
        let (name_len, extra) = (be16(fixed, 18), be32(fixed, 20));
        let len =
            (ENTRY_HEADER as u64 + u64::from(extra) + u64::from(name_len)).next_multiple_of(8);
        if at as u64 + len > dir.len() as u64 {
            return Err(BROKEN.into());
        }
        if extra != 0 {
            return Err("Bitmap extra data is not supported".into());
        }
        let name = &dir[at + ENTRY_HEADER..at + ENTRY_HEADER + usize::from(name_len)];
        let entry = BitmapEntry {
            table_offset: be64_at(fixed, 0),
            table_entries: be32(fixed, 8),
            flags: be32(fixed, 12),
            granularity_bits: fixed[17],
            name_len,
            bitmap_type: fixed[16],
            extra_data_size: extra,
            name: String::from_utf8_lossy(name).into_owned(),
        };
        if !satisfies_constraints(&entry, fixed[16], image) {
            return Err(format!(
                "Bitmap '{}' doesn't satisfy the constraints",
                entry.name
            ));
        }
        out.push(entry);
        at += len as usize;
    }
    if out.len() as u32 != count {
        return Err("Less bitmaps found than specified in header extension".into());
    }
    Ok(out)
}

/// qemu's `check_dir_entry`, plus: the table lies inside the file.
fn satisfies_constraints(e: &BitmapEntry, kind: u8, image: &ImageFacts) -> bool {
    let cs = image.cluster_size;
    let table_end = e.table_offset.checked_add(u64::from(e.table_entries) * 8);
    let basic = e.table_entries != 0
        && e.table_offset != 0
        && e.table_offset.is_multiple_of(cs)
        && e.table_entries <= MAX_TABLE_ENTRIES
        && GRANULARITY_BITS.contains(&e.granularity_bits)
        && e.flags & RESERVED_FLAGS == 0
        && e.name_len <= MAX_NAME
        && kind == TYPE_DIRTY_TRACKING
        && table_end.is_some_and(|end| end <= image.file_size);
    if !basic {
        return false;
    }
    let phys = u64::from(e.table_entries) * cs;
    if phys > MAX_PHYS_BYTES {
        return false;
    }
    // A consistent bitmap's table must cover the whole disk.
    let covered = (phys * 8).saturating_mul(1 << e.granularity_bits);
    e.flags & FLAG_IN_USE != 0 || image.disk_size <= covered
}

/// Reads a bitmap's table and checks it as qemu does before it loads the
/// bitmap: no reserved bit, data clusters aligned, and as many entries as
/// the disk needs at the bitmap's granularity.
fn check_table(io: &dyn MetaIo, e: &BitmapEntry, image: &ImageFacts) -> Result<(), String> {
    let cs = image.cluster_size;
    let mut table = vec![0u8; e.table_entries as usize * 8];
    read_at(io, MetaKind::BitmapDirectory, e.table_offset, &mut table).map_err(|err| {
        format!(
            "Could not read bitmap_table table from image for bitmap '{}': {err}",
            e.name
        )
    })?;
    let bad_entry = (0..e.table_entries as usize).any(|i| {
        let entry = be64_at(&table, i);
        let offset = entry & TABLE_OFFSET_MASK;
        entry & TABLE_RESERVED != 0
            || (offset != 0 && (entry & TABLE_ALL_ONES != 0 || !offset.is_multiple_of(cs)))
    });
    if bad_entry {
        return Err(format!(
            "Could not read bitmap_table table from image for bitmap '{}': Invalid argument",
            e.name
        ));
    }
    // qemu serializes a bitmap in 64-bit words.
    let bits = image.disk_size.div_ceil(1 << e.granularity_bits);
    let needed = bits.div_ceil(64).saturating_mul(8).div_ceil(cs);
    if needed != u64::from(e.table_entries) {
        return Err(format!(
            "Could not read bitmap '{}' from image: Invalid argument",
            e.name
        ));
    }
    Ok(())
}

/// The persistent bitmaps of an image behind `io` (an open image's
/// metadata-I/O seam), in a file of `file_size` bytes (`path` names it in
/// errors), in directory order: none for a v2 image, one without the
/// extension or one whose autoclear bit says the bitmaps are
/// inconsistent; an error for a directory qemu would refuse. The header
/// is read again: a read-write open clears the autoclear bit after the
/// header was parsed.
pub(crate) fn bitmaps_in(
    io: &dyn MetaIo,
    file_size: u64,
    path: &Path,
) -> Result<Vec<BitmapEntry>, BlockError> {
    let header = read_header_in(io, file_size, path, true)?;
    bitmaps_of(io, &header, file_size).map_err(|reason| BlockError::InvalidImage {
        path: path.to_owned(),
        reason,
    })
}

/// The validated bitmaps of an image whose header is `header` (none
/// while its extension is absent or inconsistent).
pub(crate) fn bitmaps_of(
    io: &dyn MetaIo,
    header: &Header,
    file_size: u64,
) -> Result<Vec<BitmapEntry>, String> {
    let Some(ext) = &header.bitmaps else {
        return Ok(Vec::new());
    };
    let facts = ImageFacts {
        cluster_size: header.cluster_size(),
        disk_size: header.size,
        file_size,
    };
    load_directory(io, ext, &facts)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 65536;

    fn entry(name: &str, granularity_bits: u8, table_offset: u64) -> Vec<u8> {
        let mut e = vec![0u8; ENTRY_HEADER];
        e[0..8].copy_from_slice(&table_offset.to_be_bytes());
        e[8..12].copy_from_slice(&1u32.to_be_bytes());
        e[12..16].copy_from_slice(&FLAG_AUTO.to_be_bytes());
        e[16] = TYPE_DIRTY_TRACKING;
        e[17] = granularity_bits;
        e[18..20].copy_from_slice(&(name.len() as u16).to_be_bytes());
        e.extend_from_slice(name.as_bytes());
        e.resize(e.len().next_multiple_of(8), 0);
        e
    }

    fn facts() -> ImageFacts {
        ImageFacts {
            cluster_size: CS,
            disk_size: 64 << 20,
            file_size: 1 << 20,
        }
    }

    #[test]
    fn entries_are_checked_like_qemu() {
        let mut dir = entry("b1", 16, CS);
        dir.extend(entry("a-longer-name", 16, 2 * CS));
        let got = parse_entries(&dir, 2, &facts()).unwrap();
        assert_eq!(got[1].name, "a-longer-name");
        assert_eq!(got[0].flag_names(), ["auto"]);
        let err = |dir: &[u8], n: u32| parse_entries(dir, n, &facts()).unwrap_err();
        assert_eq!(
            err(&dir, 1),
            "More bitmaps found than specified in header extension"
        );
        assert_eq!(
            err(&dir, 3),
            "Less bitmaps found than specified in header extension"
        );
        assert_eq!(err(&dir[..dir.len() - 8], 2), "Broken bitmap directory");
        // Granularity under 512 bytes, and a table outside the file.
        let small = entry("g", 8, CS);
        assert!(err(&small, 1).contains("'g' doesn't satisfy"));
        let far = entry("f", 16, 1 << 40);
        assert!(err(&far, 1).contains("'f' doesn't satisfy"));
    }
}
