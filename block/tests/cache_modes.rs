//! Cache modes at the block layer: `cache=unsafe` completes flushes
//! without an fdatasync (the fault engine counts every op that reaches an
//! engine); every other mode sends one per writable file. A qcow2 image in
//! `cache=unsafe` also skips its metadata ordering barriers, at close too
//! (counted at the metadata-I/O seam).

mod engine_support;
mod support;

use std::sync::Arc;

use block::engines::new_engine;
use block::formats::qcow2::metadata::meta_faults::FaultyMetaIo;
use block::formats::qcow2::metadata::meta_io::MetaIo;
use block::formats::qcow2::open_qcow2;
use block::options::CacheMode;
use block::{Disk, DiskOptions, EngineKind, ImageType, RequestOp};
use engine_support::faults::{FaultEngine, FaultPlan};
use engine_support::{op_req, run_batch_polling, write_req};
use support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Ops that reached the engine for one write and one flush.
fn ops_for_write_and_flush(cache: CacheMode) -> u64 {
    let dir = temp_dir("cache-modes");
    let path = dir.join("disk.raw");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::RAW;
    o.engine = EngineKind::Threads;
    o.cache = cache;
    o.direct = cache.direct();
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(EngineKind::Threads, disk.format().files().local(), efd).unwrap();
    let (engine, stats) = FaultEngine::new(inner, FaultPlan::default());
    let mut q = disk.queue_on(Box::new(engine));
    let done = run_batch_polling(&mut q, vec![write_req(0, 0, vec![7u8; 4096])]);
    assert!(done[0].result.is_ok());
    let done = run_batch_polling(&mut q, vec![op_req(1, RequestOp::Flush, 0)]);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    let pushes = stats.lock().unwrap().pushes;
    pushes
}

#[test]
fn unsafe_ignores_flushes_and_the_others_keep_them() {
    assert_eq!(ops_for_write_and_flush(CacheMode::Unsafe), 1);
    for mode in [
        CacheMode::Writeback,
        CacheMode::None,
        CacheMode::Writethrough,
        CacheMode::Directsync,
    ] {
        assert_eq!(ops_for_write_and_flush(mode), 2, "{mode}");
    }
}

/// Metadata fdatasyncs of an allocating write, a flush and a close.
fn qcow2_metadata_syncs(cache: CacheMode, create_opts: &str) -> u64 {
    let dir = temp_dir("cache-modes-qcow2");
    let path = dir.join("disk.qcow2");
    qemu_create("qcow2", s(&path), "8M", create_opts);
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::Format("qcow2");
    o.cache = cache;
    o.direct = cache.direct();
    o.lock = false;
    let file = block::formats::open::open_file(&o).unwrap();
    let img = Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap());
    let mut seam = None;
    img.wrap_meta_io(|inner| {
        let f = Arc::new(FaultyMetaIo::new(inner, &[]));
        seam = Some(Arc::clone(&f));
        f as Arc<dyn MetaIo>
    });
    let disk = Disk::from_format(img.clone(), &o).unwrap();
    disk.write_at(65536, &[7u8; 4096]).unwrap();
    disk.flush().unwrap();
    disk.write_at(3 << 20, &[8u8; 4096]).unwrap();
    disk.close().unwrap();
    drop(disk);
    drop(img);
    qemu_check(&path);
    seam.unwrap().stats().syncs
}

#[test]
fn unsafe_qcow2_skips_its_metadata_barriers_and_the_others_keep_them() {
    for create in ["cluster_size=65536", "cluster_size=65536,lazy_refcounts=on"] {
        assert_eq!(
            qcow2_metadata_syncs(CacheMode::Unsafe, create),
            0,
            "{create}"
        );
        for mode in [CacheMode::Writeback, CacheMode::None] {
            let n = qcow2_metadata_syncs(mode, create);
            assert!(n >= 2, "{mode} {create}: {n} metadata syncs");
        }
    }
}
