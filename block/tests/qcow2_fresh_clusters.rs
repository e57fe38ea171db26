//! A write into an unallocated cluster of an image without backing data:
//! a new cluster past everything the file ever held is a hole, so through
//! the page cache only the 4 KiB blocks the data touches are written; a
//! cluster reused after a discard may hold old bytes, and with O_DIRECT a
//! write into a hole is slow, so those are written whole, zeroes around
//! the data. Checked on the write plans themselves (offsets and lengths),
//! on the file's holes (`SEEK_DATA`), and by reading back and `qemu-img
//! check`.

mod support;

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use block::formats::{Format, HostWrite, WriteOutcome, WritePlan};
use block::options::{DiskOptions, ImageType};
use support::*;

const CLUSTER: u64 = 64 << 10;

/// The plan of writing `len` bytes at `offset` (not yet carried out).
fn plan(f: &dyn Format, offset: u64, len: u64) -> WritePlan {
    match f.plan_write(offset, len, &waker()).unwrap() {
        WriteOutcome::Ready(plan) => plan,
        _ => panic!("a write at {offset} was blocked"),
    }
}

/// The data writes of `plan`: (host offset, length).
fn data_writes(plan: &WritePlan) -> Vec<(u64, u64)> {
    plan.ops
        .iter()
        .filter_map(|op| match op {
            HostWrite::Data { offset, parts, .. } => {
                Some((*offset, parts.iter().map(|p| p.len()).sum()))
            }
            _ => None,
        })
        .collect()
}

/// Carries out `plan` with `data` and commits it.
fn run_plan(f: &dyn Format, plan: WritePlan, data: &[u8]) {
    execute(f, &plan, data);
    if let Some(c) = plan.commit {
        f.commit(c).unwrap();
    }
}

/// The first byte at or after `from` that the file holds data for.
fn next_data(path: &Path, from: u64) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: lseek on an open descriptor with plain integers.
    let r = unsafe { libc::lseek(file.as_raw_fd(), from as i64, libc::SEEK_DATA) };
    assert!(r >= 0, "SEEK_DATA from {from}");
    r as u64
}

/// Guest cluster `cluster` of `f` reads as `data` at `at`, zeroes around.
fn assert_cluster(f: &dyn Format, cluster: u64, at: usize, data: &[u8], what: &str) {
    let mut want = vec![0u8; CLUSTER as usize];
    want[at..at + data.len()].copy_from_slice(data);
    assert_same(&read(f, cluster * CLUSTER, CLUSTER as usize), &want, what);
}

/// A new, empty 4 MiB qcow2 (64 KiB clusters) in its own folder.
fn new_image(name: &str) -> (TempDir, std::path::PathBuf) {
    let dir = temp_dir(name);
    let path = dir.join("img.qcow2");
    qemu_create("qcow2", s(&path), "4M", "");
    (dir, path)
}

#[test]
fn a_fresh_cluster_gets_only_the_data_blocks() {
    let (_dir, path) = new_image("fresh-cluster");
    let f = open(&path, false);
    // 4 KiB at 8 KiB into guest cluster 1, and 6 KiB straddling a block
    // boundary at 30 KiB into guest cluster 2.
    let a = pattern(1, 4096);
    let p = plan(&*f, CLUSTER + 8192, 4096);
    let writes = data_writes(&p);
    assert_eq!(writes.len(), 1, "{writes:?}");
    let (host, len) = writes[0];
    assert_eq!(len, 4096, "only the data's block is written: {writes:?}");
    assert_eq!(host % CLUSTER, 8192, "at the data's place in the cluster");
    let cluster_start = host - 8192;
    run_plan(&*f, p, &a);
    let b = pattern(2, 6144);
    let p = plan(&*f, 2 * CLUSTER + 30 * 1024, 6144);
    let writes = data_writes(&p);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].0 % CLUSTER,
        28 * 1024,
        "from the first touched block"
    );
    assert_eq!(writes[0].1, 8192, "to the end of the last touched block");
    run_plan(&*f, p, &b);
    f.flush_metadata().unwrap();
    assert_cluster(&*f, 1, 8192, &a, "guest cluster 1");
    assert_cluster(&*f, 2, 30 * 1024, &b, "guest cluster 2");
    f.close().unwrap();
    drop(f);
    // The head of the first new cluster is a hole in the file.
    assert_eq!(
        next_data(&path, cluster_start),
        cluster_start + 8192,
        "the head of the fresh cluster is a hole"
    );
    qemu_check(&path);
    let f = open(&path, true);
    assert_cluster(&*f, 1, 8192, &a, "guest cluster 1 after reopening");
    assert_cluster(&*f, 2, 30 * 1024, &b, "guest cluster 2 after reopening");
}

#[test]
fn a_reused_cluster_is_written_whole() {
    let (_dir, path) = new_image("reused-cluster");
    let f = open(&path, false);
    let full = pattern(3, CLUSTER as usize);
    let p = plan(&*f, 0, CLUSTER);
    let (h, len) = data_writes(&p)[0];
    assert_eq!(len, CLUSTER);
    run_plan(&*f, p, &full);
    f.flush_metadata().unwrap();
    discard(&*f, 0, CLUSTER);
    f.flush_metadata().unwrap();
    f.close().unwrap();
    drop(f);
    // The freed cluster holds old bytes again, as it would on a file
    // system that cannot punch holes.
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&vec![0xaa; CLUSTER as usize], h).unwrap();
    drop(file);
    qemu_check(&path);
    let f = open(&path, false);
    let a = pattern(4, 4096);
    let p = plan(&*f, 3 * CLUSTER + 8192, 4096);
    let writes = data_writes(&p);
    assert_eq!(
        writes,
        vec![(h, CLUSTER)],
        "the freed cluster is reused and written whole"
    );
    run_plan(&*f, p, &a);
    f.flush_metadata().unwrap();
    assert_cluster(&*f, 3, 8192, &a, "the reused cluster");
    f.close().unwrap();
    drop(f);
    qemu_check(&path);
}

#[test]
fn with_o_direct_a_fresh_cluster_is_written_whole() {
    let (_dir, path) = new_image("fresh-direct");
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::Format("qcow2");
    o.direct = true;
    let f = block::formats::open_image_tools(&o).unwrap();
    let p = plan(&*f, CLUSTER + 8192, 4096);
    let writes = data_writes(&p);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].0 % CLUSTER, 0, "from the cluster's start");
    assert_eq!(writes[0].1, CLUSTER, "the whole cluster");
    if let Some(c) = p.commit {
        f.abort(c);
    }
}
