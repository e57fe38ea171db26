//! Faults injected at the qcow2 metadata-I/O seam (`FaultyMetaIo`):
//! failed and short metadata writes and failed fdatasyncs surface as
//! request errors, and whatever a failed flush did not write is written
//! by the next one (a FLUSH that succeeds means durable, checked on a
//! byte copy of the file taken right after it).
//!
//! The paths that go through the seam besides the tables' own reads and
//! writes are each reached by a fault here: compressed clusters written
//! without the cache, the compressed cache's writes (buffered image) and
//! reads, the size reserve and its trim (`MetaIo::set_len`), `info`'s
//! snapshot and bitmap reads, and the tables reloaded after an amend and
//! by the undo of a failed one.

mod support;

use std::path::Path;
use std::sync::Arc;

use block::formats::qcow2::metadata::meta_faults::{
    FaultEffect, FaultTarget, FaultyMetaIo, MetaFault,
};
use block::formats::qcow2::metadata::meta_io::{MetaIo, MetaKind};
use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::formats::{Amendable, Amendment, CompressedWrites, Format, ReadPlan};
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
    let img = Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap());
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
    let d = temp_dir("meta-l2-retry");
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
    let d = temp_dir("meta-release-retry");
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
        let d = temp_dir("meta-write-error");
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
    let d = temp_dir("meta-sync-error");
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
    let d = temp_dir("meta-short");
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

/// A 4 MiB image with 64 KiB clusters, opened read-write (or read-only).
fn open_image(p: &Path, readonly: bool) -> Arc<Qcow2Image> {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    o.readonly = readonly;
    let file = block::formats::open::open_file(&o).unwrap();
    Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap())
}

/// A cluster whose first `random` bytes do not compress.
fn cluster_of(seed: u64, random: usize) -> Vec<u8> {
    let mut c = pattern(seed, random);
    c.resize(65536, 0);
    c
}

#[test]
fn compressed_clusters_written_without_the_cache_go_through_the_seam() {
    let d = temp_dir("meta-compressed-uncached");
    let p = d.join("img.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let img = open_image(&p, false);
    img.set_compressed_cache(0);
    let faults = arm(
        &img,
        &[MetaFault::fail_write(
            Some(MetaKind::GuestData),
            1,
            libc::ENOSPC,
        )],
    );
    let data = cluster_of(1, 4096);
    let err = img.write_compressed(0, &data).expect_err("a failed write");
    assert_eq!(os_error(&err), Some(libc::ENOSPC), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    assert!(img.write_compressed(65536, &data).unwrap());
    img.close().unwrap();
    drop(img);
    qemu_check_leaks_only(&p, "after a failed compressed write");
    let back = open_image(&p, true);
    assert_same(&read(&*back, 0, 65536), &[0; 65536], "the failed cluster");
    assert_same(&read(&*back, 65536, 65536), &data, "the next cluster");
}

#[test]
fn the_compressed_cache_of_a_buffered_image_writes_through_the_seam() {
    let d = temp_dir("meta-compressed-cache-write");
    let p = d.join("img.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let img = open_image(&p, false);
    let data: Vec<Vec<u8>> = (0..2).map(|i| cluster_of(10 + i, 4096)).collect();
    for (i, c) in data.iter().enumerate() {
        assert!(img.write_compressed(i as u64 * 65536, c).unwrap());
    }
    let faults = arm(
        &img,
        &[MetaFault::fail_write(
            Some(MetaKind::GuestData),
            1,
            libc::EIO,
        )],
    );
    let err = img
        .flush_metadata()
        .expect_err("a flush whose write failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    // The clusters the failed write held are dropped, not mapped.
    assert_same(&read(&*img, 0, 65536), &[0; 65536], "a dropped cluster");
    img.close().unwrap();
    drop(img);
    qemu_check(&p);
}

#[test]
fn the_compressed_cache_reads_host_clusters_it_no_longer_holds_through_the_seam() {
    let d = temp_dir("meta-compressed-cache-read");
    let p = d.join("img.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let img = open_image(&p, false);
    // About 40 KiB each once compressed: the second spans two host
    // clusters, and with room for one complete cluster in the cache the
    // first host cluster is written (and leaves the cache) before the
    // second compressed cluster is published.
    img.set_compressed_cache(1);
    let data: Vec<Vec<u8>> = (0..2).map(|i| cluster_of(20 + i, 40000)).collect();
    for (i, c) in data.iter().enumerate() {
        assert!(img.write_compressed(i as u64 * 65536, c).unwrap());
    }
    let faults = arm(
        &img,
        &[MetaFault::fail_read(
            Some(MetaKind::GuestData),
            1,
            libc::EIO,
        )],
    );
    let mut plan = ReadPlan::new();
    let err = img
        .plan_read(65536, 4096, &mut plan)
        .expect_err("a read of the written half failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    assert_same(&read(&*img, 65536, 65536), &data[1], "the read again");
    img.close().unwrap();
    drop(img);
    qemu_check(&p);
    // A cluster packed behind one written without the cache reads that
    // host cluster's start back before it joins it.
    let p = d.join("img2.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let img = open_image(&p, false);
    img.set_compressed_cache(0);
    assert!(img.write_compressed(0, &data[0]).unwrap());
    img.set_compressed_cache(64);
    let faults = arm(
        &img,
        &[MetaFault::fail_read(
            Some(MetaKind::GuestData),
            1,
            libc::EIO,
        )],
    );
    let err = img
        .write_compressed(65536, &data[1])
        .expect_err("a write whose read of the shared host cluster failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    img.close().unwrap();
    drop(img);
    qemu_check_leaks_only(&p, "after a failed read of a shared host cluster");
}

#[test]
fn the_size_reserve_and_its_trim_go_through_the_seam() {
    let d = temp_dir("meta-set-len");
    let p = make(&d, "img.qcow2");
    let (disk, img) = open_disk(&p);
    let faults = arm(&img, &[MetaFault::fail_set_len(1, libc::ENOSPC)]);
    let err = disk
        .write_at(0, &pattern(30, 4096))
        .expect_err("an allocating write whose reserve failed");
    assert_eq!(os_error(&err), Some(libc::ENOSPC), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    disk.write_at(0, &pattern(31, 4096)).unwrap();
    let reserved = std::fs::metadata(&p).unwrap().len();
    // Closing cuts the reserve off again: through the seam too.
    let faults = arm(&img, &[MetaFault::fail_set_len(1, libc::EIO)]);
    let err = disk.close().expect_err("a close whose trim failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), reserved);
    drop(disk);
    drop(img);
    assert!(std::fs::metadata(&p).unwrap().len() < reserved);
    qemu_check_leaks_only(&p, "after a failed reserve");
    assert_same(
        &read_copy(&d, &p, &[(0, 4096)])[0],
        &pattern(31, 4096),
        "data",
    );
}

#[test]
fn info_reads_snapshots_and_bitmaps_through_the_seam() {
    let d = temp_dir("meta-info");
    let p = d.join("img.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    run("qemu-img", &["snapshot", "-c", "s1", s(&p)]);
    run("qemu-img", &["bitmap", "--add", s(&p), "b1"]);
    let img = open_image(&p, true);
    let info = img.info();
    assert_eq!((info.snapshots.len(), info.bitmaps.len()), (1, 1));
    let faults = arm(
        &img,
        &[
            MetaFault::fail_read(Some(MetaKind::SnapshotTable), 1, libc::EIO),
            MetaFault::fail_read(Some(MetaKind::BitmapDirectory), 1, libc::EIO),
        ],
    );
    let info = img.info();
    assert_eq!((info.snapshots.len(), info.bitmaps.len()), (0, 0));
    assert_eq!(faults.stats().fired, 2);
}

/// A version 3 image with data, 16-bit refcounts, and its bytes.
fn amend_sample(d: &TempDir) -> (std::path::PathBuf, Vec<u8>) {
    let p = d.join("img.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    qemu_io("qcow2", &p, &["write -P 5 0 192k"]);
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes)
}

#[test]
fn the_tables_reloaded_after_an_amend_are_read_through_the_seam_and_undone() {
    let d = temp_dir("meta-amend-reload");
    let (p, before) = amend_sample(&d);
    let img = open_image(&p, false);
    let wider = Amendment {
        refcount_bits: Some(32),
        ..Default::default()
    };
    // The L1 table is only read when the tables are loaded: the reload
    // once the new header is durable.
    let faults = arm(
        &img,
        &[MetaFault::fail_read(Some(MetaKind::L1Table), 1, libc::EIO)],
    );
    let err = img
        .amend(&wider, &mut |_, _, _| {})
        .expect_err("an amend whose reload failed");
    assert_eq!(os_error(&err), Some(libc::EIO), "{err:?}");
    assert_eq!(faults.stats().fired, 1);
    // The undo put the old header back, cut the file and reloaded the
    // old tables (through the seam, which now passes).
    assert_same(&read(&*img, 0, 4096), &[5; 4096], "data after the undo");
    img.close().unwrap();
    drop(img);
    assert!(std::fs::read(&p).unwrap() == before, "the file changed");
    qemu_check(&p);
}

#[test]
fn an_undo_whose_reload_fails_leaves_the_file_and_refuses_writes() {
    let d = temp_dir("meta-undo-reload");
    let (p, before) = amend_sample(&d);
    let img = open_image(&p, false);
    let wider = Amendment {
        refcount_bits: Some(32),
        ..Default::default()
    };
    let l1_read = |nth| MetaFault::fail_read(Some(MetaKind::L1Table), nth, libc::EIO);
    let faults = arm(&img, &[l1_read(1), l1_read(2)]);
    img.amend(&wider, &mut |_, _, _| {})
        .expect_err("an amend whose reload failed");
    assert_eq!(faults.stats().fired, 2);
    let err = img
        .plan_write(0, 4096, &waker())
        .expect_err("a write after a failed undo");
    assert!(matches!(err, BlockError::Corrupt), "{err:?}");
    drop(img);
    assert!(std::fs::read(&p).unwrap() == before, "the file changed");
    qemu_check(&p);
}
