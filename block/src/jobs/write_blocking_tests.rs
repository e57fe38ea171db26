//! The write-blocking mirror through real queues: the copier's old copy
//! of a granule never lands over a mirrored guest write; the job reaches
//! `ready` while writers never stop (one of them on a single granule) and
//! copies nothing again for the writes it mirrored; a target write that
//! fails fails the job, never the guest's write; two queues' writes to
//! the same bytes at once end as on the source.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tests::{raw_source, same_bytes, spec, start_in, wait_state, MIB};
use super::*;
use crate::live::CompletionHook;
use crate::request::{Completion, IoMemory, RequestOp};
use crate::Disk;
use testkit::TempDir;

/// Writes `byte` x 4 KiB at `offset` through a queue of its own, as a
/// guest queue would; returns the source's result and how long it took.
fn guest_write(source: &Disk, offset: u64, byte: u8) -> (Result<u64, String>, Duration) {
    let mut q = source.queue().unwrap();
    let t = Instant::now();
    let r = q
        .run(RequestOp::Write, offset, IoMemory::Owned(vec![byte; 4096]))
        .map(|(n, _)| n)
        .map_err(|e| e.to_string());
    (r, t.elapsed())
}

fn read4k(d: &Disk, offset: u64) -> Vec<u8> {
    let mut b = vec![0; 4096];
    d.read_at(offset, &mut b).unwrap();
    b
}

/// The hazard the granule claims close: the copier reads granule G, a
/// guest write to G completes and is mirrored, then the copier writes
/// what it read. Without the claims the target ends with the old bytes.
#[test]
fn the_copier_never_writes_an_old_copy_over_a_mirrored_write() {
    let dir = TempDir::new("wb-race");
    let source = raw_source(&dir, 8 * MIB);
    // raw_source put 0x11 in the first MiB.
    let target = open_target(&source, &spec(&dir.path().join("t.raw"), "raw")).unwrap();
    let mirror = Arc::new(
        Mirror::new(
            source.clone(),
            target,
            SyncMode::Full,
            65536,
            MirrorMode::WriteBlocking,
        )
        .unwrap(),
    );
    mirror.attach();
    // The copier stops between its read and its write long enough for
    // an unprotected guest write to be mirrored in between.
    let (read_done, after_read) = mpsc::channel();
    mirror.set_after_read(Box::new(move || {
        let _ = read_done.send(());
        std::thread::sleep(Duration::from_millis(300));
    }));
    let copier = {
        let m = mirror.clone();
        std::thread::spawn(move || m.copy_claimed(&[(0, MIB)], true).unwrap())
    };
    after_read.recv().unwrap();
    let (result, took) = guest_write(&source, 64 << 10, 0x77);
    assert_eq!(result, Ok(4096));
    copier.join().unwrap();
    let target = mirror.take_target().unwrap();
    let there = read4k(target.image.disk(), 64 << 10);
    assert!(
        there.iter().all(|&b| b == 0x77),
        "the copier's old copy landed over the mirrored write (0x{:x})",
        there[0]
    );
    assert_eq!(read4k(target.image.disk(), 0), vec![0x11; 4096]);
    // The guest's completion waited for the copier's write.
    assert!(took >= Duration::from_millis(100), "{took:?}");
    // Mirrored: nothing for the copier to copy again.
    assert_eq!(mirror.bitmap().extents().count(), 0);
    mirror.release();
    target.close().unwrap();
}

#[test]
fn write_blocking_reaches_ready_under_writers_that_never_stop() {
    let dir = TempDir::new("wb-converge");
    let size = 64 * MIB;
    let source = raw_source(&dir, size);
    source
        .write_at(MIB, &vec![0x44; 16 * MIB as usize])
        .unwrap();
    let target = open_target(&source, &spec(&dir.path().join("t.qcow2"), "qcow2")).unwrap();
    let (mirror, mut job) = start_in(&source, target, MirrorMode::WriteBlocking);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    // Two writers as fast as they go: one all over the first half past
    // its first MiB, one on a single granule in that first MiB (the one
    // a background mirror would copy for ever). They never write one
    // granule at once: such writes are also left to the copier (the last
    // test), which this test would see as copying again.
    let writers: Vec<_> = [false, true]
        .into_iter()
        .map(|hot| {
            let (source, stop, written) = (source.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut q = source.queue().unwrap();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let off = if hot {
                        (round % 16) * 4096
                    } else {
                        MIB + (round * 7919 * 4096) % (size / 2 - MIB)
                    };
                    q.run(
                        RequestOp::Write,
                        off,
                        IoMemory::Owned(vec![round as u8; 4096]),
                    )
                    .unwrap();
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let s = wait_state(&job, JobState::Ready, Duration::from_secs(60));
    assert_eq!(s.state, JobState::Ready, "{s:?}");
    // From ready on, every write is mirrored: nothing is copied again.
    let at_ready = written.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let later = job.status();
    assert_eq!(later.state, JobState::Ready, "{later:?}");
    assert_eq!(later.bytes_total, s.bytes_total, "{s:?} then {later:?}");
    let during = written.load(Ordering::Relaxed) - at_ready;
    assert!(during > 20, "the writers wrote {during} times in 500 ms");
    // The owner's complete.
    assert!(job.park(Duration::from_secs(10)));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    mirror.sync_rest(job.shared()).unwrap();
    assert!(source.live().filters().1.mirror.is_none());
    let target = mirror.take_target().unwrap();
    job.shared().set_state(JobState::Completed);
    job.stop();
    assert_eq!(job.status().error, None);
    same_bytes(&source, target.image.disk());
    mirror.release();
    target.into_image().close().unwrap();
}

#[test]
fn a_failed_target_write_fails_the_job_and_never_the_guest() {
    let dir = TempDir::new("wb-fail");
    let source = raw_source(&dir, 16 * MIB);
    let target_path = dir.path().join("t.qcow2");
    let target = open_target(&source, &spec(&target_path, "qcow2")).unwrap();
    let (mirror, mut job) = start_in(&source, target, MirrorMode::WriteBlocking);
    let s = wait_state(&job, JobState::Ready, Duration::from_secs(30));
    assert_eq!(s.state, JobState::Ready, "{s:?}");
    mirror
        .writes()
        .unwrap()
        .fail_writes
        .store(true, Ordering::Relaxed);
    let (result, _) = guest_write(&source, 2 * MIB, 0x99);
    assert_eq!(result, Ok(4096), "the guest saw the target's error");
    assert_eq!(read4k(&source, 2 * MIB), vec![0x99; 4096]);
    let s = wait_state(&job, JobState::Failed, Duration::from_secs(10));
    assert_eq!(s.state, JobState::Failed, "{s:?}");
    assert!(
        s.error
            .as_deref()
            .unwrap_or("")
            .contains("writing the target"),
        "{s:?}"
    );
    job.join();
    mirror.release();
    // The filter is off the seam and the target the job made is gone;
    // the guest goes on writing.
    assert!(source.live().filters().1.is_empty());
    assert!(!target_path.exists());
    assert_eq!(guest_write(&source, 3 * MIB, 0x9a).0, Ok(4096));
}

/// An existing target gets zeroes where the source read zeroes when the
/// first pass began; a guest write mirrored there since is not wiped:
/// the range goes to the copier instead.
#[test]
fn zeroing_an_existing_target_keeps_a_mirrored_write() {
    let dir = TempDir::new("wb-zero");
    let source = raw_source(&dir, 8 * MIB);
    let target_path = dir.path().join("t.raw");
    std::fs::write(&target_path, vec![0xee; 8 * MIB as usize]).unwrap();
    let mut existing = spec(&target_path, "raw");
    existing.existing = true;
    let target = open_target(&source, &existing).unwrap();
    let mirror = Arc::new(
        Mirror::new(
            source.clone(),
            target,
            SyncMode::Full,
            65536,
            MirrorMode::WriteBlocking,
        )
        .unwrap(),
    );
    mirror.attach();
    // 2..4 MiB read zeroes when the pass looked; then the guest wrote.
    assert_eq!(guest_write(&source, 3 * MIB, 0x66).0, Ok(4096));
    let format = source.format().clone();
    mirror.zero_target(&format, 2 * MIB, 2 * MIB).unwrap();
    // Where nothing was written since, the target reads zeroes.
    mirror.zero_target(&format, 6 * MIB, MIB).unwrap();
    let target = mirror.take_target().unwrap();
    let kept = read4k(target.image.disk(), 3 * MIB);
    assert!(
        kept.iter().all(|&b| b == 0x66),
        "the mirrored write was zeroed (0x{:x})",
        kept[0]
    );
    assert!(read4k(target.image.disk(), 6 * MIB).iter().all(|&b| b == 0));
    // The copier copies the range from the source.
    let dirty: Vec<_> = mirror.bitmap().extents().collect();
    assert_eq!(dirty, vec![(2 * MIB, 2 * MIB)]);
    mirror.release();
    target.close().unwrap();
}

/// Two queues write the same bytes at once: A (queue 1) lands on the
/// source first, B (queue 2) last, but queue 2 mirrors B before queue 1
/// mirrors A, so the target would end with A and the source with B. The
/// filter counts writes from submission: B's mirroring finds A in flight
/// and leaves the range to the copier, which copies the source's B after
/// both.
#[test]
fn writes_of_two_queues_to_the_same_bytes_end_equal_on_the_target() {
    let dir = TempDir::new("wb-same-bytes");
    let source = raw_source(&dir, 16 * MIB);
    let target = open_target(&source, &spec(&dir.path().join("t.qcow2"), "qcow2")).unwrap();
    let (mirror, mut job) = start_in(&source, target, MirrorMode::WriteBlocking);
    let s = wait_state(&job, JobState::Ready, Duration::from_secs(30));
    assert_eq!(s.state, JobState::Ready, "{s:?}");
    // The owner takes over, as for a complete: the copier is idle.
    assert!(job.park(Duration::from_secs(10)));
    let filter = mirror.writes().unwrap().clone();
    let mut q1 = filter.clone().queue_handle();
    let mut q2 = filter.clone().queue_handle();
    let at = 2 * MIB;
    let done = |byte: u8| Completion {
        user_data: 0,
        op: RequestOp::Write,
        offset: at,
        len: 4096,
        result: Ok(4096),
        memory: IoMemory::Owned(vec![byte; 4096]),
    };
    q1.before_write(at, 4096);
    q2.before_write(at, 4096);
    source.write_at(at, &[0xAA; 4096]).unwrap();
    source.write_at(at, &[0xBB; 4096]).unwrap();
    q2.completed(&[done(0xBB)]);
    q1.completed(&[done(0xAA)]);
    mirror.sync_rest(job.shared()).unwrap();
    let target = mirror.take_target().unwrap();
    job.shared().set_state(JobState::Completed);
    job.stop();
    assert_eq!(job.status().error, None);
    let held = read4k(target.image.disk(), at);
    assert!(
        held.iter().all(|&b| b == 0xBB),
        "the target holds {:#x}, the source 0xbb",
        held[0]
    );
    same_bytes(&source, target.image.disk());
    mirror.release();
    target.into_image().close().unwrap();
}
