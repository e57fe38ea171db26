//! A host file system that fills up under a qcow2 image: writes that need
//! space fail with an error naming the operation, nothing panics or
//! hangs, every write that succeeded reads back, the range of a failed
//! write reads as before or as the new data (never another cluster's
//! bytes), and once the image is closed `qemu-img check` finds no
//! corruption (leaked clusters are allowed) and qemu-img reads what we
//! read. When space comes back, reopening the image works and new writes
//! succeed.
//!
//! The file system is a small tmpfs mounted for the test (the tests run
//! as root; without the right to mount, the test fails saying so).

mod support;

use std::path::Path;

use block::{BlockError, Disk, DiskOptions, EngineKind, ImageType};
use support::*;

const CLUSTER: u64 = 65536;
const DISK: u64 = 64 << 20;
const CHUNK: usize = 64 << 10;

/// Opens without image locks: the tests of this binary run as threads of
/// one process and spawn qemu-img, and a child caught between fork and
/// exec holds every descriptor of the process, so the OFD lock of an
/// image another thread has just closed may still be held when qemu-img
/// check runs on it ("Failed to get shared 'write' lock", seen on a loaded
/// machine).
fn open(img: &Path, engine: EngineKind) -> Result<Disk, BlockError> {
    let mut o = DiskOptions::new(img);
    o.engine = engine;
    o.image_type = ImageType::Format("qcow2");
    o.lock = false;
    Disk::open(&o)
}

/// Fills the file system with `ballast` until nothing is left, then gives
/// back `pages` 4 KiB pages.
fn leave_free(ballast: &Path, pages: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(ballast).unwrap();
    for block in [65536usize, 4096] {
        let buf = vec![1u8; block];
        while f.write_all(&buf).is_ok() {}
    }
    let len = f.metadata().unwrap().len();
    f.set_len(len.saturating_sub(pages * 4096)).unwrap();
}

/// Writes random 64 KiB chunks until 20 writes have failed; returns the
/// model (what every write left) and how many writes failed.
fn fill(disk: &Disk, rng: &mut Rng, model: &mut [u8]) -> usize {
    let mut failed = 0;
    let mut chunk = vec![0u8; CHUNK];
    for round in 0..2000 {
        // Random chunks over the whole disk: new L2 tables and refcount
        // blocks are needed along the way.
        let off = rng.below(DISK / CHUNK as u64) * CHUNK as u64;
        rng.fill(&mut chunk);
        let before = model[off as usize..][..CHUNK].to_vec();
        match disk.write_at(off, &chunk) {
            Ok(()) => model[off as usize..][..CHUNK].copy_from_slice(&chunk),
            Err(e) => {
                failed += 1;
                let msg = format!("{e}: {:?}", std::error::Error::source(&e));
                if failed == 1 {
                    eprintln!("  write {round}: {msg}");
                }
                assert!(
                    msg.contains("No space") || msg.contains("corrupt"),
                    "write {round} at {off} failed with something else: {msg}"
                );
                // The range holds its old bytes or the new ones, whole
                // 512-byte sectors of either, never anything else.
                let mut got = vec![0u8; CHUNK];
                if disk.read_at(off, &mut got).is_ok() {
                    for (i, s) in got.chunks(512).enumerate() {
                        assert!(
                            s == &before[i * 512..][..512] || s == &chunk[i * 512..][..512],
                            "sector {i} of the failed write at {off} holds other data"
                        );
                    }
                    // Whatever the failed write left is what the disk
                    // now holds for the rest of the test.
                    model[off as usize..][..CHUNK].copy_from_slice(&got);
                }
                if failed >= 20 {
                    break;
                }
            }
        }
    }
    failed
}

/// [`run_one`] with 0, 1, 2, ... `steps - 1` pages left free after the
/// image was created, so the space runs out at every point of the first
/// writes (data, new L2 tables, new refcount blocks).
fn run(engine: EngineKind, cluster_size: &str, steps: u64) {
    if engine == EngineKind::IoUring
        && !testkit::available("io_uring", block::engines::probe::uring_support())
    {
        return;
    }
    for pages in 0..steps {
        run_one(engine, cluster_size, pages * 3);
    }
}

/// Whether ENOSPC is somewhere in `e`'s chain of sources.
fn is_enospc(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ENOSPC))
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn run_one(engine: EngineKind, cluster_size: &str, free_pages: u64) {
    eprintln!("{engine:?}, {cluster_size} clusters, {free_pages} pages free:");
    // A small tmpfs (the test run has root).
    let fs = testkit::mount::Mount::tmpfs("4m").unwrap_or_else(|e| panic!("{e}"));
    let img = fs.path().join("img.qcow2");
    let ballast = fs.path().join("ballast");
    let opts = format!("cluster_size={cluster_size}");
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", &opts, s(&img), "64M"]);
    leave_free(&ballast, free_pages);
    let mut model = vec![0u8; DISK as usize];
    let mut rng = Rng::new(7 + free_pages);
    // Opening writes the header (dirty bit, autoclear bits): with no
    // space at all it may fail, cleanly, and only for want of space.
    let disk = match open(&img, engine) {
        Ok(d) => d,
        Err(e) => {
            assert!(is_enospc(&e), "open failed for another reason: {e:?}");
            eprintln!("  open failed: {e}");
            std::fs::remove_file(&ballast).unwrap();
            qemu_check(&img);
            return;
        }
    };
    let failed = fill(&disk, &mut rng, &mut model);
    assert!(failed > 0, "{engine:?}: the file system never filled up");
    eprintln!("  {failed} writes failed");
    // Everything that succeeded reads back, with the disk still open.
    let mut all = vec![0u8; DISK as usize];
    disk.read_at(0, &mut all).unwrap();
    assert!(
        all == model,
        "{engine:?}: data differs from the model while full"
    );
    // Flush and close may fail for want of space; they must not hang.
    if let Err(e) = disk.flush() {
        eprintln!("  flush: {e}");
    }
    if let Err(e) = disk.close() {
        eprintln!("  close: {e}");
    }
    drop(disk);
    // Space comes back.
    std::fs::remove_file(&ballast).unwrap();
    let text = qemu_check_leaks_only(&img, &format!("{engine:?}, after a full disk"));
    eprintln!(
        "  qemu-img check: {}",
        text.trim().lines().next().unwrap_or("")
    );
    let out_dir = temp_dir("full-disk-out");
    let theirs = out_dir.join("theirs.raw");
    qemu_img(&["convert", "-f", "qcow2", "-O", "raw", s(&img), s(&theirs)]);
    assert!(
        std::fs::read(&theirs).unwrap() == model,
        "{engine:?}: qemu-img reads other data than the model"
    );
    // Reopened with space: writes work again and everything reads back.
    let disk = open(&img, engine).unwrap();
    let data = vec![0x77u8; CHUNK];
    disk.write_at(5 * CLUSTER, &data).unwrap();
    model[5 * CLUSTER as usize..][..CHUNK].copy_from_slice(&data);
    disk.read_at(0, &mut all).unwrap();
    assert!(all == model, "{engine:?}: data differs after reopening");
    disk.close().unwrap();
    drop(disk);
    qemu_check_leaks_only(&img, &format!("{engine:?}, after reopening"));
}

// 64 KiB clusters: one L2 table and one refcount block serve the whole
// disk, so the writes that fail are data writes. 4 KiB clusters: an L2
// table maps 2 MiB and a refcount block counts 8 MiB, so metadata
// allocations and their writes run out of space too.

#[test]
fn full_host_file_system_sync_engine() {
    run(EngineKind::Sync, "64k", 6);
}

#[test]
fn full_host_file_system_uring_engine() {
    run(EngineKind::IoUring, "64k", 6);
}

#[test]
fn full_host_file_system_small_clusters_sync_engine() {
    run(EngineKind::Sync, "4k", 24);
}

#[test]
fn full_host_file_system_small_clusters_uring_engine() {
    run(EngineKind::IoUring, "4k", 24);
}

#[test]
fn full_host_file_system_threads_engine() {
    run(EngineKind::Threads, "64k", 6);
}

#[test]
fn full_host_file_system_aio_engine() {
    run(EngineKind::Aio, "64k", 6);
}
