//! The bits of a dirty bitmap in memory, and what `ch-img bitmap` does to
//! one ([`BitmapAction`]).
//!
//! A bitmap covers a disk of `disk_size` bytes; bit `i` stands for bytes
//! `i * granularity .. (i + 1) * granularity`. The bits are kept in chunks
//! of one image cluster each (bit `i` in byte `i / 8`, least significant
//! bit first, as qcow2 stores them): a chunk is all zeroes, all ones, or
//! data read from (or for) one data cluster, so memory follows the
//! clusters a bitmap really has, not the size it claims.
//!
//! [`DirtyBits::merge`] sets every bit whose bytes overlap a set bit of
//! the source, whatever the two granularities, as QEMU merges bitmaps;
//! both must cover the same disk size.

/// One cluster's worth of bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    Zero,
    Ones,
    Data(Vec<u8>),
}

/// A bitmap's bits (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyBits {
    pub granularity: u64,
    pub disk_size: u64,
    /// Bytes per chunk (the image's cluster size).
    pub chunk_bytes: u64,
    pub chunks: Vec<Chunk>,
}

/// A persistent bitmap as an owner that records guest writes keeps it
/// (the VMM's live bitmaps): loaded when it opens the image, stored
/// back when it closes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedBitmap {
    pub name: String,
    pub granularity: u64,
    /// The `auto` flag: it records writes.
    pub recording: bool,
    /// The `in_use` flag: set while an owner holds it; found set at open,
    /// the bitmap is inconsistent.
    pub in_use: bool,
    /// Its bits; `None` for an inconsistent bitmap when loaded, and when
    /// stored, "keep the bits the image has".
    pub bits: Option<DirtyBits>,
}

/// What `ch-img bitmap` does to a bitmap, in command-line order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BitmapAction {
    /// A new bitmap, empty and enabled, of this granularity (bytes per
    /// bit; `None`: the format's default).
    Add {
        granularity: Option<u64>,
    },
    Remove,
    Clear,
    /// QEMU records writes in it (the `auto` flag).
    Enable,
    Disable,
    /// Sets the bits another bitmap of the same image has set.
    Merge(String),
    /// Sets the bits of a bitmap read from another image.
    MergeBits(String, DirtyBits),
}

impl BitmapAction {
    /// The action's name in qemu-img's messages.
    pub fn name(&self) -> &'static str {
        match self {
            BitmapAction::Add { .. } => "add",
            BitmapAction::Remove => "remove",
            BitmapAction::Clear => "clear",
            BitmapAction::Enable => "enable",
            BitmapAction::Disable => "disable",
            BitmapAction::Merge(_) | BitmapAction::MergeBits(..) => "merge",
        }
    }
}

impl DirtyBits {
    /// An empty bitmap.
    pub fn new(granularity: u64, disk_size: u64, chunk_bytes: u64) -> DirtyBits {
        let mut bits = DirtyBits {
            granularity,
            disk_size,
            chunk_bytes,
            chunks: Vec::new(),
        };
        bits.chunks = vec![Chunk::Zero; bits.chunk_count() as usize];
        bits
    }

    /// Bits the bitmap has.
    pub fn len(&self) -> u64 {
        self.disk_size.div_ceil(self.granularity)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bits_per_chunk(&self) -> u64 {
        self.chunk_bytes * 8
    }

    /// Chunks (table entries) the bitmap needs.
    pub fn chunk_count(&self) -> u64 {
        self.len().div_ceil(self.bits_per_chunk())
    }

    /// Clears every bit.
    pub fn clear(&mut self) {
        self.chunks.iter_mut().for_each(|c| *c = Chunk::Zero);
    }

    /// Runs `[first, end)` of set bits, in order.
    fn set_runs(&self) -> Vec<(u64, u64)> {
        let per = self.bits_per_chunk();
        let len = self.len();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut push = |first: u64, end: u64| match runs.last_mut() {
            Some(last) if last.1 == first => last.1 = end,
            _ => runs.push((first, end)),
        };
        for (k, chunk) in self.chunks.iter().enumerate() {
            let base = k as u64 * per;
            match chunk {
                Chunk::Zero => {}
                Chunk::Ones => push(base, (base + per).min(len)),
                Chunk::Data(bytes) => {
                    for (i, byte) in bytes.iter().enumerate().filter(|(_, b)| **b != 0) {
                        for bit in (0..8).filter(|bit| byte & (1 << bit) != 0) {
                            let at = base + i as u64 * 8 + bit;
                            if at < len {
                                push(at, at + 1);
                            }
                        }
                    }
                }
            }
        }
        runs
    }

    /// Sets bits `first..end`.
    fn set_range(&mut self, first: u64, end: u64) {
        let per = self.bits_per_chunk();
        let mut bit = first;
        while bit < end {
            let k = (bit / per) as usize;
            let stop = end.min((k as u64 + 1) * per);
            let chunk_bytes = self.chunk_bytes as usize;
            let chunk = &mut self.chunks[k];
            if *chunk == Chunk::Ones {
                bit = stop;
                continue;
            }
            if *chunk == Chunk::Zero {
                *chunk = Chunk::Data(vec![0; chunk_bytes]);
            }
            if let Chunk::Data(bytes) = chunk {
                for b in bit..stop {
                    let i = b - k as u64 * per;
                    bytes[(i / 8) as usize] |= 1 << (i % 8);
                }
            }
            bit = stop;
        }
    }

    /// Sets every bit whose bytes overlap a set bit of `source`; the
    /// message when the two cover different disk sizes (QEMU's words).
    pub fn merge(&mut self, source: &DirtyBits) -> Result<(), String> {
        if source.disk_size != self.disk_size {
            return Err(format!(
                "Bitmaps are of different sizes (destination size is {}, source size is {}) and can't be merged",
                self.disk_size, source.disk_size
            ));
        }
        for (first, end) in source.set_runs() {
            let start = first * source.granularity;
            let stop = (end * source.granularity).min(self.disk_size);
            if start >= stop {
                continue;
            }
            self.set_range(start / self.granularity, stop.div_ceil(self.granularity));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(granularity: u64, disk: u64, set: &[u64]) -> DirtyBits {
        let mut b = DirtyBits::new(granularity, disk, 512);
        for s in set {
            b.set_range(*s, s + 1);
        }
        b
    }

    #[test]
    fn merges_across_granularities_as_qemu_does() {
        // A 512-byte source with bytes 100k and 3M dirty, into a 1 MiB
        // target: bits 0 and 3 (qemu-img bitmap --merge gives the same).
        let source = bits(512, 64 << 20, &[200, 6144]);
        let mut target = DirtyBits::new(1 << 20, 64 << 20, 512);
        target.merge(&source).unwrap();
        assert_eq!(target.set_runs(), vec![(0, 1), (3, 4)]);
        // And back: a coarse bit sets every fine bit it covers.
        let mut fine = DirtyBits::new(512, 64 << 20, 512);
        fine.merge(&target).unwrap();
        assert_eq!(fine.set_runs(), vec![(0, 2048), (6144, 8192)]);
    }

    #[test]
    fn runs_cross_chunks_and_stop_at_the_end() {
        // 512-byte chunks hold 4096 bits each.
        let mut b = DirtyBits::new(512, 3 * 4096 * 512 - 512, 512);
        assert_eq!(b.len(), 3 * 4096 - 1);
        b.chunks[1] = Chunk::Ones;
        b.set_range(4000, 4200);
        b.chunks[2] = Chunk::Ones;
        assert_eq!(b.set_runs(), vec![(4000, 3 * 4096 - 1)]);
        b.clear();
        assert!(b.set_runs().is_empty());
    }

    #[test]
    fn sizes_must_match() {
        let mut a = DirtyBits::new(65536, 64 << 20, 512);
        let b = DirtyBits::new(65536, 32 << 20, 512);
        assert_eq!(
            a.merge(&b).unwrap_err(),
            "Bitmaps are of different sizes (destination size is 67108864, source size is 33554432) and can't be merged"
        );
    }
}
