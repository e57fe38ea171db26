//! The queue worker's busy poll (`poll_us`) and its re-check of the avail
//! ring after completions: each run keeps several reads in flight, posting
//! new ones as others complete, and checks every returned sector's
//! contents, status and used length. That the poll of an idle ring takes
//! a chain that was never kicked can only be seen against a clock, so it
//! is measured, not asserted: blk-bench's QD 1 rows with `--poll-us`
//! (docs/performance.md, "What explains the limits").

mod common;

use block::EngineKind;
use common::*;
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions};

const SECTORS: u64 = 2048;

/// Keeps `qd` one-sector reads in flight until `total` have completed.
fn run(engine: EngineKind, poll_us: u32, qd: u16, total: u64) {
    let dir = TempDir::new("poll");
    let raw = raw_image(&dir, SECTORS * 512);
    let Some(disk) = open_engine(&raw, engine) else {
        return;
    };
    let config = BlockDeviceConfig {
        queue_size: 64,
        poll_us,
        ..Default::default()
    };
    let opts = DriverOptions {
        slots: qd,
        slot_data: 512,
        ..Default::default()
    };
    let mut h = BlockHarness::new(disk, config, opts).unwrap();
    let q = h.queue(0).unwrap();
    reads_in_flight(q, total, 1, SECTORS, &format!("{engine:?} poll {poll_us}"));
}

#[test]
fn busy_poll_sync_engine() {
    run(EngineKind::Sync, 50, 8, 400);
}

#[test]
fn busy_poll_io_uring() {
    run(EngineKind::IoUring, 50, 8, 400);
}

#[test]
fn no_poll_io_uring_deep_queue() {
    run(EngineKind::IoUring, 0, 16, 400);
}
