//! Conformance: one body per engine x {buffered, O_DIRECT} on raw images
//! (qemu-img creates them; qemu-img compare checks what we wrote).

mod engine_support;
mod support;

use block::{Disk, DiskOptions, EngineKind, ImageType};
use engine_support::conformance as body;
use support::*;

fn raw_case(engine: EngineKind, direct: bool) {
    let dir = temp_dir("conf-raw");
    let path = dir.join("disk.raw");
    let size = 4u64 << 20;
    qemu_create("raw", path.to_str().unwrap(), &size.to_string(), "");
    let mut o = DiskOptions::new(&path);
    o.engine = engine;
    o.direct = direct;
    o.image_type = ImageType::RAW;
    o.lock = false;
    let disk = Disk::open(&o).unwrap();
    assert_eq!(disk.engine(), engine);
    let model = body::exercise(&disk, vec![0u8; size as usize], 0x5eed ^ u64::from(direct));
    disk.close().unwrap();
    drop(disk);
    qemu_compare_to_model(&dir, &path, "raw", &model);
}

#[test]
fn raw_sync_buffered() {
    raw_case(EngineKind::Sync, false);
}

#[test]
fn raw_sync_direct() {
    raw_case(EngineKind::Sync, true);
}

#[test]
fn raw_uring_buffered() {
    raw_case(EngineKind::IoUring, false);
}

#[test]
fn raw_uring_direct() {
    raw_case(EngineKind::IoUring, true);
}

#[test]
fn raw_aio_buffered() {
    raw_case(EngineKind::Aio, false);
}

#[test]
fn raw_aio_direct() {
    raw_case(EngineKind::Aio, true);
}

#[test]
fn raw_threads_buffered() {
    raw_case(EngineKind::Threads, false);
}

#[test]
fn raw_threads_direct() {
    raw_case(EngineKind::Threads, true);
}
