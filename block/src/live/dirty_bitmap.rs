//! [`DirtyBitmap`]: which granules of a running disk were written, marked
//! by every queue of the disk at once without a lock.
//!
//! Bit `i` stands for bytes `i * granularity .. (i + 1) * granularity` of
//! the disk (the last granule may be short). The bits live in words of
//! [`AtomicU64`]; a queue marks a completed write's granules with
//! `fetch_or` (after a plain load, so granules already dirty cost no
//! write to a shared cache line). Reading, clearing, merging and
//! copying are meant for a disk whose queues are quiesced (the owner's
//! "one instant", docs/live-operations.md); done while queues mark, they
//! see some concurrent marks and miss others, never lose one that
//! happened before them.
//!
//! Data leaves as dirty extents ([`DirtyBitmap::extents`]), as a frozen
//! copy ([`DirtyBitmap::frozen`]), or as the chunked bits a qcow2 image
//! stores ([`DirtyBitmap::to_bits`], [`DirtyBitmap::from_bits`]).
//! Why by hand: the crates with bit sets (`bitvec`, `fixedbitset`) have
//! no atomic shared marking of ranges.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::formats::dirty_bits::{Chunk, DirtyBits};

/// The smallest granularity (QEMU's: one sector).
pub const MIN_GRANULARITY: u64 = 512;
/// The largest granularity (what a qcow2 bitmap can store: 2^31).
pub const MAX_GRANULARITY: u64 = 1 << 31;
/// The granularity of a bitmap added without one.
pub const DEFAULT_GRANULARITY: u64 = 64 << 10;

/// A granularity a bitmap may have, or why not.
pub fn check_granularity(granularity: u64) -> Result<(), String> {
    if !granularity.is_power_of_two() || !(MIN_GRANULARITY..=MAX_GRANULARITY).contains(&granularity)
    {
        return Err(format!(
            "the granularity must be a power of two from {MIN_GRANULARITY} to {MAX_GRANULARITY} bytes, not {granularity}"
        ));
    }
    Ok(())
}

/// See the module docs.
#[derive(Debug)]
pub struct DirtyBitmap {
    granularity_bits: u32,
    /// Bytes of disk the bitmap covers.
    size: u64,
    words: Box<[AtomicU64]>,
}

impl DirtyBitmap {
    /// A clean bitmap of a disk of `size` bytes; the granularity must
    /// pass [`check_granularity`].
    pub fn new(granularity: u64, size: u64) -> Result<DirtyBitmap, String> {
        check_granularity(granularity)?;
        let bits = size.div_ceil(granularity);
        let words = usize::try_from(bits.div_ceil(64))
            .map_err(|_| format!("a bitmap of {bits} bits does not fit in memory"))?;
        Ok(DirtyBitmap {
            granularity_bits: granularity.trailing_zeros(),
            size,
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn granularity(&self) -> u64 {
        1 << self.granularity_bits
    }

    /// Bytes of disk covered.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Granules (bits) the bitmap has.
    pub fn len(&self) -> u64 {
        self.size.div_ceil(self.granularity())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks every granule bytes `offset..offset + len` touch (what lies
    /// past the end of the disk is ignored).
    #[inline]
    pub fn mark(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        if len == 0 || offset >= end {
            return;
        }
        let first = offset >> self.granularity_bits;
        let last = (end - 1) >> self.granularity_bits;
        self.set_bits(first, last + 1);
    }

    /// Sets bits `first..end`.
    fn set_bits(&self, first: u64, end: u64) {
        let mut bit = first;
        while bit < end {
            let word = (bit / 64) as usize;
            let lo = bit % 64;
            let hi = (end - word as u64 * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            let w = &self.words[word];
            if w.load(Ordering::Relaxed) & mask != mask {
                w.fetch_or(mask, Ordering::Relaxed);
            }
            bit = word as u64 * 64 + hi;
        }
    }

    /// Whether bit `i` is set.
    pub fn get(&self, i: u64) -> bool {
        i < self.len()
            && self.words[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    /// Whether byte `offset` lies in a dirty granule.
    pub fn is_dirty(&self, offset: u64) -> bool {
        self.get(offset >> self.granularity_bits)
    }

    /// Dirty granules.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// Bytes of disk in dirty granules.
    pub fn dirty_bytes(&self) -> u64 {
        self.extents().map(|(_, len)| len).sum()
    }

    /// Clears every bit.
    pub fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Clears the granules bytes `offset..offset + len` touch, each with
    /// one atomic `fetch_and` per word, and says whether any was dirty: a
    /// block job takes a range this way before it copies it, so a write
    /// that completes after the copy's read marks it again.
    pub fn take_range(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len).min(self.size);
        if len == 0 || offset >= end {
            return false;
        }
        let mut bit = offset >> self.granularity_bits;
        let stop = ((end - 1) >> self.granularity_bits) + 1;
        let mut was = false;
        while bit < stop {
            let word = (bit / 64) as usize;
            let lo = bit % 64;
            let hi = (stop - word as u64 * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            let w = &self.words[word];
            if w.load(Ordering::Relaxed) & mask != 0 {
                was |= w.fetch_and(!mask, Ordering::Relaxed) & mask != 0;
            }
            bit = word as u64 * 64 + hi;
        }
        was
    }

    /// Sets every bit whose bytes overlap a dirty granule of `source`
    /// (any granularity; what lies past this bitmap's size is ignored),
    /// as QEMU merges bitmaps.
    pub fn merge_from(&self, source: &DirtyBitmap) {
        for (start, len) in source.extents() {
            self.mark(start, len);
        }
    }

    /// A copy of the bits as they are now, which later marks of `self`
    /// do not change (a backup's view of the bitmap at its instant).
    pub fn frozen(&self) -> DirtyBitmap {
        self.resized(self.size)
    }

    /// A copy covering `size` bytes (the disk was resized): the bits of
    /// the part both cover; granules past the old end start clean, as
    /// QEMU's bitmaps do when a disk grows.
    pub fn resized(&self, size: u64) -> DirtyBitmap {
        let copy = DirtyBitmap::new(self.granularity(), size)
            .expect("the granularity was checked when self was made");
        for (start, len) in self.extents() {
            copy.mark(start, len);
        }
        copy
    }

    /// The dirty extents, `(offset, length)` in bytes, in order, each as
    /// long as possible (the last one ends at the disk's end).
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let g = self.granularity_bits;
        let len = self.len();
        let size = self.size;
        let mut bit = 0u64;
        std::iter::from_fn(move || {
            let first = self.next_with(bit, true, len)?;
            let end = self.next_with(first, false, len).unwrap_or(len);
            bit = end;
            let start = first << g;
            Some((start, (end << g).min(size) - start))
        })
    }

    /// The first dirty run that overlaps `from..end`, clipped to it:
    /// `(start, len)` with `len > 0`; `None` when the range is clean (an
    /// NBD server's `qemu:dirty-bitmap:NAME` extents).
    pub fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)> {
        let end = end.min(self.size);
        if from >= end {
            return None;
        }
        let g = self.granularity_bits;
        let stop_bit = ((end - 1) >> g) + 1;
        let first = self.next_with(from >> g, true, stop_bit)?;
        let stop = self.next_with(first, false, stop_bit).unwrap_or(stop_bit);
        let start = (first << g).max(from);
        Some((start, (stop << g).min(end) - start))
    }

    /// The first bit at or after `from` (below `len`) that is `set`.
    fn next_with(&self, from: u64, set: bool, len: u64) -> Option<u64> {
        let mut bit = from;
        while bit < len {
            let word = (bit / 64) as usize;
            let raw = self.words[word].load(Ordering::Relaxed);
            let w = if set { raw } else { !raw } >> (bit % 64);
            if w != 0 {
                let at = bit + u64::from(w.trailing_zeros());
                return (at < len).then_some(at);
            }
            bit = (word as u64 + 1) * 64;
        }
        None
    }

    /// The bits in the chunked form qcow2 stores (`chunk_bytes`: the
    /// image's cluster size).
    pub fn to_bits(&self, chunk_bytes: u64) -> DirtyBits {
        let mut bits = DirtyBits::new(self.granularity(), self.size, chunk_bytes);
        let per_chunk = chunk_bytes * 8;
        for (k, chunk) in bits.chunks.iter_mut().enumerate() {
            let first = k as u64 * per_chunk;
            let end = (first + per_chunk).min(self.len());
            if self.next_with(first, true, end).is_none() {
                continue;
            }
            let mut data = vec![0u8; chunk_bytes as usize];
            for i in first..end {
                if self.get(i) {
                    let at = i - first;
                    data[(at / 8) as usize] |= 1 << (at % 8);
                }
            }
            *chunk = Chunk::Data(data);
        }
        bits
    }

    /// A bitmap holding `bits` (as read from a qcow2 image).
    pub fn from_bits(bits: &DirtyBits) -> Result<DirtyBitmap, String> {
        let bitmap = DirtyBitmap::new(bits.granularity, bits.disk_size)?;
        let per_chunk = bits.chunk_bytes * 8;
        let len = bitmap.len();
        for (k, chunk) in bits.chunks.iter().enumerate() {
            let base = k as u64 * per_chunk;
            match chunk {
                Chunk::Zero => {}
                Chunk::Ones => bitmap.set_bits(base.min(len), (base + per_chunk).min(len)),
                Chunk::Data(data) => {
                    for (i, byte) in data.iter().enumerate().filter(|(_, b)| **b != 0) {
                        for b in (0..8).filter(|b| byte & (1 << b) != 0) {
                            let at = base + i as u64 * 8 + b;
                            if at < len {
                                bitmap.set_bits(at, at + 1);
                            }
                        }
                    }
                }
            }
        }
        Ok(bitmap)
    }
}

#[cfg(test)]
#[path = "dirty_bitmap_tests.rs"]
mod tests;
