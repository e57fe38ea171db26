//! Copy-before-write and the point-in-time view through real queues:
//! the view keeps the bytes of the instant while queues on several
//! threads overwrite the disk, zero granules are not copied, a failed
//! copy breaks the view and not the guest's write.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;
use crate::create::{create_image, CreateOptions};
use crate::options::{DiskOptions, ImageType};
use crate::request::{BlockRequest, IoMemory, RequestOp};
use crate::Disk;
use testkit::TempDir;

const MIB: u64 = 1 << 20;

/// A raw disk of `size` bytes whose byte at `i` is `pattern(i)`, except
/// the last MiB, which stays zero; and an empty qcow2 scratch image.
fn disks(dir: &TempDir, size: u64) -> (Disk, Disk) {
    let path = dir.path().join("d.raw");
    let mut data: Vec<u8> = (0..size).map(pattern).collect();
    data[(size - MIB) as usize..].fill(0);
    std::fs::write(&path, &data).unwrap();
    let source = Disk::open(&DiskOptions::new(&path)).unwrap();
    let scratch_path = dir.path().join("scratch.qcow2");
    create_image(&CreateOptions {
        path: scratch_path.clone(),
        format: ImageType::Format("qcow2"),
        size,
        ..Default::default()
    })
    .unwrap();
    let scratch = Disk::open(&DiskOptions::new(&scratch_path)).unwrap();
    (source, scratch)
}

fn pattern(i: u64) -> u8 {
    (i / 4096 * 7 + i % 251) as u8
}

fn begin(source: &Disk, scratch: &Disk) -> (Arc<CopyBeforeWrite>, PointInTimeView) {
    let cbw = Arc::new(CopyBeforeWrite::new(source, scratch).unwrap());
    source.live().set_cbw(Some(cbw.clone()));
    (cbw.clone(), PointInTimeView::new(cbw, None))
}

fn view_bytes(view: &PointInTimeView) -> Vec<u8> {
    let mut buf = vec![0; view.size() as usize];
    view.reader().unwrap().read(0, &mut buf).unwrap();
    buf
}

#[test]
fn the_view_keeps_the_instant_while_the_disk_changes() {
    let dir = TempDir::new("cbw-view");
    let size = 8 * MIB;
    let (source, scratch) = disks(&dir, size);
    let before = {
        let mut b = vec![0; size as usize];
        source.read_at(0, &mut b).unwrap();
        b
    };
    let (cbw, view) = begin(&source, &scratch);
    let mut q = source.queue().unwrap();
    q.run(
        RequestOp::Write,
        70_000,
        IoMemory::Owned(vec![0xee; 100_000]),
    )
    .unwrap();
    q.run(
        RequestOp::WriteZeroes {
            len: MIB,
            may_unmap: true,
        },
        2 * MIB,
        IoMemory::None,
    )
    .unwrap();
    q.run(RequestOp::Discard { len: 65536 }, 5 * MIB, IoMemory::None)
        .unwrap();
    // The zero tail: its granule is claimed, found zero, not written.
    q.run(
        RequestOp::Write,
        size - 4096,
        IoMemory::Owned(vec![1; 4096]),
    )
    .unwrap();
    assert_eq!(cbw.state(0), GranuleState::Uncopied);
    assert_eq!(cbw.state(1), GranuleState::Copied);
    assert_eq!(cbw.state(2), GranuleState::Copied);
    assert_eq!(
        cbw.state((size - 1) / cbw.granule()),
        GranuleState::CopiedZero
    );
    assert_eq!(cbw.copied_bytes(), (2 + 16 + 1) * 65536);
    assert!(
        view_bytes(&view) == before,
        "the view differs from the instant"
    );
    // Reads at odd offsets across copied and uncopied granules.
    let mut r = view.reader().unwrap();
    let mut part = vec![0; 300_000];
    r.read(12_345, &mut part).unwrap();
    assert!(part[..] == before[12_345..312_345]);
    // Block status: the zero tail reads as zeroes, copied data as data.
    let st = view.allocation(size - 65536, 65536).unwrap();
    assert!(st.zero && !st.data);
    let st = view.allocation(65536, 65536).unwrap();
    assert!(st.data && !st.zero && st.len == 65536);
    assert!(view.allocation(size - 1, 2).is_err());
    // The filter removed: writes no longer copy.
    source.live().set_cbw(None);
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![2; 4096]))
        .unwrap();
    assert_eq!(cbw.state(0), GranuleState::Uncopied);
}

#[test]
fn queues_on_many_threads_overwrite_while_readers_read_the_instant() {
    let dir = TempDir::new("cbw-threads");
    let size = 16 * MIB;
    let (source, scratch) = disks(&dir, size);
    let before = {
        let mut b = vec![0; size as usize];
        source.read_at(0, &mut b).unwrap();
        Arc::new(b)
    };
    let (cbw, view) = begin(&source, &scratch);
    let view = Arc::new(view);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let source = source.clone();
            s.spawn(move || {
                let mut q = source.queue().unwrap();
                // Overlapping batches of writes across granule borders,
                // each thread in its own order.
                for round in 0..40u64 {
                    let batch: Vec<BlockRequest> = (0..8u64)
                        .map(|k| {
                            let at = ((round * 8 + k) * 2_654_435_761 * (t + 1)) % (size - 200_000);
                            BlockRequest {
                                user_data: k,
                                op: RequestOp::Write,
                                offset: at,
                                memory: IoMemory::Owned(vec![0x80 | t as u8; 150_000]),
                            }
                        })
                        .collect();
                    q.submit_batch_requests(batch);
                    let mut out = Vec::new();
                    while q.in_flight() > 0 {
                        q.wait_completions(&mut out).unwrap();
                    }
                    assert!(out.iter().all(|c| c.result.is_ok()));
                }
            });
        }
        for _ in 0..2 {
            let view = view.clone();
            let before = before.clone();
            s.spawn(move || {
                let mut r = view.reader().unwrap();
                for pass in 0..6u64 {
                    let mut buf = vec![0; 1 << 20];
                    for chunk in 0..size / (1 << 20) {
                        let at = chunk * (1 << 20) + pass * 4096;
                        let len = (1u64 << 20).min(size - at) as usize;
                        r.read(at, &mut buf[..len]).unwrap();
                        assert!(
                            buf[..len] == before[at as usize..at as usize + len],
                            "view read at {at} saw a later write"
                        );
                    }
                }
            });
        }
    });
    assert!(cbw.copied_bytes() > 0);
    assert!(view_bytes(&view) == *before);
    source.live().set_cbw(None);
}

#[test]
fn a_failed_copy_breaks_the_view_and_not_the_write() {
    let dir = TempDir::new("cbw-broken");
    let size = 4 * MIB;
    let (source, scratch) = disks(&dir, size);
    let (cbw, view) = begin(&source, &scratch);
    let mut q = source.queue().unwrap();
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![3; 4096]))
        .unwrap();
    let mut r = view.reader().unwrap();
    let mut buf = vec![0; 4096];
    r.read(0, &mut buf).unwrap();
    cbw.fail_copies.store(true, Ordering::Relaxed);
    q.run(RequestOp::Write, MIB, IoMemory::Owned(vec![4; 4096]))
        .expect("the guest's write goes on");
    let mut back = vec![0; 4096];
    source.read_at(MIB, &mut back).unwrap();
    assert_eq!(back, vec![4; 4096]);
    assert!(cbw.broken().unwrap().contains("offset 1048576"));
    let e = r.read(0, &mut buf).unwrap_err();
    assert!(e.to_string().contains("read failed"), "{e}");
    assert!(std::error::Error::source(&e)
        .unwrap()
        .to_string()
        .contains("broken"));
    assert!(view.allocation(0, 4096).is_err());
    // Later writes go on without copying.
    q.run(RequestOp::Write, 2 * MIB, IoMemory::Owned(vec![5; 4096]))
        .unwrap();
    source.live().set_cbw(None);
}

#[test]
fn a_bitmap_change_keeps_the_copy_filter() {
    let dir = TempDir::new("cbw-bitmaps");
    let (source, scratch) = disks(&dir, 2 * MIB);
    let (cbw, _view) = begin(&source, &scratch);
    source
        .live()
        .bitmaps()
        .add("b", 65536, false, false)
        .unwrap();
    assert!(source.live().cbw().is_some_and(|c| Arc::ptr_eq(&c, &cbw)));
    let mut q = source.queue().unwrap();
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![3; 4096]))
        .unwrap();
    assert_eq!(cbw.state(0), GranuleState::Copied);
    source.live().set_cbw(None);
}

#[test]
fn next_dirty_runs_are_clipped() {
    let b = DirtyBitmap::new(65536, 10 * 65536 + 100).unwrap();
    b.mark(65536, 3 * 65536);
    b.mark(10 * 65536, 1);
    assert_eq!(b.next_dirty(0, 1 << 30), Some((65536, 3 * 65536)));
    assert_eq!(b.next_dirty(70_000, 80_000), Some((70_000, 10_000)));
    assert_eq!(b.next_dirty(4 * 65536, 10 * 65536), None);
    assert_eq!(b.next_dirty(4 * 65536, 1 << 30), Some((10 * 65536, 100)));
}
