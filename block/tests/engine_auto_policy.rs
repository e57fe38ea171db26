//! `engine=auto`'s notion of a fully allocated image, on images qemu-img
//! made with each preallocation mode: only images where no write can make
//! the file system allocate (raw falloc/full, qcow2 falloc/full, or a
//! qcow2 whose every cluster was written) count, so only those may get
//! the aio engine when io_uring is missing; and of those, the ones whose
//! blocks are fallocated but never written (falloc), which get aio first
//! even where io_uring works (FIEMAP reports them: ext4 and XFS, the file
//! systems these tests run on).

mod support;

use block::engine_choice::allocation::{fully_allocated, Allocated};
use block::engine_choice::{choose_engine, KernelSupport};
use block::{Disk, DiskOptions, EngineKind, ImageType};
use support::*;

fn open(path: &std::path::Path, fmt: ImageType) -> Disk {
    let mut o = DiskOptions::new(path);
    o.image_type = fmt;
    o.direct = true;
    o.engine = EngineKind::Sync;
    Disk::open(&o).unwrap()
}

fn allocated(fmt: &str, prealloc: &str) -> Result<Allocated, String> {
    let dir = temp_dir("auto-policy");
    let path = dir.join(format!("img.{fmt}"));
    qemu_create(fmt, s(&path), "4M", &format!("preallocation={prealloc}"));
    let t = if fmt == "raw" {
        ImageType::RAW
    } else {
        ImageType::Format("qcow2")
    };
    let disk = open(&path, t);
    fully_allocated(disk.format().as_ref())
}

#[test]
fn raw_preallocation_modes() {
    assert!(allocated("raw", "off").unwrap_err().contains("sparse"));
    assert_eq!(allocated("raw", "falloc").unwrap().unwritten, 4 << 20);
    assert_eq!(allocated("raw", "full"), Ok(Allocated { unwritten: 0 }));
}

#[test]
fn qcow2_preallocation_modes() {
    let off = allocated("qcow2", "off").unwrap_err();
    assert!(off.contains("no host cluster"), "{off}");
    let meta = allocated("qcow2", "metadata").unwrap_err();
    assert!(meta.contains("sparse"), "{meta}");
    // Every guest cluster's host cluster is fallocated and unwritten.
    assert_eq!(allocated("qcow2", "falloc").unwrap().unwritten, 4 << 20);
    assert_eq!(allocated("qcow2", "full"), Ok(Allocated { unwritten: 0 }));
}

#[test]
fn a_qcow2_written_everywhere_counts_and_an_overlay_does_not() {
    let dir = temp_dir("auto-policy-written");
    let base = dir.join("base.qcow2");
    qemu_create("qcow2", s(&base), "4M", "");
    qemu_io("qcow2", &base, &["write -q -P 0x5a 0 4M"]);
    let disk = open(&base, ImageType::Format("qcow2"));
    assert_eq!(
        fully_allocated(disk.format().as_ref()),
        Ok(Allocated { unwritten: 0 })
    );
    drop(disk);
    let top = dir.join("top.qcow2");
    qemu_create_overlay("qcow2", s(&top), None, "", "base.qcow2", "qcow2");
    let disk = open(&top, ImageType::Format("qcow2"));
    assert!(fully_allocated(disk.format().as_ref()).is_err());
}

/// Without io_uring, auto picks aio only for the preallocated image.
#[test]
fn auto_without_uring_follows_the_allocation() {
    let kernel = KernelSupport {
        uring: Err("pretend".into()),
        aio: block::engines::aio::aio_support(),
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

/// With io_uring, auto takes it for every image, fresh fallocated ones
/// included (the engine matrix: io_uring as fast as aio on first writes
/// into unwritten extents, with a far shorter submit call).
#[test]
fn auto_with_uring_takes_it_for_every_preallocation() {
    let kernel = KernelSupport {
        uring: Ok(()),
        aio: block::engines::aio::aio_support(),
    };
    if !testkit::available("Linux AIO", kernel.aio.clone()) {
        return;
    }
    let pick = |prealloc: &str, direct: bool| {
        choose_engine(EngineKind::Auto, direct, &kernel, || {
            allocated("qcow2", prealloc)
        })
        .unwrap()
        .kind
    };
    assert_eq!(pick("falloc", true), EngineKind::IoUring);
    assert_eq!(pick("falloc", false), EngineKind::IoUring);
    assert_eq!(pick("full", true), EngineKind::IoUring);
    assert_eq!(pick("metadata", true), EngineKind::IoUring);
    assert_eq!(pick("off", true), EngineKind::IoUring);
}

/// The whole path through `Disk::open`: engine=auto on this kernel
/// (io_uring and AIO both work here) resolves a fresh falloc qcow2, a
/// full one, a sparse one and a buffered open to io_uring.
#[test]
fn disk_open_resolves_auto_to_io_uring_for_every_preallocation() {
    let uring = block::engines::probe::uring_support();
    let aio = block::engines::aio::aio_support();
    if !testkit::available("io_uring", uring) || !testkit::available("Linux AIO", aio) {
        return;
    }
    let dir = temp_dir("auto-policy-open");
    let resolved = |prealloc: &str, direct: bool| {
        let path = dir.join(format!("{prealloc}.qcow2"));
        if !path.exists() {
            qemu_create(
                "qcow2",
                s(&path),
                "4M",
                &format!("preallocation={prealloc}"),
            );
        }
        let mut o = DiskOptions::new(&path);
        o.image_type = ImageType::Format("qcow2");
        o.direct = direct;
        o.engine = EngineKind::Auto;
        Disk::open(&o).unwrap().engine()
    };
    assert_eq!(resolved("falloc", true), EngineKind::IoUring);
    assert_eq!(resolved("falloc", false), EngineKind::IoUring);
    assert_eq!(resolved("full", true), EngineKind::IoUring);
    assert_eq!(resolved("off", true), EngineKind::IoUring);
    assert_eq!(resolved("metadata", true), EngineKind::IoUring);
}
