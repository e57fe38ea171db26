//! Starting and stopping single queues ([`BlockDevice::start_queue`],
//! [`BlockDevice::stop_queue`]), as the storage daemon's vhost-user-blk
//! export does per vring: a stopped queue reports the ring positions its
//! worker reached, the other queues keep serving, and the queue resumes
//! from those positions when started again.

mod common;

use std::sync::Arc;

use block::ImageType;
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::{ActivatedQueue, VirtioInterrupt};
use virtio_host_driver::DriverOptions;
use virtio_queue::QueueT;

const OK: u8 = VIRTIO_BLK_S_OK as u8;

#[test]
fn a_stopped_queue_reports_its_positions_and_resumes_from_them() {
    let dir = TempDir::new("startstop");
    let raw = raw_image(&dir, 1 << 20);
    let disk = open(&raw, ImageType::RAW, false).unwrap();
    let mut h = harness(disk, 2, DriverOptions::default());
    for s in 0..3 {
        let u = h.queue(0).unwrap().run(VIRTIO_BLK_T_IN, s, 512).unwrap();
        assert_eq!(u.status, OK);
    }
    assert!(h.device.is_queue_running(0));
    let stopped = h.device.stop_queue(0).expect("queue 0 was running");
    assert!(!h.device.is_queue_running(0));
    assert!(h.device.stop_queue(0).is_none(), "stopped twice");
    assert_eq!(stopped.queue.next_avail(), 3);
    assert_eq!(stopped.queue.next_used(), 3);

    // Queue 1 still serves.
    let u = h.queue(1).unwrap().run(VIRTIO_BLK_T_IN, 9, 512).unwrap();
    assert_eq!(u.status, OK);

    // Out of range, and running already, are refused.
    let interrupt: Arc<dyn VirtioInterrupt> = h.interrupt.clone();
    let q1 = h.queue(1).unwrap().vq.device_queue();
    let kick = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let err = h.device.start_queue(
        Arc::clone(&h.mem),
        Arc::clone(&interrupt),
        ActivatedQueue {
            index: 1,
            queue: q1,
            kick,
        },
    );
    assert!(err.is_err(), "queue 1 started twice");
    let q5 = h.queue(1).unwrap().vq.device_queue();
    let kick = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    let err = h.device.start_queue(
        Arc::clone(&h.mem),
        Arc::clone(&interrupt),
        ActivatedQueue {
            index: 5,
            queue: q5,
            kick,
        },
    );
    assert!(err.is_err(), "queue 5 of 2");

    // Queue 0 resumes where it stopped, on the same kick eventfd.
    h.device
        .start_queue(
            Arc::clone(&h.mem),
            interrupt,
            ActivatedQueue {
                index: 0,
                queue: stopped.queue,
                kick: stopped.kick,
            },
        )
        .unwrap();
    let q = h.queue(0).unwrap();
    let u = q.run(VIRTIO_BLK_T_IN, 5, 512).unwrap();
    assert_eq!(u.status, OK);
    assert!(q
        .read_data(u.slot, 512)
        .iter()
        .all(|&b| b == sector_byte(5)));
}
