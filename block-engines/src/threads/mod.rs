//! The thread-pool engine (QEMU's aio=threads): every op runs as a
//! blocking syscall (preadv, pwritev, fdatasync, fallocate) on a worker of
//! a bounded pool the disk's queues share.
//!
//! Ops enter through [`Engine::push`], which hands them to the pool at
//! once (so a batch's first ops run while the rest are still being
//! planned); workers leave completions in this queue's sink, which
//! signals the queue's eventfd; [`Engine::reap`] takes them from there.
//! Nothing runs on the queue's own thread, so an allocating write that
//! blocks in the file system holds up one worker, never the queue.

use std::fs::File;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::{Engine, EngineCompletion, HostOp, OpToken};
use crate::error::BlockError;

mod pool;

use pool::{CompletionSink, Job};
pub use pool::{WorkerPool, DEFAULT_MAX_THREADS};

/// See the module docs.
pub struct ThreadsEngine {
    files: Arc<[Arc<File>]>,
    pool: Arc<WorkerPool>,
    sink: Arc<CompletionSink>,
    eventfd: Arc<EventFd>,
    /// Ops handed to the pool whose completion has not been reaped.
    outstanding: usize,
}

impl ThreadsEngine {
    /// An engine over `files` running its ops on `pool`, signalling
    /// `eventfd` when completions are ready.
    pub fn new(files: &[Arc<File>], eventfd: Arc<EventFd>, pool: Arc<WorkerPool>) -> Self {
        ThreadsEngine {
            files: files.iter().cloned().collect(),
            pool,
            sink: Arc::new(CompletionSink::new(eventfd.clone())),
            eventfd,
            outstanding: 0,
        }
    }
}

impl Engine for ThreadsEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        let job = Job {
            token,
            op,
            files: self.files.clone(),
            sink: self.sink.clone(),
        };
        self.outstanding += 1;
        if let Err(job) = self.pool.dispatch(job) {
            // No worker could be started: run it here rather than lose it.
            job.run();
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        // Every op went to the pool at push.
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        let n = self.sink.take(out);
        self.outstanding -= n;
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        if self.outstanding > 0 {
            let n = self.sink.wait(out);
            self.outstanding -= n;
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.outstanding
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }
}

impl Drop for ThreadsEngine {
    /// The executor reaps everything before dropping its engine; should a
    /// worker still hold an op, wait for it so its memory outlives it.
    fn drop(&mut self) {
        let mut sink = Vec::new();
        while self.outstanding > 0 {
            let n = self.sink.wait(&mut sink);
            self.outstanding -= n;
            sink.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_blocks::{BlockFile, ReadBuffers};
    use crate::FileId;
    use pool::IDLE_EXIT;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    fn engine(fx: &BlockFile, pool: &Arc<WorkerPool>) -> (ThreadsEngine, Arc<EventFd>) {
        let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let e = ThreadsEngine::new(std::slice::from_ref(&fx.file), efd.clone(), pool.clone());
        (e, efd)
    }

    #[test]
    fn reads_complete_once_each_on_several_workers() {
        let fx = BlockFile::new("threads-reads");
        let pool = Arc::new(WorkerPool::new(DEFAULT_MAX_THREADS));
        let (mut e, efd) = engine(&fx, &pool);
        let bufs = ReadBuffers::new();
        // Workers that finish hold on to their result while the sink is
        // locked, so every op needs a worker of its own: the pool must
        // start 16 rather than queue them behind one.
        let sink = e.sink.clone();
        let held = sink.lock();
        // SAFETY: `bufs` lives until every op is reaped below.
        unsafe { bufs.push_all(&mut e) };
        assert_eq!(pool.threads(), 16);
        drop(held);
        e.submit().unwrap();
        let mut out = Vec::new();
        while e.in_flight() > 0 {
            e.wait(&mut out).unwrap();
        }
        let mut tokens: Vec<u64> = out.iter().map(|c| c.token).collect();
        tokens.sort();
        assert_eq!(tokens, (0..16).collect::<Vec<_>>());
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
        bufs.assert_read(|_| true);
        assert!(efd.read().unwrap() >= 1, "completions signal the eventfd");
    }

    #[test]
    fn dropping_the_engine_waits_for_its_ops() {
        let fx = BlockFile::new("threads-drop");
        let pool = Arc::new(WorkerPool::new(4));
        let (mut e, _efd) = engine(&fx, &pool);
        let bufs = ReadBuffers::new();
        // SAFETY: `bufs` outlives the engine, whose drop waits for every op.
        unsafe { bufs.push_all(&mut e) };
        drop(e);
        bufs.assert_read(|_| true);
    }

    /// Workers sleep and wake thousands of times in bursts of 1-8 jobs;
    /// a wakeup miscounted (a job queued while every worker sleeps and
    /// none is signalled) would leave a job until a worker's idle timeout
    /// (10 s): a hang check, with a margin far above any run time.
    #[test]
    fn bursts_never_wait_for_an_idle_timeout() {
        let fx = BlockFile::new("threads-bursts");
        let pool = Arc::new(WorkerPool::new(4));
        let (mut e, _efd) = engine(&fx, &pool);
        let mut out = Vec::new();
        for burst in 0..2000u64 {
            let started = std::time::Instant::now();
            let n = burst % 8 + 1;
            for i in 0..n {
                let op = HostOp::Fdatasync { file: FileId(3) };
                // SAFETY: no memory involved.
                unsafe { e.push(burst << 8 | i, op).unwrap() };
            }
            e.submit().unwrap();
            out.clear();
            while out.len() < n as usize {
                e.wait(&mut out).unwrap();
            }
            assert!(
                started.elapsed() < IDLE_EXIT / 2,
                "burst {burst} waited {:?}",
                started.elapsed()
            );
            if burst % 500 == 0 {
                // Let every worker fall asleep between some bursts.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn errors_complete_like_results() {
        let fx = BlockFile::new("threads-err");
        let pool = Arc::new(WorkerPool::new(2));
        let (mut e, _efd) = engine(&fx, &pool);
        // SAFETY: no memory involved.
        unsafe { e.push(7, HostOp::Fdatasync { file: FileId(3) }).unwrap() };
        let mut out = Vec::new();
        e.wait(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, 7);
        assert_eq!(
            out[0].result.as_ref().unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        assert_eq!(e.in_flight(), 0);
    }
}
