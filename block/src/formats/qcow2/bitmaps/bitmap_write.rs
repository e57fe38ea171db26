//! Changing the persistent dirty bitmaps of a qcow2 image (`ch-img
//! bitmap`): add, remove, clear, enable, disable and merge, as qemu-img
//! 7.2 does them, refused where it refuses, in its words.
//!
//! A bitmap name and its actions enter [`BitmapEditor::change`], which
//! works on the image's locked tables (`PersistentBitmaps` in `tools`).
//! The image's bitmaps are loaded (`bitmap_store`) and the actions run in
//! memory, in order; a refused one stops everything before the image is
//! touched (qemu-img keeps the ones before it). Then the changes are
//! stored as QEMU stores them, never over what the header names:
//! 1. every bitmap whose bits changed gets new data clusters (one per
//!    cluster of bits that is not all zeroes) and a new bitmap table;
//!    a new directory lists every bitmap (the unchanged ones keep their
//!    tables); a barrier;
//! 2. one write of the header cluster points the bitmaps extension at the
//!    new directory (or drops it when no bitmap is left) and sets the
//!    bitmaps autoclear bit (clears it with the extension); a barrier;
//! 3. the old directory, and the tables and data clusters only it named,
//!    are freed.
//!
//! The change runs as a tool operation that undoes itself when it fails
//! (`undo`, the image's `FailureUndo`): a failure up to step 2 being
//! durable (a failed barrier after the header write included) leaves the
//! file as it was, the clusters step 1 allocated freed and the old header
//! back. Once step 2 is durable a failure can only leak clusters
//! (logged; the change succeeded).
//!
//! The image must be open with `keep_persistent_bitmaps` (else its open
//! already declared the bitmaps inconsistent, and there are none).

use super::bitmap_directory::{EXT_BITMAPS, FLAG_AUTO, FLAG_IN_USE, MAX_BITMAPS, MAX_DIRECTORY};
use super::bitmap_store::{
    clusters_of, BitmapStore, StoredBitmap, MAX_BITMAP_BYTES, MAX_TABLE_ENTRIES, TABLE_ALL_ONES,
    TABLE_OFFSET_MASK,
};
use crate::error::BlockError;
use crate::formats::dirty_bits::{BitmapAction, Chunk, DirtyBits};
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::features::AUTOCLEAR_BITMAPS;
use crate::formats::qcow2::on_disk::header::Header;
use crate::formats::qcow2::on_disk::header_cluster::{current_header, HeaderCluster};

/// qemu's longest bitmap name, in bytes.
const MAX_NAME: usize = 1023;
/// The only bitmap type: dirty tracking.
const TYPE_DIRTY_TRACKING: u8 = 1;

/// A bitmap while the actions run (or as a live owner stores it,
/// `bitmap_live`).
#[derive(Clone, Debug)]
pub(super) struct Working {
    pub name: String,
    pub flags: u32,
    pub granularity_bits: u8,
    /// Where it is now (`None`: added by these actions).
    pub stored: Option<StoredBitmap>,
    /// Its new bits (`None`: as stored).
    pub bits: Option<DirtyBits>,
}

fn not_found(name: &str) -> String {
    format!("Dirty bitmap '{name}' not found")
}

fn inconsistent(name: &str) -> String {
    format!("Bitmap '{name}' is inconsistent and cannot be used\nTry block-dirty-bitmap-remove to delete this bitmap from disk")
}

/// See the module docs: the image's tables (locked) and its disk size.
pub(crate) struct BitmapEditor<'a> {
    pub meta: &'a mut MetaState,
    pub disk_size: u64,
}

impl BitmapEditor<'_> {
    /// The bits a stored bitmap holds, read through the seam.
    pub(super) fn read_bits(&self, b: &StoredBitmap) -> Result<DirtyBits, BlockError> {
        let meta = &*self.meta;
        let cs = meta.geometry().cluster_size;
        let size = self.disk_size;
        let mut bits = DirtyBits::new(1u64 << b.entry.granularity_bits, size, cs);
        if b.table.len() as u64 != bits.chunk_count() {
            return Err(meta.invalid(format!(
                "bitmap '{}' has {} table entries where a disk of {size} bytes needs {}",
                b.entry.name,
                b.table.len(),
                bits.chunk_count()
            )));
        }
        for (chunk, &entry) in bits.chunks.iter_mut().zip(&b.table) {
            let data = entry & TABLE_OFFSET_MASK;
            *chunk = if data != 0 {
                let mut bytes = vec![0u8; cs as usize];
                meta.read(MetaKind::BitmapDirectory, data, &mut bytes)?;
                Chunk::Data(bytes)
            } else if entry & TABLE_ALL_ONES != 0 {
                Chunk::Ones
            } else {
                Chunk::Zero
            };
        }
        Ok(bits)
    }

    /// The bitmaps as the header names them now, refusing entries this
    /// code would not write back as they are.
    pub(super) fn load_bitmaps(&self, header: &Header) -> Result<BitmapStore, BlockError> {
        let store = BitmapStore::load(self.meta, header)?;
        for b in &store.bitmaps {
            let e = &b.entry;
            if e.bitmap_type != TYPE_DIRTY_TRACKING
                || e.extra_data_size != 0
                || e.name.len() != usize::from(e.name_len)
                || !(9..=31).contains(&e.granularity_bits)
            {
                return Err(BlockError::Unsupported {
                    path: self.meta.path().to_path_buf(),
                    feature: format!(
                        "changing the bitmaps of an image whose bitmap '{}' has type {}, {} bytes of extra data or granularity bits {}",
                        e.name, e.bitmap_type, e.extra_data_size, e.granularity_bits
                    ),
                });
            }
        }
        Ok(store)
    }

    /// Runs one action on the bitmaps in memory; the error is its
    /// message (qemu's words).
    fn run_action(
        &self,
        bitmaps: &mut Vec<Working>,
        name: &str,
        action: &BitmapAction,
    ) -> Result<(), String> {
        let index = bitmaps.iter().position(|b| b.name == name);
        let in_use = |b: &Working| b.flags & FLAG_IN_USE != 0;
        let meta = &*self.meta;
        let size = self.disk_size;
        let cs = meta.geometry().cluster_size;
        let bits_of = |b: &Working| -> Result<DirtyBits, String> {
            match (&b.bits, &b.stored) {
                (Some(bits), _) => Ok(bits.clone()),
                (None, Some(stored)) => self.read_bits(stored).map_err(|e| e.to_string()),
                (None, None) => Ok(DirtyBits::new(1 << b.granularity_bits, size, cs)),
            }
        };
        if let BitmapAction::Add { granularity } = action {
            if name.is_empty() {
                return Err("Bitmap name cannot be empty".into());
            }
            if index.is_some() {
                return Err(format!("Bitmap already exists: {name}"));
            }
            let persistent = |why: &str| {
                format!(
                    "Can't make bitmap '{name}' persistent in '{}': {why}",
                    meta.path().display()
                )
            };
            // qemu-img takes the granularity as a 32-bit number.
            let g = match granularity {
                Some(g) => u64::from(*g as u32),
                None => cs.clamp(4096, 65536),
            };
            if g < 512 || !g.is_power_of_two() {
                return Err("Granularity must be power of 2 and at least 512".into());
            }
            if meta.geometry().version < 3 {
                return Err(persistent("Cannot store dirty bitmaps in qcow2 v2 files"));
            }
            if name.len() > MAX_NAME {
                return Err(persistent("Name length exceeds maximum (1023 characters)"));
            }
            let data_clusters = size.div_ceil(g).div_ceil(8).div_ceil(cs);
            if data_clusters * cs > MAX_BITMAP_BYTES || data_clusters > MAX_TABLE_ENTRIES {
                return Err(persistent(
                    "Too much space will be occupied by the bitmap. Use larger granularity",
                ));
            }
            if bitmaps.len() >= MAX_BITMAPS as usize {
                return Err(persistent(
                    "Maximum number of persistent bitmaps is already reached",
                ));
            }
            bitmaps.push(Working {
                name: name.into(),
                flags: FLAG_AUTO,
                granularity_bits: g.trailing_zeros() as u8,
                stored: None,
                bits: Some(DirtyBits::new(g, size, cs)),
            });
            return Ok(());
        }
        let i = index.ok_or_else(|| not_found(name))?;
        if *action == BitmapAction::Remove {
            bitmaps.remove(i);
            return Ok(());
        }
        if in_use(&bitmaps[i]) {
            return Err(inconsistent(name));
        }
        match action {
            BitmapAction::Clear => {
                let b = &mut bitmaps[i];
                let mut bits = DirtyBits::new(1 << b.granularity_bits, size, cs);
                bits.clear();
                b.bits = Some(bits);
            }
            BitmapAction::Enable => bitmaps[i].flags |= FLAG_AUTO,
            BitmapAction::Disable => bitmaps[i].flags &= !FLAG_AUTO,
            BitmapAction::Merge(source) => {
                let s = bitmaps
                    .iter()
                    .find(|b| b.name == *source)
                    .ok_or_else(|| not_found(source))?;
                if in_use(s) {
                    return Err(inconsistent(source));
                }
                let source_bits = bits_of(s)?;
                let mut bits = bits_of(&bitmaps[i])?;
                bits.merge(&source_bits)?;
                bitmaps[i].bits = Some(bits);
            }
            BitmapAction::MergeBits(_, source_bits) => {
                let mut bits = bits_of(&bitmaps[i])?;
                bits.merge(source_bits)?;
                bitmaps[i].bits = Some(bits);
            }
            BitmapAction::Add { .. } | BitmapAction::Remove => {}
        }
        Ok(())
    }

    /// The bits of bitmap `name`.
    pub fn read(&self, name: &str) -> Result<DirtyBits, BlockError> {
        let header = current_header(self.meta)?;
        let store = self.load_bitmaps(&header)?;
        let b = store
            .find(name)
            .ok_or_else(|| BlockError::Refused(not_found(name)))?;
        if b.entry.flags & FLAG_IN_USE != 0 {
            return Err(BlockError::Refused(inconsistent(name)));
        }
        self.read_bits(b)
    }

    /// Runs `actions` on bitmap `name` and stores the result (see the
    /// module docs).
    pub fn change(&mut self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError> {
        self.meta.flush_dirty()?;
        self.meta.barrier()?;
        let header = current_header(self.meta)?;
        let old = self.load_bitmaps(&header)?;
        let mut bitmaps: Vec<Working> = old
            .bitmaps
            .iter()
            .map(|b| Working {
                name: b.entry.name.clone(),
                flags: b.entry.flags,
                granularity_bits: b.entry.granularity_bits,
                stored: Some(b.clone()),
                bits: None,
            })
            .collect();
        for action in actions {
            self.run_action(&mut bitmaps, name, action).map_err(|m| {
                BlockError::Refused(format!(
                    "Operation {} on bitmap {name} failed: {m}",
                    action.name()
                ))
            })?;
        }
        self.replace(&header, &old, &bitmaps)
    }

    /// Stores `bitmaps` as the image's bitmaps (steps 1 and 2), then
    /// frees what only `old` named (step 3).
    pub(super) fn replace(
        &mut self,
        header: &Header,
        old: &BitmapStore,
        bitmaps: &[Working],
    ) -> Result<(), BlockError> {
        let meta = &mut *self.meta;
        let directory = store(meta, header, bitmaps)?;
        // Free what only the old header named.
        let cb = meta.geometry().cluster_bits;
        let mut freed: Vec<(u64, u64)> = old
            .directory
            .iter()
            .map(|(at, bytes)| (at >> cb, bytes.div_ceil(meta.geometry().cluster_size)))
            .collect();
        for b in &old.bitmaps {
            let kept = bitmaps.iter().any(|w| {
                w.bits.is_none()
                    && w.stored
                        .as_ref()
                        .is_some_and(|s| s.entry.table_offset == b.entry.table_offset)
            });
            if !kept {
                freed.extend(clusters_of(b, cb));
            }
        }
        let result = freed
            .iter()
            .try_for_each(|&(first, count)| meta.change_refcounts(first, count, -1))
            .and_then(|()| meta.barrier());
        if let Err(e) = result {
            log::warn!(
                "{}: the old bitmap clusters may stay leaked ({e}); `ch-img check -r leaks` frees them",
                meta.path().display()
            );
        }
        meta.set_bitmap_directory(directory);
        meta.rebuild_metadata_map();
        Ok(())
    }
}

/// Writes a bitmap's chunks and table; returns (table offset, entries).
fn write_bits(meta: &mut MetaState, bits: &DirtyBits) -> Result<(u64, u32), BlockError> {
    let cs = meta.geometry().cluster_size;
    let per_chunk = cs * 8;
    let mut table = Vec::with_capacity(bits.chunks.len());
    for (k, chunk) in bits.chunks.iter().enumerate() {
        let bytes = match chunk {
            Chunk::Zero => None,
            Chunk::Data(d) if d.iter().all(|b| *b == 0) => None,
            Chunk::Data(d) => Some(d.clone()),
            Chunk::Ones => {
                // Written out as QEMU writes it, without bits past the end.
                let valid = (bits.len() - k as u64 * per_chunk).min(per_chunk);
                let mut d = vec![0u8; cs as usize];
                d[..(valid / 8) as usize].fill(0xff);
                if !valid.is_multiple_of(8) {
                    d[(valid / 8) as usize] = (1u8 << (valid % 8)) - 1;
                }
                Some(d)
            }
        };
        table.push(match bytes {
            None => 0,
            Some(d) => {
                let at = meta.alloc_clusters(1)?;
                meta.write(MetaKind::BitmapDirectory, at, &d)?;
                at
            }
        });
    }
    let mut raw: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
    let clusters = (raw.len() as u64).div_ceil(cs).max(1);
    raw.resize((clusters * cs) as usize, 0);
    let at = meta.alloc_clusters(clusters)?;
    meta.write(MetaKind::BitmapDirectory, at, &raw)?;
    Ok((at, table.len() as u32))
}

/// A directory entry's bytes.
fn encode_entry(
    table_offset: u64,
    table_entries: u32,
    flags: u32,
    granularity_bits: u8,
    name: &str,
) -> Vec<u8> {
    let mut e = Vec::with_capacity(24 + name.len() + 7);
    e.extend_from_slice(&table_offset.to_be_bytes());
    e.extend_from_slice(&table_entries.to_be_bytes());
    e.extend_from_slice(&flags.to_be_bytes());
    e.push(TYPE_DIRTY_TRACKING);
    e.push(granularity_bits);
    e.extend_from_slice(&(name.len() as u16).to_be_bytes());
    e.extend_from_slice(&0u32.to_be_bytes());
    e.extend_from_slice(name.as_bytes());
    e.resize(e.len().next_multiple_of(8), 0);
    e
}

/// Steps 1 and 2 of the module docs; returns the new directory.
fn store(
    meta: &mut MetaState,
    header: &Header,
    bitmaps: &[Working],
) -> Result<Option<(u64, u64)>, BlockError> {
    let mut dir = Vec::new();
    for b in bitmaps {
        let (table_offset, entries) = match (&b.bits, &b.stored) {
            (Some(bits), _) => write_bits(meta, bits)?,
            (None, Some(s)) => (s.entry.table_offset, s.entry.table_entries),
            (None, None) => return Err(meta.invalid("a new bitmap without bits")),
        };
        dir.extend(encode_entry(
            table_offset,
            entries,
            b.flags,
            b.granularity_bits,
            &b.name,
        ));
    }
    if dir.len() as u64 > MAX_DIRECTORY {
        return Err(BlockError::Refused(format!(
            "the bitmap directory would take {} bytes, more than qcow2 allows",
            dir.len()
        )));
    }
    let mut hc = HeaderCluster::read(meta.io(), header, meta.path())?;
    let directory = if bitmaps.is_empty() {
        hc.set_extension(EXT_BITMAPS, None);
        hc.header.autoclear &= !AUTOCLEAR_BITMAPS;
        None
    } else {
        let cs = meta.geometry().cluster_size;
        let clusters = (dir.len() as u64).div_ceil(cs);
        let at = meta.alloc_clusters(clusters)?;
        let bytes = dir.len() as u64;
        dir.resize((clusters * cs) as usize, 0);
        meta.write(MetaKind::BitmapDirectory, at, &dir)?;
        let mut ext = (bitmaps.len() as u32).to_be_bytes().to_vec();
        ext.extend_from_slice(&[0; 4]);
        ext.extend_from_slice(&bytes.to_be_bytes());
        ext.extend_from_slice(&at.to_be_bytes());
        hc.set_extension(EXT_BITMAPS, Some(ext));
        hc.header.autoclear |= AUTOCLEAR_BITMAPS;
        Some((at, bytes))
    };
    meta.barrier()?;
    let bytes = hc.encode(meta.path())?;
    meta.write(MetaKind::Header, 0, &bytes)?;
    meta.barrier()?;
    Ok(directory)
}

#[cfg(test)]
mod tests {
    use super::super::bitmap_directory::BitmapEntry;
    use super::*;

    #[test]
    fn entries_are_laid_out_as_the_spec_says() {
        let e = encode_entry(0x5_0000, 3, FLAG_AUTO, 16, "b1");
        assert_eq!(e.len(), 32);
        let facts = super::super::bitmap_directory::ImageFacts {
            cluster_size: 0x1_0000,
            disk_size: 1 << 30,
            file_size: 1 << 20,
        };
        let parsed = super::super::bitmap_directory::parse_entries(&e, 1, &facts).unwrap();
        let want = BitmapEntry {
            table_offset: 0x5_0000,
            table_entries: 3,
            flags: FLAG_AUTO,
            granularity_bits: 16,
            name_len: 2,
            bitmap_type: 1,
            extra_data_size: 0,
            name: "b1".into(),
        };
        assert_eq!(parsed, vec![want]);
    }
}
