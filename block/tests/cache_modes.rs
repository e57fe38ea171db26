//! Cache modes at the block layer: `cache=unsafe` completes flushes
//! without an fdatasync (the fault engine counts every op that reaches an
//! engine); every other mode sends one per writable file.

mod engine_support;
mod support;

use std::sync::Arc;

use block::io::new_engine;
use block::options::CacheMode;
use block::{Disk, DiskOptions, EngineKind, ImageType, RequestOp};
use engine_support::faults::{FaultEngine, FaultPlan};
use engine_support::{op_req, run_batch_polling, write_req};
use support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Ops that reached the engine for one write and one flush.
fn ops_for_write_and_flush(cache: CacheMode) -> u64 {
    let dir = TempDir::new("cache-modes");
    let path = dir.join("disk.raw");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::Raw;
    o.engine = EngineKind::Threads;
    o.cache = cache;
    o.direct = cache.direct();
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(EngineKind::Threads, disk.format().files(), efd).unwrap();
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
