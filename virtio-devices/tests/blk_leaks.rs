//! Reset and reactivation leak nothing: no file descriptors, no threads.
//! Alone in its own test binary so that no other test opens descriptors or
//! starts threads while it counts.

mod common;

use block::ImageType;
use common::*;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};
use virtio_devices::VirtioDevice;
use virtio_host_driver::DriverOptions;

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Threads of this process but io_uring's io-wq workers (`iou-wrk-*`),
/// which the kernel starts on demand and ends after they idle a while,
/// whatever this process does.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            !comm.starts_with("iou-")
        })
        .count()
}

#[test]
fn reset_cycles_leak_no_fds_or_threads() {
    let dir = TempDir::new("leak");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        4,
        DriverOptions::default(),
    );
    let workers = 4;
    // Serving a request on every queue proves each worker is in its loop
    // (its epoll descriptor exists) before anything is counted.
    let serve_all = |h: &mut virtio_host_driver::BlockHarness, sector: u64| {
        for q in 0..4 {
            let u = h
                .queue(q)
                .unwrap()
                .run(VIRTIO_BLK_T_IN, sector, 512)
                .unwrap();
            assert_eq!(u.status, VIRTIO_BLK_S_OK as u8);
        }
    };
    // One cycle first so lazily created state (allocator arenas, ...)
    // exists before the baseline.
    h.reset_and_reactivate().unwrap();
    serve_all(&mut h, 0);
    let fds = count("/proc/self/fd");
    let baseline = threads();
    for cycle in 0..20 {
        assert_eq!(h.reset_and_reactivate().unwrap(), 4);
        serve_all(&mut h, cycle);
    }
    // Twenty cycles of four queues: a leak would show as dozens more.
    let after = count("/proc/self/fd");
    assert_eq!(after, fds, "file descriptors leaked");
    assert_eq!(threads(), baseline, "threads leaked");
    // Reset for good: the worker threads are gone.
    assert_eq!(h.device.reset().len(), 4);
    assert_eq!(threads(), baseline - workers);
}
