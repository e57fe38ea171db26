//! Stream and commit through real queues and images: the populate race
//! (the guest's write wins, decided under the format's lock: each order
//! checked one step at a time, then a guest writing during a whole
//! stream), the chain rewrite after a stream (with and without a base,
//! checked by reopening and by `qemu-img`), a commit of an
//! intermediate layer, and the second open beside a running one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::populate::populate;
use super::*;
use crate::create::{create_image, CreateOptions};
use crate::formats::WriteOutcome;
use crate::options::{DiskOptions, EngineKind, ImageType};
use crate::request::{IoMemory, RequestOp};
use crate::{Disk, ExclusiveImage};
use testkit::TempDir;

const CLUSTER: u64 = 65536;
const SIZE: u64 = 8 << 20;

fn qcow2(path: &Path, backing: Option<&Path>) {
    create_image(&CreateOptions {
        path: path.to_owned(),
        format: ImageType::Format("qcow2"),
        size: SIZE,
        backing_file: backing.map(|b| b.display().to_string()),
        backing_fmt: backing.map(|_| ImageType::Format("qcow2")),
        ..Default::default()
    })
    .unwrap();
}

fn opts(path: &Path) -> DiskOptions {
    let mut o = DiskOptions::new(path);
    o.engine = EngineKind::Sync;
    o
}

/// Writes `byte` over `len` bytes at `offset` of the image at `path`.
fn fill(path: &Path, offset: u64, len: u64, byte: u8) {
    let d = Disk::open(&opts(path)).unwrap();
    d.write_at(offset, &vec![byte; len as usize]).unwrap();
    d.close().unwrap();
}

/// base (0xAA in MiB 0..4) <- mid (0xBB in MiB 2..3, a zero cluster
/// at MiB 3) <- top (0xCC in the first cluster).
fn chain(dir: &TempDir) -> (PathBuf, PathBuf, PathBuf) {
    let (base, mid, top) = (
        dir.path().join("base.qcow2"),
        dir.path().join("mid.qcow2"),
        dir.path().join("top.qcow2"),
    );
    qcow2(&base, None);
    fill(&base, 0, 4 << 20, 0xAA);
    qcow2(&mid, Some(&base));
    fill(&mid, 2 << 20, 1 << 20, 0xBB);
    let d = Disk::open(&opts(&mid)).unwrap();
    d.write_zeroes(3 << 20, CLUSTER, false).unwrap();
    d.close().unwrap();
    drop(d);
    qcow2(&top, Some(&mid));
    fill(&top, 0, CLUSTER, 0xCC);
    (base, mid, top)
}

fn contents(d: &Disk) -> Vec<u8> {
    let mut v = vec![0; d.size() as usize];
    d.read_at(0, &mut v).unwrap();
    v
}

fn waker() -> Arc<EventFd> {
    Arc::new(EventFd::new(EFD_NONBLOCK).unwrap())
}

#[test]
fn a_populate_never_overwrites_what_the_guest_wrote_first() {
    let dir = TempDir::new("populate-order");
    let (_, _, top) = chain(&dir);
    let d = Disk::open(&opts(&top)).unwrap();
    let f = d.format().clone();
    let w = waker();
    // 1. The guest wrote cluster 2 first: the populate leaves it.
    d.write_at(2 * CLUSTER + 512, &[0x11; 512]).unwrap();
    let backing = vec![0xAA; 4 * CLUSTER as usize];
    let written = populate(f.as_ref(), CLUSTER, &backing, &w).unwrap();
    // Clusters 1, 3 and 4 were unallocated; 2 was the guest's.
    assert_eq!(written, 3 * CLUSTER);
    let mut b = vec![0; CLUSTER as usize];
    d.read_at(2 * CLUSTER, &mut b).unwrap();
    assert_eq!(&b[512..1024], &[0x11; 512]);
    assert!(
        b[..512].iter().all(|&x| x == 0xAA),
        "the guest's COW kept the backing data"
    );
    // Cluster 0 (the top's own 0xCC) is left too.
    assert_eq!(
        populate(f.as_ref(), 0, &backing[..CLUSTER as usize], &w).unwrap(),
        0
    );
    d.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xCC));

    // 2. A populate planned first: a guest write to the cluster waits
    //    for its commit, then lands on it.
    let WriteOutcome::Ready(plan) = f.plan_populate(8 * CLUSTER, CLUSTER, &w).unwrap() else {
        panic!("an idle cluster is not blocked");
    };
    assert_eq!(
        f.plan_write(8 * CLUSTER, 4096, &w).unwrap(),
        WriteOutcome::Blocked
    );
    f.commit(plan.commit.expect("an allocating plan commits"))
        .unwrap();
    d.write_at(8 * CLUSTER, &[0x22; 4096]).unwrap();
    d.read_at(8 * CLUSTER, &mut b).unwrap();
    assert_eq!(&b[..4096], &[0x22; 4096]);

    // 3. A guest write allocating first (its plan in flight): the
    //    populate is blocked, and after the guest's commit it finds the
    //    cluster allocated and writes nothing.
    let WriteOutcome::Ready(guest) = f.plan_write(9 * CLUSTER, 4096, &w).unwrap() else {
        panic!("an idle cluster is not blocked");
    };
    assert_eq!(
        f.plan_populate(9 * CLUSTER, CLUSTER, &w).unwrap(),
        WriteOutcome::Blocked
    );
    f.commit(guest.commit.expect("an allocating write commits"))
        .unwrap();
    let WriteOutcome::Ready(after) = f.plan_populate(9 * CLUSTER, CLUSTER, &w).unwrap() else {
        panic!("blocked after the guest's commit");
    };
    assert!(after.ops.is_empty() && after.commit.is_none(), "{after:?}");
    // Not whole clusters: refused.
    assert!(f.plan_populate(CLUSTER + 512, CLUSTER, &w).is_err());
    d.close().unwrap();
}

/// Runs a stream of `d` to its end; returns the guest's writes.
fn run_stream(d: &Disk, base_depth: Option<u32>, guest: bool) -> Vec<(u64, u8)> {
    let stream = Arc::new(Stream::new(d.clone(), base_depth).unwrap());
    let s = stream.clone();
    let mut job = Job::spawn(JobShared::new("job-1", "stream", "d", 0), move |j| s.run(j)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // A guest writing stamped 4 KiB blocks all over the disk meanwhile.
    let writer = guest.then(|| {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut q = d.queue().unwrap();
            let mut wrote = Vec::new();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) || round < 64 {
                round += 1;
                let off = (round * 7919 * 4096) % SIZE;
                let stamp = (round % 250) as u8 + 1;
                q.run(RequestOp::Write, off, IoMemory::Owned(vec![stamp; 4096]))
                    .unwrap();
                wrote.push((off, stamp));
            }
            wrote
        })
    });
    job.join();
    stop.store(true, Ordering::Relaxed);
    let wrote = writer.map(|w| w.join().unwrap()).unwrap_or_default();
    let s = job.status();
    assert_eq!((s.state, s.error.as_deref()), (JobState::Running, None));
    assert!(stream.copied());
    assert_eq!(s.bytes_done, s.bytes_total);
    stream.release();
    wrote
}

#[test]
fn a_stream_under_guest_writes_keeps_every_write_and_fills_the_image() {
    let dir = TempDir::new("stream-race");
    let (base, mid, top) = chain(&dir);
    let before = contents(&Disk::open(&opts(&top)).unwrap());
    let d = Disk::open(&opts(&top)).unwrap();
    let wrote = run_stream(&d, None, true);
    // Every guest write reads back (the last one to each block).
    let mut expect = before.clone();
    for (off, stamp) in &wrote {
        expect[*off as usize..(*off + 4096) as usize].fill(*stamp);
    }
    let now = contents(&d);
    assert!(
        now == expect,
        "a guest write was lost or the backing data is wrong"
    );
    // Every range that holds data anywhere is now in the top itself.
    let mut pos = 0;
    while pos < SIZE {
        let s = d.format().block_status(pos, SIZE - pos).unwrap();
        if s.data {
            assert_eq!(s.depth, 0, "at {pos}: {s:?}");
        }
        pos += s.len;
    }
    d.close().unwrap();
    let _ = (base, mid);
}

#[test]
fn a_stream_then_the_relink_leaves_the_same_disk_on_a_shorter_chain() {
    for keep_base in [true, false] {
        let dir = TempDir::new("stream-relink");
        let (base, _mid, top) = chain(&dir);
        let before = contents(&Disk::open(&opts(&top)).unwrap());
        let image = ExclusiveImage::open(&opts(&top)).unwrap();
        let layers = layers_of(image.disk());
        assert_eq!(layers.len(), 3);
        assert_eq!(find_layer(&layers, base.to_str().unwrap()), Some(2));
        run_stream(image.disk(), keep_base.then_some(2), false);
        let (name, fmt) = if keep_base {
            let n = chain::backing_name(&layers[0].path, &layers[2], &layers[1].path);
            // Same folder: the name the old overlay recorded.
            assert_eq!(n, base.display().to_string());
            (Some(n), Some("qcow2"))
        } else {
            (None, None)
        };
        image
            .tools()
            .set_backing_file(name.as_deref(), fmt)
            .unwrap();
        image.close().unwrap();
        drop(layers);
        // Reopened from its header, the chain is shorter and reads the same.
        let d = Disk::open(&opts(&top)).unwrap();
        assert_eq!(layers_of(&d).len(), if keep_base { 2 } else { 1 });
        assert!(
            contents(&d) == before,
            "the disk changed (keep base: {keep_base})"
        );
        d.close().unwrap();
        drop(d);
        if testkit::has_command("qemu-img") {
            let out = std::process::Command::new("qemu-img")
                .args(["check", top.to_str().unwrap()])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

#[test]
fn a_commit_of_the_middle_layer_fills_the_base_and_the_top_relinks() {
    let dir = TempDir::new("commit-mid");
    let (base, mid, top) = chain(&dir);
    let before = contents(&Disk::open(&opts(&top)).unwrap());
    let running = ExclusiveImage::open(&opts(&top)).unwrap();
    let layers = layers_of(running.disk());
    // The base, writable beside the running chain's open of it; a plain
    // second writer is refused by the locks.
    let mut bo = opts(&base);
    bo.image_type = ImageType::Format("qcow2");
    assert!(ExclusiveImage::open(&bo).is_err());
    let base_image = ExclusiveImage::open_beside(&bo).unwrap();
    let mut to = opts(&mid);
    to.readonly = true;
    let top_disk = Disk::from_format(layers[1].format.clone(), &to).unwrap();
    let commit = Arc::new(Commit::new(top_disk, base_image, 1).unwrap());
    let c = commit.clone();
    let mut job = Job::spawn(JobShared::new("job-1", "commit", "d", 0), move |j| c.run(j)).unwrap();
    job.join();
    assert_eq!(job.status().state, JobState::Running);
    assert!(commit.copied());
    commit.close_base().unwrap();
    // The running disk reads the same while the base changed below it.
    assert!(contents(running.disk()) == before);
    // The top now points at the base.
    let name = chain::backing_name(&layers[0].path, &layers[2], &layers[1].path);
    running
        .tools()
        .set_backing_file(Some(&name), Some("qcow2"))
        .unwrap();
    running.close().unwrap();
    commit.release();
    drop(layers);
    drop((job, commit));
    let d = Disk::open(&opts(&top)).unwrap();
    assert_eq!(layers_of(&d).len(), 2);
    assert!(contents(&d) == before, "the disk changed");
    d.close().unwrap();
    drop(d);
    // The base holds mid's data, its zero cluster included.
    let b = Disk::open(&opts(&base)).unwrap();
    let mut x = vec![0; CLUSTER as usize];
    b.read_at(2 << 20, &mut x).unwrap();
    assert!(x.iter().all(|&v| v == 0xBB));
    b.read_at(3 << 20, &mut x).unwrap();
    assert!(x.iter().all(|&v| v == 0));
    b.close().unwrap();
}
