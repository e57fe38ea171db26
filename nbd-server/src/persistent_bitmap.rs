//! A qcow2 image's persistent dirty bitmap as an exported bitmap:
//! qemu-storage-daemon's `--export type=nbd,bitmaps=...` (qemu-nbd's
//! `-B NAME`) for a read-only image.
//!
//! [`PersistentBitmap::load`] finds the bitmap in the image's bitmaps
//! extension and reads its bits through the image's tool capability
//! (`read_bitmap` of its `PersistentBitmaps`, what `ch-img bitmap --merge` reads
//! with), refusing what QEMU refuses, in its words: a bitmap the image
//! does not have, and an inconsistent one (its in-use flag set: a writer
//! held it and never wrote it back). The bits are read once, at load:
//! the image is open read-only, so nothing changes them while they are
//! served. [`DirtyBitmap::next_dirty`] then walks them a chunk (one
//! image cluster of bits) and a byte at a time, skipping chunks and
//! bytes that are all clean or all dirty.

use block::formats::dirty_bits::Chunk;
use block::formats::DirtyBits;
use block::ExclusiveImage;

use crate::bitmap::DirtyBitmap;

/// The bits of one persistent bitmap, as read at load.
pub struct PersistentBitmap {
    bits: DirtyBits,
}

impl PersistentBitmap {
    /// Reads bitmap `name` of `image` (opened read-only). The error is the
    /// reason, in qemu-storage-daemon's words where it has them.
    pub fn load(image: &ExclusiveImage, name: &str) -> Result<PersistentBitmap, String> {
        if !image.disk().readonly() {
            return Err(format!(
                "bitmap '{name}': the image must be opened read-only (its bitmaps do not record writes made here)"
            ));
        }
        let info = image.disk().format().info();
        let entry = info
            .bitmaps
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| format!("Bitmap '{name}' is not found"))?;
        if entry.flag_names().contains(&"in-use") {
            return Err(format!(
                "Bitmap '{name}' is inconsistent and cannot be used"
            ));
        }
        let bits = image
            .tools()
            .read_bitmap(name)
            .map_err(|e| format!("bitmap '{name}': {}", ch_log::error_chain(&e)))?;
        Ok(PersistentBitmap::from_bits(bits))
    }

    /// Serves `bits` as they are.
    pub fn from_bits(bits: DirtyBits) -> PersistentBitmap {
        PersistentBitmap { bits }
    }

    fn bits_per_chunk(&self) -> u64 {
        self.bits.chunk_bytes * 8
    }

    /// The first bit at or after `from` and before `to` that is `dirty`
    /// (set when `dirty`, clear when not); `to` when there is none.
    fn find(&self, from: u64, to: u64, dirty: bool) -> u64 {
        let per = self.bits_per_chunk();
        let mut at = from;
        while at < to {
            let k = at / per;
            let chunk_end = ((k + 1) * per).min(to);
            match self.bits.chunks.get(k as usize) {
                None | Some(Chunk::Zero) if !dirty => return at,
                Some(Chunk::Ones) if dirty => return at,
                None | Some(Chunk::Zero) | Some(Chunk::Ones) => at = chunk_end,
                Some(Chunk::Data(bytes)) => {
                    if let Some(found) = find_in(bytes, at - k * per, chunk_end - k * per, dirty) {
                        return k * per + found;
                    }
                    at = chunk_end;
                }
            }
        }
        to
    }
}

/// The first bit in `[from, to)` of `bytes` (least significant bit first;
/// bytes past the end read as clean) that is `dirty`.
fn find_in(bytes: &[u8], from: u64, to: u64, dirty: bool) -> Option<u64> {
    let skip = if dirty { 0x00 } else { 0xff };
    let mut bit = from;
    while bit < to {
        let byte = bytes.get((bit / 8) as usize).copied().unwrap_or(0);
        if bit.is_multiple_of(8) && byte == skip && bit + 8 <= to {
            bit += 8;
            continue;
        }
        if (byte >> (bit % 8)) & 1 == u8::from(dirty) {
            return Some(bit);
        }
        bit += 1;
    }
    None
}

impl DirtyBitmap for PersistentBitmap {
    fn granularity(&self) -> u64 {
        self.bits.granularity
    }

    fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)> {
        let g = self.bits.granularity;
        let end = end.min(self.bits.disk_size);
        if from >= end {
            return None;
        }
        let last = end.div_ceil(g);
        let first = self.find(from / g, last, true);
        if first == last {
            return None;
        }
        let stop = self.find(first, last, false);
        let start = (first * g).max(from);
        Some((start, (stop * g).min(end) - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bitmap::tests::Bits;

    /// A bitmap over `pattern.len()` granules of 512 bytes, in chunks of
    /// 2 bytes (16 bits): runs of one kind become whole-chunk entries.
    fn both(pattern: &[bool]) -> (PersistentBitmap, Bits) {
        let g = 512;
        let mut bits = DirtyBits::new(g, pattern.len() as u64 * g, 2);
        for (k, chunk) in bits.chunks.iter_mut().enumerate() {
            let part: Vec<bool> = pattern.iter().skip(k * 16).take(16).copied().collect();
            *chunk = if part.iter().all(|b| !b) {
                Chunk::Zero
            } else if part.len() == 16 && part.iter().all(|b| *b) {
                Chunk::Ones
            } else {
                let mut bytes = vec![0u8; 2];
                for (i, _) in part.iter().enumerate().filter(|(_, b)| **b) {
                    bytes[i / 8] |= 1 << (i % 8);
                }
                Chunk::Data(bytes)
            };
        }
        let model = Bits {
            granularity: g,
            bits: pattern.to_vec(),
        };
        (PersistentBitmap::from_bits(bits), model)
    }

    #[test]
    fn next_dirty_matches_a_bit_by_bit_model() {
        // A deterministic mix of runs: whole chunks clean and dirty,
        // single bits, runs across chunk and byte boundaries.
        let mut pattern = vec![false; 16];
        pattern.extend([true; 16]);
        pattern.extend((0..48).map(|i| (i * 7 + i / 5) % 3 == 0));
        pattern.extend([true; 9]);
        pattern.extend([false; 3]);
        let (ours, model) = both(&pattern);
        let size = pattern.len() as u64 * 512;
        for from in (0..size).step_by(173) {
            for end in [from + 1, from + 700, from + 9000, size] {
                let end = end.min(size);
                assert_eq!(
                    ours.next_dirty(from, end),
                    model.next_dirty(from, end),
                    "{from}..{end}"
                );
            }
        }
        assert_eq!(ours.next_dirty(0, 8192), None);
        assert_eq!(ours.next_dirty(0, size), Some((8192, 8192 + 512)));
    }

    #[test]
    fn bits_past_the_data_read_clean() {
        let mut bits = DirtyBits::new(512, 64 * 512, 4);
        bits.chunks[0] = Chunk::Data(vec![0xff]);
        let b = PersistentBitmap::from_bits(bits);
        assert_eq!(b.next_dirty(0, 64 * 512), Some((0, 8 * 512)));
        assert_eq!(b.next_dirty(8 * 512, 64 * 512), None);
    }
}
