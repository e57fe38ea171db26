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
    Some(deep_harness_on(open_engine(&raw, engine)?))
}

fn deep_harness_on(disk: block::Disk) -> BlockHarness {
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
    BlockHarness::new(disk, config, opts).unwrap()
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

/// A deep mix of writes and reads on a buffered image: where the engine
/// makes writes in the worker's thread during submit (io_uring's buffered
/// writes outside XFS and btrfs, the sync engine's every op), the worker
/// submits the batch's reads first and then each write on its own,
/// answering it before the next (`submit_parsed`). Every request must
/// still complete once with the right status, every read must see the
/// image's bytes, and every write must land.
#[test]
fn deep_mixed_batches_of_writes_and_reads_complete_once_on_every_engine() {
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_OUT};
    for engine in [EngineKind::IoUring, EngineKind::Threads, EngineKind::Sync] {
        let dir = TempDir::new("mixed");
        let raw = raw_image(&dir, SECTORS * 512);
        let Some(disk) = open_engine(&raw, engine) else {
            continue;
        };
        // As the worker sets its queue up.
        let mut probe = disk.queue().unwrap();
        if engine == EngineKind::IoUring {
            assert!(!probe.writes_at_submit(), "io_uring: only once allowed");
        }
        probe.allow_writes_at_submit();
        let at_submit = probe.writes_at_submit();
        drop(probe);
        let mut h = deep_harness_on(disk);
        if engine == EngineKind::Sync {
            assert!(at_submit, "the sync engine writes at submit");
        }
        if engine == EngineKind::Threads {
            assert!(!at_submit, "the threads engine writes in its pool");
        }
        if engine == EngineKind::IoUring && hands_buffered_writes_to_io_wq(&raw) {
            assert!(at_submit, "io_uring's buffered writes on ext4 and tmpfs");
        }
        let q = h.queue(0).unwrap();
        // Writes go to the first half, one sector each, with a byte that
        // names the sector and the round; reads to the second half,
        // which keeps the image's bytes.
        let half = SECTORS / 2;
        let stamp = |sector: u64, round: u64| (sector * 7 + round * 13 + 1) as u8;
        let (total, mut posted, mut done) = (3000u64, 0u64, 0u64);
        let mut what = std::collections::HashMap::new();
        let mut last_stamp = std::collections::HashMap::new();
        let mut used = Vec::new();
        while done < total {
            while posted < total {
                let n = posted;
                if n % 2 == 0 {
                    let sector = (n * 37) % half;
                    let byte = stamp(sector, n);
                    let Some(slot) = q.post_data(VIRTIO_BLK_T_OUT, sector, &[byte; 512]) else {
                        break;
                    };
                    // Each write's sector is written by no other write
                    // in flight: 37 is prime to `half`, and fewer than
                    // `half` requests are in flight.
                    last_stamp.insert(sector, byte);
                    what.insert(slot, (true, sector));
                } else {
                    let sector = half + (n * 37) % half;
                    let Some(slot) = q.post(VIRTIO_BLK_T_IN, sector, 512) else {
                        break;
                    };
                    what.insert(slot, (false, sector));
                }
                posted += 1;
            }
            q.kick().unwrap();
            used.clear();
            let n = q.wait(Duration::from_secs(10), &mut used).unwrap();
            assert!(n > 0, "{engine:?}: no completion after {done} of {total}");
            for u in &used {
                assert_eq!(u32::from(u.status), VIRTIO_BLK_S_OK, "{engine:?}");
                let (is_write, sector) = what.remove(&u.slot).expect("completed once");
                if is_write {
                    assert_eq!(u.used_len, 1, "{engine:?}");
                } else {
                    assert_eq!(u.used_len, 513, "{engine:?}");
                    let want = sector_byte(sector);
                    assert!(
                        q.read_data(u.slot, 512).iter().all(|&b| b == want),
                        "{engine:?}: wrong data at sector {sector}"
                    );
                }
            }
            done += used.len() as u64;
        }
        assert_eq!(q.free_slots(), 128, "{engine:?}");
        // Every write landed: read each written sector back.
        for (&sector, &byte) in &last_stamp {
            let u = q.run(VIRTIO_BLK_T_IN, sector, 512).expect("read back");
            assert_eq!(u32::from(u.status), VIRTIO_BLK_S_OK, "{engine:?}");
            assert!(
                q.read_data(u.slot, 512).iter().all(|&b| b == byte),
                "{engine:?}: sector {sector} lost its last write"
            );
        }
    }
}

/// Whether `path` lies on ext4 or tmpfs, where io_uring hands every
/// buffered write to an io-wq thread.
fn hands_buffered_writes_to_io_wq(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statfs the call fills.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut fs) }, 0);
    matches!(fs.f_type as i64, 0xEF53 | 0x0102_1994)
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
