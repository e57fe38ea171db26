//! The seam through real queues of a raw disk: what completes marks the
//! enabled bitmaps, nothing else does, and a queue picks up a change of
//! the filter set at its next batch.

use std::sync::Arc;

use super::*;
use crate::options::{DiskOptions, EngineKind};
use crate::request::{BlockRequest, IoMemory, RequestOp};
use crate::Disk;
use testkit::TempDir;

fn raw_disk(size: u64) -> (TempDir, Disk) {
    let dir = TempDir::new("live-seam");
    let path = dir.path().join("d.raw");
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    let mut o = DiskOptions::new(&path);
    o.engine = EngineKind::Sync;
    (dir, Disk::open(&o).unwrap())
}

fn extents(live: &LiveState, name: &str) -> Vec<(u64, u64)> {
    let reg = live.bitmaps();
    reg.find(name).unwrap().bitmap.extents().collect()
}

#[test]
fn completed_writes_zeroes_and_discards_mark_and_reads_do_not() {
    let (_dir, disk) = raw_disk(4 << 20);
    {
        let mut reg = disk.live().bitmaps();
        reg.configure(disk.size(), Some("raw".into()));
        reg.add("b", 65536, false, false).unwrap();
        reg.add("off", 65536, false, true).unwrap();
    }
    let mut q = disk.queue().unwrap();
    q.run(RequestOp::Write, 70_000, IoMemory::Owned(vec![1; 4096]))
        .unwrap();
    q.run(
        RequestOp::WriteZeroes {
            len: 65536,
            may_unmap: false,
        },
        1 << 20,
        IoMemory::None,
    )
    .unwrap();
    q.run(RequestOp::Discard { len: 4096 }, 3 << 20, IoMemory::None)
        .unwrap();
    q.run(RequestOp::Read, 2 << 20, IoMemory::Owned(vec![0; 65536]))
        .unwrap();
    q.run(RequestOp::Flush, 0, IoMemory::None).unwrap();
    assert_eq!(
        extents(disk.live(), "b"),
        vec![(65536, 65536), (1 << 20, 65536), (3 << 20, 65536)]
    );
    assert_eq!(extents(disk.live(), "off"), vec![]);
}

#[test]
fn a_failed_write_marks_its_range() {
    let (_dir, disk) = raw_disk(1 << 20);
    disk.live().bitmaps().configure(disk.size(), None);
    disk.live().bitmaps().add("b", 4096, false, false).unwrap();
    let mut q = disk.queue().unwrap();
    // Past the end of the disk: refused, yet it names a range.
    let r = q.run(
        RequestOp::Write,
        (1 << 20) - 4096,
        IoMemory::Owned(vec![0; 8192]),
    );
    assert!(r.is_err());
    assert_eq!(extents(disk.live(), "b"), vec![((1 << 20) - 4096, 4096)]);
}

#[test]
fn a_queue_sees_a_new_filter_set_at_its_next_batch() {
    let (_dir, disk) = raw_disk(1 << 20);
    let mut q = disk.queue().unwrap();
    let g0 = disk.live().generation();
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![1; 512]))
        .unwrap();
    {
        let mut reg = disk.live().bitmaps();
        reg.configure(disk.size(), None);
        reg.add("b", 512, false, false).unwrap();
    }
    assert_eq!(disk.live().generation(), g0 + 1);
    q.run(RequestOp::Write, 4096, IoMemory::Owned(vec![1; 512]))
        .unwrap();
    assert_eq!(extents(disk.live(), "b"), vec![(4096, 512)]);
    // Disabled: the next batch no longer marks.
    disk.live().bitmaps().disable("b").unwrap();
    q.run(RequestOp::Write, 8192, IoMemory::Owned(vec![1; 512]))
        .unwrap();
    assert_eq!(extents(disk.live(), "b"), vec![(4096, 512)]);
    // A guard that changes nothing keeps the generation.
    let g = disk.live().generation();
    drop(disk.live().bitmaps());
    assert_eq!(disk.live().generation(), g);
}

#[test]
fn every_queue_marks_the_same_bitmap() {
    let (_dir, disk) = raw_disk(8 << 20);
    disk.live().bitmaps().configure(disk.size(), None);
    disk.live().bitmaps().add("b", 65536, false, false).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let disk = disk.clone();
            std::thread::spawn(move || {
                let mut q = disk.queue().unwrap();
                let reqs = (0..8u64).map(|i| BlockRequest {
                    user_data: i,
                    op: RequestOp::Write,
                    offset: (t * 32 + i * 4) * 65536,
                    memory: IoMemory::Owned(vec![t as u8; 4096]),
                });
                q.submit_batch_requests(reqs);
                let mut out = Vec::new();
                while q.in_flight() > 0 {
                    q.wait_completions(&mut out).unwrap();
                }
                assert_eq!(out.len(), 8);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let reg = disk.live().bitmaps();
    let b = &reg.find("b").unwrap().bitmap;
    assert_eq!(b.count(), 32);
    for t in 0..4u64 {
        for i in 0..8u64 {
            assert!(b.get(t * 32 + i * 4));
        }
    }
}

#[test]
fn registry_refuses_as_qemu_does_and_restores_a_checkpoint() {
    let mut reg = BitmapRegistry::default();
    reg.configure(1 << 20, Some("raw images keep bitmaps in memory".into()));
    assert_eq!(
        reg.add("a", 1000, false, false),
        Err(LiveError::BadGranularity(
            check_granularity(1000).unwrap_err()
        ))
    );
    assert_eq!(reg.add("", 65536, false, false), Err(LiveError::BadName));
    assert!(matches!(
        reg.add("p", 65536, true, false),
        Err(LiveError::NotPersistable { .. })
    ));
    reg.add("a", 65536, false, false).unwrap();
    assert_eq!(
        reg.add("a", 65536, false, false),
        Err(LiveError::Exists("a".into()))
    );
    assert_eq!(reg.clear("x"), Err(LiveError::NotFound("x".into())));
    reg.insert(NamedBitmap {
        name: "broken".into(),
        bitmap: Arc::new(DirtyBitmap::new(65536, 1 << 20).unwrap()),
        enabled: true,
        persistent: true,
        inconsistent: true,
    })
    .unwrap();
    assert_eq!(reg.recording().len(), 1);
    assert_eq!(
        reg.merge("a", &["broken".into()]),
        Err(LiveError::Inconsistent("broken".into()))
    );
    assert_eq!(
        reg.enable("broken"),
        Err(LiveError::Inconsistent("broken".into()))
    );
    reg.list()[0].bitmap.mark(0, 1);
    let saved = reg.checkpoint();
    reg.add("b", 4096, false, false).unwrap();
    reg.list()[2].bitmap.mark(100_000, 1);
    reg.merge("a", &["b".into()]).unwrap();
    reg.remove("broken").unwrap();
    assert_eq!(reg.find("a").unwrap().bitmap.count(), 2);
    reg.restore(saved);
    let names: Vec<_> = reg.list().iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["a", "broken"]);
    assert_eq!(reg.find("a").unwrap().bitmap.count(), 1);
}

#[test]
fn bitmaps_taken_over_by_another_disk_go_on_recording_there() {
    let (_d1, old) = raw_disk(4 << 20);
    let (_d2, new) = raw_disk(4 << 20);
    {
        let mut reg = old.live().bitmaps();
        reg.configure(old.size(), Some("raw".into()));
        reg.add("b", 65536, false, false).unwrap();
    }
    new.live()
        .bitmaps()
        .configure(new.size(), Some("raw".into()));
    let mut q = old.queue().unwrap();
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![1; 4096]))
        .unwrap();
    new.live().take_bitmaps_from(old.live()).unwrap();
    assert!(old.live().bitmaps().find("b").is_none());
    // The old disk's queue no longer marks it; the new disk's does.
    q.run(RequestOp::Write, 1 << 20, IoMemory::Owned(vec![1; 4096]))
        .unwrap();
    let mut q = new.queue().unwrap();
    q.run(RequestOp::Write, 2 << 20, IoMemory::Owned(vec![1; 4096]))
        .unwrap();
    assert_eq!(extents(new.live(), "b"), vec![(0, 65536), (2 << 20, 65536)]);
}
