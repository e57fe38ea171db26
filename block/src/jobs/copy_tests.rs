//! The copier's pipeline: a batch's writes stay in flight while the next
//! batch is read, never two writes of the same bytes at once, a batch's
//! hold lives until its writes are done, and what is zero on a zeroed
//! target is skipped.

use std::sync::Arc;

use super::copy::{Copied, Copier, Hold, DEPTH};
use super::tests::{same_bytes, MIB};
use crate::options::{DiskOptions, EngineKind};
use crate::Disk;
use testkit::TempDir;

fn open(dir: &TempDir, name: &str, size: u64) -> Disk {
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    let mut o = DiskOptions::new(&path);
    o.engine = EngineKind::IoUring;
    Disk::open(&o).unwrap()
}

fn allocated_bytes(disk: &Disk) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(&disk.options().path).unwrap().blocks() * 512
}

#[test]
fn the_next_batch_is_read_while_this_one_is_written() {
    let dir = TempDir::new("copier-pipeline");
    let (source, target) = (open(&dir, "s.raw", 16 * MIB), open(&dir, "t.raw", 16 * MIB));
    for i in 0..8 {
        source
            .write_at(i * 2 * MIB, &vec![0x10 + i as u8; MIB as usize])
            .unwrap();
    }
    let mut c = Copier::new(&source, &target).unwrap();
    let holds: Vec<Arc<()>> = (0..4).map(|_| Arc::new(())).collect();
    for (i, hold) in holds.iter().enumerate() {
        let i = i as u64;
        let batch = [(i * 4 * MIB, MIB), (i * 4 * MIB + 2 * MIB, MIB)];
        c.start(&batch, true, Some(Box::new(hold.clone()) as Hold))
            .unwrap();
    }
    assert_eq!(
        c.most_writing, DEPTH,
        "writes of two batches in flight at once"
    );
    // Batches finished on the way dropped their holds: at most the
    // last DEPTH are still being written (or not yet reaped).
    let alive = holds.iter().filter(|h| Arc::strong_count(h) > 1).count();
    assert!(alive <= DEPTH, "{alive} holds alive");
    c.finish().unwrap();
    assert!(
        holds.iter().all(|h| Arc::strong_count(h) == 1),
        "holds outlived their writes"
    );
    assert_eq!(
        c.take_finished(),
        Copied {
            bytes: 8 * MIB,
            zero: 0
        }
    );
    assert!(!c.writing());
    same_bytes(&source, &target);
}

/// A batch that meets one still being written waits for it: the later
/// copy of the same bytes always lands last.
#[test]
fn a_batch_meeting_one_in_flight_waits_for_it() {
    let dir = TempDir::new("copier-overlap");
    let (source, target) = (open(&dir, "s.raw", 4 * MIB), open(&dir, "t.raw", 4 * MIB));
    source.write_at(0, &vec![0x61; MIB as usize]).unwrap();
    let mut c = Copier::new(&source, &target).unwrap();
    for round in 0..20u8 {
        c.start(&[(0, MIB)], false, None).unwrap();
        source
            .write_at(0, &vec![0x62 + round; MIB as usize])
            .unwrap();
    }
    c.start(&[(0, MIB)], false, None).unwrap();
    assert_eq!(c.most_writing, 1, "two writes of the same bytes in flight");
    // Rounded out to 4 MiB the ranges below meet the one in flight.
    c.settle(&[(3 * MIB, 4096)], 4 * MIB).unwrap();
    assert!(!c.writing());
    same_bytes(&source, &target);
}

/// Zero ranges: skipped on a target that reads zeroes there, written as
/// zeroes (unmapped: the target stays sparse) on one that does not.
#[test]
fn zero_ranges_are_skipped_or_unmapped() {
    let dir = TempDir::new("copier-zero");
    let (source, target) = (open(&dir, "s.raw", 8 * MIB), open(&dir, "t.raw", 8 * MIB));
    source.write_at(MIB, &vec![0x71; MIB as usize]).unwrap();
    let mut c = Copier::new(&source, &target).unwrap();
    let all = [(0, MIB), (MIB, MIB), (2 * MIB, MIB), (3 * MIB, MIB)];
    let copied = c.copy(&all, true).unwrap();
    assert_eq!(
        copied,
        Copied {
            bytes: 4 * MIB,
            zero: 3 * MIB
        }
    );
    assert_eq!(allocated_bytes(&target), MIB, "only the data was written");
    // Old data on the target where the source now reads zeroes.
    target.write_at(2 * MIB, &vec![0x72; MIB as usize]).unwrap();
    c.copy(&all, false).unwrap();
    same_bytes(&source, &target);
    assert_eq!(allocated_bytes(&target), MIB, "zeroes unmapped");
}

/// Writes in flight stay with their thread: another thread is refused
/// until they are done, then gets queues of its own.
#[test]
fn writes_in_flight_keep_the_copier_on_its_thread() {
    let dir = TempDir::new("copier-thread-writing");
    let (source, target) = (open(&dir, "s.raw", 4 * MIB), open(&dir, "t.raw", 4 * MIB));
    source.write_at(0, &vec![0x81; MIB as usize]).unwrap();
    source.write_at(2 * MIB, &vec![0x82; MIB as usize]).unwrap();
    let copier = std::sync::Mutex::new(Copier::new(&source, &target).unwrap());
    copier
        .lock()
        .unwrap()
        .start(&[(0, MIB)], true, None)
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let e = copier
                .lock()
                .unwrap()
                .copy(&[(2 * MIB, MIB)], true)
                .unwrap_err();
            assert!(e.contains("in flight on another thread"), "{e}");
        });
    });
    copier.lock().unwrap().finish().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            copier
                .lock()
                .unwrap()
                .copy(&[(2 * MIB, MIB)], true)
                .unwrap()
        });
    });
    same_bytes(&source, &target);
}
