//! [`BlkBackend`]: one front-end connection's vhost-user backend, a thin
//! transport around virtio-devices' [`BlockDevice`].
//!
//! Data enters as vhost-user control messages, which rust-vmm's
//! vhost-user-backend parses and checks and turns into calls on the
//! [`VhostUserBackend`] trait: features and config space go to the
//! `BlockDevice` (the same feature bits, config space and WCE handling as
//! the in-VMM device), the memory table is kept for the workers, and a
//! vring that is started and enabled gets its own [`QueueWorker`] thread
//! through [`BlockDevice::start_queue`]. Guest requests then flow exactly
//! as in the VMM: the worker pops chains from the shared guest memory,
//! parses them with the one request parser, submits them to its own
//! `DiskQueue`, and completes them into the used ring. Interrupts leave
//! through the vring's call eventfd ([`VringInterrupt`]).
//!
//! Why a worker thread per vring instead of driving the worker from
//! vhost-user-backend's `handle_event`: the worker's loop (batching,
//! EVENT_IDX, busy poll, throttling, writethrough flushes, draining on
//! stop) stays one piece of code that both front ends run unchanged, and
//! the disk queue's completion eventfd stays in the thread that owns the
//! disk queue. The price is one hop per guest kick: vhost-user-backend's
//! vring thread reads the front end's kick eventfd (it must, the library
//! owns that fd) and writes the worker's own kick eventfd. With EVENT_IDX
//! a busy queue suppresses kicks, so the hop is paid when a queue wakes
//! from idle, not per request.
//!
//! Vring stop (GET_VRING_BASE), device reset, and a memory table change
//! stop the affected workers after their in-flight requests completed;
//! the ring positions the worker reached are written back into the vring
//! so GET_VRING_BASE reports them. [`BlkBackend::disconnect`] does the
//! same for every vring when the front end goes away.
//!
//! [`QueueWorker`]: virtio_devices::block::queue_worker::QueueWorker

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use block::Disk;
use log::{debug, error, warn};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_devices::block::BlockDevice;
use virtio_devices::device::{ActivateError, InterruptKind};
use virtio_devices::{ActivatedQueue, VirtioDevice, VirtioInterrupt};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The guest memory vhost-user-backend maintains from the memory table.
pub type SharedMemory = GuestMemoryAtomic<GuestMemoryMmap>;

/// Why a vring could not be started.
#[derive(Debug, Error)]
enum StartVringError {
    #[error("the front end sent no memory table")]
    NoMemoryTable,
    #[error("cannot copy the vring's queue state")]
    CopyQueue(#[source] virtio_queue::Error),
    #[error("cannot create the worker's kick eventfd")]
    KickEventFd(#[source] io::Error),
    #[error(transparent)]
    Activate(#[from] ActivateError),
}

/// Signals a vring's call eventfd (looked up on every interrupt: the
/// front end may replace it while the vring runs).
struct VringInterrupt(VringRwLock);

impl VirtioInterrupt for VringInterrupt {
    fn trigger(&self, kind: InterruptKind) -> io::Result<()> {
        match kind {
            InterruptKind::Queue(_) => self.0.signal_used_queue(),
            // The config space never changes while the daemon runs.
            InterruptKind::Config => Ok(()),
        }
    }
}

/// A vring with a running worker.
struct RunningVring {
    vring: VringRwLock,
    /// The worker's kick eventfd: written for each front-end kick.
    forward: EventFd,
}

struct ConnectionState {
    device: BlockDevice,
    memory: Option<SharedMemory>,
    running: Vec<Option<RunningVring>>,
    /// Ends vhost-user-backend's vring threads of this connection.
    exit_notifiers: Vec<EventNotifier>,
    /// Set once the connection is gone: late events are ignored.
    closed: bool,
}

/// The backend of one front-end connection (see the module doc).
pub struct BlkBackend {
    state: Mutex<ConnectionState>,
    disk: Disk,
    num_queues: u16,
    queue_size: u16,
}

impl BlkBackend {
    pub fn new(device: BlockDevice, disk: Disk) -> Self {
        let num_queues = u16::try_from(device.queue_max_sizes().len()).unwrap_or(1);
        let queue_size = device.queue_max_sizes().first().copied().unwrap_or(128);
        BlkBackend {
            state: Mutex::new(ConnectionState {
                device,
                memory: None,
                running: (0..num_queues).map(|_| None).collect(),
                exit_notifiers: Vec::new(),
                closed: false,
            }),
            disk,
            num_queues,
            queue_size,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ConnectionState> {
        // A worker panic cannot poison this lock (workers never take it);
        // recover the state anyway rather than panic the daemon.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The front end is gone: stops every worker after its in-flight
    /// requests completed, flushes the image, and ends the connection's
    /// vring threads. Idempotent.
    pub fn disconnect(&self) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        st.closed = true;
        for index in 0..self.num_queues {
            st.stop_vring(index);
        }
        if let Err(e) = self.disk.flush() {
            error!("vhost-user-blk: flush after disconnect: {e}");
        }
        for notifier in st.exit_notifiers.drain(..) {
            if let Err(e) = notifier.notify() {
                warn!("vhost-user-blk: cannot stop a vring thread: {e}");
            }
        }
    }
}

impl ConnectionState {
    /// Starts a worker for `vring` on its current ring positions.
    fn start_vring(&mut self, index: u16, vring: &VringRwLock) -> Result<(), StartVringError> {
        let queue = copy_queue(vring.get_ref().get_queue()).map_err(StartVringError::CopyQueue)?;
        self.start_worker(index, queue, vring)
    }

    fn start_worker(
        &mut self,
        index: u16,
        queue: Queue,
        vring: &VringRwLock,
    ) -> Result<(), StartVringError> {
        let memory = self
            .memory
            .as_ref()
            .ok_or(StartVringError::NoMemoryTable)?
            .memory()
            .into_inner();
        let kick = EventFd::new(EFD_NONBLOCK).map_err(StartVringError::KickEventFd)?;
        let forward = kick.try_clone().map_err(StartVringError::KickEventFd)?;
        let interrupt: Arc<dyn VirtioInterrupt> = Arc::new(VringInterrupt(vring.clone()));
        self.device
            .start_queue(memory, interrupt, ActivatedQueue { index, queue, kick })?;
        if let Some(slot) = self.running.get_mut(usize::from(index)) {
            *slot = Some(RunningVring {
                vring: vring.clone(),
                forward,
            });
        }
        debug!("vhost-user-blk: queue {index} started");
        Ok(())
    }

    /// Stops vring `index`'s worker (if any) once its requests completed,
    /// and writes the ring positions it reached back into the vring.
    /// Returns the stopped queue and its vring.
    fn stop_vring(&mut self, index: u16) -> Option<(Queue, VringRwLock)> {
        let running = self.running.get_mut(usize::from(index))?.take()?;
        let stopped = self.device.stop_queue(index)?;
        running
            .vring
            .set_queue_next_avail(stopped.queue.next_avail());
        running.vring.set_queue_next_used(stopped.queue.next_used());
        debug!(
            "vhost-user-blk: queue {index} stopped at avail {}",
            stopped.queue.next_avail()
        );
        Some((stopped.queue, running.vring))
    }
}

/// A worker's own copy of a vring's queue (addresses, size, positions,
/// EVENT_IDX); the vring keeps its own for vhost-user-backend.
fn copy_queue(from: &Queue) -> Result<Queue, virtio_queue::Error> {
    let mut queue = Queue::new(from.max_size())?;
    queue.try_set_size(from.size())?;
    queue.try_set_desc_table_address(GuestAddress(from.desc_table()))?;
    queue.try_set_avail_ring_address(GuestAddress(from.avail_ring()))?;
    queue.try_set_used_ring_address(GuestAddress(from.used_ring()))?;
    queue.set_event_idx(from.event_idx_enabled());
    queue.set_next_avail(from.next_avail());
    queue.set_next_used(from.next_used());
    queue.set_ready(from.ready());
    Ok(queue)
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        usize::from(self.num_queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.queue_size)
    }

    fn features(&self) -> u64 {
        self.lock().device.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        let device_features = features & !VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        self.lock().device.ack_features(device_features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // CONFIG: QEMU's vhost-user-blk reads the config space from us;
        // MQ: more than one queue; REPLY_ACK: a refused message gets an
        // error reply instead of silence.
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
    }

    fn reset_device(&self) {
        let mut st = self.lock();
        for index in 0..self.num_queues {
            st.stop_vring(index);
        }
        drop(st.device.reset());
    }

    fn set_event_idx(&self, _enabled: bool) {
        // The device takes EVENT_IDX from the acked features.
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // vhost's message parser bounds `size` by the message size.
        let mut buf = vec![0u8; size as usize];
        self.lock().device.read_config(u64::from(offset), &mut buf);
        buf
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.lock().device.write_config(u64::from(offset), buf);
        Ok(())
    }

    fn update_memory(&self, memory: SharedMemory) -> io::Result<()> {
        let mut st = self.lock();
        st.memory = Some(memory);
        // Running workers hold the old mapping: restart them on the new
        // one from the positions they reached.
        for index in 0..self.num_queues {
            if let Some((queue, vring)) = st.stop_vring(index) {
                if let Err(e) = st.start_worker(index, queue, &vring) {
                    error!("vhost-user-blk: queue {index}: restart on the new memory table: {e}");
                }
            }
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One vring thread forwards the kicks of every queue.
        vec![u64::MAX >> (64 - u32::from(self.num_queues))]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = match new_event_consumer_and_notifier(EventFlag::NONBLOCK) {
            Ok(pair) => pair,
            Err(e) => {
                error!("vhost-user-blk: cannot create a vring thread's exit eventfd: {e}");
                return None;
            }
        };
        match notifier.try_clone() {
            Ok(kept) => self.lock().exit_notifiers.push(kept),
            Err(e) => {
                error!("vhost-user-blk: cannot keep a vring thread's exit eventfd: {e}");
                return None;
            }
        }
        Some((consumer, notifier))
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let index = u16::try_from(queue_index).map_err(|_| io::ErrorKind::InvalidInput)?;
        self.lock().stop_vring(index);
        Ok(())
    }

    /// Called by vhost-user-backend's vring thread when vring
    /// `device_event` was kicked or just became started and enabled.
    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        // Errors are logged, never returned: an error would end the vring
        // thread, and with it every queue of this connection.
        let mut st = self.lock();
        if st.closed {
            return Ok(());
        }
        let index = usize::from(device_event);
        if let Some(Some(running)) = st.running.get(index) {
            if let Err(e) = running.forward.write(1) {
                error!("vhost-user-blk: queue {index}: cannot pass on a kick: {e}");
            }
            return Ok(());
        }
        let Some(vring) = vrings.get(index) else {
            debug!("vhost-user-blk: event {device_event} for no queue");
            return Ok(());
        };
        // A kick that raced with GET_VRING_BASE or a disable: not for us.
        let startable = {
            let state = vring.get_ref();
            state.get_queue().ready() && state.is_enabled()
        };
        if !startable {
            return Ok(());
        }
        if let Err(e) = st.start_vring(device_event, vring) {
            error!("vhost-user-blk: queue {index}: cannot start: {e}");
        }
        Ok(())
    }
}
