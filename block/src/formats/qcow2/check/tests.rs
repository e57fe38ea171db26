//! Unit tests of the qcow2 check: images made by `create_image` and
//! written through `Disk`, then damaged on purpose.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use testkit::TempDir;

use super::check_qcow2 as check_image;
use crate::create::{create_image, CreateOptions};
use crate::formats::check_report::Repair;
use crate::options::{DiskOptions, ImageType};
use crate::Disk;

/// A 4 MiB qcow2 image (64 KiB clusters) with two data clusters.
fn image(dir: &TempDir) -> PathBuf {
    let path = dir.join("img.qcow2");
    create_image(&CreateOptions {
        path: path.clone(),
        format: ImageType::Format("qcow2"),
        size: 4 << 20,
        ..Default::default()
    })
    .unwrap();
    let mut opts = DiskOptions::new(&path);
    opts.image_type = ImageType::Format("qcow2");
    let disk = Disk::open(&opts).unwrap();
    disk.write_at(0, &[0x11; 4096]).unwrap();
    disk.write_at(1 << 20, &[0x22; 4096]).unwrap();
    disk.close().unwrap();
    path
}

fn be64(path: &Path, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, offset)
        .unwrap();
    u64::from_be_bytes(b)
}

/// Stores a 16-bit refcount for host cluster `index` (first refcount block).
fn set_refcount(path: &Path, index: u64, value: u16) {
    let block = be64(path, be64(path, 48));
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_be_bytes(), block + 2 * index)
        .unwrap();
}

#[test]
fn clean_image_has_no_findings() {
    let dir = TempDir::new("ch-check-clean");
    let path = image(&dir);
    let r = check_image(&path, None).unwrap();
    assert_eq!(
        (r.corruptions, r.leaks, r.check_errors),
        (0, 0, 0),
        "{:?}",
        r.messages
    );
    assert_eq!(r.allocated_clusters, Some(2));
    assert_eq!(r.total_clusters, Some(64));
    assert_eq!(
        r.image_end_offset,
        Some(std::fs::metadata(&path).unwrap().len())
    );
}

#[test]
fn leak_is_found_and_repaired() {
    let dir = TempDir::new("ch-check-leak");
    let path = image(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len + 65536)
        .unwrap();
    set_refcount(&path, len / 65536, 1);
    let r = check_image(&path, None).unwrap();
    assert_eq!((r.corruptions, r.leaks), (0, 1), "{:?}", r.messages);
    assert!(r.messages.iter().any(|m| m.starts_with("Leaked cluster")));
    let r = check_image(&path, Some(Repair::Leaks)).unwrap();
    assert_eq!((r.leaks, r.leaks_fixed), (0, 1), "{:?}", r.messages);
    let r = check_image(&path, None).unwrap();
    assert_eq!((r.corruptions, r.leaks), (0, 0), "{:?}", r.messages);
}

#[test]
fn missing_refcount_is_corruption_and_repair_all_fixes_it() {
    let dir = TempDir::new("ch-check-corrupt");
    let path = image(&dir);
    // The first data cluster: L1[0] -> L2, L2[0] -> data.
    let l2 = be64(&path, be64(&path, 40)) & 0x00ff_ffff_ffff_fe00;
    let data = be64(&path, l2) & 0x00ff_ffff_ffff_fe00;
    set_refcount(&path, data / 65536, 0);
    let r = check_image(&path, None).unwrap();
    // The refcount itself, and the COPIED flag that no longer matches it.
    assert_eq!((r.corruptions, r.leaks), (2, 0), "{:?}", r.messages);
    let r = check_image(&path, Some(Repair::Leaks)).unwrap();
    assert_eq!(r.corruptions, 2, "-r leaks must not touch corruptions");
    let r = check_image(&path, Some(Repair::All)).unwrap();
    assert_eq!(
        (r.corruptions, r.corruptions_fixed),
        (0, 1),
        "{:?}",
        r.messages
    );
    let r = check_image(&path, None).unwrap();
    assert_eq!((r.corruptions, r.leaks), (0, 0), "{:?}", r.messages);
}

#[test]
fn unaligned_l2_offset_is_reported_not_followed() {
    let dir = TempDir::new("ch-check-unaligned");
    let path = image(&dir);
    let l1 = be64(&path, 40);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&(0x200u64 | 1 << 63).to_be_bytes(), l1)
        .unwrap();
    let r = check_image(&path, None).unwrap();
    assert!(r.corruptions >= 1);
    assert!(
        r.messages
            .iter()
            .any(|m| m.contains("Table is not cluster aligned")),
        "{:?}",
        r.messages
    );
}
