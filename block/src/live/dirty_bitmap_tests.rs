use std::sync::Arc;

use super::*;

fn extents(b: &DirtyBitmap) -> Vec<(u64, u64)> {
    b.extents().collect()
}

#[test]
fn granularity_limits_follow_qemu() {
    for g in [512, 4096, 64 << 10, 1 << 31] {
        assert!(DirtyBitmap::new(g, 1 << 20).is_ok(), "{g}");
    }
    for g in [0, 1, 256, 511, 513, 3 << 10, 1 << 32] {
        let e = DirtyBitmap::new(g, 1 << 20).unwrap_err();
        assert!(e.contains("power of two"), "{g}: {e}");
    }
}

#[test]
fn marks_every_granule_a_range_touches() {
    let b = DirtyBitmap::new(4096, 1 << 20).unwrap();
    b.mark(4095, 2);
    assert_eq!(extents(&b), vec![(0, 8192)]);
    b.mark(16384, 4096);
    assert_eq!(extents(&b), vec![(0, 8192), (16384, 4096)]);
    assert_eq!(b.count(), 3);
    assert!(b.is_dirty(4096) && !b.is_dirty(8192) && b.is_dirty(20479));
    // Zero length marks nothing; a range past the end is cut at the end.
    b.mark(65536, 0);
    b.mark((1 << 20) - 1, 100);
    b.mark(1 << 21, 100);
    assert_eq!(b.count(), 4);
    assert_eq!(extents(&b).last(), Some(&((1 << 20) - 4096, 4096)));
}

#[test]
fn a_range_across_many_words_sets_exactly_its_bits() {
    let b = DirtyBitmap::new(512, 1 << 20).unwrap();
    // Bits 63..=200: crosses three word edges.
    b.mark(63 * 512, (201 - 63) * 512);
    assert_eq!(b.count(), 201 - 63);
    assert_eq!(extents(&b), vec![(63 * 512, (201 - 63) * 512)]);
    assert!(!b.get(62) && b.get(63) && b.get(200) && !b.get(201));
    // A whole word at once.
    let c = DirtyBitmap::new(512, 1 << 20).unwrap();
    c.mark(64 * 512, 64 * 512);
    assert_eq!(c.count(), 64);
    assert!(!c.get(63) && c.get(64) && c.get(127) && !c.get(128));
}

#[test]
fn the_last_short_granule_ends_at_the_disk_end() {
    let b = DirtyBitmap::new(65536, 100_000).unwrap();
    assert_eq!(b.len(), 2);
    b.mark(99_999, 1);
    assert_eq!(extents(&b), vec![(65536, 100_000 - 65536)]);
    b.clear();
    assert_eq!(b.count(), 0);
    assert_eq!(extents(&b), vec![]);
}

#[test]
fn merge_sets_every_granule_a_source_granule_overlaps() {
    let fine = DirtyBitmap::new(4096, 1 << 20).unwrap();
    fine.mark(70_000, 1);
    let coarse = DirtyBitmap::new(65536, 1 << 20).unwrap();
    coarse.merge_from(&fine);
    assert_eq!(extents(&coarse), vec![(65536, 65536)]);
    let back = DirtyBitmap::new(4096, 1 << 20).unwrap();
    back.merge_from(&coarse);
    assert_eq!(extents(&back), vec![(65536, 65536)]);
    // Merging ORs: what the target had stays.
    back.mark(0, 1);
    back.merge_from(&fine);
    assert_eq!(extents(&back), vec![(0, 4096), (65536, 65536)]);
}

#[test]
fn a_frozen_copy_does_not_see_later_marks() {
    let b = DirtyBitmap::new(65536, 1 << 20).unwrap();
    b.mark(0, 1);
    let frozen = b.frozen();
    b.mark(1 << 19, 1);
    assert_eq!(extents(&frozen), vec![(0, 65536)]);
    assert_eq!(b.count(), 2);
}

#[test]
fn resizing_keeps_the_common_bits() {
    let b = DirtyBitmap::new(65536, 1 << 20).unwrap();
    b.mark(0, 1);
    b.mark((1 << 20) - 1, 1);
    let grown = b.resized(2 << 20);
    assert_eq!(grown.len(), 32);
    assert_eq!(
        extents(&grown),
        vec![(0, 65536), ((1 << 20) - 65536, 65536)]
    );
    let shrunk = b.resized(65536);
    assert_eq!(extents(&shrunk), vec![(0, 65536)]);
}

#[test]
fn qcow2_chunks_round_trip() {
    let b = DirtyBitmap::new(512, 10 << 20).unwrap();
    b.mark(0, 512);
    b.mark(3 << 20, 1 << 20);
    let bits = b.to_bits(4096);
    assert_eq!(bits.chunks.len(), 1);
    let back = DirtyBitmap::from_bits(&bits).unwrap();
    assert_eq!(extents(&back), extents(&b));
    // Chunks of all ones set only bits inside the disk.
    let mut ones = DirtyBits::new(65536, 100_000, 512);
    ones.chunks = vec![Chunk::Ones];
    let b = DirtyBitmap::from_bits(&ones).unwrap();
    assert_eq!(extents(&b), vec![(0, 100_000)]);
}

#[test]
fn threads_marking_at_once_lose_no_bit() {
    // Each thread marks every fourth granule of its own phase, so every
    // word is written by all threads at once.
    let b = Arc::new(DirtyBitmap::new(512, 64 << 20).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for i in (t..b.len()).step_by(4) {
                    b.mark(i * 512, 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(b.count(), b.len());
    assert_eq!(extents(&b), vec![(0, 64 << 20)]);
}

#[test]
fn take_range_clears_what_it_touches_and_says_if_any_was_dirty() {
    let b = DirtyBitmap::new(4096, 1 << 20).unwrap();
    b.mark(4096, 3 * 4096);
    b.mark(64 * 4096, 70 * 4096);
    assert!(!b.take_range(0, 4096));
    assert!(b.take_range(8192, 1));
    assert_eq!(
        extents(&b),
        vec![(4096, 4096), (12288, 4096), (64 * 4096, 70 * 4096)]
    );
    // Across a word boundary.
    assert!(b.take_range(60 * 4096, 20 * 4096));
    assert_eq!(
        extents(&b),
        vec![(4096, 4096), (12288, 4096), (80 * 4096, 54 * 4096)]
    );
    assert!(!b.take_range(1 << 20, 4096));
}
