//! The queue worker hands a large batch to the disk in slices and returns
//! each slice's completions before it parses the next
//! (`WorkerState::process_available`), and one pass over the ring takes at
//! most a queue size of chains. Checked here: deep batches (128 chains
//! posted at once, so every pass is sliced) complete once each with the
//! right data on every engine that can run without O_DIRECT, and a driver
//! that reposts every completion at once, as fast as it can, cannot keep
//! the worker from a reset.
//!
//! That the slices let the driver refill while the worker works (the
//! throughput gain) can only be seen against a clock, so it is measured,
//! not asserted: blk-bench's per-thread CPU and context switches
//! (docs/performance.md, "What explains the limits").

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use block::EngineKind;
use common::*;
use virtio_bindings::virtio_blk::VIRTIO_BLK_T_IN;
use virtio_devices::block::{BlockDevice, BlockDeviceConfig};
use virtio_devices::device::{ActivatedQueue, InterruptKind, VirtioDevice, VirtioInterrupt};
use virtio_host_driver::{BlockHarness, DescSpec, DriverOptions, DriverQueue, QueueLayout};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const SECTORS: u64 = 4096;

fn deep_harness(engine: EngineKind, dir: &TempDir) -> Option<BlockHarness> {
    let raw = raw_image(dir, SECTORS * 512);
    let disk = open_engine(&raw, engine)?;
    let config = BlockDeviceConfig {
        queue_size: 256,
        ..Default::default()
    };
    let opts = DriverOptions {
        slots: 128,
        slot_data: 512,
        indirect: true,
        ..Default::default()
    };
    Some(BlockHarness::new(disk, config, opts).unwrap())
}

#[test]
fn deep_batches_complete_once_with_the_right_data_on_every_engine() {
    for engine in [EngineKind::IoUring, EngineKind::Threads, EngineKind::Sync] {
        let dir = TempDir::new("slices");
        let Some(mut h) = deep_harness(engine, &dir) else {
            continue;
        };
        let q = h.queue(0).unwrap();
        // 128 in flight, refilled as they complete: every pass of the
        // worker sees a deep ring and submits it in slices.
        reads_in_flight(q, 2000, 1, SECTORS, &format!("{engine:?} deep"));
        // Nothing left over: every slot came back exactly once.
        assert_eq!(q.free_slots(), 128, "{engine:?}");
    }
}

/// The guest of the reset test: its "interrupt handler" runs inside the
/// worker's trigger call and makes a full queue of the same read chain
/// available again (a guest may repost a chain still in flight; the
/// device must cope), and asks for an interrupt at the next used entry.
/// So every completed slice is replaced before the worker looks at the
/// ring again: without a bound on one pass, the worker would never go
/// back to its epoll loop and never see a stop request.
struct RefillingGuest {
    vq: Mutex<DriverQueue>,
    head: u16,
    pushed: Mutex<u16>,
    refill: AtomicBool,
    interrupts: AtomicU64,
}

impl RefillingGuest {
    fn refill(&self) {
        let mut vq = self.vq.lock().unwrap();
        let mut pushed = self.pushed.lock().unwrap();
        let used = vq.used_idx();
        while pushed.wrapping_sub(used) < QUEUE_SIZE {
            vq.push_avail(self.head);
            *pushed = pushed.wrapping_add(1);
        }
        vq.publish();
        vq.set_used_event(used);
    }
}

impl VirtioInterrupt for RefillingGuest {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        if let InterruptKind::Queue(_) = kind {
            self.interrupts.fetch_add(1, Ordering::SeqCst);
            if self.refill.load(Ordering::SeqCst) {
                self.refill();
            }
        }
        Ok(())
    }
}

const QUEUE_SIZE: u16 = 64;

#[test]
fn a_guest_that_refills_on_every_interrupt_cannot_hold_the_worker_from_a_reset() {
    let dir = TempDir::new("slices-reset");
    let raw = raw_image(&dir, SECTORS * 512);
    let Some(disk) = open_engine(&raw, EngineKind::IoUring) else {
        return;
    };
    let config = BlockDeviceConfig {
        queue_size: QUEUE_SIZE,
        ..Default::default()
    };
    let mut device = BlockDevice::new(disk, config).unwrap();
    device.ack_features(device.features());
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let layout = QueueLayout::at(GuestAddress(0), QUEUE_SIZE);
    let mut vq = DriverQueue::new(Arc::clone(&mem), layout, true);
    // One read of sector 0: header, 512 bytes of data, status.
    let at = layout.end().next_multiple_of(4096);
    mem.write_obj(VIRTIO_BLK_T_IN, GuestAddress(at)).unwrap();
    let head = vq
        .add_chain(&[
            DescSpec::readable(at, 16),
            DescSpec::writable(at + 4096, 512),
            DescSpec::writable(at + 64, 1),
        ])
        .unwrap();
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let queue = vq.device_queue();
    let guest = Arc::new(RefillingGuest {
        vq: Mutex::new(vq),
        head,
        pushed: Mutex::new(0),
        refill: AtomicBool::new(true),
        interrupts: AtomicU64::new(0),
    });
    guest.refill();
    let activated = ActivatedQueue {
        index: 0,
        queue,
        kick: kick.try_clone().unwrap(),
    };
    let interrupt: Arc<dyn VirtioInterrupt> = guest.clone();
    device
        .activate(Arc::clone(&mem), interrupt, vec![activated])
        .unwrap();
    kick.write(1).unwrap();
    // Wait until the worker is in the refill cycle.
    let start = Instant::now();
    while guest.interrupts.load(Ordering::SeqCst) < 20 && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        guest.interrupts.load(Ordering::SeqCst) >= 20,
        "the device serves the guest"
    );
    // Should the reset hang, the watchdog stops the refills after 20 s,
    // which frees the worker; the elapsed time then fails the test
    // instead of hanging it.
    let done = Arc::new(AtomicBool::new(false));
    let (watch_guest, watch_done) = (Arc::clone(&guest), Arc::clone(&done));
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while !watch_done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        watch_guest.refill.store(false, Ordering::SeqCst);
    });
    let start = Instant::now();
    let kicks = device.reset();
    let took = start.elapsed();
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    assert_eq!(kicks.len(), 1, "the reset hands the kick eventfd back");
    assert!(
        took < Duration::from_secs(10),
        "the reset waited {took:?} for a worker the guest kept busy"
    );
}
