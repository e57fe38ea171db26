//! The split engine `engine=auto` picks for an O_DIRECT image whose
//! blocks are fallocated but never written: reads on io_uring, every
//! other op (writes, flushes, discard, write-zeroes) on Linux AIO.
//!
//! Why: on such an image the two engines are each best at one half
//! (docs/performance.md, "Engine x preallocation"). A read of an
//! unwritten extent needs no device I/O and io_uring completes it inside
//! the submit call with less CPU than `io_submit`; a first write converts
//! its extent inside the submit call, which io_uring does one small chunk
//! at a time (its submit budget) while AIO takes a whole batch per
//! `io_submit`. Both engines are safe there: every block is allocated.
//!
//! Ops enter through [`Engine::push`] and go to one side by kind; both
//! sides signal the queue's one eventfd, and completions leave through
//! [`Engine::reap`] from both. Each op's completion comes from the side
//! that ran it, so the one-completion-per-op rule of each engine holds
//! here too. Ordering between reads and writes is the executor's, as with
//! any engine (a read-modify-write pushes its write after its read ends).

use std::fs::File;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::aio::{AioEngine, DEFAULT_DEPTH};
use super::uring::{UringEngine, DEFAULT_ENTRIES};
use super::{Engine, EngineCompletion, HostOp, OpToken};
use crate::error::BlockError;

/// See the module docs.
pub struct SplitEngine {
    reads: UringEngine,
    others: AioEngine,
    eventfd: Arc<EventFd>,
}

impl SplitEngine {
    /// A ring and an AIO context over `files`, both signalling `eventfd`.
    pub fn new(files: &[Arc<File>], eventfd: Arc<EventFd>) -> Result<Self, BlockError> {
        Ok(SplitEngine {
            reads: UringEngine::new(files, eventfd.clone(), DEFAULT_ENTRIES)?,
            others: AioEngine::new(files, eventfd.clone(), DEFAULT_DEPTH)?,
            eventfd,
        })
    }
}

impl Engine for SplitEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        match op {
            // SAFETY: the caller's contract (`Engine::push`) is passed on
            // unchanged to the side that runs the op.
            HostOp::Readv { .. } => unsafe { self.reads.push(token, op) },
            // SAFETY: as above.
            _ => unsafe { self.others.push(token, op) },
        }
    }

    /// Submits both sides; an error of one does not keep the other's ops
    /// from the kernel (each side reports its unsubmitted ops as
    /// completions).
    fn submit(&mut self) -> Result<(), BlockError> {
        let others = self.others.submit();
        let reads = self.reads.submit();
        others.and(reads)
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        self.reads.reap(out);
        self.others.reap(out);
    }

    /// Blocks on one side only (no `poll`, which the VMM's queue threads
    /// may not call): on the reads while any are in flight, as they need
    /// no allocation and end soonest, else on the other ops.
    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        self.submit()?;
        let before = out.len();
        self.reap(out);
        if out.len() > before {
            return Ok(());
        }
        if self.reads.in_flight() > 0 {
            self.reads.wait(out)?;
            self.others.reap(out);
        } else {
            self.others.wait(out)?;
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.reads.in_flight() + self.others.in_flight()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }
}
