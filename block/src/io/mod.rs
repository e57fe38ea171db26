//! I/O engines: execute the host operations of format plans.
//!
//! Data enters through [`crate::DiskQueue::submit_batch_requests`]: the
//! [`executor`] asks the format for a plan, turns each piece into a host
//! operation ([`HostOp`]) and pushes it to the queue's [`Engine`] under a
//! token. The engine performs the operation (the `sync` engine inline at
//! submit, the `threads` engine on a worker pool, the `aio` and `uring`
//! engines in the kernel) and hands back
//! [`EngineCompletion`]s, signalling the queue's completion eventfd.
//! Finished requests leave through [`crate::DiskQueue::drain_completions`],
//! which clears that eventfd first, or
//! [`crate::DiskQueue::reap_completions`], which leaves it to the caller
//! (one that reads it in its own io_uring, or watches it edge-triggered).
//!
//! Raw pointers and `libc::iovec` exist only inside this boundary:
//! [`Engine::push`] is an `unsafe fn` whose caller promises the memory
//! stays valid until the op's completion has been reaped. The executor
//! upholds that by owning each request (and so its memory) in its
//! in-flight table until then.

use std::io;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;

pub mod aio;
pub mod align;
pub mod allocation;
pub(crate) mod blocking;
pub(crate) mod executor;
pub use executor::INFLATIONS_PER_DRAIN;

/// Which file of an image chain an op goes to: an index into
/// [`crate::formats::Format::files`] (then into its `remote_files`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u16);
pub mod inflate;
pub mod inflate_pool;
pub(crate) mod memory;
pub mod probe;
pub mod submit_stats;
pub mod sync;
#[cfg(test)]
mod test_blocks;
pub mod threads;
pub mod uring;

/// Tags an operation; returned with its completion.
pub type OpToken = u64;

/// A scatter/gather list handed to an engine. Holds raw `iovec`s, so it
/// only ever travels inside the engine boundary.
#[derive(Debug)]
pub struct RawIovecs {
    pub ptr: *const libc::iovec,
    pub count: u32,
}

/// One host operation.
#[derive(Debug)]
pub enum HostOp {
    /// preadv into the iovecs at `offset` of `file`.
    Readv {
        file: FileId,
        offset: u64,
        iov: RawIovecs,
    },
    /// pwritev from the iovecs at `offset` of `file`.
    Writev {
        file: FileId,
        offset: u64,
        iov: RawIovecs,
    },
    /// fdatasync(`file`).
    Fdatasync { file: FileId },
    /// fallocate(PUNCH_HOLE | KEEP_SIZE).
    PunchHole { file: FileId, offset: u64, len: u64 },
    /// fallocate(ZERO_RANGE) (may extend the file).
    ZeroRange { file: FileId, offset: u64, len: u64 },
}

/// A finished operation: bytes moved (0 for sync/fallocate) or the errno.
#[derive(Debug)]
pub struct EngineCompletion {
    pub token: OpToken,
    pub result: io::Result<u64>,
}

/// A low-level engine: one per queue.
pub trait Engine: Send {
    /// Queues `op` under `token`. The engine may submit earlier ops to make
    /// room; nothing is guaranteed to reach the kernel before [`Engine::submit`].
    ///
    /// # Safety
    ///
    /// Every iovec of `op`, the iovec array itself and the memory the iovecs
    /// point to must stay valid (and, for reads, not otherwise accessed)
    /// until the completion carrying `token` has been returned by
    /// [`Engine::reap`] or [`Engine::wait`].
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError>;

    /// Hands every queued op to the kernel (one `io_uring_enter`, or runs
    /// them inline). Nothing stays queued when this returns `Ok`.
    fn submit(&mut self) -> Result<(), BlockError>;

    /// Moves every finished op to `out` without blocking.
    fn reap(&mut self, out: &mut Vec<EngineCompletion>);

    /// Blocks until at least one op has finished (or none is in flight),
    /// then reaps like [`Engine::reap`].
    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError>;

    /// Ops pushed and not yet reaped.
    fn in_flight(&self) -> usize;

    /// The eventfd signalled when completions are ready.
    fn eventfd(&self) -> &Arc<EventFd>;
}

/// Creates the engine `kind` (`Auto` means sync here) over `files`,
/// signalling `eventfd`. A `threads` engine made here gets a pool of its
/// own; [`crate::Disk`] shares one pool between a disk's queues.
pub fn new_engine(
    kind: crate::options::EngineKind,
    files: &[Arc<std::fs::File>],
    eventfd: Arc<EventFd>,
) -> Result<Box<dyn Engine>, BlockError> {
    use crate::options::EngineKind;
    match kind {
        EngineKind::IoUring => Ok(Box::new(uring::UringEngine::new(
            files,
            eventfd,
            uring::DEFAULT_ENTRIES,
        )?)),
        EngineKind::Aio => Ok(Box::new(aio::AioEngine::new(
            files,
            eventfd,
            aio::DEFAULT_DEPTH,
        )?)),
        EngineKind::Threads => Ok(Box::new(threads::ThreadsEngine::new(
            files,
            eventfd,
            Arc::new(threads::WorkerPool::new(threads::DEFAULT_MAX_THREADS)),
        ))),
        EngineKind::Sync | EngineKind::Auto => Ok(Box::new(sync::SyncEngine::new(files, eventfd))),
    }
}
