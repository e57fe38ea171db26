//! The image switch of a running device (`BlockDevice::switch_image`,
//! `prepare_switch` + `swap_prepared`): every queue moves to a new qcow2
//! overlay over the running image between two requests; requests in
//! flight when it is asked complete on the old image; what is written
//! after lands in the overlay only; a refused switch leaves every queue
//! on the old image; a switch prepared before a pause is refused outside
//! one.

mod common;

use std::path::Path;
use std::time::Duration;

use block::overlay::NewOverlay;
use block::{Disk, DiskOptions, EngineKind, ExclusiveImage, ImageType};
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::block::{BlockDevice, BlockDeviceConfig, ControlError};
use virtio_devices::VirtioDevice;
use virtio_host_driver::{BlockHarness, DriverOptions};

const OK: u8 = VIRTIO_BLK_S_OK as u8;

fn options(path: &Path, image_type: ImageType) -> DiskOptions {
    let mut o = DiskOptions::new(path);
    o.image_type = image_type;
    o.engine = EngineKind::Sync;
    o
}

fn owned(path: &Path, num_queues: u16) -> BlockHarness {
    let image = ExclusiveImage::open(&options(path, ImageType::RAW)).unwrap();
    let config = BlockDeviceConfig {
        num_queues,
        queue_size: 64,
        ..Default::default()
    };
    let dev = BlockDevice::with_image(image, config).unwrap();
    BlockHarness::for_device(dev, DriverOptions::default()).unwrap()
}

/// Writes `byte` over 4 KiB at `sector` through queue `q`, and waits.
fn write(h: &mut BlockHarness, q: u16, sector: u64, byte: u8) {
    let d = h.queue(q).unwrap();
    let s = d
        .post_data(VIRTIO_BLK_T_OUT, sector, &[byte; 4096])
        .unwrap();
    d.kick().unwrap();
    assert_eq!(d.wait_slot(s).unwrap().status, OK);
}

fn read(h: &mut BlockHarness, q: u16, sector: u64) -> Vec<u8> {
    let d = h.queue(q).unwrap();
    let u = d.run(VIRTIO_BLK_T_IN, sector, 4096).unwrap();
    assert_eq!(u.status, OK);
    d.read_data(u.slot, 4096)
}

/// 4 KiB at `sector` of the image at `path`, opened on its own.
fn bytes_at(path: &Path, image_type: ImageType, sector: u64) -> Vec<u8> {
    let mut o = options(path, image_type);
    o.readonly = true;
    let disk = Disk::open(&o).unwrap();
    let mut buf = vec![0u8; 4096];
    disk.read_at(sector * 512, &mut buf).unwrap();
    buf
}

#[test]
fn every_queue_moves_to_the_overlay_between_two_requests() {
    let dir = TempDir::new("switch-overlay");
    let raw = raw_image(&dir, 4 << 20);
    let mut h = owned(&raw, 2);
    write(&mut h, 0, 0, 0xA1);
    write(&mut h, 1, 8, 0xA2);
    // Requests in flight when the switch is asked complete first, on the
    // old image.
    let d = h.queue(0).unwrap();
    let slots: Vec<usize> = (0..8u64)
        .map(|i| {
            d.post_data(VIRTIO_BLK_T_OUT, 64 + i * 8, &[0xB0; 4096])
                .unwrap()
        })
        .collect();
    d.kick().unwrap();
    let ov = dir.join("ov.qcow2");
    let overlay = NewOverlay::create(&ov, h.device.disk()).unwrap();
    let image = overlay.open(h.device.disk()).unwrap();
    let old = h.device.switch_image(image).unwrap();
    overlay.keep();
    assert_eq!(old.options().path, raw);
    assert_eq!(h.device.disk().options().path, ov);
    assert_eq!(h.device.image_info().format, "qcow2");
    let d = h.queue(0).unwrap();
    let mut done = Vec::new();
    for _ in 0..100 {
        if done.len() >= slots.len() {
            break;
        }
        d.wait(Duration::from_millis(100), &mut done).unwrap();
    }
    assert_eq!(done.len(), slots.len(), "{done:?}");
    assert!(done.iter().all(|u| u.status == OK), "{done:?}");
    // After it, writes on both queues go to the overlay; reads see the
    // whole chain.
    write(&mut h, 0, 16, 0xC1);
    write(&mut h, 1, 0, 0xC2);
    assert!(read(&mut h, 1, 8).iter().all(|&b| b == 0xA2));
    assert!(read(&mut h, 0, 16).iter().all(|&b| b == 0xC1));
    assert!(read(&mut h, 0, 64).iter().all(|&b| b == 0xB0));
    h.device.shutdown();
    drop((h, old));
    // The base holds what came before, the overlay what came after.
    let base = |s| bytes_at(&raw, ImageType::RAW, s);
    assert!(base(0).iter().all(|&b| b == 0xA1));
    assert!(base(64 + 7 * 8).iter().all(|&b| b == 0xB0));
    assert!(base(16).iter().all(|&b| b != 0xC1));
    let top = |s| bytes_at(&ov, ImageType::Format("qcow2"), s);
    assert!(top(0).iter().all(|&b| b == 0xC2));
    assert!(top(8).iter().all(|&b| b == 0xA2));
    assert!(top(16).iter().all(|&b| b == 0xC1));
}

#[test]
fn a_refused_switch_leaves_every_queue_on_the_old_image() {
    let dir = TempDir::new("switch-refused");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = owned(&raw, 2);
    let other = dir.join("other.raw");
    std::fs::write(&other, vec![0u8; 1 << 20]).unwrap();
    let mut o = options(&other, ImageType::RAW);
    o.readonly = true;
    let ro = Disk::open(&o).unwrap();
    assert!(matches!(
        h.device.switch_image(ro),
        Err(ControlError::SwitchReadOnly { .. })
    ));
    // Prepared, but swapped outside a pause: refused, nothing moved.
    let rw = Disk::open(&options(&other, ImageType::RAW)).unwrap();
    let prepared = h.device.prepare_switch(rw).unwrap();
    assert!(matches!(
        h.device.swap_prepared(prepared),
        Err(ControlError::NotPaused)
    ));
    assert!(!h.device.is_paused());
    write(&mut h, 0, 0, 0x5A);
    write(&mut h, 1, 8, 0x5B);
    h.device.shutdown();
    drop(h);
    assert!(bytes_at(&raw, ImageType::RAW, 0).iter().all(|&b| b == 0x5A));
    assert!(bytes_at(&raw, ImageType::RAW, 8).iter().all(|&b| b == 0x5B));
    assert!(bytes_at(&other, ImageType::RAW, 0).iter().all(|&b| b == 0));
}
