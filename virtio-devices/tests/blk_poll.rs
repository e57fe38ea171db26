//! The queue worker's busy poll (`poll_us`) and its re-check of the avail
//! ring after completions: each run keeps several reads in flight, posting
//! new ones as others complete, and checks every returned sector's
//! contents, status and used length; and the poll of an idle ring takes a
//! chain that was never kicked.

mod common;

use std::time::Instant;

use block::{Disk, DiskOptions, EngineKind, ImageType};
use common::*;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};
use virtio_devices::block::BlockDeviceConfig;
use virtio_devices::testing::{BlockHarness, DriverOptions};
use vm_memory::Bytes;

const SECTORS: u64 = 2048;

fn open_engine(path: &std::path::Path, engine: EngineKind) -> Option<Disk> {
    let mut o = DiskOptions::new(path);
    o.image_type = ImageType::Raw;
    o.engine = engine;
    o.lock = false;
    match Disk::open(&o).and_then(|d| d.queue().map(|_| d)) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIP engine {engine:?}: {e}");
            None
        }
    }
}

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

/// With a poll budget the worker watches the avail ring after a request
/// completes even though nothing is in flight: a chain the driver posts
/// right after taking the completion, without a kick, is taken inside
/// the window. Without it such a chain waits for a kick. 20 tries; a try
/// whose chain is not back within 200 ms is kicked (a loaded machine may
/// wake the driver after the window closed), and at least one of them
/// must have made it on its own.
#[test]
fn busy_poll_takes_a_chain_posted_without_a_kick() {
    let dir = TempDir::new("poll-idle");
    let raw = raw_image(&dir, SECTORS * 512);
    let Some(disk) = open_engine(&raw, EngineKind::IoUring) else {
        return;
    };
    let config = BlockDeviceConfig {
        queue_size: 64,
        poll_us: 1000,
        ..Default::default()
    };
    let opts = DriverOptions {
        slots: 2,
        slot_data: 512,
        halt_poll: std::time::Duration::from_micros(500),
        ..Default::default()
    };
    let mut h = BlockHarness::new(disk, config, opts).unwrap();
    let q = h.queue(0).unwrap();
    let mut unkicked = 0;
    for sector in 0..20u64 {
        let first = q.run(VIRTIO_BLK_T_IN, sector, 512).expect("kicked read");
        assert_eq!(first.status, VIRTIO_BLK_S_OK as u8);
        // Post the next read and publish it, without notifying the device.
        let slot = q.post(VIRTIO_BLK_T_IN, sector + 100, 512).unwrap();
        q.vq.publish();
        let mut out = Vec::new();
        let deadline = Instant::now() + std::time::Duration::from_millis(200);
        while out.is_empty() && Instant::now() < deadline {
            q.reap(&mut out);
            std::thread::yield_now();
        }
        if out.is_empty() {
            q.force_kick().unwrap();
            out.push(q.wait_slot(slot).expect("read after a kick"));
        } else {
            unkicked += 1;
        }
        assert_eq!(out[0].slot, slot);
        assert_eq!(out[0].status, VIRTIO_BLK_S_OK as u8);
        let mut byte = [0u8; 1];
        q.memory().read_slice(&mut byte, q.slot(slot).data).unwrap();
        assert_eq!(byte[0], sector_byte(sector + 100));
    }
    eprintln!("{unkicked} of 20 chains taken without a kick");
    assert!(unkicked > 0, "no chain was taken without a kick");
}
