//! The disk handle: a shared opened image and the per-queue handles that
//! submit requests to it.
//!
//! [`Disk`] is cheap to clone (an `Arc`): the format with its metadata and
//! the options it was opened with. [`Disk::queue`] creates a
//! [`DiskQueue`]: its own engine (an io_uring ring and dup'd descriptors,
//! or the sync engine) and its own completion eventfd.
//!
//! A queue worker's loop:
//! 1. `submit_batch_requests(batch)`: every request is planned by the
//!    format and turned into host operations; the whole batch reaches the
//!    kernel in one submission before this returns.
//! 2. wait for `completion_eventfd()` to become readable;
//! 3. `drain_completions(&mut out)`: clears the eventfd, then returns every
//!    finished request, exactly one [`Completion`] per request.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;
use crate::formats::Format;
use crate::options::{DiskOptions, EngineKind};
use crate::request::{BlockRequest, Completion};

/// An opened image, shared by all its queues.
#[derive(Clone)]
pub struct Disk {
    format: Arc<dyn Format>,
    options: DiskOptions,
    /// The engine `options.engine` resolved to (never `Auto`).
    engine: EngineKind,
}

impl Disk {
    /// Opens the image (format, backing chain, locks) and resolves the
    /// engine (`auto` probes io_uring once).
    pub fn open(options: &DiskOptions) -> Result<Disk, BlockError> {
        let format = crate::formats::open_format(options)?;
        let engine = match options.engine {
            EngineKind::Auto => EngineKind::Sync,
            e => e,
        };
        Ok(Disk {
            format,
            options: options.clone(),
            engine,
        })
    }

    pub fn size(&self) -> u64 {
        self.format.size()
    }

    pub fn readonly(&self) -> bool {
        self.options.readonly
    }

    pub fn options(&self) -> &DiskOptions {
        &self.options
    }

    /// The engine in use (`IoUring` or `Sync`).
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    pub fn format(&self) -> &Arc<dyn Format> {
        &self.format
    }

    /// Creates a queue handle with its own engine and completion eventfd.
    pub fn queue(&self) -> Result<DiskQueue, BlockError> {
        todo!("engine executor")
    }
}

/// One queue's handle on a [`Disk`].
pub struct DiskQueue {
    completion_fd: EventFd,
}

impl DiskQueue {
    /// Plans and submits every request; all of them reach the kernel before
    /// this returns. Each request later yields exactly one completion.
    pub fn submit_batch_requests(&mut self, requests: impl IntoIterator<Item = BlockRequest>) {
        let _ = requests.into_iter();
        todo!("engine executor")
    }

    /// Readable when completions are ready (non-blocking eventfd).
    pub fn completion_eventfd(&self) -> &EventFd {
        &self.completion_fd
    }

    /// Clears the eventfd, then moves every finished request to `out`.
    pub fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        let _ = out;
        todo!("engine executor")
    }

    /// Requests submitted and not yet drained.
    pub fn in_flight(&self) -> usize {
        todo!("engine executor")
    }
}
