//! An image's qemu-compatible locks go when the image closes, even while
//! its open file descriptions live on elsewhere: a child process forked
//! before its exec holds every descriptor for a moment (close-on-exec or
//! not), and an io_uring ring may drop its references after the close.
//! `qemu-img` run right after a close must find the image unlocked.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use block::create::{create_image, CreateOptions};
use block::lock::{lock_image, LockMode};
use block::{BlockError, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use support::temp_dir;

mod support;

/// Whether a writer could lock `path` now (from a new open file
/// description, as another process would).
fn writer_can_lock(path: &Path) -> bool {
    let f = File::options().read(true).write(true).open(path).unwrap();
    match lock_image(&f, path, LockMode::Writer) {
        Ok(_) => true,
        Err(BlockError::Locked { .. }) => false,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn create(path: &Path, format: ImageType, backing: Option<(&str, ImageType)>) {
    create_image(&CreateOptions {
        path: path.to_owned(),
        format,
        size: 1 << 20,
        backing_file: backing.map(|b| b.0.to_owned()),
        backing_fmt: backing.map(|b| b.1),
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn locks_go_at_close_while_the_descriptors_live_on() {
    for (top, base) in [
        (ImageType::RAW, None),
        (ImageType::Format("qcow2"), None),
        (ImageType::Format("qcow2"), Some(ImageType::RAW)),
        (ImageType::Format("qcow2"), Some(ImageType::Format("qcow2"))),
    ] {
        let case = format!("{top:?} over {base:?}");
        let dir = temp_dir("image-locks");
        let img = dir.path().join("top");
        let base_path = dir.path().join("base");
        if let Some(b) = base {
            create(&base_path, b, None);
            create(&img, top, Some(("base", b)));
        } else {
            create(&img, top, None);
        }
        for engine in [EngineKind::Sync, EngineKind::IoUring] {
            if engine == EngineKind::IoUring
                && !testkit::available("io_uring", block::engines::probe::uring_support())
            {
                continue;
            }
            let mut o = DiskOptions::new(&img);
            o.image_type = top;
            o.engine = engine;
            let disk = Disk::open(&o).unwrap();
            let (n, _) = disk
                .queue()
                .unwrap()
                .run(RequestOp::Write, 0, IoMemory::Owned(vec![7; 4096]))
                .unwrap();
            assert_eq!(n, 4096, "{case}");
            assert!(
                !writer_can_lock(&img),
                "{case}: the open image is not locked"
            );
            if base.is_some() {
                assert!(!writer_can_lock(&base_path), "{case}: backing not locked");
            }
            // What a forked child would hold: every file of the chain.
            let held: Vec<Arc<File>> = disk.format().files().local().to_vec();
            disk.close().unwrap();
            drop(disk);
            assert!(
                writer_can_lock(&img),
                "{case} {engine:?}: still locked after close"
            );
            if base.is_some() {
                assert!(
                    writer_can_lock(&base_path),
                    "{case} {engine:?}: backing still locked"
                );
            }
            drop(held);
        }
    }
}
