//! The Linux native AIO engine (QEMU's aio=native): one AIO context per
//! queue through vmm-sys-util's `linux::aio`.
//!
//! Ops enter through [`Engine::push`]: reads and writes become
//! IOCB_CMD_PREADV/PWRITEV control blocks on the op's iovecs, a flush an
//! IOCB_CMD_FDSYNC (until the kernel refuses it once with EINVAL; from then
//! on an inline fdatasync). Linux AIO has no command for fallocate, so
//! discard and write-zeroes run inline at [`Engine::submit`], after the
//! asynchronous ops have been handed to the kernel. Every kernel completion
//! signals the queue's eventfd (IOCB_FLAG_RESFD); inline results are
//! queued here and signal it too, so the queue has one drain path.
//!
//! Submission: one `io_submit` per batch. EAGAIN (the context is full)
//! is handled by reaping and resubmitting; any other error fails the
//! control block the kernel refused (reported as its completion) and the
//! rest of the batch is submitted. The engine never puts more ops into the
//! kernel than the context was set up for.
//!
//! Without O_DIRECT the kernel runs AIO reads and writes synchronously
//! inside `io_submit`; with O_DIRECT `io_submit` still blocks while the
//! file system allocates blocks, which is why `engine=auto` only picks
//! this engine for images that are fully allocated.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use vmm_sys_util::aio::{
    IoContext, IoControlBlock, IoEvent, IOCB_CMD_FDSYNC, IOCB_CMD_PREADV, IOCB_CMD_PWRITEV,
    IOCB_FLAG_RESFD,
};
use vmm_sys_util::eventfd::EventFd;

use super::blocking::{fd_of, run_op};
use super::{Engine, EngineCompletion, HostOp, OpToken};
use crate::error::BlockError;

/// Ops a queue's context holds (the uring engine's SQ size).
pub const DEFAULT_DEPTH: u32 = 256;

/// How many times submission retries EAGAIN with nothing to reap.
const SUBMIT_RETRIES: u32 = 10_000;

/// Events read per `io_getevents`.
const EVENT_BATCH: usize = 64;

/// Whether this kernel lets us set up an AIO context (`Err` says why:
/// io_setup failing, typically `aio-max-nr` exhausted).
pub fn aio_support() -> Result<(), String> {
    IoContext::new(1)
        .map(drop)
        .map_err(|e| format!("io_setup failed: {e}"))
}

/// See the module docs.
pub struct AioEngine {
    ctx: IoContext,
    files: Vec<Arc<File>>,
    eventfd: Arc<EventFd>,
    depth: usize,
    /// Control blocks not yet accepted by the kernel.
    queued: VecDeque<IoControlBlock>,
    /// Ops run inline at the next submit (fallocate, fallback fdatasync).
    inline: Vec<(OpToken, HostOp)>,
    /// Ops the kernel accepted whose event has not been read.
    in_kernel: usize,
    done: VecDeque<EngineCompletion>,
    /// The kernel takes IOCB_CMD_FDSYNC (until it refuses one).
    fdsync_in_kernel: bool,
    events: Vec<IoEvent>,
    /// Injected results of the next `io_submit` calls (tests; see
    /// [`AioEngine::inject_submit_results`]).
    injected: VecDeque<i32>,
}

// SAFETY: the raw iovec pointers (inside queued control blocks and inline
// `HostOp`s) are only handed to the kernel by the thread that owns the
// engine; `Engine::push`'s contract keeps their memory valid until the
// completion is reaped, whichever thread that is.
unsafe impl Send for AioEngine {}

impl AioEngine {
    /// A context of `depth` events over `files`, completions signalling
    /// `eventfd`.
    pub fn new(files: &[Arc<File>], eventfd: Arc<EventFd>, depth: u32) -> Result<Self, BlockError> {
        let ctx = IoContext::new(depth).map_err(BlockError::AioSetup)?;
        Ok(AioEngine {
            ctx,
            files: files.to_vec(),
            eventfd,
            depth: depth as usize,
            queued: VecDeque::new(),
            inline: Vec::new(),
            in_kernel: 0,
            done: VecDeque::new(),
            fdsync_in_kernel: true,
            events: vec![IoEvent::default(); EVENT_BATCH],
            injected: VecDeque::new(),
        })
    }

    /// Fault injection for tests: the next `io_submit` calls take these
    /// results in order; an errno makes that call fail with it (nothing is
    /// submitted), 0 lets it run.
    #[doc(hidden)]
    pub fn inject_submit_results(&mut self, results: impl IntoIterator<Item = i32>) {
        self.injected.extend(results);
    }

    fn iocb(&self, token: OpToken, fd: i32, opcode: u32) -> IoControlBlock {
        IoControlBlock {
            aio_data: token,
            aio_lio_opcode: opcode as u16,
            aio_fildes: fd as u32,
            aio_flags: IOCB_FLAG_RESFD,
            aio_resfd: self.eventfd.as_raw_fd() as u32,
            ..Default::default()
        }
    }

    /// A control block for `op`, or `None` when `op` runs inline.
    fn to_iocb(&self, token: OpToken, op: &HostOp) -> io::Result<Option<IoControlBlock>> {
        let (file, opcode, offset, iov) = match *op {
            HostOp::Readv {
                file,
                offset,
                ref iov,
            } => (file, IOCB_CMD_PREADV, offset, iov),
            HostOp::Writev {
                file,
                offset,
                ref iov,
            } => (file, IOCB_CMD_PWRITEV, offset, iov),
            HostOp::Fdatasync { file } if self.fdsync_in_kernel => {
                return Ok(Some(self.iocb(
                    token,
                    fd_of(&self.files, file)?,
                    IOCB_CMD_FDSYNC,
                )));
            }
            _ => return Ok(None),
        };
        let mut cb = self.iocb(token, fd_of(&self.files, file)?, opcode);
        cb.aio_buf = iov.ptr as u64;
        cb.aio_nbytes = u64::from(iov.count);
        cb.aio_offset =
            i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(Some(cb))
    }

    fn complete(&mut self, token: OpToken, result: io::Result<u64>) {
        self.done.push_back(EngineCompletion { token, result });
    }

    /// `io_submit` of the queued control blocks (tests may make it fail).
    fn io_submit(&mut self) -> io::Result<usize> {
        if let Some(errno) = self.injected.pop_front() {
            if errno != 0 {
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        let room = self.depth.saturating_sub(self.in_kernel);
        let front = self.queued.make_contiguous();
        let n = front.len().min(room);
        let cbs: Vec<&mut IoControlBlock> = front[..n].iter_mut().collect();
        // The kernel reads the control blocks and iovec arrays during this
        // call only; the buffers they point to stay valid until reaped by
        // `Engine::push`'s contract.
        let t = super::submit_stats::start();
        let r = self.ctx.submit(&cbs);
        super::submit_stats::record(t, n);
        r
    }

    /// Hands every queued control block to the kernel; see the module docs
    /// for how errors are handled. Never leaves one queued.
    fn submit_queued(&mut self) -> Result<(), BlockError> {
        let mut retries = 0;
        while !self.queued.is_empty() {
            if self.in_kernel >= self.depth {
                self.wait_or_fail_queued()?;
                continue;
            }
            match self.io_submit() {
                Ok(n) if n > 0 => {
                    let n = n.min(self.queued.len());
                    self.queued.drain(..n);
                    self.in_kernel += n;
                    retries = 0;
                }
                Ok(_) => retries += 1,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    retries += 1;
                    if self.in_kernel > 0 {
                        self.wait_or_fail_queued()?;
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(e) => self.refuse_front(e),
            }
            if retries > SUBMIT_RETRIES {
                let e = io::Error::from_raw_os_error(libc::EAGAIN);
                self.refuse_front(e);
                retries = 0;
            }
        }
        Ok(())
    }

    /// Waits for completions to make room; if even that fails, the queued
    /// control blocks can never be submitted: each completes with the
    /// error (so no request waits forever), and the error is returned.
    fn wait_or_fail_queued(&mut self) -> Result<(), BlockError> {
        let r = self.wait_events();
        if let Err(BlockError::AioWait(e)) = &r {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            while let Some(cb) = self.queued.pop_front() {
                self.complete(cb.aio_data, Err(io::Error::from_raw_os_error(errno)));
            }
            let _ = self.eventfd.write(1);
        }
        r
    }

    /// The kernel refused the first queued control block with `e`: an
    /// FDSYNC refused with EINVAL moves to inline fdatasync (for this one
    /// and every later flush); anything else completes with the error.
    fn refuse_front(&mut self, e: io::Error) {
        let Some(cb) = self.queued.pop_front() else {
            return;
        };
        if u32::from(cb.aio_lio_opcode) == IOCB_CMD_FDSYNC && e.raw_os_error() == Some(libc::EINVAL)
        {
            if self.fdsync_in_kernel {
                log::info!("aio engine: the kernel refuses IOCB_CMD_FDSYNC; flushes run inline");
            }
            self.fdsync_in_kernel = false;
            let result = super::blocking::fdatasync(cb.aio_fildes as i32);
            self.complete(cb.aio_data, result);
            return;
        }
        self.complete(cb.aio_data, Err(e));
    }

    /// Runs the inline ops (after the asynchronous ones went to the kernel).
    fn run_inline(&mut self) {
        for (token, op) in std::mem::take(&mut self.inline) {
            // SAFETY: `push`'s contract keeps any memory of `op` valid until
            // it is reaped; inline ops here carry none (fallocate, fdatasync).
            let result = unsafe { run_op(&self.files, &op) };
            self.complete(token, result);
        }
    }

    /// Reads every available event without blocking.
    fn reap_events(&mut self) {
        while self.in_kernel > 0 {
            let n = match self.ctx.get_events(0, &mut self.events, None) {
                Ok(n) => n,
                Err(_) => return,
            };
            self.take_events(n);
            if n < self.events.len() {
                return;
            }
        }
    }

    /// Blocks until the kernel completes at least one op, then reaps.
    fn wait_events(&mut self) -> Result<(), BlockError> {
        loop {
            match self.ctx.get_events(1, &mut self.events, None) {
                Ok(n) => {
                    self.take_events(n);
                    self.reap_events();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(BlockError::AioWait(e)),
            }
        }
    }

    fn take_events(&mut self, n: usize) {
        for i in 0..n.min(self.events.len()) {
            let ev = self.events[i];
            let result = if ev.res < 0 {
                Err(io::Error::from_raw_os_error(-ev.res as i32))
            } else {
                Ok(ev.res as u64)
            };
            self.complete(ev.data, result);
        }
        self.in_kernel = self.in_kernel.saturating_sub(n);
    }
}

impl Engine for AioEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        match self.to_iocb(token, &op) {
            Ok(Some(cb)) => {
                if self.queued.len() >= self.depth {
                    self.submit_queued()?;
                }
                self.queued.push_back(cb);
            }
            Ok(None) => self.inline.push((token, op)),
            Err(e) => {
                self.complete(token, Err(e));
                let _ = self.eventfd.write(1);
            }
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        let before = self.done.len();
        let r = self.submit_queued();
        self.run_inline();
        if self.done.len() > before {
            self.eventfd.write(1).map_err(BlockError::EventFd)?;
        }
        r
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        self.reap_events();
        out.extend(self.done.drain(..));
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        self.submit()?;
        self.reap_events();
        if self.done.is_empty() && self.in_kernel > 0 {
            self.wait_events()?;
        }
        out.extend(self.done.drain(..));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.inline.len() + self.in_kernel + self.done.len()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }
}

impl Drop for AioEngine {
    /// The executor reaps everything before dropping its engine; should
    /// the kernel still hold ops, wait for them before the context (and
    /// the memory they use) goes away.
    fn drop(&mut self) {
        self.queued.clear();
        while self.in_kernel > 0 {
            if self.wait_events().is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_blocks::{BlockFile, ReadBuffers};
    use crate::FileId;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    fn engine(fx: &BlockFile, depth: u32) -> (AioEngine, Arc<EventFd>) {
        let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let e = AioEngine::new(std::slice::from_ref(&fx.file), efd.clone(), depth).unwrap();
        (e, efd)
    }

    /// Reads the 16 blocks through `e`; returns completions in token order.
    fn read_all(e: &mut AioEngine) -> Vec<EngineCompletion> {
        let bufs = ReadBuffers::new();
        // SAFETY: `bufs` lives until all 16 are reaped below.
        unsafe { bufs.push_all(e) };
        e.submit().unwrap();
        let mut out = Vec::new();
        while e.in_flight() > 0 {
            e.wait(&mut out).unwrap();
        }
        out.sort_by_key(|c| c.token);
        bufs.assert_read(|i| out[i].result.is_ok());
        out
    }

    #[test]
    fn more_ops_than_the_context_holds_complete_once() {
        let fx = BlockFile::new("aio-depth");
        let (mut e, efd) = engine(&fx, 4);
        let out = read_all(&mut e);
        assert_eq!(out.len(), 16);
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
        assert!(efd.read().unwrap() >= 1, "RESFD signals the eventfd");
    }

    #[test]
    fn eagain_and_eintr_from_io_submit_are_retried() {
        let fx = BlockFile::new("aio-eagain");
        let (mut e, _efd) = engine(&fx, 64);
        e.inject_submit_results([libc::EAGAIN, libc::EINTR, libc::EAGAIN]);
        let out = read_all(&mut e);
        assert!(e.injected.is_empty(), "every injected error was hit");
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
    }

    #[test]
    fn a_refused_control_block_fails_alone() {
        let fx = BlockFile::new("aio-refused");
        let (mut e, _efd) = engine(&fx, 64);
        e.inject_submit_results([libc::EBADF]);
        let out = read_all(&mut e);
        assert_eq!(out.len(), 16);
        let failed: Vec<u64> = out
            .iter()
            .filter(|c| c.result.is_err())
            .map(|c| c.token)
            .collect();
        assert_eq!(failed, vec![0]);
        assert_eq!(
            out[0].result.as_ref().unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
    }

    #[test]
    fn fdsync_refused_with_einval_runs_inline_from_then_on() {
        let fx = BlockFile::new("aio-fdsync");
        let (mut e, _efd) = engine(&fx, 8);
        e.inject_submit_results([libc::EINVAL]);
        // SAFETY: no memory involved.
        unsafe { e.push(1, HostOp::Fdatasync { file: FileId(0) }) }.unwrap();
        let mut out = Vec::new();
        e.wait(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(matches!(out[0].result, Ok(0)), "{:?}", out[0].result);
        assert!(!e.fdsync_in_kernel);
        // SAFETY: no memory involved.
        unsafe { e.push(2, HostOp::Fdatasync { file: FileId(0) }) }.unwrap();
        let zero = HostOp::ZeroRange {
            file: FileId(0),
            offset: 0,
            len: 4096,
        };
        // SAFETY: no memory involved.
        unsafe { e.push(3, zero) }.unwrap();
        assert_eq!(e.queued.len(), 0, "both run inline");
        out.clear();
        e.wait(&mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn dropping_the_engine_waits_for_the_kernel() {
        let fx = BlockFile::new("aio-drop");
        let (mut e, _efd) = engine(&fx, 64);
        let bufs = ReadBuffers::new();
        // SAFETY: `bufs` outlives the engine, whose drop waits for every op.
        unsafe { bufs.push_all(&mut e) };
        e.submit().unwrap();
        drop(e);
        bufs.assert_read(|_| true);
    }
}
