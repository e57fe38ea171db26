//! A tool operation that fails half-way leaves the image file as it was
//! (`FailureUndo`, what `ch-img snapshot`, `rebase`, `commit` and
//! `resize` run their changes in): ENOSPC and EIO are injected at the
//! metadata-I/O seam at every write and every fdatasync the operation
//! makes, in turn, and after each failure (and the image's close) the
//! file must be byte for byte what it was before, and still pass
//! `qemu-img check`. A run without a fault must change the file (so the
//! faults are reached).

mod support;

use std::path::Path;
use std::sync::Arc;

use block::formats::qcow2::metadata::meta_faults::{FaultyMetaIo, MetaFault};
use block::formats::qcow2::metadata::meta_io::MetaIo;
use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::formats::{FailureUndo, Format, ImageTools};
use block::{BlockError, DiskOptions};
use support::*;

/// Opens `p` read-write as its owner, with `faults` at its metadata seam.
fn open_faulty(p: &Path, faults: &[MetaFault]) -> (Arc<Qcow2Image>, Arc<FaultyMetaIo>) {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    let file = block::formats::open::open_file(&o).unwrap();
    let img = Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap());
    let mut installed = None;
    img.wrap_meta_io(|inner| {
        let f = Arc::new(FaultyMetaIo::new(inner, faults));
        installed = Some(Arc::clone(&f));
        f as Arc<dyn MetaIo>
    });
    (img, installed.expect("wrap_meta_io calls its closure"))
}

/// An image with data, a snapshot and a backing file, made by qemu-img.
fn image(d: &TempDir) -> std::path::PathBuf {
    let base = d.join("base.qcow2");
    qemu_create("qcow2", s(&base), "8M", "cluster_size=4096");
    qemu_io("qcow2", &base, &["write -P 0x11 0 2M"]);
    let top = d.join("top.qcow2");
    qemu_create_overlay(
        "qcow2",
        s(&top),
        None,
        "cluster_size=4096",
        "base.qcow2",
        "qcow2",
    );
    qemu_io("qcow2", &top, &["write -P 0x22 1M 1M", "write -z 3M 64k"]);
    qemu_img(&["snapshot", "-c", "first", s(&top)]);
    qemu_io("qcow2", &top, &["write -P 0x33 4M 1M"]);
    top
}

/// Runs `op` with each write, then each fdatasync, failing in turn
/// (`errno`), and checks the file after every failure.
fn every_fault_leaves_the_file(
    case: &str,
    errno: i32,
    op: &dyn Fn(&dyn ImageTools) -> Result<(), BlockError>,
) {
    let d = temp_dir(&format!("tool-fail-{case}"));
    let p = image(&d);
    let before = std::fs::read(&p).unwrap();
    // Without a fault: how many writes and syncs the operation makes.
    let (img, seam) = open_faulty(&p, &[]);
    let base = seam.stats();
    img.undo_on_failure(&mut || op(&*img)).unwrap();
    let done = seam.stats();
    drop(img);
    assert_ne!(
        std::fs::read(&p).unwrap(),
        before,
        "{case}: changes nothing"
    );
    let (writes, syncs) = (done.writes - base.writes, done.syncs - base.syncs);
    assert!(writes > 0, "{case}: no metadata write");
    let faults = (1..=writes)
        .map(|n| MetaFault::fail_write(None, base.writes + n, errno))
        .chain((1..=syncs).map(|n| MetaFault::fail_sync(base.syncs + n, errno)));
    for (i, fault) in faults.enumerate() {
        std::fs::write(&p, &before).unwrap();
        let (img, seam) = open_faulty(&p, &[fault]);
        let r = img.undo_on_failure(&mut || op(&*img));
        assert!(
            seam.stats().fired > 0,
            "{case}: fault {i} ({fault:?}) never fired"
        );
        assert!(
            r.is_err(),
            "{case}: fault {i} ({fault:?}) did not fail the operation"
        );
        let _ = img.close();
        drop(img);
        let after = std::fs::read(&p).unwrap();
        assert!(
            after == before,
            "{case}: fault {i} ({fault:?}) left the file changed ({} bytes, was {})",
            after.len(),
            before.len()
        );
        qemu_check(&p);
    }
}

const ERRNOS: [i32; 2] = [libc::ENOSPC, libc::EIO];

#[test]
fn a_failed_snapshot_create_leaves_the_file() {
    for errno in ERRNOS {
        every_fault_leaves_the_file("snap-create", errno, &|t| {
            t.snapshot_create("second", (1, 0))
        });
    }
}

#[test]
fn a_failed_snapshot_delete_or_apply_leaves_the_file() {
    for errno in ERRNOS {
        every_fault_leaves_the_file("snap-delete", errno, &|t| {
            t.snapshot_delete("first").map(|found| assert!(found))
        });
        every_fault_leaves_the_file("snap-apply", errno, &|t| {
            t.snapshot_apply("first").map(|found| assert!(found))
        });
    }
}

#[test]
fn a_failed_rebase_or_commit_empty_leaves_the_file() {
    for errno in ERRNOS {
        every_fault_leaves_the_file("rebase", errno, &|t| {
            t.set_backing_file(Some("elsewhere.qcow2"), Some("qcow2"))
        });
        every_fault_leaves_the_file("make-empty", errno, &|t| t.make_empty());
    }
}

#[test]
fn a_failed_resize_leaves_the_file() {
    for errno in ERRNOS {
        every_fault_leaves_the_file("grow", errno, &|t| t.resize(64 << 20));
        every_fault_leaves_the_file("shrink", errno, &|t| t.resize(2 << 20));
    }
}
