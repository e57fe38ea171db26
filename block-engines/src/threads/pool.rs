//! A bounded pool of worker threads shared by the queues of one disk
//! (QEMU's aio=threads pool: threads start on demand, at most
//! [`DEFAULT_MAX_THREADS`], and leave after [`IDLE_EXIT`] without work).
//!
//! Jobs enter through [`WorkerPool::dispatch`]; a worker runs the job's
//! blocking syscall and hands the result to the job's [`CompletionSink`],
//! which signals its queue's eventfd. Dropping the pool lets the workers
//! finish every queued job, then joins them.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use crate::blocking::run_op;
use crate::{EngineCompletion, HostOp, OpToken};

/// Workers per disk (QEMU's thread-pool-max default).
pub const DEFAULT_MAX_THREADS: usize = 64;

/// A worker with nothing to do for this long exits (QEMU: 10 s).
pub const IDLE_EXIT: Duration = Duration::from_secs(10);

/// One operation for a worker.
pub(super) struct Job {
    pub token: OpToken,
    pub op: HostOp,
    pub files: Arc<[Arc<File>]>,
    pub sink: Arc<CompletionSink>,
}

// SAFETY: the raw iovec pointers inside `op` are only dereferenced by the
// worker's syscall; the `Engine::push` contract keeps their memory valid
// until the completion is reaped, which happens after the worker has handed
// the result to the sink, whichever thread runs it.
unsafe impl Send for Job {}

impl Job {
    /// Runs the op and delivers its completion.
    pub fn run(self) {
        // SAFETY: see `unsafe impl Send for Job`: the memory stays valid
        // until the completion delivered below is reaped.
        let result = unsafe { run_op(&self.files, &self.op) };
        self.sink.complete(EngineCompletion {
            token: self.token,
            result,
        });
    }
}

/// Where the workers leave one queue's completions.
pub(super) struct CompletionSink {
    state: Mutex<SinkState>,
    ready: Condvar,
    eventfd: Arc<EventFd>,
}

#[derive(Default)]
pub(super) struct SinkState {
    pub done: Vec<EngineCompletion>,
    /// The queue's thread sleeps in [`CompletionSink::wait`].
    waiting: bool,
}

impl CompletionSink {
    pub fn new(eventfd: Arc<EventFd>) -> Self {
        CompletionSink {
            state: Mutex::new(SinkState::default()),
            ready: Condvar::new(),
            eventfd,
        }
    }

    /// Adds a completion. The eventfd is written only when the list was
    /// empty: the queue clears the eventfd before taking the whole list,
    /// so one signal covers every completion added before that take.
    pub fn complete(&self, c: EngineCompletion) {
        let (was_empty, waiting) = {
            let mut st = self.lock();
            let was_empty = st.done.is_empty();
            st.done.push(c);
            (was_empty, st.waiting)
        };
        if waiting {
            self.ready.notify_one();
        }
        if was_empty {
            // Fails only on counter overflow, which a pending signal covers.
            let _ = self.eventfd.write(1);
        }
    }

    /// Moves every completion to `out`; returns how many.
    pub fn take(&self, out: &mut Vec<EngineCompletion>) -> usize {
        let mut st = self.lock();
        let n = st.done.len();
        out.append(&mut st.done);
        n
    }

    /// Blocks until a completion is there, then moves all to `out`.
    pub fn wait(&self, out: &mut Vec<EngineCompletion>) -> usize {
        let mut st = self.lock();
        while st.done.is_empty() {
            st.waiting = true;
            st = self.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting = false;
        let n = st.done.len();
        out.append(&mut st.done);
        n
    }

    /// A poisoned lock only means a worker panicked; the list is intact.
    pub(super) fn lock(&self) -> MutexGuard<'_, SinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// See the module docs.
pub struct WorkerPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    state: Mutex<PoolState>,
    work: Condvar,
    max_threads: usize,
}

#[derive(Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Workers waiting on `work` (counted before they wait, uncounted
    /// when they wake, whatever woke them).
    sleeping: usize,
    /// Wakeups sent and not yet taken by a worker: a sleeping worker that
    /// has been signalled will look at the queue, so a job needs another
    /// wakeup only while the queue holds more jobs than this.
    signalled: usize,
    shutdown: bool,
    handles: Vec<JoinHandle<()>>,
}

impl PoolShared {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl WorkerPool {
    /// A pool of at most `max_threads` workers (none started yet).
    pub fn new(max_threads: usize) -> Self {
        WorkerPool {
            shared: Arc::new(PoolShared {
                state: Mutex::new(PoolState::default()),
                work: Condvar::new(),
                max_threads: max_threads.max(1),
            }),
        }
    }

    /// Workers currently alive.
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }

    /// Queues `job`, starting a worker when more jobs wait than workers
    /// idle. Gives the job back when no worker exists and none can be
    /// started (the caller then runs it itself).
    pub(super) fn dispatch(&self, job: Job) -> Result<(), Job> {
        let mut st = self.shared.lock();
        st.jobs.push_back(job);
        let idle = st.sleeping.saturating_sub(st.signalled);
        let spawn = st.jobs.len() > st.signalled + idle && st.threads < self.shared.max_threads;
        if spawn {
            st.threads += 1;
            st.handles.retain(|h| !h.is_finished());
            let shared = self.shared.clone();
            match std::thread::Builder::new()
                .name("blk-worker".into())
                .spawn(move || worker(shared))
            {
                Ok(h) => st.handles.push(h),
                Err(e) => {
                    st.threads -= 1;
                    log::warn!("block thread pool: cannot start a worker ({e})");
                    if st.threads == 0 {
                        return st.jobs.pop_back().map_or(Ok(()), Err);
                    }
                }
            }
        }
        // A busy worker looks at the queue before it sleeps (under the
        // lock), so only a sleeping one needs waking, and only when the
        // workers already signalled are fewer than the jobs waiting: no
        // futex call per job while every worker is busy or on its way
        // (each wake is a syscall, and 64 woken workers fighting for this
        // lock cost 4 futex calls per 4 KiB read on reads that need no
        // device I/O).
        let wake = idle > 0 && st.jobs.len() > st.signalled;
        if wake {
            st.signalled += 1;
        }
        drop(st);
        if wake {
            self.shared.work.notify_one();
        }
        Ok(())
    }
}

fn worker(shared: Arc<PoolShared>) {
    let mut st = shared.lock();
    loop {
        if let Some(job) = st.jobs.pop_front() {
            drop(st);
            job.run();
            st = shared.lock();
            continue;
        }
        if st.shutdown {
            break;
        }
        st.sleeping += 1;
        // One wait per loop turn (not `wait_timeout_while`, which would
        // sleep again after a wakeup whose job another worker took, and
        // leave `signalled` counting a wakeup nobody is still on).
        let (guard, timeout) = shared
            .work
            .wait_timeout(st, IDLE_EXIT)
            .unwrap_or_else(|p| p.into_inner());
        st = guard;
        st.sleeping -= 1;
        // Whether a signal or a job already queued woke this worker, one
        // wakeup fewer is on its way (never below zero: a timed-out or
        // spuriously woken worker may take one meant for another, which
        // only makes `dispatch` send one more).
        st.signalled = st.signalled.saturating_sub(1);
        if timeout.timed_out() && st.jobs.is_empty() {
            break;
        }
    }
    st.threads -= 1;
}

impl Drop for WorkerPool {
    /// Workers finish the queued jobs, then exit; waits for all of them.
    fn drop(&mut self) {
        let handles = {
            let mut st = self.shared.lock();
            st.shutdown = true;
            std::mem::take(&mut st.handles)
        };
        self.shared.work.notify_all();
        for h in handles {
            let _ = h.join();
        }
    }
}
