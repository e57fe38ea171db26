//! The VMM's vhost-user-blk front end (virtio-devices'
//! `VhostUserBlkDevice`, what `cloud-hypervisor --disk vhost_user=on`
//! builds) against `ch-storage-daemon`, with the test playing the virtio
//! transport and the guest driver: negotiation and config space, I/O on
//! two queues through the kick and call eventfds, a reset and a second
//! activation, and the errors for a backend with too few queues.

mod vhost_user_support;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vhost_user_support::*;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_devices::vhost_user_blk::device::VhostUserBlkConfig;
use virtio_devices::vhost_user_blk::{VhostUserBlkDevice, VhostUserBlkError};
use virtio_devices::{ActivatedQueue, VirtioDevice, VirtioInterrupt};
use virtio_host_driver::{DriverOptions, DriverQueue, EventFdInterrupt, QueueDriver, QueueLayout};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IMAGE_SIZE: u64 = 8 << 20;
const QUEUE_SIZE: u16 = 64;

/// Guest memory shared with the backend and the driver side of each queue.
struct Guest {
    memory: SharedMemory,
    interrupt: Arc<EventFdInterrupt>,
    drivers: Vec<QueueDriver>,
}

/// Activates `device` with fresh rings in `memory` (one kick eventfd per
/// queue from `kicks`, or new ones).
fn activate(
    device: &mut VhostUserBlkDevice,
    memory: SharedMemory,
    kicks: Option<Vec<EventFd>>,
) -> Guest {
    let num_queues = device.queue_max_sizes().len() as u16;
    let opts = DriverOptions {
        slots: 4,
        slot_data: 64 << 10,
        ..Default::default()
    };
    device.ack_features(device.features());
    let interrupt = Arc::new(EventFdInterrupt::new(num_queues).expect("eventfds"));
    let rings = QueueLayout::at(GuestAddress(0), QUEUE_SIZE)
        .end()
        .next_multiple_of(4096);
    let per_queue = rings + QueueDriver::slot_stride(&opts) * u64::from(opts.slots);
    let mut kicks = kicks.map(Vec::into_iter);
    let mut drivers = Vec::new();
    let mut activated = Vec::new();
    for q in 0..num_queues {
        let base = per_queue * u64::from(q);
        let layout = QueueLayout::at(GuestAddress(base), QUEUE_SIZE);
        let vq = DriverQueue::new(Arc::clone(&memory.mem), layout, true);
        let kick = match kicks.as_mut() {
            Some(k) => k.next().expect("a kick per queue"),
            None => EventFd::new(EFD_NONBLOCK).expect("kick"),
        };
        activated.push(ActivatedQueue {
            index: q,
            queue: vq.device_queue(),
            kick: kick.try_clone().expect("dup kick"),
        });
        drivers.push(QueueDriver::new(
            q,
            vq,
            kick,
            Arc::clone(&interrupt),
            base + rings,
            &opts,
        ));
    }
    assert!(per_queue * u64::from(num_queues) <= memory.size);
    let irq: Arc<dyn VirtioInterrupt> = interrupt.clone();
    device
        .activate(Arc::clone(&memory.mem), irq, activated)
        .expect("activate");
    Guest {
        memory,
        interrupt,
        drivers,
    }
}

fn config_u64(device: &VhostUserBlkDevice, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    device.read_config(offset, &mut b);
    u64::from_le_bytes(b)
}

fn config_u16(device: &VhostUserBlkDevice, offset: u64) -> u16 {
    let mut b = [0u8; 2];
    device.read_config(offset, &mut b);
    u16::from_le_bytes(b)
}

#[test]
fn two_queues_io_reset_and_reactivation() {
    let dir = TempDir::new("vufront");
    let image = zeroed_raw(&dir, "disk.raw", IMAGE_SIZE);
    let mut daemon = Daemon::start(&dir, &image, "", "num_queues=4,writable=on");
    // The front end uses two of the backend's four queues.
    let mut device = VhostUserBlkDevice::new(&VhostUserBlkConfig {
        socket: daemon.socket.clone(),
        num_queues: 2,
        queue_size: QUEUE_SIZE,
    })
    .expect("connect");
    let features = device.features();
    for bit in [
        VIRTIO_BLK_F_MQ,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_RING_F_EVENT_IDX,
    ] {
        assert_ne!(
            features & (1u64 << bit),
            0,
            "feature {bit} in {features:#x}"
        );
    }
    // Not passed through: VHOST_USER_F_PROTOCOL_FEATURES (30).
    assert_eq!(features & (1u64 << 30), 0);
    assert_eq!(device.capacity_bytes(), IMAGE_SIZE);
    assert_eq!(config_u64(&device, 0), IMAGE_SIZE / 512);
    // num_queues (offset 34) says what this front end uses.
    assert_eq!(config_u16(&device, 34), 2);

    let mut guest = activate(&mut device, SharedMemory::new(4 << 20), None);
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    let q0 = &mut guest.drivers[0];
    let slot = q0.post_data(VIRTIO_BLK_T_OUT, 16, &pattern).expect("post");
    q0.kick().expect("kick");
    assert_eq!(q0.wait_slot(slot).expect("write done").status, OK);
    let used = guest.drivers[0]
        .run(VIRTIO_BLK_T_FLUSH, 0, 0)
        .expect("flush");
    assert_eq!(used.status, OK);
    // Read it back on the other queue.
    let q1 = &mut guest.drivers[1];
    let used = q1.run(VIRTIO_BLK_T_IN, 16, 8192).expect("read done");
    assert_eq!(used.status, OK);
    assert_eq!(q1.read_data(used.slot, 8192), pattern);
    // Each queue's call eventfd reached the interrupt (the forwarder
    // thread may raise it just after the driver saw the used entry).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while guest.interrupt.count(0) == 0 || guest.interrupt.count(1) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no interrupt forwarded: {} {}",
            guest.interrupt.count(0),
            guest.interrupt.count(1)
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    // Reset: the backend stops both queues, the kicks come back, and a
    // second activation on fresh rings works.
    let kicks = device.reset();
    assert_eq!(kicks.len(), 2);
    let mut guest = activate(&mut device, guest.memory, Some(kicks));
    let used = guest.drivers[1]
        .run(VIRTIO_BLK_T_IN, 16, 4096)
        .expect("read after reset");
    assert_eq!(used.status, OK);
    assert_eq!(guest.drivers[1].read_data(used.slot, 4096), pattern[..4096]);

    device.shutdown();
    drop(device);
    daemon.assert_running();
    let log = daemon.stop();
    assert!(log.contains("front end disconnected"), "{log}");
    let mut on_disk = vec![0u8; 8192];
    std::fs::File::open(&image)
        .and_then(|f| f.read_exact_at(&mut on_disk, 16 * 512))
        .expect("read image");
    assert_eq!(on_disk, pattern);
}

#[test]
fn backend_with_too_few_queues_is_refused_naming_the_socket() {
    let dir = TempDir::new("vufront-q");
    let image = zeroed_raw(&dir, "disk.raw", IMAGE_SIZE);
    let daemon = Daemon::start(&dir, &image, "", "num_queues=1");
    let err = VhostUserBlkDevice::new(&VhostUserBlkConfig {
        socket: daemon.socket.clone(),
        num_queues: 2,
        queue_size: QUEUE_SIZE,
    })
    .err()
    .expect("two queues from a one-queue backend");
    let socket = daemon.socket.display().to_string();
    assert!(err.to_string().contains(&socket), "{err}");
    assert!(
        matches!(
            err,
            VhostUserBlkError::TooFewQueues { .. } | VhostUserBlkError::MissingFeature { .. }
        ),
        "{err:?}"
    );
    daemon.stop();
}

#[test]
fn missing_socket_is_named() {
    let dir = TempDir::new("vufront-none");
    let socket = dir.join("nobody.sock");
    let err = VhostUserBlkDevice::new(&VhostUserBlkConfig {
        socket: socket.clone(),
        num_queues: 1,
        queue_size: QUEUE_SIZE,
    })
    .err()
    .expect("no backend");
    assert!(matches!(err, VhostUserBlkError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("nobody.sock"), "{err}");
}

/// Guest RAM the backend cannot map (anonymous, `--memory shared=off`):
/// activation fails with a message, and the device then activates on
/// shared memory.
#[test]
fn anonymous_memory_is_refused_at_activation() {
    let dir = TempDir::new("vufront-anon");
    let image = zeroed_raw(&dir, "disk.raw", IMAGE_SIZE);
    let daemon = Daemon::start(&dir, &image, "", "num_queues=1");
    let mut device = VhostUserBlkDevice::new(&VhostUserBlkConfig {
        socket: daemon.socket.clone(),
        num_queues: 1,
        queue_size: QUEUE_SIZE,
    })
    .expect("connect");
    device.ack_features(device.features());
    let anon = Arc::new(
        vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)])
            .expect("anonymous memory"),
    );
    let layout = QueueLayout::at(GuestAddress(0), QUEUE_SIZE);
    let vq = DriverQueue::new(Arc::clone(&anon), layout, true);
    let irq: Arc<dyn VirtioInterrupt> = Arc::new(EventFdInterrupt::new(1).expect("eventfds"));
    let err = device
        .activate(
            anon,
            irq,
            vec![ActivatedQueue {
                index: 0,
                queue: vq.device_queue(),
                kick: EventFd::new(EFD_NONBLOCK).expect("kick"),
            }],
        )
        .expect_err("anonymous memory accepted");
    assert!(err.to_string().contains("shared=on"), "{err}");
    let mut guest = activate(&mut device, SharedMemory::new(1 << 20), None);
    let used = guest.drivers[0]
        .run(VIRTIO_BLK_T_IN, 0, 512)
        .expect("read after the failed activation");
    assert_eq!(used.status, OK);
    device.shutdown();
    drop(device);
    daemon.stop();
}
