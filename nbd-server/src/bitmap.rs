//! Dirty bitmaps as the server reads them: the [`DirtyBitmap`] trait a
//! bitmap source implements (a qcow2 image's persistent bitmap,
//! `crate::persistent_bitmap`; later a frozen copy of a running disk's
//! bitmap), the name it is exported under ([`ExportedBitmap`]), and
//! [`dirty_extents`], which turns a range of it into the extents of a
//! `qemu:dirty-bitmap:NAME` block-status chunk.

use std::sync::Arc;

use nbd::wire::consts::state;

/// A dirty bitmap covering an export, read-only to the server.
pub trait DirtyBitmap: Send + Sync {
    /// Bytes one bit stands for.
    fn granularity(&self) -> u64;

    /// The first dirty range that starts before `end` and ends after
    /// `from`, clipped to `[from, end)`: `(start, len)` with `len > 0`;
    /// `None` when the whole range is clean.
    fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)>;
}

/// A bitmap and the name its context carries (`qemu:dirty-bitmap:NAME`).
#[derive(Clone)]
pub struct ExportedBitmap {
    pub name: String,
    pub bitmap: Arc<dyn DirtyBitmap>,
}

/// The `(length, flags)` extents of `bitmap` over `len` bytes at
/// `offset`, at most `max_extents` of them, as QEMU's server builds
/// them: clean (0) and dirty ([`state::DIRTY`]) runs in order, clipped to
/// the range, equal neighbours merged; when the list is full it ends
/// early (the client asks again from where it ends). `len` fits the
/// protocol's 32-bit extent lengths, so no extent needs splitting.
pub fn dirty_extents(
    bitmap: &dyn DirtyBitmap,
    offset: u64,
    len: u32,
    max_extents: usize,
) -> Vec<(u32, u32)> {
    let end = offset + u64::from(len);
    let mut extents: Vec<(u32, u32)> = Vec::new();
    // Appends a run; false once the list is full.
    let mut push = |run: u64, flags: u32| -> bool {
        if run == 0 {
            return true;
        }
        let full = extents.len() >= max_extents;
        match extents.last_mut() {
            Some((l, f)) if *f == flags => *l += run as u32,
            _ if full => return false,
            _ => extents.push((run as u32, flags)),
        }
        true
    };
    let mut at = offset;
    while at < end {
        let Some((start, run)) = bitmap.next_dirty(at, end) else {
            break;
        };
        // Held to the contract even if a source is not.
        let start = start.clamp(at, end);
        let run = run.min(end - start);
        if run == 0 {
            break;
        }
        if !push(start - at, 0) || !push(run, state::DIRTY) {
            return extents;
        }
        at = start + run;
    }
    push(end - at, 0);
    extents
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bitmap of `granularity`-byte granules, `bits[i]` for granule i.
    pub struct Bits {
        pub granularity: u64,
        pub bits: Vec<bool>,
    }

    impl DirtyBitmap for Bits {
        fn granularity(&self) -> u64 {
            self.granularity
        }

        fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)> {
            let g = self.granularity;
            let first = (from / g..end.div_ceil(g)).find(|&i| self.bits[i as usize])?;
            let stop = (first..end.div_ceil(g))
                .find(|&i| !self.bits[i as usize])
                .unwrap_or(end.div_ceil(g));
            let start = (first * g).max(from);
            Some((start, (stop * g).min(end) - start))
        }
    }

    fn bits(pattern: &str) -> Bits {
        Bits {
            granularity: 4096,
            bits: pattern.chars().map(|c| c == '1').collect(),
        }
    }

    #[test]
    fn extents_are_runs_clipped_to_the_range() {
        let b = bits("0011100001");
        const D: u32 = state::DIRTY;
        assert_eq!(
            dirty_extents(&b, 0, 40960, 100),
            [(8192, 0), (12288, D), (16384, 0), (4096, D)]
        );
        // Offsets inside granules clip the first and last extent.
        assert_eq!(dirty_extents(&b, 9000, 10000, 100), [(10000, D)]);
        assert_eq!(dirty_extents(&b, 100, 8000, 100), [(8000, 0)]);
        assert_eq!(dirty_extents(&b, 100, 10000, 100), [(8092, 0), (1908, D)]);
        // Full: the list ends early.
        assert_eq!(dirty_extents(&b, 0, 40960, 1), [(8192, 0)]);
        assert_eq!(dirty_extents(&b, 8192, 40960 - 8192, 1), [(12288, D)]);
        assert_eq!(
            dirty_extents(&b, 0, 40960, 3),
            [(8192, 0), (12288, D), (16384, 0)]
        );
        // All clean, all dirty.
        assert_eq!(dirty_extents(&bits("0000"), 0, 16384, 1), [(16384, 0)]);
        assert_eq!(dirty_extents(&bits("1111"), 0, 16384, 1), [(16384, D)]);
    }
}
