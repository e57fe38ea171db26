//! What every engine speaks: a host operation ([`HostOp`]) on a file of
//! an image ([`FileId`]), pushed under a token ([`OpToken`]) and handed
//! back as an [`EngineCompletion`], and the [`Engine`] trait each engine
//! (sync, threads, aio, uring, the NBD engine, the router between them)
//! implements.
//!
//! Raw pointers and `libc::iovec` exist only inside this boundary:
//! [`Engine::push`] is an `unsafe fn` whose caller promises the memory
//! stays valid until the op's completion has been reaped. The block
//! crate's executor upholds that by owning each request (and so its
//! memory) in its in-flight table until then.

use std::io;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;

/// Which file of an image chain an op goes to: its index among the
/// image's files (the local ones first, then the remote ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u16);

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

    /// Whether writes run in the calling thread during [`Engine::submit`]
    /// (the sync engine's every op; once allowed, the uring engine's
    /// buffered writes where io_uring would hand them to a worker thread).
    /// A caller that answers each request as soon as it is done submits
    /// such writes one at a time, so the first is answered before the
    /// last is written.
    fn writes_at_submit(&self) -> bool {
        false
    }

    /// Lets the engine make writes in the calling thread during submit
    /// where that is cheaper than handing them to a kernel worker (the
    /// uring engine's `inline_writes`). Only a caller that submits such
    /// writes one at a time asks; other engines ignore it.
    fn allow_writes_at_submit(&mut self) {}
}
