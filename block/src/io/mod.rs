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

pub mod allocation;
pub(crate) mod executor;
pub use executor::INFLATIONS_PER_DRAIN;
pub mod inflate;
pub mod inflate_pool;
pub(crate) mod memory;
pub mod probe;

pub use block_engines::{
    aio, align, new_engine, submit_stats, sync, threads, uring, Engine, EngineCompletion, FileId,
    HostOp, OpToken, RawIovecs,
};
