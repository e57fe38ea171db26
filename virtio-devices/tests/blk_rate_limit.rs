//! Throttling (`BlockDeviceConfig::rate_limit`): a queue limited in ops
//! or bytes completes every request, correctly, no faster than its
//! buckets allow; a chain it cannot pay for waits on the ring (no error,
//! no stall) until the worker's timer says the buckets have refilled.
//!
//! The timing checks are lower bounds only (a slow machine can only make
//! a run longer), plus a generous upper bound that catches a queue that
//! stalls until some unrelated wake-up.

mod common;

use std::time::{Duration, Instant};

use block::{Disk, DiskOptions, EngineKind, ImageType};
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::block::rate_limit::{RateLimitConfig, RateLimiter, TokenBucketConfig};
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const SECTORS: u64 = 2048;

fn bucket(size: u64, one_time_burst: u64, refill_time_ms: u64) -> TokenBucketConfig {
    TokenBucketConfig {
        size,
        one_time_burst,
        refill_time_ms,
    }
}

/// Reads `total` requests of `sectors` sectors, `qd` in flight, through a
/// queue limited by `limit`; returns the wall time.
fn run(engine: EngineKind, limit: RateLimitConfig, qd: u16, sectors: u32, total: u64) -> Duration {
    let dir = TempDir::new("rate-limit");
    let raw = raw_image(&dir, SECTORS * 512);
    let mut o = DiskOptions::new(&raw);
    o.image_type = ImageType::RAW;
    o.engine = engine;
    o.lock = false;
    let disk = Disk::open(&o).unwrap();
    let config = BlockDeviceConfig {
        queue_size: 64,
        rate_limit: limit,
        ..Default::default()
    };
    let opts = DriverOptions {
        slots: qd,
        slot_data: sectors * 512,
        ..Default::default()
    };
    let mut h = BlockHarness::new(disk, config, opts).unwrap();
    let q = h.queue(0).unwrap();
    let t0 = Instant::now();
    reads_in_flight(
        q,
        total,
        sectors,
        SECTORS - u64::from(sectors),
        &format!("{engine:?}"),
    );
    let t = t0.elapsed();
    eprintln!("{engine:?}: {total} requests in {t:?}");
    t
}

fn engines() -> Vec<EngineKind> {
    let mut e = vec![EngineKind::Sync];
    if testkit::available("io_uring", block::engines::probe::uring_support()) {
        e.push(EngineKind::IoUring);
    }
    e
}

#[test]
fn ops_limit_holds_the_request_rate() {
    for engine in engines() {
        // 10 requests per 50 ms (200/s), none extra: 60 requests need at
        // least the 50 beyond the first full bucket, 250 ms.
        let limit = RateLimitConfig {
            bandwidth: None,
            ops: Some(bucket(10, 0, 50)),
        };
        let t = run(engine, limit, 8, 1, 60);
        assert!(t >= Duration::from_millis(240), "{engine:?}: {t:?}");
    }
}

#[test]
fn bandwidth_limit_holds_the_byte_rate() {
    for engine in engines() {
        // 32 KiB per 100 ms (320 KiB/s) plus a 32 KiB one-time burst:
        // 40 reads of 8 KiB (320 KiB) need at least the 256 KiB beyond
        // bucket and burst, 800 ms.
        let limit = RateLimitConfig {
            bandwidth: Some(bucket(32 << 10, 32 << 10, 100)),
            ops: None,
        };
        let t = run(engine, limit, 4, 16, 40);
        assert!(t >= Duration::from_millis(780), "{engine:?}: {t:?}");
    }
}

#[test]
fn requests_larger_than_the_bucket_still_complete() {
    for engine in engines() {
        // 4 KiB buckets, 16 KiB requests: each passes on a full bucket and
        // leaves a 12 KiB debt (a 4 KiB refill per 20 ms: 80 ms each).
        let limit = RateLimitConfig {
            bandwidth: Some(bucket(4096, 0, 20)),
            ops: None,
        };
        let t = run(engine, limit, 2, 32, 8);
        assert!(t >= Duration::from_millis(7 * 80 - 20), "{engine:?}: {t:?}");
    }
}

/// Without a limit no limiter is built (the worker has no buckets to pay
/// and no timer to wait for), and every request completes with its data.
#[test]
fn without_a_limit_no_limiter_is_built_and_every_read_completes() {
    assert!(!RateLimitConfig::default().is_enabled());
    assert!(RateLimiter::new(RateLimitConfig::default(), Instant::now()).is_none());
    for engine in engines() {
        // `reads_in_flight` asserts each status, length and sector's data.
        run(engine, RateLimitConfig::default(), 8, 1, 200);
    }
}

/// The buckets belong to the device, not to a worker: a guest that resets
/// the device (which stops the workers and starts new ones) finds them as
/// empty as it left them, so resetting is no way around the limit.
#[test]
fn a_device_reset_does_not_refill_the_buckets() {
    let dir = TempDir::new("rate-limit-reset");
    let raw = raw_image(&dir, SECTORS * 512);
    let mut o = DiskOptions::new(&raw);
    o.image_type = ImageType::RAW;
    o.engine = EngineKind::Sync;
    o.lock = false;
    let disk = Disk::open(&o).unwrap();
    // 10 requests per second, starting with 10.
    let config = BlockDeviceConfig {
        queue_size: 64,
        rate_limit: RateLimitConfig {
            bandwidth: None,
            ops: Some(bucket(10, 0, 1000)),
        },
        ..Default::default()
    };
    let mut h = BlockHarness::new(disk, config, DriverOptions::default()).unwrap();
    let read_n = |h: &mut BlockHarness, n: u64| {
        let t0 = Instant::now();
        for i in 0..n {
            let u = h.queue(0).unwrap().run(VIRTIO_BLK_T_IN, i, 512).unwrap();
            assert_eq!(u.status, OK);
        }
        t0.elapsed()
    };
    // The full bucket pays for the first ten.
    read_n(&mut h, 10);
    h.reset_and_reactivate().unwrap();
    // Five more need half a second of refill, reset or not.
    let t = read_n(&mut h, 5);
    assert!(t >= Duration::from_millis(400), "{t:?} after a reset");
}
