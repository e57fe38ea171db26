//! A queue worker's control channel: what the device (and, through it,
//! the VMM's control loop) asks of a running worker. This is the
//! channel and the device's end; the worker's end is `commands.rs`.
//!
//! Commands travel on an mpsc channel; the worker's control eventfd
//! wakes it to read them. [`WorkerCommand::Stop`] ends the worker once
//! its requests in flight have completed. [`WorkerCommand::Pause`] makes
//! it stop taking chains, wait until nothing is in flight, answer on the
//! given sender, and then block until [`WorkerCommand::Resume`] (which
//! may carry new parser limits, e.g. a grown capacity) or `Stop`. While a
//! worker is paused its disk has no request of this queue in flight, so
//! the owner may resize, flush or snapshot the image, or hand the worker
//! a queue on another image ([`WorkerCommand::Swap`], the image switch).

use std::sync::mpsc::Sender;
use std::sync::Arc;

use block::DiskQueue;
use log::error;
use vmm_sys_util::eventfd::EventFd;

use crate::block::request_parser::ParserLimits;

/// What a worker is asked to do.
pub enum WorkerCommand {
    /// Complete what is in flight, then return.
    Stop,
    /// Complete what is in flight, take nothing new, send the queue
    /// index on the sender, then wait for `Resume` or `Stop`.
    Pause(Sender<u16>),
    /// Take chains again, checking them against these limits.
    Resume(ParserLimits),
    /// Only while paused: serve the queue from `queue` (on another
    /// image) from now on, and send the one it replaces back on `done`.
    /// A worker that is not paused sends `queue` back unused.
    Swap {
        queue: Box<DiskQueue>,
        done: Sender<SwapAnswer>,
    },
}

/// A worker's answer to [`WorkerCommand::Swap`].
pub struct SwapAnswer {
    pub index: u16,
    /// The queue the worker no longer uses: its old one when `swapped`,
    /// else the one it was given.
    pub unused: DiskQueue,
    pub swapped: bool,
}

/// The device's end of one worker's control channel.
pub struct WorkerControl {
    commands: Sender<WorkerCommand>,
    wake: Arc<EventFd>,
}

impl WorkerControl {
    pub fn new(commands: Sender<WorkerCommand>, wake: Arc<EventFd>) -> Self {
        WorkerControl { commands, wake }
    }

    /// Sends `cmd` and wakes the worker; false if the worker is gone.
    pub fn send(&self, cmd: WorkerCommand) -> bool {
        if self.commands.send(cmd).is_err() {
            return false;
        }
        if let Err(e) = self.wake.write(1) {
            error!("virtio-blk: cannot wake a queue worker: {e}");
            return false;
        }
        true
    }
}
