//! The owner's controls of a running device (what `--api-socket` drives):
//! counters that add up to what the driver did, pause with requests held
//! back and resumed, resize with a config interrupt and a new capacity the
//! parser honours, and internal snapshots taken between requests.

mod common;

use std::path::Path;
use std::time::Duration;

use block::{DiskOptions, EngineKind, ExclusiveImage, ImageType};
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::block::{BlockDevice, BlockDeviceConfig, ControlError, Shrink};
use virtio_host_driver::{BlockHarness, DriverOptions};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;

fn owned(path: &Path, image_type: ImageType, num_queues: u16) -> BlockHarness {
    let mut o = DiskOptions::new(path);
    o.image_type = image_type;
    o.engine = EngineKind::Sync;
    o.lock = false;
    let image = ExclusiveImage::open(&o).unwrap();
    let config = BlockDeviceConfig {
        num_queues,
        queue_size: 64,
        ..Default::default()
    };
    let dev = BlockDevice::with_image(image, config).unwrap();
    BlockHarness::for_device(dev, DriverOptions::default()).unwrap()
}

fn capacity(h: &BlockHarness) -> u64 {
    use virtio_devices::VirtioDevice;
    let mut b = [0u8; 8];
    h.device.read_config(0, &mut b);
    u64::from_le_bytes(b)
}

#[test]
fn counters_add_up_to_what_the_driver_did() {
    let dir = TempDir::new("ctl-counters");
    let raw = raw_image(&dir, 4 << 20);
    let mut h = owned(&raw, ImageType::RAW, 2);
    let counters = h.device.counters();
    for q in 0..2u16 {
        let d = h.queue(q).unwrap();
        for i in 0..3u64 {
            let s = d.post_data(VIRTIO_BLK_T_OUT, i * 8, &[7u8; 4096]).unwrap();
            d.kick().unwrap();
            assert_eq!(d.wait_slot(s).unwrap().status, OK);
        }
        for _ in 0..2 {
            assert_eq!(d.run(VIRTIO_BLK_T_IN, 64, 8192).unwrap().status, OK);
        }
        assert_eq!(d.run(VIRTIO_BLK_T_FLUSH, 0, 0).unwrap().status, OK);
    }
    // A read past the end fails and counts only as an error.
    let d = h.queue(0).unwrap();
    assert_eq!(d.run(VIRTIO_BLK_T_IN, 1 << 20, 512).unwrap().status, IOERR);
    let t = counters.totals();
    assert_eq!((t.write_ops, t.write_bytes), (6, 6 * 4096));
    assert_eq!((t.read_ops, t.read_bytes), (4, 4 * 8192));
    assert_eq!((t.flushes, t.errors, t.in_flight), (2, 1, 0));
    assert!(t.read_latency_min <= t.read_latency_avg);
    assert!(t.read_latency_avg <= t.read_latency_max);
    assert!(t.write_latency_min <= t.write_latency_max);
}

#[test]
fn a_paused_device_holds_requests_until_resumed() {
    let dir = TempDir::new("ctl-pause");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = owned(&raw, ImageType::RAW, 2);
    h.device.pause().unwrap();
    // Nested pause: one resume is not enough.
    h.device.pause().unwrap();
    assert!(h.device.is_paused());
    let d = h.queue(1).unwrap();
    let s = d.post(VIRTIO_BLK_T_IN, 3, 512).unwrap();
    d.kick().unwrap();
    let mut used = Vec::new();
    assert_eq!(d.wait(Duration::from_millis(300), &mut used).unwrap(), 0);
    h.device.resume();
    let d = h.queue(1).unwrap();
    assert_eq!(d.wait(Duration::from_millis(300), &mut used).unwrap(), 0);
    h.device.resume();
    assert!(!h.device.is_paused());
    let d = h.queue(1).unwrap();
    let u = d.wait_slot(s).unwrap();
    assert_eq!(u.status, OK);
    assert!(d.read_data(s, 512).iter().all(|&b| b == sector_byte(3)));
}

#[test]
fn raw_resize_grows_and_shrinks_with_a_config_interrupt() {
    let dir = TempDir::new("ctl-resize");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = owned(&raw, ImageType::RAW, 1);
    assert_eq!(capacity(&h), 2048);
    let d = h.queue(0).unwrap();
    assert_eq!(d.run(VIRTIO_BLK_T_IN, 2048, 512).unwrap().status, IOERR);
    assert_eq!(h.device.resize(2 << 20, Shrink::Refused).unwrap(), 1 << 20);
    assert_eq!(capacity(&h), 4096);
    assert_eq!(h.interrupt.config_count(), 1);
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 2 << 20);
    // The parser takes the new end; the grown area reads as zeroes.
    let d = h.queue(0).unwrap();
    let u = d.run(VIRTIO_BLK_T_IN, 4095, 512).unwrap();
    assert_eq!(u.status, OK);
    assert!(d.read_data(u.slot, 512).iter().all(|&b| b == 0));
    let s = d.post_data(VIRTIO_BLK_T_OUT, 4095, &[9u8; 512]).unwrap();
    d.kick().unwrap();
    assert_eq!(d.wait_slot(s).unwrap().status, OK);
    assert_eq!(d.run(VIRTIO_BLK_T_IN, 4096, 512).unwrap().status, IOERR);
    // Raw may shrink when asked to in so many words; bad sizes are
    // refused and change nothing.
    assert!(matches!(
        h.device.resize(1 << 19, Shrink::Refused),
        Err(ControlError::ShrinkNotAsked { old, new }) if old == 2 << 20 && new == 1 << 19
    ));
    assert_eq!(capacity(&h), 4096);
    assert_eq!(h.device.resize(1 << 19, Shrink::Allowed).unwrap(), 2 << 20);
    assert_eq!(capacity(&h), 1024);
    for bad in [0, 1000] {
        assert!(matches!(
            h.device.resize(bad, Shrink::Allowed),
            Err(ControlError::BadSize(_))
        ));
    }
    assert_eq!(capacity(&h), 1024);
    let d = h.queue(0).unwrap();
    assert_eq!(d.run(VIRTIO_BLK_T_IN, 1024, 512).unwrap().status, IOERR);
    assert_eq!(d.run(VIRTIO_BLK_T_IN, 1023, 512).unwrap().status, OK);
}

#[test]
fn qcow2_grows_only_and_takes_snapshots_between_requests() {
    let dir = TempDir::new("ctl-qcow2");
    let raw = raw_image(&dir, 1 << 20);
    let Some(qcow2) = qcow2_from_raw(&dir, &raw) else {
        return;
    };
    let mut h = owned(&qcow2, ImageType::Format("qcow2"), 1);
    assert!(matches!(
        h.device.resize(1 << 19, Shrink::Allowed),
        Err(ControlError::NoShrink { .. })
    ));
    h.device.resize(4 << 20, Shrink::Refused).unwrap();
    assert_eq!(capacity(&h), 8192);
    let d = h.queue(0).unwrap();
    let s = d.post_data(VIRTIO_BLK_T_OUT, 8000, &[5u8; 4096]).unwrap();
    d.kick().unwrap();
    assert_eq!(d.wait_slot(s).unwrap().status, OK);
    h.device.snapshot("first").unwrap();
    assert!(matches!(
        h.device.snapshot("first"),
        Err(ControlError::SnapshotExists(_))
    ));
    assert!(matches!(
        h.device.snapshot(""),
        Err(ControlError::BadSnapshotName)
    ));
    let names: Vec<String> = h
        .device
        .image_info()
        .snapshots
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, ["first"]);
    // Requests still run after the snapshot.
    let d = h.queue(0).unwrap();
    let u = d.run(VIRTIO_BLK_T_IN, 8000, 4096).unwrap();
    assert_eq!(u.status, OK);
    assert!(d.read_data(u.slot, 4096).iter().all(|&b| b == 5));
    use virtio_devices::VirtioDevice;
    h.device.shutdown();
    let out = testkit::output_within(
        std::process::Command::new("qemu-img")
            .args(["snapshot", "-l"])
            .arg(&qcow2),
        testkit::COMMAND_LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("first"), "{text}");
    let out = testkit::output_within(
        std::process::Command::new("qemu-img")
            .arg("check")
            .arg(&qcow2),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn raw_images_have_no_internal_snapshots() {
    let dir = TempDir::new("ctl-raw-snap");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = owned(&raw, ImageType::RAW, 1);
    assert!(matches!(
        h.device.snapshot("x"),
        Err(ControlError::SnapshotFormat("raw"))
    ));
    // A device without its image tools cannot resize.
    let plain = open(&raw, ImageType::RAW, false).unwrap();
    let mut dev = BlockDevice::new(plain, BlockDeviceConfig::default()).unwrap();
    assert!(matches!(
        dev.resize(2 << 20, Shrink::Refused),
        Err(ControlError::NoImageTools)
    ));
}
