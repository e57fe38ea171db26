//! The mirror through real queues: a "guest" queue writes the source
//! while the job copies; after ready, the last dirty granules copied with
//! the writer stopped (the owner's pause), the target reads as the
//! source does and stays sparse; refusals write nothing; a cancel ends
//! the job and removes the target it made.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::options::{DiskOptions, EngineKind};
use crate::request::{IoMemory, RequestOp};
use crate::Disk;
use testkit::TempDir;

pub(super) const MIB: u64 = 1 << 20;

pub(super) fn raw_source(dir: &TempDir, size: u64) -> Disk {
    let path = dir.path().join("src.raw");
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    let mut o = DiskOptions::new(&path);
    o.engine = EngineKind::Sync;
    let d = Disk::open(&o).unwrap();
    // Data in a few places, holes between them.
    d.write_at(0, &vec![0x11; MIB as usize]).unwrap();
    d.write_at(5 * MIB + 4096, &[0x22; 8192]).unwrap();
    d.write_at(size - MIB, &vec![0x33; MIB as usize]).unwrap();
    d
}

pub(super) fn spec(path: &Path, format: &str) -> TargetSpec {
    TargetSpec {
        path: path.to_owned(),
        format: Some(format.into()),
        existing: false,
        sync: SyncMode::Full,
    }
}

pub(super) fn wait_state(job: &Job, want: JobState, within: Duration) -> JobStatus {
    let deadline = Instant::now() + within;
    loop {
        let s = job.status();
        if s.state == want || s.state.is_final() || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start(source: &Disk, target: MirrorTarget) -> (Arc<Mirror>, Job) {
    start_in(source, target, MirrorMode::Background)
}

pub(super) fn start_in(
    source: &Disk,
    target: MirrorTarget,
    mode: MirrorMode,
) -> (Arc<Mirror>, Job) {
    let mirror =
        Arc::new(Mirror::new(source.clone(), target, SyncMode::Full, 65536, mode).unwrap());
    // The owner attaches the job with the queues quiesced; no guest
    // request is in flight here.
    mirror.attach();
    let shared = JobShared::new("job-1", "mirror", "disk0", 0);
    let m = mirror.clone();
    let job = Job::spawn(shared, move |s| m.run(s)).unwrap();
    (mirror, job)
}

pub(super) fn same_bytes(a: &Disk, b: &Disk) {
    assert_eq!(a.size(), b.size());
    let mut x = vec![0; MIB as usize];
    let mut y = vec![0; MIB as usize];
    for off in (0..a.size()).step_by(MIB as usize) {
        a.read_at(off, &mut x).unwrap();
        b.read_at(off, &mut y).unwrap();
        assert!(
            x == y,
            "the target differs from the source in MiB {}",
            off / MIB
        );
    }
}

#[test]
fn mirror_follows_guest_writes_and_reaches_a_sparse_copy() {
    let dir = TempDir::new("mirror-job");
    let size = 64 * MIB;
    let source = raw_source(&dir, size);
    let target_path = dir.path().join("t.qcow2");
    let target = open_target(&source, &spec(&target_path, "qcow2")).unwrap();
    let (mirror, mut job) = start(&source, target);

    // The guest writes rounds all over the disk while the job copies, at
    // a pace a background mirror can follow (one needs a look at the
    // bitmap that finds nothing dirty; against a writer at full speed
    // only write-blocking mode converges: write_blocking_tests).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (source, stop) = (source.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut q = source.queue().unwrap();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let off = (round * 7919 * 4096) % (size / 2);
                q.run(
                    RequestOp::Write,
                    off,
                    IoMemory::Owned(vec![round as u8; 4096]),
                )
                .unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            round
        })
    };
    let s = wait_state(&job, JobState::Ready, Duration::from_secs(30));
    assert_eq!(s.state, JobState::Ready, "{s:?}");
    std::thread::sleep(Duration::from_millis(50));
    // The owner's complete: the thread parked, the guest stopped.
    assert!(job.park(Duration::from_secs(10)));
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 0);
    mirror.sync_rest(job.shared()).unwrap();
    let target = mirror.take_target().unwrap();
    job.shared().set_state(JobState::Completed);
    job.stop();
    assert_eq!(job.status().state, JobState::Completed);
    assert_eq!(job.status().error, None);
    same_bytes(&source, target.image.disk());
    // Sparse: what was never written (the guest wrote the first half
    // only) is not allocated.
    let status = target
        .image
        .disk()
        .format()
        .block_status(40 * MIB, MIB)
        .unwrap();
    assert!(!status.data, "{status:?}");
    let image = target.into_image();
    image.close().unwrap();
    assert!(target_path.exists());
}

#[test]
fn cancel_before_ready_stops_and_removes_the_target_it_made() {
    let dir = TempDir::new("mirror-cancel");
    let source = raw_source(&dir, 256 * MIB);
    source.write_at(0, &vec![0x44; 64 * MIB as usize]).unwrap();
    let target_path = dir.path().join("t.raw");
    let target = open_target(&source, &spec(&target_path, "raw")).unwrap();
    let (mirror, mut job) = start(&source, target);
    job.shared().set_speed(MIB);
    std::thread::sleep(Duration::from_millis(30));
    job.cancel();
    job.join();
    mirror.release();
    let s = job.status();
    assert_eq!(s.state, JobState::Cancelled, "{s:?}");
    assert!(s.bytes_done < s.bytes_total, "{s:?}");
    assert!(!target_path.exists());
    // The source is untouched and its seam has no bitmap left.
    let mut b = vec![0; 4096];
    source.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0x44));
    assert!(source.live().filters().1.is_empty());
}

#[test]
fn refused_targets_write_nothing() {
    let dir = TempDir::new("mirror-refuse");
    let source = raw_source(&dir, 8 * MIB);
    let src_path = source.options().path.clone();
    let e = open_target(&source, &spec(&src_path, "raw")).err().unwrap();
    assert!(matches!(e, TargetError::IsSource(_)), "{e}");
    let other = dir.path().join("exists.raw");
    std::fs::write(&other, b"keep").unwrap();
    let e = open_target(&source, &spec(&other, "raw")).err().unwrap();
    assert!(matches!(e, TargetError::Exists(_)), "{e}");
    let mut existing = spec(&other, "raw");
    existing.existing = true;
    let e = open_target(&source, &existing).err().unwrap();
    assert!(matches!(e, TargetError::SizeDiffers { .. }), "{e}");
    assert_eq!(std::fs::read(&other).unwrap(), b"keep");
    let e = open_target(&source, &spec(&dir.path().join("n"), "vmdk"))
        .err()
        .unwrap();
    assert!(matches!(e, TargetError::Invalid(_)), "{e}");
    assert!(!dir.path().join("n").exists());
}

/// A copier's io_uring queues belong to the thread that used them first;
/// the owner's thread (the last granules of a complete) gets its own.
#[test]
fn a_copier_used_on_a_second_thread_copies_there_too() {
    let dir = TempDir::new("copier-threads");
    let open = |name: &str| {
        let path = dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(4 * MIB)
            .unwrap();
        let mut o = DiskOptions::new(&path);
        o.engine = EngineKind::IoUring;
        Disk::open(&o).unwrap()
    };
    let (source, target) = (open("s.raw"), open("t.raw"));
    source.write_at(0, &vec![0x44; MIB as usize]).unwrap();
    source.write_at(2 * MIB, &vec![0x55; MIB as usize]).unwrap();
    let copier = std::sync::Mutex::new(copy::Copier::new(&source, &target).unwrap());
    std::thread::scope(|s| {
        s.spawn(|| copier.lock().unwrap().copy(&[(0, MIB)], true).unwrap());
    });
    copier
        .lock()
        .unwrap()
        .copy(&[(2 * MIB, MIB)], true)
        .unwrap();
    same_bytes(&source, &target);
}
