//! `PersistentBitmaps::change_bitmap` on a qcow2 image with bitmaps made
//! by qemu-img (and bits QEMU recorded), with a fault (EIO, ENOSPC, a
//! failed fdatasync) injected at every metadata write and sync in turn: a
//! failed change leaves every bitmap as it was (`qemu-img info` the same,
//! `qemu-img check` clean without leaks, the same bits read back), and
//! once no fault fires the change is complete. A refused action leaves
//! the image untouched, also after actions before it succeeded in memory.

mod support;

use std::path::Path;
use std::sync::Arc;

use block::formats::qcow2::metadata::meta_faults::{FaultyMetaIo, MetaFault};
use block::formats::qcow2::metadata::meta_io::MetaIo;
use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::formats::{BitmapAction, DirtyBits, Format, PersistentBitmaps};
use block::{BlockError, DiskOptions};
use support::*;

fn open(p: &Path, readonly: bool) -> Arc<Qcow2Image> {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    o.readonly = readonly;
    o.keep_persistent_bitmaps = !readonly;
    let file = block::formats::open::open_file(&o).unwrap();
    Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap())
}

/// `qemu-img info` without the lines that follow the layout.
fn facts(p: &Path) -> String {
    run("qemu-img", &["info", s(p)])
        .lines()
        .filter(|l| !l.starts_with("image:") && !l.starts_with("disk size:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bits of each named bitmap, as our reader sees them.
fn bits(p: &Path, names: &[&str]) -> Vec<Result<DirtyBits, String>> {
    let img = open(p, true);
    names
        .iter()
        .map(|n| img.read_bitmap(n).map_err(|e| e.to_string()))
        .collect()
}

fn sample(dir: &TempDir) -> std::path::PathBuf {
    let img = dir.join("img.qcow2");
    qemu_create("qcow2", s(&img), "64M", "");
    run("qemu-img", &["bitmap", "--add", s(&img), "b0"]);
    qemu_io("qcow2", &img, &["write 0 64k", "write 1M 200k"]);
    run(
        "qemu-img",
        &["bitmap", "--add", "-g", "512", "--disable", s(&img), "fine"],
    );
    img
}

const NAMES: &[&str] = &["b0", "fine", "new"];

fn change_fails_cleanly(actions: &[(&str, Vec<BitmapAction>)]) {
    let dir = temp_dir("bitmap-faults");
    let base = sample(&dir);
    let (before, before_bits) = (facts(&base), bits(&base, NAMES));
    let faults: [fn(u64) -> MetaFault; 3] = [
        |n| MetaFault::fail_write(None, n, libc::EIO),
        |n| MetaFault::fail_write(None, n, libc::ENOSPC),
        |n| MetaFault::fail_sync(n, libc::EIO),
    ];
    for fault in faults {
        for n in 1.. {
            let work = dir.join("work.qcow2");
            std::fs::copy(&base, &work).unwrap();
            let img = open(&work, false);
            let mut armed = None;
            img.wrap_meta_io(|inner| {
                let f = Arc::new(FaultyMetaIo::new(inner, &[fault(n)]));
                armed = Some(Arc::clone(&f));
                f as Arc<dyn MetaIo>
            });
            let result: Result<(), BlockError> = actions
                .iter()
                .try_for_each(|(name, a)| img.change_bitmap(name, a));
            let fired = armed.unwrap().stats().fired > 0;
            let what = format!("{actions:?} with {:?}", fault(n));
            if !fired {
                result.unwrap_or_else(|e| panic!("{what}: {e}"));
                img.close().unwrap();
                drop(img);
                qemu_check(&work);
                assert_ne!(facts(&work), before, "{what}: nothing changed");
                assert!(n > 1, "{what}: no fault fired");
                break;
            }
            if result.is_ok() {
                // The fault hit the freeing of the old clusters, after the
                // new header was durable: the change is done, and at
                // worst those clusters leak.
                img.close().unwrap();
                drop(img);
                qemu_check_leaks_only(&work, &what);
                assert_ne!(facts(&work), before, "{what}: nothing changed");
                continue;
            }
            drop(img);
            qemu_check(&work);
            assert_eq!(facts(&work), before, "{what}: the bitmaps changed");
            assert_eq!(bits(&work, NAMES), before_bits, "{what}: the bits changed");
            assert!(n < 300, "{what}: never completes");
        }
    }
}

#[test]
fn merging_into_a_new_bitmap_fails_cleanly_or_completes() {
    change_fails_cleanly(&[(
        "new",
        vec![
            BitmapAction::Add {
                granularity: Some(4096),
            },
            BitmapAction::Merge("b0".into()),
            BitmapAction::Merge("fine".into()),
        ],
    )]);
}

#[test]
fn clearing_and_removing_fail_cleanly_or_complete() {
    change_fails_cleanly(&[("b0", vec![BitmapAction::Clear, BitmapAction::Disable])]);
    change_fails_cleanly(&[("fine", vec![BitmapAction::Remove])]);
}

#[test]
fn a_refused_action_changes_nothing() {
    let dir = temp_dir("bitmap-refused");
    let img = sample(&dir);
    let keep = std::fs::read(&img).unwrap();
    let image = open(&img, false);
    let e = image
        .change_bitmap(
            "b5",
            &[
                BitmapAction::Add { granularity: None },
                BitmapAction::Merge("nope".into()),
            ],
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Operation merge on bitmap b5 failed: Dirty bitmap 'nope' not found"
    );
    image.close().unwrap();
    drop(image);
    assert!(
        std::fs::read(&img).unwrap() == keep,
        "a refused change wrote to the image"
    );
}

/// The merged bits are the union, at the target's granularity, of what
/// QEMU recorded in the sources.
#[test]
fn merged_bits_cover_the_sources() {
    let dir = temp_dir("bitmap-merge");
    let img = sample(&dir);
    {
        let image = open(&img, false);
        image
            .change_bitmap(
                "new",
                &[
                    BitmapAction::Add {
                        granularity: Some(1 << 20),
                    },
                    BitmapAction::Merge("b0".into()),
                ],
            )
            .unwrap();
        image.close().unwrap();
    }
    qemu_check(&img);
    let new = open(&img, true).read_bitmap("new").unwrap();
    assert_eq!((new.granularity, new.disk_size), (1 << 20, 64 << 20));
    // b0 recorded 0..64k and 1M..1M+200k: bits 0 and 1 of a 1 MiB map.
    let block::formats::dirty_bits::Chunk::Data(bytes) = &new.chunks[0] else {
        panic!("{:?}", new.chunks);
    };
    assert_eq!(bytes[0], 0b11);
    assert!(bytes[1..].iter().all(|b| *b == 0));
}
