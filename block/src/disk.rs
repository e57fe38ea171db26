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
//!
//! Tools and tests use the blocking helpers ([`Disk::read_at`],
//! [`Disk::write_at`], ...), which run one request through a sync-engine
//! queue with [`DiskQueue::run`]: the same code path as the device.

use std::sync::{Arc, Mutex, OnceLock};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::error::BlockError;
use crate::executor::{DiskShared, Executor};
use crate::formats::Format;
use crate::live::{LiveState, QueueFilters};
use crate::options::{DiskOptions, EngineKind};
use crate::request::{BlockRequest, Completion, IoMemory, RequestOp};
use block_engines::threads::{self, WorkerPool};
use block_engines::Engine;

/// The blocking helpers move at most this much per request (so O_DIRECT
/// bounce buffers stay within the executor's per-request budget).
const HELPER_CHUNK: usize = 16 << 20;

/// An opened image, shared by all its queues.
#[derive(Clone)]
pub struct Disk {
    format: Arc<dyn Format>,
    options: DiskOptions,
    /// The engine `options.engine` resolved to (never `Auto`).
    engine: EngineKind,
    /// O_DIRECT alignment of the image's files (512 when buffered).
    block_size: u32,
    /// The sync-engine queue the blocking helpers reuse.
    helper: Arc<Mutex<Option<DiskQueue>>>,
    /// Partial-block locks and write tracking shared by this disk's queues.
    shared: Arc<DiskShared>,
    /// The worker pool of this disk's `threads` queues (made by the first).
    pool: Arc<OnceLock<Arc<WorkerPool>>>,
    /// The write seam's shared state: the filters every queue applies.
    live: Arc<LiveState>,
}

impl Disk {
    /// Opens the image (format, backing chain, locks) and resolves the
    /// engine (`auto` probes io_uring once).
    pub fn open(options: &DiskOptions) -> Result<Disk, BlockError> {
        let format = crate::formats::open_format(options)?;
        Self::from_format(format, options)
    }

    /// Wraps an already opened format (tests, tools) and resolves its
    /// engine; fails when an explicit `engine=aio` cannot work here.
    pub fn from_format(format: Arc<dyn Format>, options: &DiskOptions) -> Result<Disk, BlockError> {
        let engine = crate::engine_choice::resolve_engine(
            options.engine,
            options.direct,
            format.as_ref(),
            &options.path,
        )
        .map_err(|reason| BlockError::AioUnavailable {
            path: options.path.clone(),
            reason,
        })?;
        let block_size = format
            .files()
            .alignments()
            .iter()
            .map(|a| a.offset)
            .fold(crate::SECTOR_SIZE as u32, u32::max);
        let live = Arc::new(LiveState::default());
        live.bitmaps().configure(
            format.size(),
            Some(no_persistence_reason(format.name(), options)),
        );
        Ok(Disk {
            format,
            options: options.clone(),
            engine,
            block_size,
            helper: Arc::new(Mutex::new(None)),
            shared: Arc::new(DiskShared {
                ignore_flushes: !options.cache.flushes(),
                ..Default::default()
            }),
            pool: Arc::new(OnceLock::new()),
            live,
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

    /// The engine in use (never `Auto`).
    pub fn engine(&self) -> EngineKind {
        self.engine
    }

    pub fn format(&self) -> &Arc<dyn Format> {
        &self.format
    }

    /// The logical block size guests should use: the O_DIRECT alignment of
    /// the image's files, at least 512 (virtio-blk's `blk_size`).
    pub fn logical_block_size(&self) -> u32 {
        self.block_size
    }

    /// The write seam's state (dirty bitmaps, later other filters),
    /// shared by every queue of this disk; changed by the owner while the
    /// queues are quiesced (docs/live-operations.md).
    pub fn live(&self) -> &Arc<LiveState> {
        &self.live
    }

    /// Creates a queue handle with its own engine and completion eventfd.
    /// With `engine=auto`, a ring or AIO context that cannot be set up
    /// (locked-memory limits, `aio-max-nr` exhausted) falls back to the
    /// thread pool with a warning.
    pub fn queue(&self) -> Result<DiskQueue, BlockError> {
        match self.queue_with_engine(self.engine) {
            Err(e @ (BlockError::UringSetup(_) | BlockError::AioSetup(_)))
                if self.options.engine == EngineKind::Auto =>
            {
                log::warn!(
                    "disk {}: {} queue setup failed ({e}: {}); this queue uses the threads engine",
                    self.options.path.display(),
                    self.engine,
                    std::error::Error::source(&e)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
                self.queue_with_engine(EngineKind::Threads)
            }
            r => r,
        }
    }

    /// A queue on a given engine (`Auto` means sync here).
    pub fn queue_with_engine(&self, kind: EngineKind) -> Result<DiskQueue, BlockError> {
        let eventfd = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd)?);
        let engine = block_engines::queue_engine(kind, self.format.files(), eventfd, || {
            self.pool
                .get_or_init(|| Arc::new(WorkerPool::new(threads::DEFAULT_MAX_THREADS)))
                .clone()
        })?;
        Ok(self.queue_on(engine))
    }

    /// A queue driving a caller-supplied engine (tests inject faults this
    /// way). The engine's eventfd becomes the queue's completion eventfd.
    pub fn queue_on(&self, engine: Box<dyn Engine>) -> DiskQueue {
        DiskQueue {
            exec: Executor::new(self.format.clone(), engine, self.shared.clone()),
            filters: QueueFilters::new(self.live.clone()),
        }
    }

    /// Runs one request to completion on the helpers' sync-engine queue.
    fn run(
        &self,
        op: RequestOp,
        offset: u64,
        memory: IoMemory,
    ) -> Result<(u64, IoMemory), BlockError> {
        // A poisoned lock only means another helper call panicked; the
        // queue itself is still consistent (every call drains it).
        let mut guard = self.helper.lock().unwrap_or_else(|p| p.into_inner());
        let q = match guard.as_mut() {
            Some(q) => q,
            None => guard.insert(self.queue_with_engine(EngineKind::Sync)?),
        };
        q.run(op, offset, memory)
    }

    /// Reads `buf.len()` bytes at `offset` of the virtual disk.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let mut pos = offset;
        for chunk in buf.chunks_mut(HELPER_CHUNK) {
            let (_, mem) = self.run(RequestOp::Read, pos, IoMemory::Owned(vec![0; chunk.len()]))?;
            if let Some(data) = mem.into_owned() {
                chunk.copy_from_slice(&data);
            }
            pos += chunk.len() as u64;
        }
        Ok(())
    }

    /// Writes `buf` at `offset` of the virtual disk.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        let mut pos = offset;
        for chunk in buf.chunks(HELPER_CHUNK) {
            self.run(RequestOp::Write, pos, IoMemory::Owned(chunk.to_vec()))?;
            pos += chunk.len() as u64;
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeroes.
    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<(), BlockError> {
        self.run(
            RequestOp::WriteZeroes { len, may_unmap },
            offset,
            IoMemory::None,
        )
        .map(|_| ())
    }

    /// Deallocates `len` bytes at `offset`.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.run(RequestOp::Discard { len }, offset, IoMemory::None)
            .map(|_| ())
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> Result<(), BlockError> {
        self.run(RequestOp::Flush, 0, IoMemory::None).map(|_| ())
    }

    /// Closes the image cleanly: the persistent dirty bitmaps are stored
    /// (`live`), the format writes its metadata and marks the image
    /// clean, then its files are synced.
    pub fn close(&self) -> Result<(), BlockError> {
        // The persistent dirty bitmaps first (their in-use flag cleared);
        // if that fails the image still closes, its bitmaps left in use
        // (inconsistent), as after a crash.
        let stored = self.live.store_persistent();
        if let Err(e) = &stored {
            log::error!(
                "{}: cannot store its persistent dirty bitmaps ({e}); they stay marked in use",
                self.options.path.display()
            );
        }
        self.format.close()?;
        let r = self.flush().and(stored);
        *self.helper.lock().unwrap_or_else(|p| p.into_inner()) = None;
        r
    }
}

/// Why the dirty bitmaps of a disk opened this way can only live in
/// memory, until an owner that stores them in the image says otherwise
/// (`BitmapRegistry::configure`).
fn no_persistence_reason(format: &str, options: &DiskOptions) -> String {
    if format != "qcow2" {
        format!("{format} images keep dirty bitmaps in memory only")
    } else if options.readonly {
        "the disk is read-only".to_string()
    } else {
        "this image was opened without its persistent bitmaps".to_string()
    }
}

/// One queue's handle on a [`Disk`].
pub struct DiskQueue {
    exec: Executor,
    /// This queue's side of the write seam.
    filters: QueueFilters,
}

impl DiskQueue {
    /// Plans and submits every request; all of them reach the kernel before
    /// this returns. Each request later yields exactly one completion.
    pub fn submit_batch_requests(&mut self, requests: impl IntoIterator<Item = BlockRequest>) {
        self.filters.refresh();
        if self.filters.acts_before_submit() {
            let filters = &mut self.filters;
            self.exec
                .submit_batch(requests.into_iter().inspect(|r| filters.before_submit(r)));
        } else {
            self.exec.submit_batch(requests);
        }
    }

    /// Picks up a change of the disk's filters now rather than at the
    /// next batch: an owner that removed a filter while the queues were
    /// paused has the queues call this at the resume, so that an idle
    /// queue lets go of its handles on the filter's images (and their
    /// locks) at once.
    pub fn refresh_filters(&mut self) {
        self.filters.refresh();
    }

    /// Readable when completions are ready (non-blocking eventfd).
    pub fn completion_eventfd(&self) -> &EventFd {
        self.exec.eventfd()
    }

    /// Clears the eventfd, then moves every finished request to `out`.
    pub fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        let start = out.len();
        self.exec.drain(out);
        self.leaving(out, start);
    }

    /// Completions `out[start..]` are about to leave: the filters see
    /// them (dirty bitmaps mark write-like ones).
    #[inline]
    fn leaving(&mut self, out: &[Completion], start: usize) {
        self.filters.refresh();
        if let Some(done) = out.get(start..) {
            self.filters.completed(done);
        }
    }

    /// Moves every finished request to `out` like
    /// [`DiskQueue::drain_completions`], but leaves the eventfd alone (no
    /// syscall for it): for a caller that clears the eventfd itself before
    /// calling this, e.g. with a read of it in its own io_uring that has
    /// completed, or that looks for completions without sleeping. A
    /// completion that arrives later, or work left for another round
    /// (compressed clusters still to inflate), signals the eventfd again;
    /// a caller that never clears it just sees it stay readable.
    pub fn reap_completions(&mut self, out: &mut Vec<Completion>) {
        let start = out.len();
        self.exec.reap_ready(out);
        self.leaving(out, start);
    }

    /// Blocks until at least one request has completed (or none is in
    /// flight), then drains like [`DiskQueue::drain_completions`].
    pub fn wait_completions(&mut self, out: &mut Vec<Completion>) -> Result<(), BlockError> {
        let start = out.len();
        let r = self.exec.wait(out);
        self.leaving(out, start);
        r
    }

    /// Requests submitted and not yet drained.
    pub fn in_flight(&self) -> usize {
        self.exec.in_flight()
    }

    /// Runs one request to completion, blocking: the helper tools and
    /// tests use (the blocking methods of [`Disk`], ch-img). Returns the
    /// bytes moved and the request's memory. The queue must have nothing
    /// else in flight: the first completion is taken as this request's.
    pub fn run(
        &mut self,
        op: RequestOp,
        offset: u64,
        memory: IoMemory,
    ) -> Result<(u64, IoMemory), BlockError> {
        self.submit_batch_requests([BlockRequest {
            user_data: 0,
            op,
            offset,
            memory,
        }]);
        let mut out = Vec::with_capacity(1);
        while out.is_empty() && self.in_flight() > 0 {
            self.wait_completions(&mut out)?;
        }
        let c = out.pop().ok_or(BlockError::LostCompletion)?;
        c.result.map(|n| (n, c.memory))
    }

    /// Whether this queue's engine makes writes during submit, in the
    /// submitting thread (the sync engine; io_uring's buffered writes
    /// where the kernel would hand them to a worker thread, once
    /// [`DiskQueue::allow_writes_at_submit`]): a caller that answers
    /// requests as they finish submits writes one at a time.
    pub fn writes_at_submit(&self) -> bool {
        self.exec.writes_at_submit()
    }

    /// Lets the io_uring engine make in the submitting thread the buffered
    /// writes the kernel would hand to a worker thread anyway (on most
    /// file systems; docs/io-engines.md, "Buffered writes in the queue's
    /// thread"). For a caller that then submits writes one at a time, as
    /// the virtio-blk queue worker does; a loop that answers a whole
    /// batch at once would see none of it done until all of it is.
    pub fn allow_writes_at_submit(&mut self) {
        self.exec.allow_writes_at_submit();
    }

    /// The O_DIRECT alignment this queue's files need (1 when buffered).
    pub fn alignment(&self) -> block_engines::align::DioAlign {
        self.exec.alignment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Disk>();
        send::<DiskQueue>();
    }
}
