//! What the owner of a running virtio-blk device may ask of it besides
//! the guest's requests: pause and resume its queues, resize or snapshot
//! its image, read its counters and facts.
//!
//! Every operation that touches the image quiesces the queues first: each
//! worker gets [`WorkerCommand::Pause`], completes what it has in flight,
//! answers and parks; only then does the operation run (on the caller's
//! thread, with no request of this disk in flight), and the workers get
//! [`WorkerCommand::Resume`] with the parser limits of the (maybe new)
//! capacity. Pauses nest: the VMM's `vm.pause` parks the workers, and a
//! resize while paused leaves them parked.
//!
//! [`SharedBlockDevice`] lets the transport drive a device the owner also
//! holds: the transport sees a [`VirtioDevice`], the owner locks the same
//! [`BlockDevice`] for these operations. The queue workers never take
//! that lock, so holding it never stalls the request path.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use block::formats::ImageInfo;
use block::BlockError;
use thiserror::Error;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::counters::DiskCounters;
use super::queue_worker::WorkerCommand;
use super::BlockDevice;
use crate::device::{ActivateError, ActivatedQueue, InterruptKind, VirtioDevice, VirtioInterrupt};

/// Whether a resize may make the disk smaller (as `ch-img resize
/// --shrink`): what lies past the new end is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shrink {
    Refused,
    Allowed,
}

/// How long a pause waits for the workers to drain what is in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A pause asked for and not yet waited for ([`BlockDevice::begin_pause`]).
pub struct PauseTicket {
    answers: mpsc::Receiver<u16>,
    /// Workers asked to park that have not answered yet.
    waiting: usize,
    deadline: Instant,
}

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("the disk's queues did not drain within {0:?}")]
    DrainTimeout(Duration),
    #[error("the disk was not opened with its image tools (resize and snapshots need them)")]
    NoImageTools,
    #[error("the disk is read-only")]
    ReadOnly,
    #[error("the size must be a positive multiple of 512 bytes, not {0}")]
    BadSize(u64),
    #[error("{format} disks only grow (from {old} to at least {old} bytes, not {new})")]
    NoShrink {
        format: &'static str,
        old: u64,
        new: u64,
    },
    /// A smaller size without [`Shrink::Allowed`]: the data past the new
    /// end would be lost, so the asker must say so.
    #[error(
        "the disk is {old} bytes: shrinking it to {new} bytes loses the data past {new}; \
         shrinking must be asked for explicitly"
    )]
    ShrinkNotAsked { old: u64, new: u64 },
    #[error("internal snapshots need a qcow2 image, this one is {0}")]
    SnapshotFormat(&'static str),
    #[error("a snapshot named '{0}' exists already")]
    SnapshotExists(String),
    #[error("a snapshot name must be 1 to 255 bytes without control characters")]
    BadSnapshotName,
    #[error("resizing the image failed")]
    Resize(#[source] BlockError),
    #[error("flushing the image failed")]
    Flush(#[source] BlockError),
    #[error("creating the snapshot failed")]
    Snapshot(#[source] BlockError),
    #[error("the device was shut down")]
    Closed,
    #[error("the queues must be paused for this")]
    NotPaused,
    #[error("the new image is {}, the running disk is {}", rw(*.new), rw(*.now))]
    SwitchReadOnly { now: bool, new: bool },
    #[error("the new image needs {new}-byte blocks, the guest was told {now}")]
    SwitchBlockSize { now: u32, new: u32 },
    #[error("cannot set up a queue on the new image")]
    SwitchQueue(#[source] BlockError),
    #[error("a queue worker did not take the new image; the disk stays on its image")]
    SwitchRefused,
    #[error("closing the old image failed")]
    Close(#[source] BlockError),
}

fn rw(readonly: bool) -> &'static str {
    if readonly {
        "read-only"
    } else {
        "writable"
    }
}

impl BlockDevice {
    /// The disk's counters, readable from any thread.
    pub fn counters(&self) -> DiskCounters {
        self.counters.clone()
    }

    /// Facts about the open image (`ch-img info`).
    pub fn image_info(&self) -> ImageInfo {
        self.disk.format().info()
    }

    /// Whether the queues are paused.
    pub fn is_paused(&self) -> bool {
        self.pause_depth > 0
    }

    /// Parks every running worker once its requests in flight have
    /// completed. Nested calls only count.
    pub fn pause(&mut self) -> Result<(), ControlError> {
        let ticket = self.begin_pause();
        self.finish_pause(ticket)
    }

    /// The first half of [`BlockDevice::pause`]: asks every worker to
    /// park and returns at once, so that an owner pausing several devices
    /// lets them all drain at the same time; [`BlockDevice::finish_pause`]
    /// waits. Until then the pause counts (a [`BlockDevice::resume`]
    /// undoes it).
    pub fn begin_pause(&mut self) -> PauseTicket {
        self.pause_depth += 1;
        let (tx, rx) = mpsc::channel();
        let mut waiting = 0usize;
        if self.pause_depth == 1 {
            for w in &self.workers {
                if w.control.send(WorkerCommand::Pause(tx.clone())) {
                    waiting += 1;
                }
            }
        }
        PauseTicket {
            answers: rx,
            waiting,
            deadline: Instant::now() + DRAIN_TIMEOUT,
        }
    }

    /// Waits until every worker asked by `ticket`'s pause has parked; if
    /// they do not drain in time, the pause is undone.
    pub fn finish_pause(&mut self, ticket: PauseTicket) -> Result<(), ControlError> {
        let PauseTicket {
            answers,
            mut waiting,
            deadline,
        } = ticket;
        while waiting > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match answers.recv_timeout(left) {
                Ok(_) => waiting -= 1,
                // Every sender gone: the workers that did not answer have
                // stopped (nothing in flight there either).
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // Leave it paused as far as the workers are concerned
                    // (they park once drained) but undo our count so a
                    // resume is not owed.
                    self.resume();
                    return Err(ControlError::DrainTimeout(DRAIN_TIMEOUT));
                }
            }
        }
        Ok(())
    }

    /// Undoes one [`BlockDevice::pause`]; the last one restarts the
    /// workers with the current capacity.
    pub fn resume(&mut self) {
        match self.pause_depth {
            0 => {}
            1 => {
                self.pause_depth = 0;
                self.resume_workers();
            }
            _ => self.pause_depth -= 1,
        }
    }

    fn resume_workers(&self) {
        let limits = self.limits();
        for w in &self.workers {
            w.control.send(WorkerCommand::Resume(limits));
        }
    }

    /// Runs `op` with the queues paused (and resumes them whatever it
    /// returns).
    fn quiesced<T>(
        &mut self,
        op: impl FnOnce(&mut Self) -> Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        self.pause()?;
        let r = op(self);
        self.resume();
        r
    }

    /// Sets the disk's virtual size to `new_size` bytes and tells the
    /// driver (config change interrupt). Raw images may shrink when
    /// `shrink` allows it; qcow2 images only grow, as in Cloud
    /// Hypervisor. Returns the old size.
    pub fn resize(&mut self, new_size: u64, shrink: Shrink) -> Result<u64, ControlError> {
        let image = self.image.as_ref().ok_or(ControlError::NoImageTools)?;
        if self.disk.readonly() {
            return Err(ControlError::ReadOnly);
        }
        if new_size == 0 || !new_size.is_multiple_of(block::SECTOR_SIZE) {
            return Err(ControlError::BadSize(new_size));
        }
        let old = self.disk.size();
        let format = self.disk.format().name();
        if new_size < old && format != "raw" {
            return Err(ControlError::NoShrink {
                format,
                old,
                new: new_size,
            });
        }
        if new_size < old && shrink == Shrink::Refused {
            return Err(ControlError::ShrinkNotAsked { old, new: new_size });
        }
        if new_size == old {
            return Ok(old);
        }
        let resizer = image.resizer();
        self.quiesced(|dev| {
            resizer.resize(new_size).map_err(ControlError::Resize)?;
            dev.config_space.set_capacity(dev.disk.size());
            // Dirty bitmaps follow the disk's size (queues are paused),
            // in the image too.
            dev.disk
                .live()
                .resize(dev.disk.size())
                .map_err(ControlError::Resize)?;
            Ok(())
        })?;
        if let Some(irq) = &self.interrupt {
            if let Err(e) = irq.trigger(InterruptKind::Config) {
                log::error!("virtio-blk: cannot signal the capacity change: {e}");
            }
        }
        Ok(old)
    }

    /// Writes everything completed so far to stable storage, with the
    /// queues paused.
    pub fn flush(&mut self) -> Result<(), ControlError> {
        self.quiesced(|dev| dev.disk.flush().map_err(ControlError::Flush))
    }

    /// Takes an internal qcow2 snapshot `name` of the disk as it is now:
    /// queues paused, everything flushed, the snapshot made as `ch-img
    /// snapshot -c` makes it, queues resumed.
    pub fn snapshot(&mut self, name: &str) -> Result<(), ControlError> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(ControlError::BadSnapshotName);
        }
        if self.image.is_none() {
            return Err(ControlError::NoImageTools);
        }
        let format = self.disk.format().name();
        if format != "qcow2" {
            return Err(ControlError::SnapshotFormat(format));
        }
        if self.disk.readonly() {
            return Err(ControlError::ReadOnly);
        }
        if self.image_info().snapshots.iter().any(|s| s.name == name) {
            return Err(ControlError::SnapshotExists(name.to_string()));
        }
        self.quiesced(|dev| {
            dev.disk.flush().map_err(ControlError::Flush)?;
            let image = dev.image.as_ref().ok_or(ControlError::NoImageTools)?;
            image
                .tools()
                .snapshot_create(name, now())
                .map_err(ControlError::Snapshot)?;
            dev.disk.flush().map_err(ControlError::Flush)
        })
    }
}

/// Seconds and nanoseconds since the epoch, as snapshot dates are kept.
fn now() -> (u32, u32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (
        u32::try_from(d.as_secs()).unwrap_or(u32::MAX),
        d.subsec_nanos(),
    )
}

/// A [`BlockDevice`] the transport drives while its owner keeps a handle
/// for pause, resize, snapshot and counters.
pub struct SharedBlockDevice {
    device: Arc<Mutex<BlockDevice>>,
    queue_sizes: Vec<u16>,
}

impl SharedBlockDevice {
    pub fn new(device: BlockDevice) -> Self {
        let queue_sizes = device.queue_max_sizes().to_vec();
        SharedBlockDevice {
            device: Arc::new(Mutex::new(device)),
            queue_sizes,
        }
    }

    /// The owner's handle.
    pub fn handle(&self) -> Arc<Mutex<BlockDevice>> {
        Arc::clone(&self.device)
    }

    fn lock(&self) -> MutexGuard<'_, BlockDevice> {
        self.device.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl VirtioDevice for SharedBlockDevice {
    fn device_type(&self) -> u32 {
        self.lock().device_type()
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.lock().features()
    }

    fn ack_features(&mut self, features: u64) {
        self.lock().ack_features(features)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.lock().read_config(offset, data)
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.lock().write_config(offset, data)
    }

    fn activate(
        &mut self,
        mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<ActivatedQueue>,
    ) -> Result<(), ActivateError> {
        self.lock().activate(mem, interrupt, queues)
    }

    fn reset(&mut self) -> Vec<EventFd> {
        self.lock().reset()
    }

    fn shutdown(&mut self) {
        self.lock().shutdown()
    }
}
