//! Runs one [`HostOp`] with a blocking syscall (preadv, pwritev,
//! fdatasync, fallocate) in the calling thread.
//!
//! Shared by every engine that does some work outside the kernel's
//! asynchronous paths: the `sync` engine (everything, at submit), the
//! `threads` engine's workers (everything, off the queue's thread) and the
//! `aio` engine (what Linux AIO has no command for: fallocate, and
//! fdatasync where the kernel refuses IOCB_CMD_FDSYNC), and the `uring`
//! engine's buffered writes made in the queue's thread.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::{EngineCompletion, HostOp, OpToken};
use crate::FileId;

/// Runs every op of `queued` in order with [`run_op`], queueing their
/// completions on `done`; `queued` is left empty (its capacity kept).
///
/// # Safety
///
/// As [`run_op`], for every op of `queued`.
pub(crate) unsafe fn run_all(
    files: &[Arc<File>],
    queued: &mut Vec<(OpToken, HostOp)>,
    done: &mut VecDeque<EngineCompletion>,
) {
    for (token, op) in queued.drain(..) {
        // SAFETY: the caller's promise, for this op.
        let result = unsafe { run_op(files, &op) };
        done.push_back(EngineCompletion { token, result });
    }
}

/// The descriptor of `file` among `files`.
pub(crate) fn fd_of(files: &[Arc<File>], file: FileId) -> io::Result<i32> {
    files
        .get(usize::from(file.0))
        .map(|f| f.as_raw_fd())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
}

/// Runs `op` on `files`: bytes moved, 0 for fdatasync/fallocate, or the
/// errno.
///
/// # Safety
///
/// The iovecs of `op` and the memory they point to must be valid (and, for
/// reads, writable and not otherwise accessed) for the whole call.
pub(crate) unsafe fn run_op(files: &[Arc<File>], op: &HostOp) -> io::Result<u64> {
    match *op {
        HostOp::Readv {
            file,
            offset,
            ref iov,
        } => {
            let fd = fd_of(files, file)?;
            let off = to_off(offset)?;
            // SAFETY: the caller keeps the iovecs and their memory valid
            // and writable for this call.
            let n = unsafe { libc::preadv(fd, iov.ptr, iov_count(iov.count)?, off) };
            cvt(n)
        }
        HostOp::Writev {
            file,
            offset,
            ref iov,
        } => {
            let fd = fd_of(files, file)?;
            let off = to_off(offset)?;
            // SAFETY: the caller keeps the iovecs and their memory valid
            // for this call.
            let n = unsafe { libc::pwritev(fd, iov.ptr, iov_count(iov.count)?, off) };
            cvt(n)
        }
        HostOp::Fdatasync { file } => fdatasync(fd_of(files, file)?),
        HostOp::PunchHole { file, offset, len } => fallocate(
            fd_of(files, file)?,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ),
        HostOp::ZeroRange { file, offset, len } => {
            fallocate(fd_of(files, file)?, libc::FALLOC_FL_ZERO_RANGE, offset, len)
        }
    }
}

/// fdatasync(`fd`).
pub(crate) fn fdatasync(fd: i32) -> io::Result<u64> {
    // SAFETY: plain syscall on a descriptor the caller keeps open.
    let r = unsafe { libc::fdatasync(fd) };
    cvt(r as isize)
}

fn iov_count(count: u32) -> io::Result<i32> {
    i32::try_from(count).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
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
    // SAFETY: plain syscall on a descriptor the caller keeps open; no
    // memory is passed.
    let r = unsafe { libc::fallocate(fd, mode, off, len) };
    cvt(r as isize)
}
