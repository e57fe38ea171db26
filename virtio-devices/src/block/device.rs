//! [`BlockDevice`]: virtio-blk as a [`VirtioDevice`], and its lifecycle.
//!
//! Data enters from the transport: feature negotiation, config space
//! accesses, and at DRIVER_OK the queues with their kick eventfds. The
//! device starts one [`QueueWorker`] thread per queue, each with its own
//! [`block::DiskQueue`]. `reset` stops the workers once their in-flight
//! I/O has completed, joins them and hands the kick eventfds back;
//! `shutdown` also flushes the disk and closes the image.
//!
//! The owner (the VMM) may also pause the workers, resize or snapshot
//! the image while they are paused, and read the per-queue counters
//! (`control.rs`, [`super::counters`]).
//!
//! A transport that starts and stops queues one at a time (the storage
//! daemon's vhost-user-blk export: a vring starts when the front end
//! enables it and stops at its GET_VRING_BASE) uses
//! [`BlockDevice::start_queue`] and [`BlockDevice::stop_queue`] instead
//! of `activate` and `reset`; the workers are the same.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use block::{BlockError, Disk, ExclusiveImage};
use log::{error, warn};
use thiserror::Error;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::config_space::{BlockDeviceConfig, ConfigSpace, MAX_DISCARD_SECTORS, WRITEBACK_OFFSET};
use super::counters::DiskCounters;
use super::features::{has_event_idx, offered_features};
use super::queue_worker::{QueueWorker, WorkerCommand, WorkerControl, WorkerExit};
use super::rate_limit::RateLimiter;
use super::request_parser::ParserLimits;
use crate::device::{ActivateError, ActivatedQueue, VirtioDevice, VirtioInterrupt};

/// virtio device ID of a block device.
pub const VIRTIO_ID_BLOCK: u32 = 2;

#[derive(Debug, Error)]
pub enum BlockDeviceError {
    #[error("invalid virtio-blk configuration: {0}")]
    InvalidConfig(String),
    #[error("closing the image failed")]
    Close(#[source] BlockError),
}

/// A queue whose worker [`BlockDevice::stop_queue`] stopped.
pub struct StoppedQueue {
    /// Ring positions as the worker left them.
    pub queue: Queue,
    pub kick: EventFd,
}

pub(super) struct RunningWorker {
    pub(super) index: u16,
    pub(super) control: WorkerControl,
    handle: JoinHandle<WorkerExit>,
}

/// A virtio-blk device over one [`Disk`].
pub struct BlockDevice {
    pub(super) disk: Disk,
    /// The owner's open, with the tools (resize, snapshots) queues never
    /// reach; `None` for a device made from a plain [`Disk`].
    pub(super) image: Option<ExclusiveImage>,
    pub(super) config: BlockDeviceConfig,
    pub(super) config_space: ConfigSpace,
    queue_sizes: Vec<u16>,
    offered: u64,
    acked: u64,
    writeback: Arc<AtomicBool>,
    pub(super) workers: Vec<RunningWorker>,
    /// The interrupt the running workers were given (config changes are
    /// signalled through it); `None` until activated.
    pub(super) interrupt: Option<Arc<dyn VirtioInterrupt>>,
    pub(super) counters: DiskCounters,
    /// Pauses asked for and not yet resumed (the workers are parked
    /// while it is above zero).
    pub(super) pause_depth: u32,
    /// Each queue's token buckets while its worker is stopped (a worker
    /// holds its own while it runs); kept across resets so a reset does
    /// not refill them.
    limiters: Vec<Option<RateLimiter>>,
    pub(super) closed: bool,
}

impl BlockDevice {
    /// Checks the configuration and lays out the config space.
    pub fn new(disk: Disk, config: BlockDeviceConfig) -> Result<Self, BlockDeviceError> {
        let bad = |s: &str| Err(BlockDeviceError::InvalidConfig(s.to_string()));
        if config.num_queues == 0 {
            return bad("num_queues must be at least 1");
        }
        if !config.queue_size.is_power_of_two()
            || config.queue_size < 2
            || config.queue_size > 32768
        {
            return bad("queue_size must be a power of two between 2 and 32768");
        }
        let lbs = config.logical_block_size;
        if !lbs.is_power_of_two() || lbs < 512 {
            return bad("logical block size must be a power of two of at least 512");
        }
        let pbs = config.physical_block_size;
        if !pbs.is_power_of_two() || pbs < lbs {
            return bad(
                "physical block size must be a power of two no smaller than the logical one",
            );
        }
        let readonly = disk.readonly() || config.readonly;
        // The guest must not be told a block size smaller than what the
        // image's files need (O_DIRECT alignment).
        let mut config = config;
        config.logical_block_size = config.logical_block_size.max(disk.logical_block_size());
        config.physical_block_size = config.physical_block_size.max(config.logical_block_size);
        let mut config_space = ConfigSpace::new(&config, disk.size(), readonly);
        // The cache mode decides whether the device starts with a volatile
        // write cache (QEMU: cache.writeback).
        let writeback = disk.options().cache.writeback();
        config_space.write(WRITEBACK_OFFSET, &[u8::from(writeback)]);
        let limiters = (0..config.num_queues)
            .map(|_| RateLimiter::new(config.rate_limit, Instant::now()))
            .collect();
        Ok(BlockDevice {
            counters: DiskCounters::new(config.num_queues),
            image: None,
            interrupt: None,
            pause_depth: 0,
            offered: offered_features(readonly, config.num_queues),
            queue_sizes: vec![config.queue_size; usize::from(config.num_queues)],
            disk,
            config,
            config_space,
            acked: 0,
            writeback: Arc::new(AtomicBool::new(writeback)),
            workers: Vec::new(),
            limiters,
            closed: false,
        })
    }

    /// As [`BlockDevice::new`] over the owner's open of the image, which
    /// lets the device resize and snapshot it ([`BlockDevice::resize`],
    /// [`BlockDevice::snapshot`]).
    pub fn with_image(
        image: ExclusiveImage,
        config: BlockDeviceConfig,
    ) -> Result<Self, BlockDeviceError> {
        let mut dev = Self::new(image.disk().clone(), config)?;
        dev.image = Some(image);
        Ok(dev)
    }

    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// The owner's open of the image the device runs on, when it was
    /// given one ([`BlockDevice::with_image`], or a switch to one): its
    /// tools (a block job rewrites the image's backing link with them).
    pub fn image(&self) -> Option<&ExclusiveImage> {
        self.image.as_ref()
    }

    /// The feature bits the driver accepted.
    pub fn acked_features(&self) -> u64 {
        self.acked
    }

    /// Whether worker threads are running.
    pub fn is_activated(&self) -> bool {
        !self.workers.is_empty()
    }

    pub(super) fn limits(&self) -> ParserLimits {
        ParserLimits {
            capacity_sectors: self.config_space.capacity_sectors(),
            seg_max: self.config.effective_seg_max(),
            readonly: self.disk.readonly() || self.config.readonly,
            max_discard_sectors: MAX_DISCARD_SECTORS,
            max_discard_seg: 1,
        }
    }

    fn stop_workers(&mut self) -> Vec<EventFd> {
        self.stop_workers_where(|_| true)
            .into_iter()
            .map(|(_, stopped)| stopped.kick)
            .collect()
    }

    /// Stops the workers of the queues `which` selects, after their
    /// in-flight requests have completed; returns what they handed back.
    fn stop_workers_where(&mut self, which: impl Fn(u16) -> bool) -> Vec<(u16, StoppedQueue)> {
        let (stopping, keep): (Vec<_>, Vec<_>) =
            self.workers.drain(..).partition(|w| which(w.index));
        self.workers = keep;
        for worker in &stopping {
            // A worker already gone is joined below all the same.
            worker.control.send(WorkerCommand::Stop);
        }
        if self.workers.is_empty() {
            self.interrupt = None;
            self.pause_depth = 0;
        }
        let mut stopped = Vec::new();
        for worker in stopping {
            match worker.handle.join() {
                Ok(exit) => {
                    if let Some(slot) = self.limiters.get_mut(usize::from(worker.index)) {
                        *slot = exit.limiter;
                    }
                    stopped.push((
                        worker.index,
                        StoppedQueue {
                            queue: exit.queue,
                            kick: exit.kick,
                        },
                    ));
                }
                Err(_) => {
                    error!("virtio-blk: a queue worker panicked");
                    // Its buckets went with it: start full ones rather
                    // than lose the limit.
                    if let Some(slot) = self.limiters.get_mut(usize::from(worker.index)) {
                        *slot = RateLimiter::new(self.config.rate_limit, Instant::now());
                    }
                }
            }
        }
        stopped
    }

    /// Starts the worker of one queue (the others keep running): the
    /// queue must be ready, inside `mem`, and not running already.
    pub fn start_queue(
        &mut self,
        mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queue: ActivatedQueue,
    ) -> Result<(), ActivateError> {
        self.check_startable(&queue, &mem)?;
        let limits = self.limits();
        let event_idx = has_event_idx(self.acked);
        let device_id = self.config.device_id();
        self.start_worker(queue, &mem, &interrupt, limits, event_idx, device_id)
    }

    /// Stops one queue's worker once its in-flight requests have
    /// completed; `None` if it was not running.
    pub fn stop_queue(&mut self, index: u16) -> Option<StoppedQueue> {
        self.stop_workers_where(|i| i == index)
            .pop()
            .map(|(_, stopped)| stopped)
    }

    /// Whether queue `index` has a running worker.
    pub fn is_queue_running(&self, index: u16) -> bool {
        self.workers.iter().any(|w| w.index == index)
    }

    fn check_startable(
        &self,
        q: &ActivatedQueue,
        mem: &GuestMemoryMmap,
    ) -> Result<(), ActivateError> {
        if self.closed {
            return Err(ActivateError::BadActivate("device was shut down".into()));
        }
        if usize::from(q.index) >= self.queue_sizes.len() {
            return Err(ActivateError::BadActivate(format!(
                "queue {} does not exist (the device has {})",
                q.index,
                self.queue_sizes.len()
            )));
        }
        if self.is_queue_running(q.index) {
            return Err(ActivateError::BadActivate(format!(
                "queue {} is already running",
                q.index
            )));
        }
        if !q.queue.is_valid(mem) {
            return Err(ActivateError::BadActivate(format!(
                "queue {} is not ready or its rings lie outside guest memory",
                q.index
            )));
        }
        Ok(())
    }

    /// Drains the workers, then closes the image (metadata written, image
    /// marked clean, files synced). Later calls do nothing.
    pub fn close(&mut self) -> Result<(), BlockDeviceError> {
        drop(self.stop_workers());
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        // Writes the format's metadata, marks the image clean, then syncs.
        self.disk.close().map_err(BlockDeviceError::Close)
    }
}

impl VirtioDevice for BlockDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.offered
    }

    fn ack_features(&mut self, features: u64) {
        let unknown = features & !self.offered;
        if unknown != 0 {
            warn!("virtio-blk: driver acked features {unknown:#x} that were not offered; ignored");
        }
        self.acked = features & self.offered;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.config_space.read(offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if offset == WRITEBACK_OFFSET && !self.disk.options().cache.flushes() {
            // cache=unsafe: flushes never reach the disk, so writethrough
            // would promise durability it cannot give; the cache stays on.
            warn!("virtio-blk: cache=unsafe: the guest may not turn the write cache off; ignored");
            return;
        }
        if self.config_space.write(offset, data) {
            self.writeback
                .store(self.config_space.writeback(), Ordering::Relaxed);
        } else {
            warn!(
                "virtio-blk: ignored write of {} bytes to read-only config offset {offset} (only {WRITEBACK_OFFSET} is writable)",
                data.len()
            );
        }
    }

    fn activate(
        &mut self,
        mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<ActivatedQueue>,
    ) -> Result<(), ActivateError> {
        if !self.workers.is_empty() {
            return Err(ActivateError::BadActivate(
                "device is already active".into(),
            ));
        }
        if self.closed {
            return Err(ActivateError::BadActivate("device was shut down".into()));
        }
        if queues.is_empty() || queues.len() > self.queue_sizes.len() {
            return Err(ActivateError::BadActivate(format!(
                "{} queues given, the device has 1 to {}",
                queues.len(),
                self.queue_sizes.len()
            )));
        }
        for q in &queues {
            self.check_startable(q, &mem)?;
        }
        for activated in queues {
            if let Err(e) = self.start_queue(Arc::clone(&mem), Arc::clone(&interrupt), activated) {
                drop(self.stop_workers());
                return Err(e);
            }
        }
        Ok(())
    }

    fn reset(&mut self) -> Vec<EventFd> {
        let kicks = self.stop_workers();
        self.acked = 0;
        let writeback = self.disk.options().cache.writeback();
        self.config_space
            .write(WRITEBACK_OFFSET, &[u8::from(writeback)]);
        self.writeback.store(writeback, Ordering::Relaxed);
        kicks
    }

    fn shutdown(&mut self) {
        if let Err(e) = self.close() {
            error!("virtio-blk: shutdown: {e}");
        }
    }
}

impl BlockDevice {
    fn start_worker(
        &mut self,
        activated: ActivatedQueue,
        mem: &Arc<GuestMemoryMmap>,
        interrupt: &Arc<dyn VirtioInterrupt>,
        limits: ParserLimits,
        event_idx: bool,
        device_id: [u8; 20],
    ) -> Result<(), ActivateError> {
        let ActivatedQueue {
            index,
            mut queue,
            kick,
        } = activated;
        queue.set_event_idx(event_idx);
        let disk = self.disk.queue().map_err(ActivateError::Backend)?;
        let control = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(ActivateError::EventFd)?);
        let counters = self
            .counters
            .queue_handle(index)
            .ok_or_else(|| ActivateError::BadActivate(format!("queue {index} has no counters")))?;
        let (commands_tx, commands) = std::sync::mpsc::channel();
        let worker = QueueWorker {
            index,
            queue,
            kick,
            control: Arc::clone(&control),
            commands,
            counters,
            // A map of its own (the same regions): every request holds the
            // worker's `Arc` until it completes, and one `Arc` for all
            // queues would make that count a line every queue writes.
            mem: Arc::new(GuestMemoryMmap::clone(mem)),
            interrupt: Arc::clone(interrupt),
            disk,
            limits,
            device_id,
            writeback: Arc::clone(&self.writeback),
            poll: std::time::Duration::from_micros(u64::from(self.config.poll_us)),
            limiter: self
                .limiters
                .get_mut(usize::from(index))
                .and_then(Option::take),
            cpus: self
                .config
                .queue_affinity
                .get(usize::from(index))
                .cloned()
                .flatten(),
            submit_each: self.disk.engine() == block::EngineKind::Sync,
        };
        let handle = std::thread::Builder::new()
            .name(format!("virtio-blk-q{index}"))
            .spawn(move || worker.run())
            .map_err(ActivateError::SpawnWorker)?;
        self.workers.push(RunningWorker {
            index,
            control: WorkerControl::new(commands_tx, control),
            handle,
        });
        self.interrupt = Some(Arc::clone(interrupt));
        Ok(())
    }
}

impl Drop for BlockDevice {
    fn drop(&mut self) {
        drop(self.stop_workers());
    }
}
