//! `engine=auto`'s notion of a fully allocated image, on images qemu-img
//! made with each preallocation mode: only images where no write can make
//! the file system allocate (raw falloc/full, qcow2 falloc/full, or a
//! qcow2 whose every cluster was written) count, so only those may get
//! the aio engine when io_uring is missing.

mod support;

use block::io::allocation::fully_allocated;
use block::io::probe::{choose_engine, KernelSupport};
use block::{Disk, DiskOptions, EngineKind, ImageType};
use support::*;

fn open(path: &std::path::Path, fmt: ImageType) -> Disk {
    let mut o = DiskOptions::new(path);
    o.image_type = fmt;
    o.direct = true;
    o.engine = EngineKind::Sync;
    Disk::open(&o).unwrap()
}

fn allocated(fmt: &str, prealloc: &str) -> Result<(), String> {
    let dir = TempDir::new("auto-policy");
    let path = dir.join(format!("img.{fmt}"));
    qemu_create(fmt, s(&path), "4M", &format!("preallocation={prealloc}"));
    let t = if fmt == "raw" {
        ImageType::Raw
    } else {
        ImageType::Qcow2
    };
    let disk = open(&path, t);
    fully_allocated(disk.format().as_ref())
}

#[test]
fn raw_preallocation_modes() {
    assert!(allocated("raw", "off").unwrap_err().contains("sparse"));
    assert_eq!(allocated("raw", "falloc"), Ok(()));
    assert_eq!(allocated("raw", "full"), Ok(()));
}

#[test]
fn qcow2_preallocation_modes() {
    let off = allocated("qcow2", "off").unwrap_err();
    assert!(off.contains("no host cluster"), "{off}");
    let meta = allocated("qcow2", "metadata").unwrap_err();
    assert!(meta.contains("sparse"), "{meta}");
    assert_eq!(allocated("qcow2", "falloc"), Ok(()));
    assert_eq!(allocated("qcow2", "full"), Ok(()));
}

#[test]
fn a_qcow2_written_everywhere_counts_and_an_overlay_does_not() {
    let dir = TempDir::new("auto-policy-written");
    let base = dir.join("base.qcow2");
    qemu_create("qcow2", s(&base), "4M", "");
    qemu_io("qcow2", &base, &["write -q -P 0x5a 0 4M"]);
    let disk = open(&base, ImageType::Qcow2);
    assert_eq!(fully_allocated(disk.format().as_ref()), Ok(()));
    drop(disk);
    let top = dir.join("top.qcow2");
    qemu_create_overlay("qcow2", s(&top), None, "", "base.qcow2", "qcow2");
    let disk = open(&top, ImageType::Qcow2);
    assert!(fully_allocated(disk.format().as_ref()).is_err());
}

/// Without io_uring, auto picks aio only for the preallocated image.
#[test]
fn auto_without_uring_follows_the_allocation() {
    let kernel = KernelSupport {
        uring: Err("pretend".into()),
        aio: block::io::aio::aio_support(),
    };
    if !testkit::available("Linux AIO", kernel.aio.clone()) {
        return;
    }
    let pick = |prealloc: &str| {
        choose_engine(EngineKind::Auto, true, &kernel, || {
            allocated("qcow2", prealloc)
        })
        .unwrap()
        .kind
    };
    assert_eq!(pick("falloc"), EngineKind::Aio);
    assert_eq!(pick("metadata"), EngineKind::Threads);
    assert_eq!(pick("off"), EngineKind::Threads);
}
