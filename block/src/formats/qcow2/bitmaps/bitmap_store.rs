//! The persistent bitmaps of an open image as a value, for the tools that
//! change them (`ch-img bitmap`) or drop them (a downgrade to version 2):
//! each bitmap's directory entry and bitmap table, read through the
//! metadata-I/O seam, and the host clusters they all hold.
//!
//! The header enters [`BitmapStore::load`] (the directory counts only
//! while its autoclear bit is set, see `bitmap_directory`); bitmaps leave
//! with their tables, checked against qemu's limits and the file (a
//! table or data cluster outside the file, unaligned, or a directory
//! beyond the limits is refused, never followed). [`bitmap_clusters`]
//! lists the clusters to free.

use super::bitmap_directory::{bitmaps_of, BitmapEntry};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{be64_at, MetaKind};
use crate::formats::qcow2::on_disk::header::Header;

/// Bits 9..=55 of a bitmap table entry: the data cluster's offset.
pub(crate) const TABLE_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// A table entry without a data cluster whose bit 0 is set: all ones.
pub(crate) const TABLE_ALL_ONES: u64 = 1;
/// qemu's limits: table entries per bitmap, and bytes of bitmap data.
pub(crate) const MAX_TABLE_ENTRIES: u64 = 0x800_0000;
pub(crate) const MAX_BITMAP_BYTES: u64 = 0x2000_0000;

/// One bitmap as the image stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredBitmap {
    pub entry: BitmapEntry,
    /// The bitmap table's entries.
    pub table: Vec<u64>,
}

/// Every persistent bitmap of the image and where their directory is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BitmapStore {
    pub bitmaps: Vec<StoredBitmap>,
    /// (offset, bytes) of the directory the header names.
    pub directory: Option<(u64, u64)>,
}

impl BitmapStore {
    /// Loads the bitmaps `header` names (none unless it is version 3 with
    /// the bitmaps autoclear bit set).
    pub fn load(meta: &MetaState, header: &Header) -> Result<BitmapStore, BlockError> {
        // The extension was checked with the header, the directory and
        // its entries are checked here as qemu checks them at open.
        let Some(ext) = header.bitmaps else {
            return Ok(BitmapStore::default());
        };
        let entries = bitmaps_of(meta.io().as_ref(), header, meta.file_size())
            .map_err(|r| meta.invalid(r))?;
        let (dir_offset, dir_size) = (ext.dir_offset, ext.dir_size);
        let mut bitmaps = Vec::with_capacity(entries.len());
        for entry in entries {
            let table = read_table(meta, &entry)?;
            bitmaps.push(StoredBitmap { entry, table });
        }
        Ok(BitmapStore {
            bitmaps,
            directory: Some((dir_offset, dir_size)),
        })
    }

    /// The bitmap named `name`.
    pub fn find(&self, name: &str) -> Option<&StoredBitmap> {
        self.bitmaps.iter().find(|b| b.entry.name == name)
    }
}

/// Reads and checks a bitmap's table.
fn read_table(meta: &MetaState, entry: &BitmapEntry) -> Result<Vec<u64>, BlockError> {
    let cs = meta.geometry().cluster_size;
    let entries = u64::from(entry.table_entries);
    let bytes = entries * 8;
    if entries > MAX_TABLE_ENTRIES
        || entries * cs > MAX_BITMAP_BYTES
        || !entry.table_offset.is_multiple_of(cs)
        || entry
            .table_offset
            .checked_add(bytes)
            .is_none_or(|e| e > meta.file_size())
    {
        return Err(meta.invalid(format!(
            "bitmap '{}' has an invalid table ({entries} entries at {:#x})",
            entry.name, entry.table_offset
        )));
    }
    let mut raw = vec![0u8; bytes as usize];
    meta.read(MetaKind::BitmapDirectory, entry.table_offset, &mut raw)?;
    let table: Vec<u64> = (0..entries as usize).map(|i| be64_at(&raw, i)).collect();
    for e in &table {
        let data = e & TABLE_OFFSET_MASK;
        if data != 0
            && (!data.is_multiple_of(cs)
                || data
                    .checked_add(cs)
                    .is_none_or(|end| end > meta.file_size()))
        {
            return Err(meta.invalid(format!(
                "bitmap '{}' has a data cluster at {data:#x} outside the file",
                entry.name
            )));
        }
    }
    Ok(table)
}

/// The host clusters a bitmap holds: its table's and its data clusters,
/// as (first cluster, count) runs.
pub(crate) fn clusters_of(b: &StoredBitmap, cluster_bits: u32) -> Vec<(u64, u64)> {
    let cs = 1u64 << cluster_bits;
    let mut runs = Vec::new();
    if b.entry.table_offset != 0 && !b.table.is_empty() {
        let clusters = (b.table.len() as u64 * 8).div_ceil(cs);
        runs.push((b.entry.table_offset >> cluster_bits, clusters));
    }
    runs.extend(
        b.table
            .iter()
            .map(|e| e & TABLE_OFFSET_MASK)
            .filter(|d| *d != 0)
            .map(|d| (d >> cluster_bits, 1)),
    );
    runs
}

/// Every host cluster the persistent bitmaps of the image hold (the
/// directory, tables and data clusters), as (first cluster, count) runs.
pub(crate) fn bitmap_clusters(
    meta: &MetaState,
    header: &Header,
) -> Result<Vec<(u64, u64)>, BlockError> {
    let store = BitmapStore::load(meta, header)?;
    let cb = meta.geometry().cluster_bits;
    let mut runs = Vec::new();
    if let Some((offset, bytes)) = store.directory {
        runs.push((offset >> cb, bytes.div_ceil(meta.geometry().cluster_size)));
    }
    for b in &store.bitmaps {
        runs.extend(clusters_of(b, cb));
    }
    Ok(runs)
}
