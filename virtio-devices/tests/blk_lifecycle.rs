//! Device lifecycle and notification behaviour: multi-queue, reset with
//! I/O in flight, EVENT_IDX interrupt and kick suppression, shutdown.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{EngineKind, ImageType};
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::block::BlockDeviceConfig;
use virtio_devices::{ActivatedQueue, VirtioDevice};
use virtio_host_driver::{DriverOptions, EventFdInterrupt};
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

const OK: u8 = VIRTIO_BLK_S_OK as u8;

/// Waits (bounded) until `cond` holds; returns whether it did.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

#[test]
fn four_queues_in_parallel() {
    let dir = TempDir::new("mq");
    let raw = raw_image(&dir, 4 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        4,
        DriverOptions::default(),
    );
    assert_ne!(h.device.features() & (1 << VIRTIO_BLK_F_MQ), 0);
    let mut cfg = [0u8; 2];
    h.device.read_config(34, &mut cfg);
    assert_eq!(u16::from_le_bytes(cfg), 4);
    let threads: Vec<_> = (0..4u16)
        .map(|i| {
            let mut q = h.take_queue(i).unwrap();
            std::thread::spawn(move || {
                let base = u64::from(i) * 2048;
                for round in 0..16u64 {
                    let pattern = vec![(i as u8) << 4 | round as u8; 4096];
                    let s = q
                        .post_data(VIRTIO_BLK_T_OUT, base + round * 8, &pattern)
                        .unwrap();
                    q.kick().unwrap();
                    assert_eq!(q.wait_slot(s).unwrap().status, OK);
                    let u = q.run(VIRTIO_BLK_T_IN, base + round * 8, 4096).unwrap();
                    assert_eq!((u.status, u.used_len), (OK, 4097));
                    assert_eq!(q.read_data(u.slot, 4096), pattern);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..4 {
        assert!(h.interrupt.count(i) > 0, "queue {i} never interrupted");
    }
    h.device.close().unwrap();
    drop(h);
    let file = std::fs::read(&raw).unwrap();
    for i in 0..4u64 {
        let at = (i * 2048 + 15 * 8) as usize * 512;
        assert!(file[at..at + 4096]
            .iter()
            .all(|&b| b == ((i as u8) << 4 | 15)));
    }
}

fn reset_with_io_in_flight(engine: EngineKind) {
    let dir = TempDir::new("reset");
    let raw = raw_image(&dir, 4 << 20);
    let Some(disk) = open_engine(&raw, engine) else {
        return;
    };
    let opts = DriverOptions {
        indirect: true,
        slots: 60,
        slot_data: 64 << 10,
        ..Default::default()
    };
    let mut h = harness(disk, 1, opts);
    let q = h.queue(0).unwrap();
    let mut slots = Vec::new();
    for i in 0..60u64 {
        slots.push(q.post(VIRTIO_BLK_T_IN, i * 128, 64 << 10).unwrap());
    }
    q.kick().unwrap();
    // Reset while the device works through the batch: it must finish what
    // it took, hand back the kick eventfd and touch nothing afterwards.
    let kicks = h.device.reset();
    assert_eq!(kicks.len(), 1);
    assert!(!h.device.is_activated());
    let q = h.queue(0).unwrap();
    let used_now = q.vq.used_idx();
    let mut done = Vec::new();
    q.reap(&mut done);
    assert_eq!(done.len(), usize::from(used_now));
    for u in &done {
        assert_eq!(
            (u.status, u.used_len),
            (OK, (64 << 10) + 1),
            "completed before reset"
        );
    }
    for &s in &slots {
        if !done.iter().any(|u| u.slot == s) {
            let st: u8 = vm_memory::Bytes::read_obj(&**q.memory(), q.slot(s).status).unwrap();
            assert_eq!(
                st, 0xff,
                "a request not returned must not have been answered"
            );
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        h.queue(0).unwrap().vq.used_idx(),
        used_now,
        "no used entries after reset"
    );
    // Activate again with the returned kick eventfd and do I/O.
    h.reactivate(kicks).unwrap();
    let q = h.queue(0).unwrap();
    let u = q.run(VIRTIO_BLK_T_IN, 1, 512).unwrap();
    assert_eq!((u.status, u.used_len), (OK, 513));
    assert!(q
        .read_data(u.slot, 512)
        .iter()
        .all(|&b| b == sector_byte(1)));
}

#[test]
fn reset_with_io_in_flight_sync() {
    reset_with_io_in_flight(EngineKind::Sync);
}

#[test]
fn reset_with_io_in_flight_io_uring() {
    reset_with_io_in_flight(EngineKind::IoUring);
}

#[test]
fn reset_then_reactivate_reuses_kick_eventfds() {
    let dir = TempDir::new("react");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        2,
        DriverOptions::default(),
    );
    assert_eq!(h.reset_and_reactivate().unwrap(), 2);
    for i in 0..2 {
        let q = h.queue(i).unwrap();
        let u = q.run(VIRTIO_BLK_T_IN, 7, 512).unwrap();
        assert_eq!(u.status, OK);
    }
    // Reset of an inactive device returns nothing and is harmless.
    assert_eq!(h.device.reset().len(), 2);
    assert!(h.device.reset().is_empty());
}

#[test]
fn event_idx_suppresses_interrupts_until_used_event() {
    let dir = TempDir::new("evidx");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        1,
        DriverOptions::default(),
    );
    let interrupt = Arc::clone(&h.interrupt);
    let q = h.queue(0).unwrap();
    // Ask for an interrupt only after 100 more used entries.
    q.vq.set_used_event(q.vq.last_used().wrapping_add(100));
    for i in 0..4 {
        q.post(VIRTIO_BLK_T_IN, i, 512).unwrap();
    }
    assert!(q.kick().unwrap(), "a fresh device wants the first kick");
    assert!(
        eventually(|| q.vq.used_idx() == 4),
        "requests never completed"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(interrupt.count(0), 0, "interrupt despite used_event");
    let mut done = Vec::new();
    q.reap(&mut done);
    assert_eq!(done.len(), 4);
    // used_event = 4: the next used entry must interrupt.
    q.vq.arm_interrupt();
    q.post(VIRTIO_BLK_T_IN, 0, 512).unwrap();
    q.kick().unwrap();
    assert!(
        interrupt.wait(0, Duration::from_secs(10)).unwrap(),
        "no interrupt at used_event"
    );
    assert_eq!(interrupt.count(0), 1);
}

#[test]
fn event_idx_avail_event_controls_kicks() {
    let dir = TempDir::new("kick");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        1,
        DriverOptions::default(),
    );
    let q = h.queue(0).unwrap();
    for round in 0..8 {
        let s = q.post(VIRTIO_BLK_T_IN, round, 512).unwrap();
        // The worker re-enables notifications (avail_event = next avail)
        // before it sleeps, so every request after an idle device kicks.
        assert!(
            q.kick().unwrap(),
            "round {round}: device did not ask for a kick"
        );
        assert_eq!(q.wait_slot(s).unwrap().status, OK);
    }
    assert_eq!(q.kicks, 8);
}

#[test]
fn shutdown_closes_and_refuses_activation() {
    let dir = TempDir::new("shut");
    let raw = raw_image(&dir, 1 << 20);
    let mut h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        1,
        DriverOptions::default(),
    );
    let q = h.queue(0).unwrap();
    let s = q.post_data(VIRTIO_BLK_T_OUT, 0, &[0xabu8; 512]).unwrap();
    q.kick().unwrap();
    assert_eq!(q.wait_slot(s).unwrap().status, OK);
    h.device.shutdown();
    assert!(!h.device.is_activated());
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let intr = Arc::new(EventFdInterrupt::new(1).unwrap());
    let queue = virtio_queue::Queue::new(64).unwrap();
    let err = h.device.activate(
        mem,
        intr,
        vec![ActivatedQueue {
            index: 0,
            queue,
            kick: EventFd::new(0).unwrap(),
        }],
    );
    assert!(err.is_err());
    drop(h);
    assert!(std::fs::read(&raw).unwrap()[..512]
        .iter()
        .all(|&b| b == 0xab));
}

#[test]
fn activation_with_too_many_queues_fails_cleanly() {
    let dir = TempDir::new("act");
    let raw = raw_image(&dir, 1 << 20);
    let disk = open(&raw, ImageType::RAW, false).unwrap();
    let config = BlockDeviceConfig {
        num_queues: 1,
        queue_size: 64,
        ..Default::default()
    };
    let mut dev = virtio_devices::block::BlockDevice::new(disk, config).unwrap();
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let intr = Arc::new(EventFdInterrupt::new(2).unwrap());
    let queues = (0..2)
        .map(|i| ActivatedQueue {
            index: i,
            queue: virtio_queue::Queue::new(64).unwrap(),
            kick: EventFd::new(0).unwrap(),
        })
        .collect();
    assert!(dev.activate(mem.clone(), intr.clone(), queues).is_err());
    assert!(!dev.is_activated());
    // A queue whose rings lie outside guest memory is refused.
    let mut queue = virtio_queue::Queue::new(64).unwrap();
    queue.set_size(64);
    queue.set_desc_table_address(Some(0), Some(0x100));
    queue.set_avail_ring_address(Some(0x1000), None);
    queue.set_used_ring_address(Some(0x2000), None);
    queue.set_ready(true);
    let bad = vec![ActivatedQueue {
        index: 0,
        queue,
        kick: EventFd::new(0).unwrap(),
    }];
    assert!(dev.activate(mem, intr, bad).is_err());
    assert!(!dev.is_activated());
    // Invalid configurations are refused.
    let disk = open(&raw, ImageType::RAW, false).unwrap();
    let bad = BlockDeviceConfig {
        queue_size: 100,
        ..Default::default()
    };
    assert!(virtio_devices::block::BlockDevice::new(disk, bad).is_err());
}
