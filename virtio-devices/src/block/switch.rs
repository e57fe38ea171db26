//! The image switch: a running device moves to another opened image at
//! one instant between two batches of every queue (docs/live-operations.md,
//! "The image switch"). External snapshots switch a disk to its new
//! overlay; a mirror's `complete` and an active commit switch it to their
//! target the same way.
//!
//! Three steps, so that a caller can switch several devices under one
//! pause (the VMM's `with_disks_paused`) and keep that pause short:
//! 1. [`BlockDevice::prepare_switch`] (queues running): checks the new
//!    image against the device and builds one [`block::DiskQueue`] per
//!    running worker on it (ring setup is the slow part);
//! 2. [`BlockDevice::swap_prepared`] (queues paused: nothing in flight):
//!    hands each worker its new queue ([`WorkerCommand::Swap`]), takes
//!    the new disk and image, updates the capacity; a failure leaves
//!    every worker on the old image and nothing written to either;
//! 3. after the resume, [`SwitchedOut::close`] drops the old queues and
//!    closes the old image (metadata written, marked clean, synced); the
//!    guest does not wait for it. An overlay keeps the old image open as
//!    its backing image, so "close" there only makes it clean.
//!
//! [`BlockDevice::switch_image`] does all three for one device.

use std::sync::mpsc;
use std::time::Instant;

use block::{BlockError, Disk, DiskQueue, ExclusiveImage};
use log::error;

use super::control::{ControlError, DRAIN_TIMEOUT};
use super::device::BlockDevice;
use super::queue_worker::{SwapAnswer, WorkerCommand};
use crate::device::InterruptKind;

/// The image a device switches to: a plain disk, or the owner's open of
/// one (which keeps resize and internal snapshots working after it).
pub struct NewImage {
    disk: Disk,
    image: Option<ExclusiveImage>,
}

impl From<Disk> for NewImage {
    fn from(disk: Disk) -> Self {
        NewImage { disk, image: None }
    }
}

impl From<ExclusiveImage> for NewImage {
    fn from(image: ExclusiveImage) -> Self {
        NewImage {
            disk: image.disk().clone(),
            image: Some(image),
        }
    }
}

/// A switch made ready while the queues still run (see the module docs).
pub struct PreparedSwitch {
    new: NewImage,
    /// A queue on the new image per running worker, by queue index.
    queues: Vec<(u16, DiskQueue)>,
}

/// What the device left behind at a switch: the old image and its queues.
pub struct SwitchedOut {
    disk: Disk,
    image: Option<ExclusiveImage>,
    /// The workers' old queues, by queue index.
    queues: Vec<(u16, DiskQueue)>,
}

impl SwitchedOut {
    /// The old image's disk (an overlay's backing image, still in use).
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// The switch back to the old image on its old queues, for a group
    /// of switches whose later member failed (give it to
    /// [`BlockDevice::swap_prepared`] while the queues are still paused).
    pub fn into_switch_back(self) -> PreparedSwitch {
        PreparedSwitch {
            new: NewImage {
                disk: self.disk,
                image: self.image,
            },
            queues: self.queues,
        }
    }

    /// Drops the old queues and closes the old image: its metadata
    /// written, marked clean, its files synced. Call it after the resume.
    pub fn close(self) -> Result<(), BlockError> {
        drop(self.queues);
        let r = self.disk.close();
        drop(self.image);
        r
    }
}

impl BlockDevice {
    /// Step 1: checks `new` against the device and builds its queues.
    pub fn prepare_switch(&self, new: impl Into<NewImage>) -> Result<PreparedSwitch, ControlError> {
        let new = new.into();
        if self.closed {
            return Err(ControlError::Closed);
        }
        let readonly = self.disk.readonly() || self.config.readonly;
        if new.disk.readonly() != readonly {
            return Err(ControlError::SwitchReadOnly {
                now: readonly,
                new: new.disk.readonly(),
            });
        }
        if new.disk.logical_block_size() > self.config.logical_block_size {
            return Err(ControlError::SwitchBlockSize {
                now: self.config.logical_block_size,
                new: new.disk.logical_block_size(),
            });
        }
        let queues = self
            .workers
            .iter()
            .map(|w| new.disk.queue().map(|q| (w.index, q)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ControlError::SwitchQueue)?;
        Ok(PreparedSwitch { new, queues })
    }

    /// Step 2, with the queues paused: every worker moves to the new
    /// image's queue, or (on any failure) every worker stays on the old.
    pub fn swap_prepared(&mut self, prepared: PreparedSwitch) -> Result<SwitchedOut, ControlError> {
        if !self.is_paused() {
            return Err(ControlError::NotPaused);
        }
        let PreparedSwitch { new, mut queues } = prepared;
        // A worker started since the preparation gets its queue now.
        for w in &self.workers {
            if !queues.iter().any(|(i, _)| *i == w.index) {
                let q = new.disk.queue().map_err(ControlError::SwitchQueue)?;
                queues.push((w.index, q));
            }
        }
        let answers = self.hand_over(queues);
        let (swapped, unused): (Vec<_>, Vec<_>) = answers.into_iter().partition(|a| a.swapped);
        let running = self.workers.len();
        if swapped.len() != running {
            // Back to the old queues on the workers that took a new one.
            let back: Vec<_> = swapped.into_iter().map(|a| (a.index, a.unused)).collect();
            let returned = self.hand_over(back);
            if returned.iter().any(|a| !a.swapped) {
                error!("virtio-blk: a queue worker could not go back to the old image");
            }
            drop(unused);
            return Err(ControlError::SwitchRefused);
        }
        drop(unused);
        let old_disk = std::mem::replace(&mut self.disk, new.disk);
        let old_image = std::mem::replace(&mut self.image, new.image);
        move_live_filters(&old_disk, &self.disk);
        let old_capacity = self.config_space.capacity_sectors();
        self.config_space.set_capacity(self.disk.size());
        if self.config_space.capacity_sectors() != old_capacity {
            if let Some(irq) = &self.interrupt {
                if let Err(e) = irq.trigger(InterruptKind::Config) {
                    error!("virtio-blk: cannot signal the capacity change: {e}");
                }
            }
        }
        Ok(SwitchedOut {
            disk: old_disk,
            image: old_image,
            queues: swapped.into_iter().map(|a| (a.index, a.unused)).collect(),
        })
    }

    /// Step 1 to 3 for this device alone: the queues are paused only
    /// for step 2. Returns the old image's disk, closed.
    pub fn switch_image(&mut self, new: impl Into<NewImage>) -> Result<Disk, ControlError> {
        let prepared = self.prepare_switch(new)?;
        self.pause()?;
        let out = self.swap_prepared(prepared);
        self.resume();
        let out = out?;
        let old = out.disk().clone();
        out.close().map_err(ControlError::Close)?;
        Ok(old)
    }

    /// Sends each worker its queue and collects every answer (a worker
    /// that is gone answers nothing; its queue is dropped).
    fn hand_over(&self, queues: Vec<(u16, DiskQueue)>) -> Vec<SwapAnswer> {
        let (done, answers) = mpsc::channel();
        let mut waiting = 0usize;
        for (index, queue) in queues {
            let Some(w) = self.workers.iter().find(|w| w.index == index) else {
                continue;
            };
            if w.control.send(WorkerCommand::Swap {
                queue: Box::new(queue),
                done: done.clone(),
            }) {
                waiting += 1;
            }
        }
        drop(done);
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut out = Vec::with_capacity(waiting);
        while out.len() < waiting {
            let left = deadline.saturating_duration_since(Instant::now());
            match answers.recv_timeout(left) {
                Ok(a) => out.push(a),
                Err(_) => break,
            }
        }
        out
    }
}

/// Filters that outlive a switch move from the old disk to the new one:
/// the dirty bitmaps go on recording the disk's writes on the new image
/// (`block::live::LiveState::take_bitmaps_from`). The queues are paused,
/// so no request sees half of it. A failure to mark persistent bitmaps
/// in use in the new image is logged: they still record, and are stored
/// at the new image's close.
fn move_live_filters(old: &Disk, new: &Disk) {
    if let Err(e) = new.live().take_bitmaps_from(old.live()) {
        log::error!(
            "{}: cannot mark the dirty bitmaps it took over in use: {e}",
            new.options().path.display()
        );
    }
}
