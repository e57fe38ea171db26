//! The synchronous engine: runs each op with preadv/pwritev/fdatasync/
//! fallocate in the calling thread at [`Engine::submit`].
//!
//! Ops enter through [`Engine::push`] (queued, not run), run in order at
//! `submit`, and leave as completions queued here; the queue's eventfd is
//! signalled so the worker drains them through the same path as io_uring
//! completions.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

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

    fn fd(&self, file: crate::formats::FileId) -> io::Result<i32> {
        self.files
            .get(usize::from(file.0))
            .map(|f| f.as_raw_fd())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn run(&self, op: &HostOp) -> io::Result<u64> {
        match *op {
            HostOp::Readv {
                file,
                offset,
                ref iov,
            } => {
                let fd = self.fd(file)?;
                let off = to_off(offset)?;
                // SAFETY: `push`'s contract keeps the iovecs and their
                // memory valid and writable until this op is reaped.
                let n = unsafe { libc::preadv(fd, iov.ptr, iov.count as i32, off) };
                cvt(n)
            }
            HostOp::Writev {
                file,
                offset,
                ref iov,
            } => {
                let fd = self.fd(file)?;
                let off = to_off(offset)?;
                // SAFETY: `push`'s contract keeps the iovecs and their
                // memory valid until this op is reaped.
                let n = unsafe { libc::pwritev(fd, iov.ptr, iov.count as i32, off) };
                cvt(n)
            }
            HostOp::Fdatasync { file } => {
                let fd = self.fd(file)?;
                // SAFETY: plain syscall on a descriptor we own.
                let r = unsafe { libc::fdatasync(fd) };
                cvt(r as isize)
            }
            HostOp::PunchHole { file, offset, len } => fallocate(
                self.fd(file)?,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ),
            HostOp::ZeroRange { file, offset, len } => {
                fallocate(self.fd(file)?, libc::FALLOC_FL_ZERO_RANGE, offset, len)
            }
        }
    }
}

fn to_off(offset: u64) -> io::Result<i64> {
    i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cvt(n: isize) -> io::Result<u64> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as u64)
    }
}

fn fallocate(fd: i32, mode: i32, offset: u64, len: u64) -> io::Result<u64> {
    let off = to_off(offset)?;
    let len = to_off(len)?;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let r = unsafe { libc::fallocate(fd, mode, off, len) };
    cvt(r as isize)
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
        let queued = std::mem::take(&mut self.queued);
        for (token, op) in &queued {
            let result = self.run(op);
            self.done.push_back(EngineCompletion {
                token: *token,
                result,
            });
        }
        self.queued = queued;
        self.queued.clear();
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
}
