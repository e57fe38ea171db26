//! Every virtio-blk request type through the real device and its worker
//! threads, driven by the host-side driver, on raw and qcow2 images.

mod common;

use std::process::Command;

use block::ImageType;
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::VirtioDevice;
use virtio_host_driver::{BlockHarness, DescSpec, DriverOptions};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
const SIZE: u64 = 1 << 20;

/// Runs `body`, buffered and with O_DIRECT, on a raw image and, when
/// qemu-img and the qcow2 format are available, on a qcow2 copy of the
/// same starting image; the qcow2 image must then pass `qemu-img check`
/// and compare equal to the raw one.
fn each_format(opts: DriverOptions, body: impl Fn(&str, &mut BlockHarness)) {
    for direct in [false, true] {
        each_format_once(opts, direct, &body);
    }
}

fn each_format_once(opts: DriverOptions, direct: bool, body: &impl Fn(&str, &mut BlockHarness)) {
    let mode = if direct { "direct" } else { "buffered" };
    let raw_dir = TempDir::new("req");
    let raw = raw_image(&raw_dir, SIZE);
    let mut h = harness(
        open_with(&raw, ImageType::RAW, false, direct).unwrap(),
        1,
        opts,
    );
    body(&format!("raw {mode}"), &mut h);
    h.device.close().unwrap();
    drop(h);
    let dir = TempDir::new("req-qcow2");
    let start = raw_image(&dir, SIZE);
    let Some(qcow2) = qcow2_from_raw(&dir, &start) else {
        return;
    };
    let disk = open_with(&qcow2, ImageType::Format("qcow2"), false, direct).unwrap();
    let mut h = harness(disk, 1, opts);
    body(&format!("qcow2 {mode}"), &mut h);
    h.device.close().unwrap();
    drop(h);
    let out = testkit::output_within(
        Command::new("qemu-img")
            .args(["check", "-f", "qcow2"])
            .arg(&qcow2),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "qemu-img check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = testkit::output_within(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "qcow2"])
            .arg(&raw)
            .arg(&qcow2),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "qemu-img compare ({mode}): {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn read_returns_image_data_with_used_length() {
    each_format(DriverOptions::default(), |fmt, h| {
        let q = h.queue(0).unwrap();
        let u = q.run(VIRTIO_BLK_T_IN, 10, 4096).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 4097), "{fmt}");
        let data = q.read_data(u.slot, 4096);
        for (i, chunk) in data.chunks(512).enumerate() {
            assert!(
                chunk.iter().all(|&b| b == sector_byte(10 + i as u64)),
                "{fmt} sector {}",
                10 + i
            );
        }
    });
}

#[test]
fn write_then_read_back() {
    each_format(DriverOptions::default(), |fmt, h| {
        let q = h.queue(0).unwrap();
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 256) as u8).collect();
        let s = q.post_data(VIRTIO_BLK_T_OUT, 100, &pattern).unwrap();
        q.kick().unwrap();
        let u = q.wait_slot(s).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 1), "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, 100, 8192).unwrap();
        assert_eq!(u.status, OK);
        assert_eq!(q.read_data(u.slot, 8192), pattern, "{fmt}");
        let u = q.run(VIRTIO_BLK_T_FLUSH, 0, 0).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 1), "{fmt}");
    });
}

#[test]
fn get_id_returns_the_serial() {
    each_format(DriverOptions::default(), |_, h| {
        let q = h.queue(0).unwrap();
        let u = q.run(VIRTIO_BLK_T_GET_ID, 0, 20).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 21));
        let mut want = b"vblk-test-serial".to_vec();
        want.resize(20, 0);
        assert_eq!(q.read_data(u.slot, 20), want);
        // A short buffer gets what fits.
        let u = q.run(VIRTIO_BLK_T_GET_ID, 0, 8).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 9));
        assert_eq!(q.read_data(u.slot, 8), b"vblk-tes");
    });
}

#[test]
fn write_zeroes_and_discard() {
    each_format(DriverOptions::default(), |fmt, h| {
        let q = h.queue(0).unwrap();
        let s = q.post_discard(true, 64, 16, 0).unwrap();
        q.kick().unwrap();
        let u = q.wait_slot(s).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 1), "{fmt}");
        let s = q
            .post_discard(true, 80, 16, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)
            .unwrap();
        q.kick().unwrap();
        assert_eq!(q.wait_slot(s).unwrap().status, OK, "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, 64, 32 * 512).unwrap();
        assert_eq!(u.status, OK);
        assert!(
            q.read_data(u.slot, 32 * 512).iter().all(|&b| b == 0),
            "{fmt}: zeroed range reads zero"
        );
        // Neighbours untouched.
        let u = q.run(VIRTIO_BLK_T_IN, 96, 512).unwrap();
        assert!(
            q.read_data(u.slot, 512)
                .iter()
                .all(|&b| b == sector_byte(96)),
            "{fmt}"
        );
        let s = q.post_discard(false, 128, 128, 0).unwrap();
        q.kick().unwrap();
        assert_eq!(q.wait_slot(s).unwrap().status, OK, "{fmt}");
        let s = q
            .post_discard(false, 128, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)
            .unwrap();
        q.kick().unwrap();
        assert_eq!(q.wait_slot(s).unwrap().status, UNSUPP, "{fmt}");
    });
}

#[test]
fn unsupported_and_out_of_range_requests() {
    each_format(DriverOptions::default(), |fmt, h| {
        let q = h.queue(0).unwrap();
        for t in [
            VIRTIO_BLK_T_SCSI_CMD,
            VIRTIO_BLK_T_SECURE_ERASE,
            VIRTIO_BLK_T_ZONE_REPORT,
            99,
        ] {
            let u = q.run(t, 0, 0).unwrap();
            assert_eq!((u.status, u.used_len), (UNSUPP, 1), "{fmt} type {t}");
        }
        let sectors = SIZE / 512;
        let u = q.run(VIRTIO_BLK_T_IN, sectors - 1, 1024).unwrap();
        assert_eq!((u.status, u.used_len), (IOERR, 1), "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, sectors - 2, 1024).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 1025), "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, 0, 100).unwrap();
        assert_eq!(u.status, IOERR, "{fmt}");
    });
}

#[test]
fn indirect_chains_and_no_event_idx() {
    let opts = DriverOptions {
        indirect: true,
        event_idx: false,
        ..Default::default()
    };
    each_format(opts, |fmt, h| {
        let q = h.queue(0).unwrap();
        let pattern = vec![0x5au8; 4096];
        let s = q.post_data(VIRTIO_BLK_T_OUT, 8, &pattern).unwrap();
        q.kick().unwrap();
        assert_eq!(q.wait_slot(s).unwrap().status, OK, "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, 8, 4096).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 4097), "{fmt}");
        assert_eq!(q.read_data(u.slot, 4096), pattern);
    });
}

#[test]
fn read_only_disk_refuses_writes() {
    let dir = TempDir::new("ro");
    let raw = raw_image(&dir, SIZE);
    let before = std::fs::read(&raw).unwrap();
    let mut h = harness(
        open(&raw, ImageType::RAW, true).unwrap(),
        1,
        DriverOptions::default(),
    );
    assert_ne!(h.device.features() & (1 << VIRTIO_BLK_F_RO), 0);
    let q = h.queue(0).unwrap();
    let s = q.post_data(VIRTIO_BLK_T_OUT, 0, &[1u8; 512]).unwrap();
    q.kick().unwrap();
    assert_eq!(q.wait_slot(s).unwrap().status, IOERR);
    for wz in [false, true] {
        let s = q.post_discard(wz, 0, 8, 0).unwrap();
        q.kick().unwrap();
        assert_eq!(q.wait_slot(s).unwrap().status, IOERR);
    }
    let u = q.run(VIRTIO_BLK_T_IN, 0, 512).unwrap();
    assert_eq!(u.status, OK);
    h.device.close().unwrap();
    drop(h);
    assert_eq!(std::fs::read(&raw).unwrap(), before);
}

#[test]
fn many_requests_in_one_batch() {
    each_format(DriverOptions::default(), |fmt, h| {
        let q = h.queue(0).unwrap();
        let mut slots = Vec::new();
        for i in 0..20u64 {
            slots.push((i, q.post(VIRTIO_BLK_T_IN, i * 8, 4096).unwrap()));
        }
        q.kick().unwrap();
        let mut done = Vec::new();
        while done.len() < 20 {
            let n = q
                .wait(std::time::Duration::from_secs(5), &mut done)
                .unwrap();
            assert!(
                n > 0,
                "{fmt}: device stalled with {} of 20 done",
                done.len()
            );
        }
        for (i, slot) in slots {
            let u = done.iter().find(|u| u.slot == slot).unwrap();
            assert_eq!((u.status, u.used_len), (OK, 4097));
            assert_eq!(q.read_data(slot, 1)[0], sector_byte(i * 8), "{fmt}");
        }
    });
}

/// The driver switches the cache to writethrough (CONFIG_WCE 0): the
/// config space says so, writes still complete with their data, and the
/// rest of the config space stays read-only. (The flush the worker adds
/// after each write is not counted and not visible from here.)
#[test]
fn a_guest_switch_to_writethrough_sticks_and_writes_still_complete() {
    each_format(DriverOptions::default(), |fmt, h| {
        // CONFIG_WCE: the driver switches the cache to writethrough.
        h.device.write_config(32, &[0]);
        let mut wb = [0xffu8; 1];
        h.device.read_config(32, &mut wb);
        assert_eq!(wb[0], 0, "{fmt}");
        let q = h.queue(0).unwrap();
        let data = vec![0x3cu8; 4096];
        let s = q.post_data(VIRTIO_BLK_T_OUT, 40, &data).unwrap();
        q.kick().unwrap();
        let u = q.wait_slot(s).unwrap();
        assert_eq!((u.status, u.used_len), (OK, 1), "{fmt}");
        let u = q.run(VIRTIO_BLK_T_IN, 40, 4096).unwrap();
        assert_eq!(q.read_data(u.slot, 4096), data, "{fmt}");
        // Other config fields are read-only.
        h.device.write_config(0, &[0xff; 8]);
        let mut cap = [0u8; 8];
        h.device.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), SIZE / 512, "{fmt}");
    });
}

#[test]
fn unaligned_guest_buffers_and_header_sharing_a_descriptor() {
    each_format(DriverOptions::default(), |fmt, h| {
        // OUT: header and 1024 data bytes in one device-readable
        // descriptor, so the data starts 16 bytes into a page.
        let base = h.scratch().0;
        let mut buf = vec![0u8; 16 + 1024];
        buf[0..4].copy_from_slice(&VIRTIO_BLK_T_OUT.to_le_bytes());
        buf[8..16].copy_from_slice(&200u64.to_le_bytes());
        for (i, b) in buf[16..].iter_mut().enumerate() {
            *b = (i * 13 % 256) as u8;
        }
        vm_memory::Bytes::write_slice(&*h.mem, &buf, vm_memory::GuestAddress(base)).unwrap();
        let status = base + 0x800;
        let q = h.queue(0).unwrap();
        let head =
            q.vq.add_chain(&[
                DescSpec::readable(base, 16 + 1024),
                DescSpec::writable(status, 1),
            ])
            .unwrap();
        q.vq.push_avail(head);
        q.kick().unwrap();
        let mut done = Vec::new();
        while done.is_empty() {
            assert!(
                q.wait(std::time::Duration::from_secs(10), &mut done)
                    .unwrap()
                    > 0,
                "{fmt}"
            );
        }
        assert_eq!((done[0].head, done[0].used_len), (head, 1), "{fmt}");
        let st: u8 =
            vm_memory::Bytes::read_obj(&**q.memory(), vm_memory::GuestAddress(status)).unwrap();
        assert_eq!(st, OK, "{fmt}");
        // IN into a buffer at an odd address, status in the same descriptor.
        let hdr = base + 0x1000;
        let mut hb = [0u8; 16];
        hb[0..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
        hb[8..16].copy_from_slice(&200u64.to_le_bytes());
        vm_memory::Bytes::write_slice(&**q.memory(), &hb, vm_memory::GuestAddress(hdr)).unwrap();
        let data = base + 0x2001;
        let head =
            q.vq.add_chain(&[DescSpec::readable(hdr, 16), DescSpec::writable(data, 1025)])
                .unwrap();
        q.vq.push_avail(head);
        q.kick().unwrap();
        done.clear();
        while done.is_empty() {
            assert!(
                q.wait(std::time::Duration::from_secs(10), &mut done)
                    .unwrap()
                    > 0,
                "{fmt}"
            );
        }
        assert_eq!(done[0].used_len, 1025, "{fmt}");
        let mut back = vec![0u8; 1025];
        vm_memory::Bytes::read_slice(&**q.memory(), &mut back, vm_memory::GuestAddress(data))
            .unwrap();
        assert_eq!(&back[..1024], &buf[16..], "{fmt}");
        assert_eq!(back[1024], OK, "{fmt}: status is the last byte");
    });
}
