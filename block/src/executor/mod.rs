//! The executor behind a [`crate::DiskQueue`]: plans requests with the
//! format, runs the plans' host operations on the queue's engine and turns
//! op completions into exactly one `Completion` per request.
//!
//! `Executor` is a thin coordinator over parts with one job each:
//!
//! | Part | Where | Job |
//! | --- | --- | --- |
//! | `OpBuilder` | `build.rs`, `read_ops.rs`, `write_ops.rs`, `memory.rs` | plan one request with the format and return its ops (bounce buffers, zero page, recycled vectors, the request memory's iovecs); the per-request bounce budget is a value of that call |
//! | `Accounting` | `accounting.rs`, `table.rs` | own each request in flight (the `table`) until its last op is reaped; short transfers, first error, commit/abort, deferred commits, one completion per request |
//! | `CompressedReads` | `compressed.rs`, `inflate_join.rs`, `inflate.rs`, `inflate_pool.rs` | read compressed clusters, inflate them (the process's `inflate_pool` or this thread) into the disk's inflate cache, join reads of a cluster already being read |
//! | `RmwLocks`, `WriteTracker` | `rmw.rs`, `barrier.rs` | partial-block locks of unaligned O_DIRECT writes (shared by the disk's queues), and write barriers for commits that free clusters (each queue numbers its writes in its own `WriteLane`) |
//!
//! The flow: requests enter through `Executor::submit_batch`; `submit.rs`
//! admits each (locks, write number), has the builder build it, hands it
//! to the accounting and pushes its ops, or parks a write the format
//! blocked (replanned on every drain). `Executor::drain` reaps op
//! results into `complete.rs`, which asks the accounting what each means
//! and acts on it (push again, inflate, serve waiters, complete);
//! completions leave through `drain` (or `reap_ready`, the same without
//! clearing the eventfd). The request, owned by the table
//! until its last op is reaped, keeps the memory behind the engine's
//! iovecs alive; dropping the executor waits for the engine first.

use std::collections::VecDeque;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;
use crate::formats::Format;
use crate::request::{BlockRequest, Completion};
use block_engines::align::DioAlign;
use block_engines::{Engine, EngineCompletion};

pub use compressed::INFLATIONS_PER_DRAIN;

mod accounting;
pub(crate) mod barrier;
mod build;
mod complete;
mod compressed;
pub mod inflate;
mod inflate_join;
pub mod inflate_pool;
pub(crate) mod memory;
mod read_ops;
pub(crate) mod rmw;
mod shared;
mod spares;
mod submit;
pub(crate) mod table;
mod write_ops;

use accounting::Accounting;
use barrier::WriteLane;
use build::OpBuilder;
use compressed::CompressedReads;
pub(crate) use shared::DiskShared;

/// See the module docs.
pub(crate) struct Executor {
    engine: Box<dyn Engine>,
    /// The queue's completion eventfd, also the waker of blocked writes.
    eventfd: Arc<EventFd>,
    builder: OpBuilder,
    acct: Accounting,
    compressed: CompressedReads,
    /// Writes the format blocked, replanned on every drain.
    parked: VecDeque<BlockRequest>,
    /// The reaped-completions vector, reused from drain to drain.
    reaped: Vec<EngineCompletion>,
    /// Partial-block locks and write tracking (shared by the disk's queues).
    shared: Arc<DiskShared>,
    /// This queue's writes, for the disk's discard barriers.
    writes: WriteLane,
    /// O_DIRECT block size writes are locked in (1: buffered, no locks).
    rmw_block: u64,
}

impl Executor {
    /// An executor over `format` driving `engine`, whose eventfd is the
    /// queue's completion eventfd (and the waker of blocked writes).
    /// `shared` is shared by every queue of the disk.
    pub fn new(format: Arc<dyn Format>, engine: Box<dyn Engine>, shared: Arc<DiskShared>) -> Self {
        let builder = OpBuilder::new(format, shared.ignore_flushes);
        let eventfd = engine.eventfd().clone();
        let rmw_block = u64::from(builder.alignment().offset).max(1);
        Executor {
            engine,
            compressed: CompressedReads::new(eventfd.clone(), shared.clone()),
            eventfd,
            builder,
            acct: Accounting::default(),
            parked: VecDeque::new(),
            reaped: Vec::new(),
            writes: shared.writes.lane(),
            shared,
            rmw_block,
        }
    }

    pub fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }

    /// Whether the engine writes during submit (see
    /// [`Engine::writes_at_submit`]).
    pub fn writes_at_submit(&self) -> bool {
        self.engine.writes_at_submit()
    }

    /// See [`Engine::allow_writes_at_submit`].
    pub fn allow_writes_at_submit(&mut self) {
        self.engine.allow_writes_at_submit();
    }

    /// The strictest O_DIRECT alignment of the image's files (1 if none).
    pub fn alignment(&self) -> DioAlign {
        self.builder.alignment()
    }

    /// Plans every request and submits all resulting ops in one go.
    pub fn submit_batch(&mut self, requests: impl IntoIterator<Item = BlockRequest>) {
        let before = self.acct.ready_len();
        for req in requests {
            self.start(req);
        }
        self.submit_engine();
        if self.acct.ready_len() > before {
            self.signal();
        }
    }

    /// Clears the eventfd, reaps finished ops, inflates and accounts
    /// compressed clusters, retries deferred commits and parked writes,
    /// and moves every finished request to `out`.
    pub fn drain(&mut self, out: &mut Vec<Completion>) {
        // Clear first: a completion arriving after this read re-arms it.
        let _ = self.eventfd.read();
        self.reap_ready(out);
    }

    /// [`Executor::drain`] without clearing the eventfd: for a caller
    /// that has cleared it itself (see [`crate::DiskQueue::reap_completions`]).
    pub fn reap_ready(&mut self, out: &mut Vec<Completion>) {
        let mut reaped = std::mem::take(&mut self.reaped);
        self.engine.reap(&mut reaped);
        for c in reaped.drain(..) {
            self.on_op_complete(c);
        }
        self.reaped = reaped;
        if self.compressed.inflate_some() {
            // More clusters wait: the caller drains again at once.
            self.signal();
        }
        self.take_inflated();
        for slot in self.acct.take_deferred() {
            self.finish_if_done(slot);
        }
        self.retry_parked();
        self.submit_engine();
        self.acct.take_ready(out);
    }

    /// Blocks until at least one completion is ready or nothing is in
    /// flight, then drains like [`Executor::drain`].
    pub fn wait(&mut self, out: &mut Vec<Completion>) -> Result<(), BlockError> {
        let start = out.len();
        loop {
            self.drain(out);
            if out.len() > start || self.in_flight() == 0 {
                return Ok(());
            }
            if self.compressed.has_backlog() {
                // The next drain inflates more without waiting.
                continue;
            }
            if self.engine.in_flight() > 0 {
                let mut reaped = std::mem::take(&mut self.reaped);
                let r = self.engine.wait(&mut reaped);
                for c in reaped.drain(..) {
                    self.on_op_complete(c);
                }
                self.reaped = reaped;
                r?;
            } else {
                // Only parked writes: wait for their waker.
                wait_readable(&self.eventfd)?;
            }
        }
    }

    /// Requests submitted and not yet drained.
    pub fn in_flight(&self) -> usize {
        self.acct.in_flight() + self.parked.len()
    }

    fn signal(&self) {
        // An eventfd write only fails on counter overflow, which a pending
        // wake-up already covers.
        let _ = self.eventfd.write(1);
    }

    /// Submits whatever is queued on the engine; a failure fails nothing
    /// here because the engine reports unsubmitted ops as completions.
    fn submit_engine(&mut self) {
        if let Err(e) = self.engine.submit() {
            log::error!("block queue: engine submit failed: {e}");
        }
    }
}

fn wait_readable(fd: &EventFd) -> Result<(), BlockError> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, -1) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(BlockError::EventFd(e));
        }
    }
    Ok(())
}

impl Drop for Executor {
    /// Waits for every op the engine still has, so no memory it uses is
    /// freed under the kernel; if the engine fails, leaks that memory.
    fn drop(&mut self) {
        self.submit_engine();
        let mut reaped = Vec::new();
        while self.engine.in_flight() > 0 {
            if let Err(e) = self.engine.wait(&mut reaped) {
                log::error!(
                    "block queue: cannot reap in-flight I/O on drop ({e}); leaking its buffers"
                );
                self.acct
                    .abandon_all(self.builder.format.as_ref(), &self.shared, &mut self.writes);
                return;
            }
            for c in reaped.drain(..) {
                self.on_op_complete(c);
            }
            self.submit_engine();
        }
        self.acct
            .abandon_deferred(self.builder.format.as_ref(), &self.shared, &mut self.writes);
    }
}
