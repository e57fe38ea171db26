//! An idle queue costs no CPU with the default adaptive polling: after a
//! burst of queue-depth-1 reads (which grows the worker's spin budget),
//! the worker thread uses under 1 % of a core while the queue is idle.
//! One test in its own binary, so no other test's worker threads run in
//! this process while the worker's CPU time is read.

mod common;

use std::time::{Duration, Instant};

use block::EngineKind;
use common::*;
use virtio_devices::block::{BlockDeviceConfig, DEFAULT_POLL_US};
use virtio_host_driver::DriverOptions;

const SECTORS: u64 = 2048;

/// CPU time (ns) of this process's threads named `virtio-blk-q*`.
fn worker_cpu_ns() -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = e.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("virtio-blk-q") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

#[test]
fn an_idle_queue_does_not_spin_with_the_default_polling() {
    let dir = TempDir::new("idle");
    let raw = raw_image(&dir, SECTORS * 512);
    let Some(disk) = open_engine(&raw, EngineKind::IoUring) else {
        return;
    };
    let config = BlockDeviceConfig {
        queue_size: 64,
        ..Default::default()
    };
    assert_eq!(config.poll_us, DEFAULT_POLL_US);
    const { assert!(DEFAULT_POLL_US > 0, "polling is on by default") };
    let opts = DriverOptions {
        slots: 1,
        slot_data: 512,
        ..Default::default()
    };
    let mut h = virtio_host_driver::BlockHarness::new(disk, config, opts).unwrap();
    let q = h.queue(0).unwrap();
    reads_in_flight(q, 2000, 1, SECTORS, "queue depth 1 before idling");
    // Let the last spin end, then measure a quiet second.
    std::thread::sleep(Duration::from_millis(50));
    let (cpu0, t0) = (worker_cpu_ns(), Instant::now());
    assert!(cpu0 > 0, "the worker thread is found");
    std::thread::sleep(Duration::from_secs(1));
    let used = worker_cpu_ns() - cpu0;
    let wall = t0.elapsed().as_nanos() as u64;
    assert!(
        used * 100 < wall,
        "an idle worker used {used} ns of CPU in {wall} ns (1 % allowed)"
    );
}
