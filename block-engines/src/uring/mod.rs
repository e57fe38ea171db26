//! The io_uring engine: one ring per queue, one dup'd descriptor per image
//! file registered as a fixed file, and the queue's eventfd registered for
//! completion notification. Where the kernel allows (6.1+) the ring has a
//! single issuer, the thread that first uses the engine, and completions
//! are posted when that thread reaps (`setup`: deferred task running).
//!
//! Ops enter through [`Engine::push`] as SQEs (tagged with the op token);
//! [`Engine::submit`] hands the rest to the kernel. A batch goes in a few
//! `io_uring_enter` calls, not one: `push` submits early while few ops
//! are in the kernel, so the first requests reach the device while the
//! rest are still being built, and never more at once than the kernel
//! takes in about [`SUBMIT_BUDGET`] (see `should_submit_early`).
//! CQEs leave through [`Engine::reap`] as [`EngineCompletion`]s.
//!
//! Once the caller allows it ([`Engine::allow_writes_at_submit`]: the
//! virtio-blk queue worker, which then submits writes one at a time),
//! buffered writes that io_uring would hand to an io-wq thread anyway (on
//! most file systems) are made with `pwritev` in the queue's thread at
//! [`Engine::submit`], after the ring's ops have gone to the kernel
//! ([`inline_writes`] says which files and why); their completions wait
//! in the same `done` queue as the CQEs'.
//!
//! The engine never has more ops in the kernel than the CQ can hold, so
//! completions are never dropped even without `IORING_FEAT_NODROP`; an
//! overflowed CQ (possible only with NODROP) is flushed while reaping.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, squeue, IoUring};
use vmm_sys_util::eventfd::EventFd;

use super::{Engine, EngineCompletion, HostOp, OpToken};
use crate::error::BlockError;

mod inline_writes;
mod setup;
mod sqe;

use setup::TaskRun;

/// SQ entries of a queue's ring (the CQ has twice as many).
pub const DEFAULT_ENTRIES: u32 = 256;

/// `io_uring_enter` flag: wait for / flush completions (not re-exported
/// by the io-uring crate).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// See [`UringEngine::should_submit_early`]: queued SQEs are submitted
/// once they number at least 1/`EARLY_SUBMIT_DIVISOR` of the ops already
/// in the kernel.
const EARLY_SUBMIT_DIVISOR: usize = 2;

/// How long one `io_uring_enter` should take at most, roughly: the
/// kernel issues each SQE inline (2-3 us for a 4 KiB O_DIRECT write over
/// written blocks here, 10-15 us into fallocated, unwritten extents), so
/// a chunk of 64 held the queue's thread for 100-400 us; the chunk is cut
/// to what fits this budget at the cost per entry measured so far.
const SUBMIT_BUDGET: Duration = Duration::from_micros(25);

/// The cost per SQE assumed before the first measurement.
const INITIAL_NS_PER_ENTRY: u64 = 3_000;

/// How many times submission retries EAGAIN/EBUSY before giving up.
const SUBMIT_RETRIES: u32 = 10_000;

/// See the module docs.
pub struct UringEngine {
    ring: IoUring<squeue::Entry, cqueue::Entry>,
    /// Dup'd descriptors, registered as fixed files 0..n (kept open for as
    /// long as the ring may use them); the inline writes use them too.
    files: Vec<Arc<File>>,
    /// Per file: its writes are made in this thread (`inline_writes`)...
    inline_write: Vec<bool>,
    /// ...once the caller allowed it (`Engine::allow_writes_at_submit`).
    inline_allowed: bool,
    /// Such writes pushed and not yet made (at `submit`).
    inline_queued: Vec<(OpToken, HostOp)>,
    eventfd: Arc<EventFd>,
    /// Tokens of SQEs pushed to the SQ and not yet consumed by the kernel.
    unsubmitted: VecDeque<OpToken>,
    /// Ops in the ring (queued or in the kernel) whose CQE we have not read.
    in_ring: usize,
    /// Completions read from the CQ (or made up) and not yet handed out.
    done: VecDeque<EngineCompletion>,
    /// Set after a fatal submit error: the SQ is never entered again.
    broken: bool,
    /// Moving average of the wall time one SQE costs inside
    /// `io_uring_enter` (ns), which sizes the submit chunks.
    ns_per_entry: u64,
    /// Every SQE of the last submitting enter had completed by the time
    /// the call returned (reads of holes and unwritten extents: no device
    /// I/O), so submitting early would keep nothing busy.
    last_enter_inline: bool,
    /// How the ring runs the task work that posts completions (`setup`).
    task_run: TaskRun,
    /// The ring is still disabled; the first push, submit, reap or wait
    /// enables it on its thread, which becomes its single issuer.
    enable_on_first_use: bool,
    /// Injected results of the next submissions, front first: an errno
    /// fails that enter, 0 lets it run (tests; see
    /// [`UringEngine::inject_submit_results`]).
    injected: VecDeque<i32>,
}

impl UringEngine {
    /// A ring with `entries` SQ entries over dup'd copies of `files`,
    /// signalling `eventfd` on completions.
    pub fn new(
        files: &[Arc<File>],
        eventfd: Arc<EventFd>,
        entries: u32,
    ) -> Result<Self, BlockError> {
        let built = setup::build_ring(files, &eventfd, entries)?;
        let inline_write = inline_writes::inline_write_files(&built.files);
        Ok(UringEngine {
            ring: built.ring,
            files: built.files.into_iter().map(Arc::new).collect(),
            inline_write,
            inline_allowed: false,
            inline_queued: Vec::new(),
            task_run: built.task_run,
            enable_on_first_use: built.enable_on_first_use,
            eventfd,
            unsubmitted: VecDeque::new(),
            in_ring: 0,
            done: VecDeque::new(),
            broken: false,
            ns_per_entry: INITIAL_NS_PER_ENTRY,
            last_enter_inline: false,
            injected: VecDeque::new(),
        })
    }

    /// Whether the ring runs task work cooperatively or deferred, not
    /// by interrupting the thread (see `setup`).
    pub fn runs_task_work_cooperatively(&self) -> bool {
        self.task_run != TaskRun::Plain
    }

    /// Whether completions are posted only when the issuer reaps (see
    /// `setup`: deferred task running).
    pub fn defers_task_work(&self) -> bool {
        self.task_run == TaskRun::Deferred
    }

    /// Enables a ring built disabled, making this thread its issuer.
    /// Should the kernel refuse, every later enter fails and the ops
    /// complete with that error, as after any fatal submit error.
    fn enable_here(&mut self) {
        if !self.enable_on_first_use {
            return;
        }
        self.enable_on_first_use = false;
        if let Err(e) = setup::enable(&self.ring) {
            log::error!("io_uring: cannot enable the queue's ring: {e}");
        }
    }

    /// Whether this engine makes `op` in its own thread.
    fn is_inline(&self, op: &HostOp) -> bool {
        match op {
            HostOp::Writev { file, .. } if self.inline_allowed => self
                .inline_write
                .get(usize::from(file.0))
                .copied()
                .unwrap_or(false),
            _ => false,
        }
    }

    /// Makes the queued inline writes (module docs) and signals the
    /// eventfd when any completed, as the ring does for its CQEs: one
    /// write per submit, kept because not every submit is followed by a
    /// reap (the executor submits from inside its own reap: parked
    /// writes, commits), and a completion nobody is told of would leave
    /// the queue asleep.
    fn run_inline(&mut self) -> Result<(), BlockError> {
        if self.inline_queued.is_empty() {
            return Ok(());
        }
        // SAFETY: `push`'s contract keeps the iovecs and their memory
        // valid until each op is reaped, which is after this call.
        unsafe { crate::blocking::run_all(&self.files, &mut self.inline_queued, &mut self.done) };
        self.eventfd.write(1).map_err(BlockError::EventFd)
    }

    fn cq_capacity(&mut self) -> usize {
        self.ring.completion().capacity()
    }

    /// Moves every CQE to `done`, first running the task work that posts
    /// finished ops' CQEs when the kernel flags some as pending (see
    /// `setup`: cooperative task running), and flushing an overflowed CQ.
    fn reap_cq(&mut self) {
        if self.ring.submission().taskrun() {
            // SAFETY: to_submit 0, min_complete 0 and no argument: the
            // call only runs this thread's pending task work.
            let _ = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
            };
        }
        loop {
            let mut cq = self.ring.completion();
            cq.sync();
            for cqe in &mut cq {
                let res = cqe.result();
                let result = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(res as u64)
                };
                self.done.push_back(EngineCompletion {
                    token: cqe.user_data(),
                    result,
                });
                self.in_ring = self.in_ring.saturating_sub(1);
            }
            drop(cq);
            if !self.ring.submission().cq_overflow() {
                return;
            }
            // Kernel-buffered CQEs (IORING_FEAT_NODROP) move to the CQ only
            // on an enter with GETEVENTS; submit nothing here.
            // SAFETY: to_submit 0, min_complete 0 and no argument: the
            // kernel only flushes its overflow list.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
            };
            if r.is_err() {
                return;
            }
        }
    }

    /// Submits the SQ until it is empty, retrying EINTR/EAGAIN/EBUSY (after
    /// reaping, so the kernel has room). A fatal error fails every
    /// unsubmitted op and breaks the ring.
    fn submit_all(&mut self) -> Result<(), BlockError> {
        let mut retries = 0;
        while !self.unsubmitted.is_empty() {
            if self.broken {
                return Err(BlockError::UringSubmit(io::Error::from_raw_os_error(
                    libc::EBADFD,
                )));
            }
            match self.enter_submit() {
                Ok(n) => {
                    let n = n.min(self.unsubmitted.len());
                    self.unsubmitted.drain(..n);
                    if n == 0 {
                        retries += 1;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    retries += 1;
                    let before = self.done.len();
                    self.reap_cq();
                    if self.done.len() == before {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    self.fail_unsubmitted(&e);
                    return Err(BlockError::UringSubmit(e));
                }
            }
            if retries > SUBMIT_RETRIES {
                let e = io::Error::from_raw_os_error(libc::EAGAIN);
                self.fail_unsubmitted(&e);
                return Err(BlockError::UringSubmit(e));
            }
        }
        Ok(())
    }

    /// Fault injection for tests: the next submitting `io_uring_enter`
    /// calls take these results in order; an errno makes that call fail
    /// with it (nothing is consumed from the SQ), 0 lets it run.
    #[doc(hidden)]
    pub fn inject_submit_results(&mut self, results: impl IntoIterator<Item = i32>) {
        self.injected.extend(results);
    }

    /// `io_uring_enter` for the queued SQEs (tests may make it fail).
    fn enter_submit(&mut self) -> io::Result<usize> {
        match self.injected.pop_front() {
            Some(errno) if errno != 0 => Err(io::Error::from_raw_os_error(errno)),
            _ => {
                let entries = self.unsubmitted.len();
                let posted_before = self.ring.completion().len();
                let t = Instant::now();
                let r = self.ring.submit();
                let took = t.elapsed();
                super::submit_stats::record_duration(took, entries);
                if let Ok(n) = r {
                    self.learn_cost(took, n);
                    let posted = self.ring.completion().len().saturating_sub(posted_before);
                    self.last_enter_inline = n > 0 && posted >= n;
                }
                r
            }
        }
    }

    /// Folds one enter that consumed `n` SQEs in `took` into
    /// `ns_per_entry` (weight 1/8).
    fn learn_cost(&mut self, took: Duration, n: usize) {
        if n == 0 {
            return;
        }
        let sample = u64::try_from(took.as_nanos() / n as u128).unwrap_or(u64::MAX);
        self.ns_per_entry = (self.ns_per_entry.saturating_mul(7).saturating_add(sample) / 8).max(1);
    }

    /// After a fatal submit error: the ring is never entered with SQEs again,
    /// so the queued ones will never run; complete them with the error.
    fn fail_unsubmitted(&mut self, e: &io::Error) {
        self.broken = true;
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        for token in self.unsubmitted.drain(..) {
            self.in_ring = self.in_ring.saturating_sub(1);
            self.done.push_back(EngineCompletion {
                token,
                result: Err(io::Error::from_raw_os_error(errno)),
            });
        }
        let _ = self.eventfd.write(1);
    }

    /// Whether the SQEs queued so far should go to the kernel now rather
    /// than at the end of the batch: while few ops are in the kernel the
    /// device may be idle, so each new op goes at once; the fuller the
    /// kernel, the larger the chunk (at most half of what is in flight),
    /// but never more than `chunk_limit`: the time inside one enter grows
    /// with its chunk (about 2.5 us per 4 KiB write, 10-15 us into
    /// unwritten extents), and a 64-entry chunk held the queue's thread
    /// for 100-400 us (p99 of the engine x preallocation matrix).
    ///
    /// Why: one `io_uring_enter` for a whole batch builds every request
    /// under one block plug before the first reaches the device, and the
    /// batch then completes together: a convoy that cost 15-20 % of
    /// 4 KiB QD 32 random-read throughput on this project's machine
    /// (docs/performance.md, "What explains the limits"). fio submits one
    /// request per enter.
    ///
    /// When the kernel completed every op of the last enter inside the
    /// call (reads of unwritten extents or holes need no device I/O), an
    /// early enter keeps no device busy and only adds a syscall: the
    /// chunk is then what fits the budget (`budget_chunk`).
    fn should_submit_early(&self) -> bool {
        let queued = self.unsubmitted.len();
        let in_kernel = self.in_ring.saturating_sub(queued);
        queued >= early_submit_threshold(in_kernel, self.ns_per_entry, self.last_enter_inline)
    }

    /// Blocks until the kernel has completed at least one op.
    fn wait_cqe(&mut self) -> Result<(), BlockError> {
        loop {
            // SAFETY: to_submit 0 (nothing is consumed from the SQ, which
            // is empty anyway after `submit_all`), wait for one CQE.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
            };
            match r {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) => {
                    if !self.ring.completion().is_empty() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(BlockError::UringSubmit(e)),
            }
        }
    }
}

/// How many queued SQEs make `push` submit, with `in_kernel` ops already
/// in the kernel and the measured cost `ns_per_entry`: half of what is in
/// the kernel, at least one, at most what fits [`SUBMIT_BUDGET`]; when
/// the last enter completed all its ops inline, what fits the budget.
fn early_submit_threshold(in_kernel: usize, ns_per_entry: u64, inline: bool) -> usize {
    let chunk = budget_chunk(ns_per_entry);
    if inline {
        return chunk;
    }
    (in_kernel / EARLY_SUBMIT_DIVISOR).clamp(1, chunk)
}

/// How many SQEs fit [`SUBMIT_BUDGET`] at `ns_per_entry` each (at least 1).
fn budget_chunk(ns_per_entry: u64) -> usize {
    let fits = SUBMIT_BUDGET.as_nanos() as u64 / ns_per_entry.max(1);
    usize::try_from(fits).unwrap_or(usize::MAX).max(1)
}

impl Engine for UringEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        self.enable_here();
        if self.broken {
            return Err(BlockError::UringSubmit(io::Error::from_raw_os_error(
                libc::EBADFD,
            )));
        }
        if self.is_inline(&op) {
            self.inline_queued.push((token, op));
            return Ok(());
        }
        // Never more ops in the ring than the CQ holds (no lost CQEs).
        while self.in_ring >= self.cq_capacity() {
            self.submit_all()?;
            self.reap_cq();
            if self.in_ring >= self.cq_capacity() {
                self.wait_cqe()?;
                self.reap_cq();
            }
        }
        let entry = sqe::to_sqe(&op).user_data(token);
        loop {
            // SAFETY: the caller's contract (`Engine::push`) keeps the
            // iovecs and their memory valid until this token's CQE is
            // reaped; the fixed-file index refers to a descriptor we keep
            // open for the ring's lifetime.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                break;
            }
            // SQ full: hand it to the kernel and continue.
            self.submit_all()?;
        }
        self.unsubmitted.push_back(token);
        self.in_ring += 1;
        if self.should_submit_early() {
            // This op is pushed: it must not also fail through our return
            // value. A submit error has already completed every
            // unsubmitted op (this one included) with the error.
            let _ = self.submit_all();
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        self.enable_here();
        // The ring's ops first, so they run while this thread writes.
        let ring = self.submit_all();
        let inline = self.run_inline();
        ring.and(inline)
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        self.enable_here();
        self.reap_cq();
        out.extend(self.done.drain(..));
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        self.enable_here();
        self.submit_all()?;
        self.run_inline()?;
        self.reap_cq();
        if self.done.is_empty() && self.in_ring > 0 {
            self.wait_cqe()?;
            self.reap_cq();
        }
        out.extend(self.done.drain(..));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_ring + self.inline_queued.len() + self.done.len()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }

    fn writes_at_submit(&self) -> bool {
        self.inline_allowed && self.inline_write.contains(&true)
    }

    fn allow_writes_at_submit(&mut self) {
        self.inline_allowed = true;
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The executor reaps every op before dropping its engine; should
        // anything still be in the kernel, let it finish before the ring
        // and the dup'd descriptors go away.
        let mut sink = Vec::new();
        while self.in_ring > 0 && !self.broken {
            if self.wait(&mut sink).is_err() {
                break;
            }
            sink.clear();
        }
        // Ring teardown is asynchronous in the kernel; unregistering drops
        // its references to our descriptors now. A ring with a single
        // issuer refuses this (EEXIST) from any other thread (an image
        // switch drops a worker's old queue on the control thread): the
        // descriptors then close with the kernel's teardown, 30-55 ms
        // later here, and the image's lock is released at close all the
        // same, by the lock guard (`block::lock`).
        let _ = self.ring.submitter().unregister_files();
        let _ = self.ring.submitter().unregister_eventfd();
    }
}

// SAFETY: the ring and the raw pointers inside queued SQEs are only used by
// the thread that owns the engine; `push`'s contract keeps the memory valid
// whichever thread that is.
unsafe impl Send for UringEngine {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileId;
    use crate::RawIovecs;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    fn engine(entries: u32) -> Option<(UringEngine, std::path::PathBuf)> {
        if !testkit::available("io_uring", crate::probe::uring_support()) {
            return None;
        }
        // A file per call: the tests run in parallel and remove theirs.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("uring-unit-{}-{entries}-{n}", std::process::id()));
        std::fs::write(&path, vec![7u8; 65536]).unwrap();
        let f = Arc::new(File::options().read(true).write(true).open(&path).unwrap());
        let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        Some((UringEngine::new(&[f], efd, entries).unwrap(), path))
    }

    /// Pushes one read of block `i` (4 KiB at `i * 4096`) into `iovs[i]`
    /// for every iovec, then submits them.
    ///
    /// # Safety
    /// `iovs` and the memory they point to must stay valid until every
    /// read is reaped.
    unsafe fn push_reads(e: &mut UringEngine, iovs: &[libc::iovec]) {
        for (i, iov) in iovs.iter().enumerate() {
            let op = HostOp::Readv {
                file: FileId(0),
                offset: i as u64 * 4096,
                iov: RawIovecs { ptr: iov, count: 1 },
            };
            // SAFETY: the caller keeps `iovs` and their memory alive until
            // the reads are reaped.
            unsafe { e.push(i as u64, op).unwrap() };
        }
        e.submit().unwrap();
    }

    /// Reads 16 blocks of 4 KiB through `e`, returning their completions.
    fn read_all(e: &mut UringEngine) -> Vec<EngineCompletion> {
        let mut bufs = vec![vec![0u8; 4096]; 16];
        let iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: `iovs` and `bufs` live until every op is reaped below
        // (the loop waits for all 16).
        unsafe { push_reads(e, &iovs) };
        let mut out = Vec::new();
        while out.len() < 16 {
            e.wait(&mut out).unwrap();
        }
        assert_eq!(e.in_flight(), 0);
        assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 7)));
        out
    }

    #[test]
    fn submit_chunks_are_cut_to_the_time_budget() {
        // Idle kernel: every op goes at once.
        assert_eq!(early_submit_threshold(0, 3_000, false), 1);
        // Half of what is in flight while that fits the budget...
        assert_eq!(early_submit_threshold(10, 3_000, false), 5);
        // ...then what fits 25 us: 8 entries at 3 us, 2 at 12 us.
        assert_eq!(early_submit_threshold(120, 3_000, false), 8);
        assert_eq!(early_submit_threshold(120, 12_000, false), 2);
        // Slower than the budget per entry: one at a time, never zero.
        assert_eq!(early_submit_threshold(120, 1_000_000, false), 1);
        assert_eq!(early_submit_threshold(120, 0, false), 60);
    }

    #[test]
    fn ops_completed_inline_are_submitted_in_budget_chunks() {
        // Nothing to keep busy: wait for what fits the budget, even from
        // an idle kernel (25 us at 1 us per entry: 25).
        assert_eq!(early_submit_threshold(0, 1_000, true), 25);
        assert_eq!(early_submit_threshold(120, 1_000, true), 25);
        assert_eq!(early_submit_threshold(0, 3_000, true), 8);
        // Never more than the budget, never zero.
        assert_eq!(early_submit_threshold(0, 1_000_000, true), 1);
    }

    #[test]
    fn buffered_writes_made_at_submit_complete_with_the_rings_reads() {
        let Some((mut e, path)) = engine(32) else {
            return;
        };
        let expect = inline_writes::inline_write_files(&e.files)[0];
        assert!(!e.writes_at_submit(), "only once allowed");
        e.allow_writes_at_submit();
        assert_eq!(e.writes_at_submit(), expect);
        let data = vec![9u8; 4096];
        let wiov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut buf = vec![0u8; 4096];
        let riov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: `data`, `buf` and both iovecs outlive the loop below,
        // which reaps both ops.
        unsafe {
            e.push(
                1,
                HostOp::Writev {
                    file: FileId(0),
                    offset: 8192,
                    iov: RawIovecs {
                        ptr: &wiov,
                        count: 1,
                    },
                },
            )
            .unwrap();
            e.push(
                2,
                HostOp::Readv {
                    file: FileId(0),
                    offset: 0,
                    iov: RawIovecs {
                        ptr: &riov,
                        count: 1,
                    },
                },
            )
            .unwrap();
        }
        assert_eq!(e.in_flight(), 2);
        e.submit().unwrap();
        if expect {
            // Made during submit: on the file before any reap.
            let on_file = std::fs::read(&path).unwrap();
            assert!(on_file[8192..12288].iter().all(|&b| b == 9));
            assert!(e.eventfd().read().is_ok(), "the eventfd says it is done");
        }
        let mut out = Vec::new();
        while out.len() < 2 {
            e.wait(&mut out).unwrap();
        }
        assert_eq!(e.in_flight(), 0);
        out.sort_by_key(|c| c.token);
        assert!(matches!(out[0].result, Ok(4096)) && out[0].token == 1);
        assert!(matches!(out[1].result, Ok(4096)) && out[1].token == 2);
        assert!(buf.iter().all(|&b| b == 7));
        let on_file = std::fs::read(&path).unwrap();
        assert!(on_file[8192..12288].iter().all(|&b| b == 9));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn an_enter_whose_reads_completed_inline_is_noticed() {
        let Some((mut e, path)) = engine(32) else {
            return;
        };
        // The file was just written: its pages are cached, so buffered
        // reads complete inside the enter. All data must still be right
        // whatever the chunking (read_all checks every byte).
        let out = read_all(&mut e);
        assert_eq!(out.len(), 16);
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
        assert!(e.last_enter_inline, "cached reads complete in the enter");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn the_cost_per_entry_follows_the_measured_enters() {
        let Some((mut e, path)) = engine(32) else {
            return;
        };
        assert_eq!(e.ns_per_entry, INITIAL_NS_PER_ENTRY);
        for _ in 0..64 {
            e.learn_cost(Duration::from_micros(120), 10);
        }
        assert!(
            (11_000..=12_000).contains(&e.ns_per_entry),
            "{}",
            e.ns_per_entry
        );
        e.learn_cost(Duration::from_secs(1), 0);
        assert!(e.ns_per_entry <= 12_000, "an empty enter teaches nothing");
        let _ = read_all(&mut e);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn ebusy_and_eagain_from_enter_are_retried() {
        let Some((mut e, path)) = engine(4) else {
            return;
        };
        e.inject_submit_results([libc::EBUSY, libc::EAGAIN, libc::EINTR, libc::EBUSY]);
        let out = read_all(&mut e);
        assert!(e.injected.is_empty(), "every injected error was hit");
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_fatal_enter_error_fails_queued_ops_and_breaks_the_ring() {
        let Some((mut e, path)) = engine(32) else {
            return;
        };
        let mut buf = vec![0u8; 4096];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let op = HostOp::Readv {
            file: FileId(0),
            offset: 0,
            iov: RawIovecs {
                ptr: &iov,
                count: 1,
            },
        };
        e.inject_submit_results([libc::EFAULT]);
        // SAFETY: the op never reaches the kernel (the enter fails and the
        // ring is never entered with SQEs again); `buf` outlives `e` anyway.
        // With nothing in the kernel, push submits at once and that enter
        // fails; the op must then complete with the error exactly once.
        unsafe { e.push(9, op).unwrap() };
        let _ = e.submit();
        let mut out = Vec::new();
        e.reap(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, 9);
        assert_eq!(
            out[0].result.as_ref().unwrap_err().raw_os_error(),
            Some(libc::EFAULT)
        );
        assert_eq!(e.in_flight(), 0);
        let op = HostOp::Fdatasync { file: FileId(0) };
        // SAFETY: no memory is involved.
        assert!(unsafe { e.push(10, op) }.is_err());
        drop(e);
        drop(buf);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn more_ops_than_the_cq_holds_complete() {
        let Some((mut e, path)) = engine(2) else {
            return;
        };
        let out = read_all(&mut e);
        let mut tokens: Vec<u64> = out.iter().map(|c| c.token).collect();
        tokens.sort();
        assert_eq!(tokens, (0..16).collect::<Vec<_>>());
        let _ = std::fs::remove_file(path);
    }

    /// Whether the running kernel is at least `major.minor`.
    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release
            .trim()
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (a, b) >= (major, minor)
    }

    #[test]
    fn rings_run_task_work_cooperatively_where_the_kernel_can() {
        let Some((e, path)) = engine(8) else { return };
        std::fs::remove_file(path).unwrap();
        assert_eq!(e.runs_task_work_cooperatively(), kernel_at_least(5, 19));
        assert_eq!(e.defers_task_work(), kernel_at_least(6, 1));
    }

    /// A queue's engine is built on one thread (a device's activation)
    /// and used on another (its queue worker): the ring must take the
    /// thread that uses it as its issuer, and then refuse any other.
    #[test]
    fn the_thread_that_first_uses_a_ring_is_its_issuer() {
        let Some((e, path)) = engine(32) else {
            return;
        };
        let defers = e.defers_task_work();
        let mut e = std::thread::spawn(move || {
            let mut e = e;
            let out = read_all(&mut e);
            assert_eq!(out.len(), 16);
            assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
            e
        })
        .join()
        .unwrap();
        let mut buf = vec![0u8; 4096];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let op = HostOp::Readv {
            file: FileId(0),
            offset: 0,
            iov: RawIovecs {
                ptr: &iov,
                count: 1,
            },
        };
        // SAFETY: `buf` and `iov` outlive the op: it either fails at
        // submission (never reaches the kernel) or is waited for below.
        unsafe { e.push(1, op).unwrap() };
        let _ = e.submit();
        let mut out = Vec::new();
        while out.is_empty() {
            e.wait(&mut out).unwrap_or(());
            if e.in_flight() == 0 && out.is_empty() {
                e.reap(&mut out);
            }
        }
        if defers {
            assert_eq!(
                out[0].result.as_ref().unwrap_err().raw_os_error(),
                Some(libc::EEXIST),
                "another thread's submission is refused, as a failed request"
            );
        } else {
            assert!(matches!(out[0].result, Ok(4096)));
        }
        drop(e);
        drop(buf);
        std::fs::remove_file(path).unwrap();
    }

    /// O_DIRECT reads complete from the device's interrupt, so their CQEs
    /// are posted by task work on this thread: a loop that only reaps
    /// (no waiting enter, no other system call) must still see them all.
    #[test]
    fn a_reap_loop_sees_completions_posted_by_task_work() {
        if !testkit::available("io_uring", crate::probe::uring_support()) {
            return;
        }
        use std::os::unix::fs::OpenOptionsExt;
        const BLOCKS: usize = 16;
        let path =
            std::path::Path::new("/var/tmp").join(format!("uring-taskrun-{}", std::process::id()));
        std::fs::write(&path, vec![9u8; BLOCKS * 4096]).unwrap();
        let f = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        // Declared before the engine, so they outlive it even when an
        // assertion fails: the engine's drop waits for ops still in flight.
        let mut buf = crate::aligned::AlignedBuf::new(BLOCKS * 4096, 4096).unwrap();
        let iovs: Vec<libc::iovec> = buf
            .as_mut_slice()
            .chunks_mut(4096)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let mut e = UringEngine::new(&[Arc::new(f)], efd, 32).unwrap();
        // SAFETY: `iovs` and `buf` are declared before `e`, so they live
        // until every op is reaped (by the loop below or by `e`'s drop).
        unsafe { push_reads(&mut e, &iovs) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < BLOCKS && Instant::now() < deadline {
            e.reap(&mut out);
            std::hint::spin_loop();
        }
        assert_eq!(out.len(), BLOCKS, "a reap-only loop missed completions");
        assert!(out.iter().all(|c| matches!(c.result, Ok(4096))));
        assert!(buf.as_slice().iter().all(|&b| b == 9));
    }
}
