//! Faults injected at the qcow2 metadata-I/O seam (`FaultyMetaIo`):
//! failed and short metadata writes and failed fdatasyncs surface as
//! request errors, and whatever a failed flush did not write is written
//! by the next one (a FLUSH that succeeds means durable, checked on a
//! byte copy of the file taken right after it).

mod support;

use std::path::Path;
use std::sync::Arc;

use block::formats::qcow2::meta_faults::{FaultEffect, FaultTarget, FaultyMetaIo, MetaFault};
use block::formats::qcow2::meta_io::{MetaIo, MetaKind};
use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::{BlockError, Disk, DiskOptions};
use support::*;

/// 4 KiB clusters: one L2 table maps 2 MiB, so writes 4 MiB apart dirty
/// different tables.
const TABLE_STRIDE: u64 = 4 << 20;

fn make(d: &TempDir, name: &str) -> std::path::PathBuf {
    let p = d.join(name);
    qemu_create("qcow2", s(&p), "32M", "cluster_size=4096");
    p
}

/// Opens `p` as a `Disk`, keeping a handle on its qcow2 image.
fn open_disk(p: &Path) -> (Disk, Arc<Qcow2Image>) {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    let file = block::formats::open::open_file(&o).unwrap();
    let img = Arc::new(open_qcow2(&o, file).unwrap());
    (Disk::from_format(img.clone(), &o).unwrap(), img)
}

/// Installs `faults` at the image's metadata seam from now on.
fn arm(img: &Qcow2Image, faults: &[MetaFault]) -> Arc<FaultyMetaIo> {
    let mut installed = None;
    img.wrap_meta_io(|inner| {
        let f = Arc::new(FaultyMetaIo::new(inner, faults));
        installed = Some(Arc::clone(&f));
        f as Arc<dyn MetaIo>
    });
    installed.expect("wrap_meta_io calls its closure")
}

/// Reads `len` bytes at `offset` of a byte copy of `p` (what is on disk
/// now, whatever the open image still caches).
/// The copy may leak clusters (a failed write may), nothing worse.
fn read_copy(d: &TempDir, p: &Path, reads: &[(u64, usize)]) -> Vec<Vec<u8>> {
    let copy = d.join("copy.qcow2");
    std::fs::copy(p, &copy).unwrap();
    qemu_check_leaks_only(&copy, "the image after the faults");
    let img = open(&copy, true);
    reads.iter().map(|&(o, n)| read(&*img, o, n)).collect()
}

fn os_error(e: &BlockError) -> Option<i32> {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        src = s.source();
    }
    None
}

#[test]
fn failed_l2_write_is_retried_by_the_next_flush() {
    let d = TempDir::new("meta-l2-retry");
    let p = make(&d, "img.qcow2");
    let (disk, img) = open_disk(&p);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(i, 4096)).collect();
    for (i, buf) in data.iter().enumerate() {
        disk.write_at(i as u64 * TABLE_STRIDE, buf).unwrap();
    }
    // The first of the three deferred L2 table writes fails.
    let faults = arm(
        &img,
        &[MetaFault::fail_write(Some(MetaKind::L2Table), 1, libc::EIO)],
    );
    let err = disk.flush().expect_err("a flush whose L2 write failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    disk.flush().expect("the retrying flush");
    let reads: Vec<(u64, usize)> = (0..3).map(|i| (i * TABLE_STRIDE, 4096)).collect();
    let got = read_copy(&d, &p, &reads);
    qemu_check(&d.join("copy.qcow2"));
    for (i, (g, want)) in got.iter().zip(&data).enumerate() {
        assert_same(g, want, &format!("cluster {i} after the retried flush"));
    }
}

#[test]
fn failed_refcount_drop_is_retried_by_the_next_flush() {
    let d = TempDir::new("meta-release-retry");
    let p = make(&d, "img.qcow2");
    {
        let (disk, _) = open_disk(&p);
        for i in 0..3 {
            disk.write_at(i * TABLE_STRIDE, &pattern(i, 8192)).unwrap();
        }
        disk.close().unwrap();
    }
    // Reopened: no refcount block is cached, so the flush after the
    // discards reads one to drop the discarded clusters' refcounts.
    let (disk, img) = open_disk(&p);
    for i in 0..3 {
        disk.discard(i * TABLE_STRIDE, 8192).unwrap();
    }
    let faults = arm(
        &img,
        &[
            MetaFault::fail_sync(1, libc::EIO),
            MetaFault {
                target: FaultTarget::Read {
                    kind: Some(MetaKind::RefcountBlock),
                    nth: 1,
                },
                effect: FaultEffect::Errno(libc::EIO),
            },
            MetaFault::fail_write(Some(MetaKind::RefcountBlock), 1, libc::ENOSPC),
        ],
    );
    assert!(disk.flush().is_err(), "flush with a failed barrier");
    assert!(disk.flush().is_err(), "flush with a failed refcount read");
    assert!(disk.flush().is_err(), "flush with a failed refcount write");
    assert_eq!(faults.stats().fired, 3);
    disk.flush().expect("the retrying flush");
    let copy = d.join("copy.qcow2");
    std::fs::copy(&p, &copy).unwrap();
    // Clean, not just leak-free: every dropped reference reached the disk.
    qemu_check(&copy);
    let img = open(&copy, true);
    for i in 0..3 {
        assert_same(
            &read(&*img, i * TABLE_STRIDE, 8192),
            &[0; 8192],
            "discarded",
        );
    }
}

#[test]
fn metadata_write_errors_fail_the_request_and_the_queue_goes_on() {
    for errno in [libc::EIO, libc::ENOSPC] {
        let d = TempDir::new("meta-write-error");
        let p = make(&d, "img.qcow2");
        // The first metadata write of any kind (the new L2 table of the
        // first allocating write) fails.
        let (disk, img) = open_disk(&p);
        let faults = arm(&img, &[MetaFault::fail_write(None, 1, errno)]);
        let err = disk
            .write_at(0, &pattern(1, 4096))
            .expect_err("an allocating write whose metadata write failed");
        assert_eq!(os_error(&err), Some(errno), "{err:?}");
        assert_eq!(faults.stats().fired, 1);
        // Reads and later writes are still served.
        let mut buf = vec![0u8; 4096];
        disk.read_at(TABLE_STRIDE, &mut buf).unwrap();
        disk.write_at(TABLE_STRIDE, &pattern(2, 4096)).unwrap();
        disk.flush().unwrap();
        let got = read_copy(&d, &p, &[(TABLE_STRIDE, 4096)]);
        assert_same(&got[0], &pattern(2, 4096), "write after the failed one");
    }
}

#[test]
fn fdatasync_errors_fail_the_flush() {
    let d = TempDir::new("meta-sync-error");
    let p = make(&d, "img.qcow2");
    let (disk, img) = open_disk(&p);
    disk.write_at(0, &pattern(3, 4096)).unwrap();
    let faults = arm(&img, &[MetaFault::fail_sync(1, libc::EIO)]);
    let err = disk.flush().expect_err("a flush whose barrier failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    disk.flush().unwrap();
    let got = read_copy(&d, &p, &[(0, 4096)]);
    assert_same(&got[0], &pattern(3, 4096), "data after the retried flush");
}

#[test]
fn short_metadata_writes_are_finished() {
    let d = TempDir::new("meta-short");
    let p = make(&d, "img.qcow2");
    let short = |kind| MetaFault {
        target: FaultTarget::Write {
            kind: Some(kind),
            nth: 1,
        },
        effect: FaultEffect::ShortWrite,
    };
    let (disk, img) = open_disk(&p);
    let faults = arm(
        &img,
        &[
            short(MetaKind::L2Table),
            short(MetaKind::RefcountBlock),
            short(MetaKind::L1Table),
        ],
    );
    for i in 0..3 {
        disk.write_at(i * TABLE_STRIDE, &pattern(10 + i, 4096))
            .unwrap();
    }
    disk.flush().unwrap();
    assert_eq!(faults.stats().fired, 3);
    let reads: Vec<(u64, usize)> = (0..3).map(|i| (i * TABLE_STRIDE, 4096)).collect();
    for (i, g) in read_copy(&d, &p, &reads).iter().enumerate() {
        assert_same(g, &pattern(10 + i as u64, 4096), "after short writes");
    }
}
