//! [`GranuleClaims`]: who writes a write-blocking mirror's target where,
//! right now: the job's copier, or guest writes being mirrored.
//!
//! The hazard it closes: the copier reads granule G from the source, a
//! guest write to G completes and is mirrored to the target, then the
//! copier writes its old copy of G over it. So the copier and the
//! guest-side mirroring of a granule never overlap in time:
//! - a queue mirroring completed writes takes a share of every granule
//!   they touch ([`GranuleClaims::guest`]) for as long as its target
//!   writes are in flight; several queues may share a granule;
//! - the copier takes granules whole ([`GranuleClaims::copier`]) for
//!   its read of the source and its write of the target: it marks them
//!   (new guest shares wait from then on), then waits until the shares
//!   taken before its mark are given back.
//!
//! A guest write that completed before the copier's mark is in the
//! source when the copier reads; one that completes after it is mirrored
//! after the copier's write: the target never goes back in time, and no
//! granule needs copying again for it (under a guest that never stops
//! writing, the job still converges).
//!
//! Each granule is one `AtomicU32`: the copier's mark in the top bit,
//! the count of guest shares below it. Both sides change it with one
//! read-modify-write, so of a guest's share and the copier's mark, each
//! sees the other or comes first. A queue never waits while it holds a
//! share (it gives back what it took and waits with empty hands), so
//! the copier's wait is bounded by target writes in flight, and a
//! queue's by one copier batch. Waits yield, then sleep briefly: no lock
//! is shared between queues.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The copier's mark.
const COPIER: u32 = 1 << 31;
/// The smallest claim granule.
const MIN_GRANULE: u64 = 64 << 10;
/// The most granules a table has (16 MiB of atomics); a larger disk gets
/// larger granules.
const MAX_GRANULES: u64 = 4 << 20;

/// See the module docs.
#[derive(Debug)]
pub struct GranuleClaims {
    granule_bits: u32,
    size: u64,
    words: Box<[AtomicU32]>,
}

impl GranuleClaims {
    /// A table for a disk of `size` bytes whose granules are at least
    /// `min_granule` (a power of two) and 64 KiB.
    pub fn new(min_granule: u64, size: u64) -> GranuleClaims {
        let granule = min_granule
            .max(MIN_GRANULE)
            .max(size.div_ceil(MAX_GRANULES))
            .next_power_of_two();
        let count = size.div_ceil(granule) as usize;
        GranuleClaims {
            granule_bits: granule.trailing_zeros(),
            size,
            words: (0..count).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Bytes of one granule.
    pub fn granule(&self) -> u64 {
        1 << self.granule_bits
    }

    /// The granules bytes `offset..offset + len` touch (clipped to the
    /// disk).
    pub fn granules(&self, offset: u64, len: u64) -> Range<u64> {
        let end = offset.saturating_add(len).min(self.size);
        if len == 0 || offset >= end {
            return 0..0;
        }
        (offset >> self.granule_bits)..((end - 1) >> self.granule_bits) + 1
    }

    /// The granules of `ranges` (byte offset, length), merged and sorted.
    fn granule_runs(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = ranges
            .into_iter()
            .map(|(o, l)| self.granules(o, l))
            .filter(|r| !r.is_empty())
            .collect();
        runs.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(runs.len());
        for r in runs {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }

    /// Takes a guest share of every granule `ranges` touch, waiting
    /// while the copier holds any of them; the shares go back when the
    /// claim is dropped.
    pub fn guest(&self, ranges: impl IntoIterator<Item = (u64, u64)>) -> GuestClaim<'_> {
        let runs = self.granule_runs(ranges);
        let mut waits = 0u32;
        loop {
            match self.try_share(&runs) {
                Ok(()) => return GuestClaim { claims: self, runs },
                Err(busy) => {
                    // Hands empty: wait until the copier lets it go.
                    while self.words[busy as usize].load(Ordering::Acquire) & COPIER != 0 {
                        back_off(&mut waits);
                    }
                }
            }
        }
    }

    /// Shares every granule of `runs`, or none: on meeting the copier's
    /// mark, gives back what it took and names the granule.
    fn try_share(&self, runs: &[Range<u64>]) -> Result<(), u64> {
        for (i, run) in runs.iter().enumerate() {
            for g in run.clone() {
                let before = self.words[g as usize].fetch_add(1, Ordering::AcqRel);
                if before & COPIER != 0 {
                    self.unshare(&runs[..i]);
                    self.unshare(std::slice::from_ref(&(run.start..g + 1)));
                    return Err(g);
                }
            }
        }
        Ok(())
    }

    fn unshare(&self, runs: &[Range<u64>]) {
        for g in runs.iter().flat_map(Clone::clone) {
            self.words[g as usize].fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Takes every granule `ranges` touch for the copier: marks them,
    /// then waits until no guest share of them is left. Released when
    /// the claim is dropped (which may be after the copier's next batch
    /// is read: the claim lives until its batch's writes are done). The
    /// copier never claims a granule it holds already: the first
    /// claim's release would end both.
    pub fn copier(self: &Arc<Self>, ranges: impl IntoIterator<Item = (u64, u64)>) -> CopierClaim {
        let runs = self.granule_runs(ranges);
        for g in runs.iter().flat_map(Clone::clone) {
            self.words[g as usize].fetch_or(COPIER, Ordering::AcqRel);
        }
        let mut waits = 0u32;
        for g in runs.iter().flat_map(Clone::clone) {
            while self.words[g as usize].load(Ordering::Acquire) & !COPIER != 0 {
                back_off(&mut waits);
            }
        }
        CopierClaim {
            claims: self.clone(),
            runs,
        }
    }

    /// Guest shares held on granule `g` and whether the copier holds it
    /// (tests).
    #[cfg(test)]
    pub fn holders(&self, g: u64) -> (u32, bool) {
        let w = self.words[g as usize].load(Ordering::Acquire);
        (w & !COPIER, w & COPIER != 0)
    }
}

/// Yields for a while, then sleeps in short steps.
fn back_off(waits: &mut u32) {
    *waits = waits.saturating_add(1);
    if *waits < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// A queue's shares of the granules its mirrored writes touch.
pub struct GuestClaim<'a> {
    claims: &'a GranuleClaims,
    runs: Vec<Range<u64>>,
}

impl Drop for GuestClaim<'_> {
    fn drop(&mut self) {
        self.claims.unshare(&self.runs);
    }
}

/// The copier's hold on the granules of one batch.
pub struct CopierClaim {
    claims: Arc<GranuleClaims>,
    runs: Vec<Range<u64>>,
}

impl Drop for CopierClaim {
    fn drop(&mut self) {
        for g in self.runs.iter().flat_map(Clone::clone) {
            self.claims.words[g as usize].fetch_and(!COPIER, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    const K64: u64 = 64 << 10;

    #[test]
    fn granules_are_merged_and_clipped() {
        let c = GranuleClaims::new(4096, 10 * K64 + 100);
        assert_eq!(c.granule(), K64);
        assert_eq!(c.granules(0, 1), 0..1);
        assert_eq!(c.granules(K64 - 1, 2), 0..2);
        assert_eq!(c.granules(10 * K64, 1 << 20), 10..11);
        assert_eq!(c.granules(20 * K64, 1), 0..0);
        assert_eq!(
            c.granule_runs([(3 * K64, K64), (0, 1), (K64, 2 * K64)]),
            vec![0..4]
        );
    }

    #[test]
    fn a_guest_waits_for_the_copier_and_the_copier_for_guests() {
        let c = Arc::new(GranuleClaims::new(K64, 16 * K64));
        // A guest share held: the copier marks, then waits for it.
        let share = c.guest([(2 * K64, 4096)]);
        let copier_in = Arc::new(AtomicBool::new(false));
        let t = {
            let (c, copier_in) = (c.clone(), copier_in.clone());
            std::thread::spawn(move || {
                let claim = c.copier([(0, 4 * K64)]);
                copier_in.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                drop(claim);
            })
        };
        while !c.holders(3).1 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !copier_in.load(Ordering::SeqCst),
            "the copier overlapped a guest"
        );
        assert_eq!(c.holders(2), (1, true));
        drop(share);
        while !copier_in.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // The copier holds granules 0..4: a guest write across 3..5
        // waits, holding nothing meanwhile.
        let g = c.guest([(3 * K64 + 10, K64)]);
        assert!(!c.holders(3).1, "a guest shared a granule the copier held");
        assert_eq!(c.holders(3), (1, false));
        assert_eq!(c.holders(4), (1, false));
        drop(g);
        t.join().unwrap();
        for i in 0..16 {
            assert_eq!(c.holders(i), (0, false));
        }
    }
}
