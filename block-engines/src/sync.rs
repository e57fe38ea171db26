//! The synchronous engine: runs each op with preadv/pwritev/fdatasync/
//! fallocate in the calling thread at [`Engine::submit`].
//!
//! Ops enter through [`Engine::push`] (queued, not run), run in order at
//! `submit`, and leave as completions queued here; the queue's eventfd is
//! signalled so the worker drains them through the same path as io_uring
//! completions.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::blocking::run_all;
use super::{Engine, EngineCompletion, HostOp, OpToken};
use crate::error::BlockError;

/// See the module docs.
pub struct SyncEngine {
    files: Vec<Arc<File>>,
    eventfd: Arc<EventFd>,
    queued: Vec<(OpToken, HostOp)>,
    done: VecDeque<EngineCompletion>,
}

// SAFETY: the raw iovec pointers inside queued `HostOp`s are only
// dereferenced by the kernel during `submit`, on whichever thread owns the
// engine; the `Engine::push` contract keeps their memory valid until the
// completion is reaped, independent of the thread.
unsafe impl Send for SyncEngine {}

impl SyncEngine {
    pub fn new(files: &[Arc<File>], eventfd: Arc<EventFd>) -> Self {
        SyncEngine {
            files: files.to_vec(),
            eventfd,
            queued: Vec::new(),
            done: VecDeque::new(),
        }
    }
}

impl Engine for SyncEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        self.queued.push((token, op));
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        if self.queued.is_empty() {
            return Ok(());
        }
        // SAFETY: `push`'s contract keeps the iovecs and their memory
        // valid until each op is reaped, which is after this call.
        unsafe { run_all(&self.files, &mut self.queued, &mut self.done) };
        self.eventfd.write(1).map_err(BlockError::EventFd)
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        out.extend(self.done.drain(..));
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        self.submit()?;
        self.reap(out);
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.done.len()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }

    fn writes_at_submit(&self) -> bool {
        true
    }
}
