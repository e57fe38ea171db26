//! The vhost-user-blk export driven by a vhost-user front end played by
//! the test (no QEMU): reads, writes, flush, discard, write-zeroes, GET_ID,
//! config space, read-only, multi-queue, EVENT_IDX on and off, WCE, and
//! reconnects, on raw and qcow2 images; every image is then checked with
//! `qemu-img check` and compared with a reference file the test wrote the
//! same data to.

mod vhost_user_support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vhost_user_support::*;
use virtio_bindings::virtio_blk::*;
use virtio_host_driver::QueueDriver;

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const IMAGE_SIZE: u64 = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Raw,
    Qcow2,
}

/// An image of IMAGE_SIZE bytes (zeroes) and a raw reference beside it.
fn make_image(dir: &TempDir, format: Format) -> (PathBuf, PathBuf) {
    let reference = zeroed_raw(dir, "reference.raw", IMAGE_SIZE);
    let image = match format {
        Format::Raw => zeroed_raw(dir, "disk.raw", IMAGE_SIZE),
        Format::Qcow2 => {
            let p = dir.join("disk.qcow2");
            run(Command::new("qemu-img").args([
                "create",
                "-q",
                "-f",
                "qcow2",
                p.to_str().unwrap(),
                &IMAGE_SIZE.to_string(),
            ]));
            p
        }
    };
    (image, reference)
}

/// `qemu-img check` (qcow2) and `qemu-img compare` with the reference.
fn check_image(image: &Path, format: Format, reference: &Path) {
    let fmt = match format {
        Format::Raw => "raw",
        Format::Qcow2 => "qcow2",
    };
    if format == Format::Qcow2 {
        run(Command::new("qemu-img").args(["check", "-q", "-f", fmt, image.to_str().unwrap()]));
    }
    run(Command::new("qemu-img").args([
        "compare",
        "-q",
        "-f",
        fmt,
        "-F",
        "raw",
        image.to_str().unwrap(),
        reference.to_str().unwrap(),
    ]));
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i % 251) as u8))
        .collect()
}

fn write(q: &mut QueueDriver, sector: u64, data: &[u8]) -> u8 {
    let slot = q.post_data(VIRTIO_BLK_T_OUT, sector, data).unwrap();
    q.kick().unwrap();
    q.wait_slot(slot).expect("write completes").status
}

fn read(q: &mut QueueDriver, sector: u64, len: u32) -> (u8, Vec<u8>) {
    let u = q.run(VIRTIO_BLK_T_IN, sector, len).expect("read completes");
    (u.status, q.read_data(u.slot, len as usize))
}

fn discard(q: &mut QueueDriver, write_zeroes: bool, sector: u64, sectors: u32) -> u8 {
    let slot = q.post_discard(write_zeroes, sector, sectors, 0).unwrap();
    q.kick().unwrap();
    q.wait_slot(slot).expect("discard completes").status
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Every request type through two queues, then the oracle.
fn requests_on(format: Format, event_idx: bool) {
    if !have_tool("qemu-img") {
        return;
    }
    let dir = TempDir::new("rw");
    let (image, reference) = make_image(&dir, format);
    let daemon = Daemon::start(
        &dir,
        &image,
        "",
        "writable=on,num_queues=2,serial=VU-SERIAL-1",
    );
    let mut opts = FrontEndOptions {
        num_queues: 2,
        ..Default::default()
    };
    opts.driver.event_idx = event_idx;
    let mut fe = FrontEnd::connect(&daemon.socket, opts);
    let features = fe.features;
    assert_eq!(
        features & (1 << VIRTIO_BLK_F_RO),
        0,
        "writable export offers no RO"
    );
    for f in [
        VIRTIO_BLK_F_MQ,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
        VIRTIO_BLK_F_CONFIG_WCE,
    ] {
        assert_ne!(features & (1 << f), 0, "feature {f} offered");
    }
    let config = fe.config(0, 60);
    assert_eq!(
        u64::from_le_bytes(config[0..8].try_into().unwrap()),
        IMAGE_SIZE / 512
    );
    assert_eq!(le32(&config, 20), 512, "blk_size");
    assert_eq!(u16::from_le_bytes([config[34], config[35]]), 2);

    let reference_file = std::fs::OpenOptions::new()
        .write(true)
        .open(&reference)
        .unwrap();
    // Writes on both queues, each read back on the other queue.
    for (i, sector) in [0u64, 7, 2048, 30000].into_iter().enumerate() {
        let data = pattern(i as u8 + 1, 8192);
        let (a, b) = fe.queues.split_at_mut(1);
        let (wq, rq) = if i % 2 == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        assert_eq!(write(wq, sector, &data), OK);
        reference_file.write_all_at(&data, sector * 512).unwrap();
        let (status, back) = read(rq, sector, 8192);
        assert_eq!(status, OK);
        assert_eq!(back, data, "sector {sector}");
    }
    let q = &mut fe.queues[0];
    assert_eq!(q.run(VIRTIO_BLK_T_FLUSH, 0, 0).unwrap().status, OK);
    // GET_ID answers the serial.
    let u = q.run(VIRTIO_BLK_T_GET_ID, 0, 20).unwrap();
    assert_eq!(u.status, OK);
    assert_eq!(&q.read_data(u.slot, 11), b"VU-SERIAL-1");
    // Write-zeroes and discard read back as zeroes.
    assert_eq!(discard(q, true, 2048, 8), OK);
    reference_file.write_all_at(&[0; 4096], 2048 * 512).unwrap();
    assert_eq!(discard(q, false, 0, 16), OK);
    reference_file.write_all_at(&[0; 8192], 0).unwrap();
    for sector in [0u64, 2048] {
        let (status, back) = read(q, sector, 4096);
        assert_eq!(status, OK);
        assert!(back.iter().all(|&b| b == 0), "sector {sector} zeroed");
    }
    // A read past the end fails, the queue keeps working.
    assert_eq!(read(q, IMAGE_SIZE / 512, 512).0, IOERR);
    assert_eq!(read(q, 7, 512).0, OK);
    drop(fe);
    let log = daemon.stop();
    assert!(log.contains("front end disconnected"), "{log}");
    check_image(&image, format, &reference);
}

#[test]
fn raw_image_serves_every_request_type() {
    requests_on(Format::Raw, true);
}

#[test]
fn qcow2_image_serves_every_request_type() {
    requests_on(Format::Qcow2, true);
}

#[test]
fn qcow2_image_without_event_idx() {
    requests_on(Format::Qcow2, false);
}

#[test]
fn read_only_export_offers_ro_and_refuses_writes() {
    let dir = TempDir::new("ro");
    let image = dir.join("disk.raw");
    std::fs::write(&image, pattern(9, 1 << 20)).unwrap();
    let daemon = Daemon::start(&dir, &image, "", "logical_block_size=4096");
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    assert_ne!(fe.features & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(fe.features & (1 << VIRTIO_BLK_F_DISCARD), 0);
    let config = fe.config(0, 60);
    assert_eq!(le32(&config, 20), 4096, "blk_size");
    let q = &mut fe.queues[0];
    assert_eq!(write(q, 0, &[1; 4096]), IOERR);
    let (status, back) = read(q, 8, 4096);
    assert_eq!(status, OK);
    assert_eq!(back, pattern(9, 1 << 20)[4096..8192]);
    drop(fe);
    daemon.stop();
    assert_eq!(std::fs::read(&image).unwrap(), pattern(9, 1 << 20));
}

#[test]
fn writethrough_set_through_config_space() {
    let dir = TempDir::new("wce");
    let image = zeroed_raw(&dir, "disk.raw", 1 << 20);
    let daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    assert_eq!(fe.config(32, 1), [1], "writeback by default");
    fe.frontend
        .set_config(32, VhostUserConfigFlags::WRITABLE, &[0])
        .expect("SET_CONFIG");
    assert_eq!(
        fe.config(32, 1),
        [0],
        "writethrough after the driver's write"
    );
    let q = &mut fe.queues[0];
    assert_eq!(write(q, 4, &pattern(3, 4096)), OK);
    assert_eq!(read(q, 4, 4096), (OK, pattern(3, 4096)));
    drop(fe);
    // A new connection starts in writeback again.
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    assert_eq!(fe.config(32, 1), [1]);
    drop(fe);
    daemon.stop();
}

#[test]
fn reconnects_keep_the_data_and_the_image_consistent() {
    if !have_tool("qemu-img") {
        return;
    }
    let dir = TempDir::new("reconnect");
    let (image, _) = make_image(&dir, Format::Qcow2);
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on,num_queues=2");
    let idle_threads = daemon.settled_threads();
    let opts = FrontEndOptions {
        num_queues: 2,
        ..Default::default()
    };
    for round in 0..3u8 {
        let mut fe = FrontEnd::connect(&daemon.socket, opts);
        if round > 0 {
            let (status, back) = read(&mut fe.queues[1], 64 * u64::from(round - 1), 4096);
            assert_eq!(status, OK);
            assert_eq!(back, pattern(round - 1, 4096), "round {round}");
        }
        assert_eq!(
            write(
                &mut fe.queues[0],
                64 * u64::from(round),
                &pattern(round, 4096)
            ),
            OK
        );
        // Leave requests in flight and hang up without waiting.
        let q = &mut fe.queues[1];
        for i in 0..8u64 {
            q.post_data(VIRTIO_BLK_T_OUT, 4096 + i * 128, &pattern(7, 65536))
                .unwrap();
        }
        q.kick().unwrap();
        drop(fe);
        daemon.assert_running();
    }
    // Every connection's threads are gone once it is (the next
    // connection's vring thread waits already).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while daemon.threads() > idle_threads && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(daemon.threads(), idle_threads, "threads left behind");
    let log = daemon.stop();
    assert_eq!(log.matches("front end connected").count(), 3, "{log}");
    run(Command::new("qemu-img").args(["check", "-q", image.to_str().unwrap()]));
}

#[test]
fn get_vring_base_reports_where_the_worker_stopped_and_the_queue_resumes() {
    let dir = TempDir::new("base");
    let image = zeroed_raw(&dir, "disk.raw", 1 << 20);
    let daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    for i in 0..5 {
        assert_eq!(read(&mut fe.queues[0], i, 512).0, OK);
    }
    assert_eq!(fe.frontend.get_vring_base(0).expect("GET_VRING_BASE"), 5);
    // Started again from there (QEMU's stop and cont), the queue serves on.
    fe.restart_vring(0, 5);
    assert_eq!(write(&mut fe.queues[0], 3, &pattern(4, 1024)), OK);
    assert_eq!(read(&mut fe.queues[0], 3, 1024), (OK, pattern(4, 1024)));
    assert_eq!(fe.frontend.get_vring_base(0).expect("GET_VRING_BASE"), 7);
    drop(fe);
    let log = daemon.stop();
    assert_eq!(log.matches("queue 0 started").count(), 2, "{log}");
}

#[test]
fn a_new_memory_table_restarts_the_running_queues() {
    let dir = TempDir::new("memtable");
    let image = dir.join("disk.raw");
    std::fs::write(&image, pattern(5, 1 << 20)).unwrap();
    let daemon = Daemon::start(&dir, &image, "", "writable=on,num_queues=2");
    let opts = FrontEndOptions {
        num_queues: 2,
        ..Default::default()
    };
    let mut fe = FrontEnd::connect(&daemon.socket, opts);
    for q in &mut fe.queues {
        assert_eq!(read(q, 0, 512).0, OK);
    }
    // QEMU sends the table again when its memory map changes.
    let region = fe.memory.region();
    fe.frontend.set_mem_table(&[region]).expect("SET_MEM_TABLE");
    for (i, q) in fe.queues.iter_mut().enumerate() {
        let (status, back) = read(q, 8, 4096);
        assert_eq!(status, OK, "queue {i}");
        assert_eq!(back, pattern(5, 1 << 20)[4096..8192]);
    }
    assert_eq!(fe.frontend.get_vring_base(1).expect("GET_VRING_BASE"), 2);
    drop(fe);
    let log = daemon.stop();
    assert_eq!(log.matches("queue 1 started").count(), 2, "{log}");
}

#[test]
fn sigterm_with_a_front_end_connected_drains_and_exits_clean() {
    if !have_tool("qemu-img") {
        return;
    }
    let dir = TempDir::new("sigterm");
    let (image, _) = make_image(&dir, Format::Qcow2);
    let daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    let q = &mut fe.queues[0];
    assert_eq!(write(q, 0, &pattern(1, 4096)), OK);
    for i in 0..8u64 {
        q.post_data(VIRTIO_BLK_T_OUT, 1024 + i * 128, &pattern(2, 65536))
            .unwrap();
    }
    q.kick().unwrap();
    // The daemon ends the connection itself: the front end is still here.
    let log = daemon.stop();
    assert!(log.contains("signal 15: stopping"), "{log}");
    assert!(fe.frontend.get_features().is_err(), "connection left open");
    run(Command::new("qemu-img").args(["check", "-q", image.to_str().unwrap()]));
    let out =
        run(Command::new("qemu-io").args(["-r", "-c", "read -P 31 0 1", image.to_str().unwrap()]));
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn writable_export_of_a_read_only_image_is_refused() {
    let dir = TempDir::new("rowritable");
    let image = zeroed_raw(&dir, "disk.raw", 1 << 20);
    let out = testkit::output_within(
        Command::new(env!("CARGO_BIN_EXE_ch-storage-daemon")).args([
            "--image",
            &format!("path={},readonly=on", image.display()),
            "--export",
            &format!(
                "type=vhost-user-blk,socket={},writable=on",
                dir.join("s.sock").display()
            ),
        ]),
        testkit::COMMAND_LIMIT,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("writable=on"), "{err}");
    assert!(!dir.join("s.sock").exists());
}

#[test]
fn every_queue_signals_its_call_eventfd() {
    let dir = TempDir::new("calls");
    let image = zeroed_raw(&dir, "disk.raw", 1 << 20);
    let daemon = Daemon::start(&dir, &image, "", "num_queues=4");
    for event_idx in [true, false] {
        let mut opts = FrontEndOptions {
            num_queues: 4,
            ..Default::default()
        };
        opts.driver.event_idx = event_idx;
        let mut fe = FrontEnd::connect(&daemon.socket, opts);
        for (i, q) in fe.queues.iter_mut().enumerate() {
            q.vq.arm_interrupt();
            let slot = q.post(VIRTIO_BLK_T_IN, i as u64, 512).unwrap();
            q.kick().unwrap();
            let q_index = u16::try_from(i).unwrap();
            assert!(
                fe.interrupt
                    .wait(q_index, std::time::Duration::from_secs(5))
                    .unwrap(),
                "no call on queue {i} (event_idx {event_idx})"
            );
            let mut out = Vec::new();
            q.reap(&mut out);
            assert_eq!(out.len(), 1);
            assert_eq!((out[0].slot, out[0].status), (slot, OK));
        }
    }
    daemon.stop();
}

#[test]
fn a_second_front_end_is_served_once_the_first_leaves() {
    let dir = TempDir::new("second");
    let image = zeroed_raw(&dir, "disk.raw", 1 << 20);
    let daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut first = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    assert_eq!(write(&mut first.queues[0], 2, &pattern(8, 512)), OK);
    let socket = daemon.socket.clone();
    let second = std::thread::spawn(move || {
        let mut fe = FrontEnd::connect(&socket, FrontEndOptions::default());
        read(&mut fe.queues[0], 2, 512)
    });
    // The second one waits in the listen backlog meanwhile.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!second.is_finished());
    assert_eq!(read(&mut first.queues[0], 2, 512), (OK, pattern(8, 512)));
    drop(first);
    assert_eq!(second.join().unwrap(), (OK, pattern(8, 512)));
    daemon.stop();
}
