//! The executor behind a [`crate::DiskQueue`]: plans requests with the
//! format, runs the plans' host operations on the queue's engine and turns
//! op completions into exactly one [`Completion`] per request.
//!
//! Requests enter through [`Executor::submit_batch`]; each is owned by the
//! in-flight table ([`table`]) until its last op has been reaped, which is
//! what keeps the memory behind the engine's iovecs alive. [`build`] turns
//! plans into ops; [`complete`] accounts op results (short transfers,
//! EOF, first error wins, commit/abort) and queues the request's
//! completion. Completions leave through [`Executor::drain`].
//!
//! Compressed clusters the queue inflates itself (zstd, see
//! [`crate::io::inflate_pool::inflates_in_queue`]) wait in a backlog; each
//! drain inflates at most [`INFLATIONS_PER_DRAIN`] of them and, if more
//! are left, signals the eventfd so the caller drains again at once. The
//! requests finished so far thus go back to the caller (which resubmits)
//! instead of all waiting for a whole burst of completions to inflate:
//! with no bound, 4 KiB random reads of a zstd image at QD 32 kept the
//! disk a third idle (completions arrive in bursts of up to the depth).

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::formats::Format;
use crate::io::align::{file_alignment, DioAlign};
use crate::io::inflate::InflateCache;
use crate::io::inflate_pool::{InflateDone, InflateJob, InflateReplies};
use crate::io::{Engine, EngineCompletion};
use crate::request::{BlockRequest, Completion};

/// Size of the shared zero page.
const ZERO_PAGE: usize = 1 << 20;

/// Clusters a drain inflates in the queue's thread before it hands the
/// requests finished so far back (the best of 1, 2, 4, 8, 16 and
/// unbounded in interleaved runs).
pub const INFLATIONS_PER_DRAIN: usize = 2;

pub mod barrier;
mod build;
mod complete;
mod inflate_join;
mod read_ops;
pub mod rmw;
mod spares;
pub mod table;
mod write_ops;

use barrier::WriteTracker;
use rmw::RmwLocks;
use table::RequestTable;

/// See the module docs.
pub struct Executor {
    format: Arc<dyn Format>,
    files: Vec<Arc<File>>,
    align: Vec<DioAlign>,
    engine: Box<dyn Engine>,
    eventfd: Arc<EventFd>,
    table: RequestTable,
    ready: Vec<Completion>,
    parked: VecDeque<BlockRequest>,
    /// Where the inflate pool posts this queue's finished inflations.
    replies: Arc<InflateReplies>,
    inflated: Vec<InflateDone>,
    /// Reaped compressed reads this queue inflates itself, oldest first.
    inflate_backlog: VecDeque<InflateJob>,
    /// Compressed clusters being read, and the reads waiting for them.
    joins: inflate_join::InflateJoins,
    reaped: Vec<EngineCompletion>,
    /// Vectors recycled from finished requests.
    spares: spares::Spares,
    /// Zeroes that write ops point at.
    zero_page: Arc<AlignedBuf>,
    /// Bounce bytes the request being built may still allocate.
    bounce_budget: u64,
    /// Whether the request being built writes (names bounce errors).
    building_write: bool,
    /// Partial-block locks and write tracking (shared by the disk's queues).
    shared: Arc<DiskShared>,
    /// O_DIRECT block size writes are locked in (1: buffered, no locks).
    rmw_block: u64,
    /// Slots whose ops are done but whose freeing commit waits for older
    /// writes (see `barrier`).
    deferred: Vec<u32>,
}

/// State shared by every queue of one disk.
#[derive(Default)]
pub struct DiskShared {
    /// Partial-block locks of unaligned O_DIRECT writes.
    pub rmw: RmwLocks,
    /// Writes in flight, for discard barriers.
    pub writes: WriteTracker,
    /// Recently inflated compressed clusters, for every queue.
    pub inflated: Mutex<InflateCache>,
    /// `cache=unsafe`: flushes complete at once without touching the disk.
    pub ignore_flushes: bool,
}

impl Executor {
    /// An executor over `format` driving `engine`, whose eventfd is the
    /// queue's completion eventfd (and the waker of blocked writes).
    /// `shared` is shared by every queue of the disk.
    pub fn new(format: Arc<dyn Format>, engine: Box<dyn Engine>, shared: Arc<DiskShared>) -> Self {
        // Like a `Vec`, a fixed-size allocation failure is fatal.
        let zero_page = AlignedBuf::new(ZERO_PAGE, 4096).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; ZERO_PAGE]>())
        });
        let files = format.files().to_vec();
        let align: Vec<DioAlign> = files.iter().map(|f| file_alignment(f)).collect();
        let eventfd = engine.eventfd().clone();
        let replies = Arc::new(InflateReplies::new(eventfd.clone()));
        let rmw_block = align.iter().map(|a| u64::from(a.offset)).max().unwrap_or(1);
        Executor {
            format,
            files,
            align,
            engine,
            eventfd,
            table: RequestTable::default(),
            ready: Vec::new(),
            parked: VecDeque::new(),
            replies,
            inflated: Vec::new(),
            inflate_backlog: VecDeque::new(),
            joins: Default::default(),
            reaped: Vec::new(),
            spares: spares::Spares::default(),
            zero_page: Arc::new(zero_page),
            bounce_budget: 0,
            building_write: false,
            shared,
            rmw_block,
            deferred: Vec::new(),
        }
    }

    pub fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }

    /// The strictest O_DIRECT alignment of the image's files (1 if none).
    pub fn alignment(&self) -> DioAlign {
        self.align.iter().fold(DioAlign::NONE, |a, b| a.max(*b))
    }

    /// Plans every request and submits all resulting ops in one go.
    pub fn submit_batch(&mut self, requests: impl IntoIterator<Item = BlockRequest>) {
        let before = self.ready.len();
        for req in requests {
            self.start(req);
        }
        self.submit_engine();
        if self.ready.len() > before {
            self.signal();
        }
    }

    /// Clears the eventfd, reaps finished ops, re-plans parked writes, and
    /// moves every finished request to `out`.
    pub fn drain(&mut self, out: &mut Vec<Completion>) {
        // Clear first: a completion arriving after this read re-arms it.
        let _ = self.eventfd.read();
        let mut reaped = std::mem::take(&mut self.reaped);
        self.engine.reap(&mut reaped);
        for c in reaped.drain(..) {
            self.on_op_complete(c);
        }
        self.reaped = reaped;
        self.inflate_some();
        self.take_inflated();
        for slot in std::mem::take(&mut self.deferred) {
            self.finish_if_done(slot);
        }
        self.retry_parked();
        self.submit_engine();
        out.append(&mut self.ready);
    }

    /// Blocks until at least one completion is ready or nothing is in
    /// flight, then drains like [`Executor::drain`].
    pub fn wait(&mut self, out: &mut Vec<Completion>) -> Result<(), BlockError> {
        let start = out.len();
        loop {
            self.drain(out);
            if out.len() > start || self.in_flight() == 0 {
                return Ok(());
            }
            if !self.inflate_backlog.is_empty() {
                // The next drain inflates more without waiting.
                continue;
            }
            if self.engine.in_flight() > 0 {
                let mut reaped = std::mem::take(&mut self.reaped);
                let r = self.engine.wait(&mut reaped);
                for c in reaped.drain(..) {
                    self.on_op_complete(c);
                }
                self.reaped = reaped;
                r?;
            } else {
                // Only parked writes: wait for their waker.
                wait_readable(&self.eventfd)?;
            }
        }
    }

    /// Requests submitted and not yet drained.
    pub fn in_flight(&self) -> usize {
        self.table.len() + self.parked.len() + self.ready.len()
    }

    /// The disk's inflate cache (a poisoned lock only means another
    /// queue panicked; the cache is still consistent).
    fn inflate_cache(&self) -> MutexGuard<'_, InflateCache> {
        self.shared
            .inflated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Inflates up to [`INFLATIONS_PER_DRAIN`] backlog clusters (their
    /// results join this drain) and signals the eventfd if any is left.
    fn inflate_some(&mut self) {
        for _ in 0..INFLATIONS_PER_DRAIN {
            let Some(job) = self.inflate_backlog.pop_front() else {
                return;
            };
            self.inflated.push(job.inflate());
        }
        if !self.inflate_backlog.is_empty() {
            self.signal();
        }
    }

    fn signal(&self) {
        // An eventfd write only fails on counter overflow, which a pending
        // wake-up already covers.
        let _ = self.eventfd.write(1);
    }

    /// Submits whatever is queued on the engine; a failure fails nothing
    /// here because the engine reports unsubmitted ops as completions.
    fn submit_engine(&mut self) {
        if let Err(e) = self.engine.submit() {
            log::error!("block queue: engine submit failed: {e}");
        }
    }
}

fn wait_readable(fd: &EventFd) -> Result<(), BlockError> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, -1) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(BlockError::EventFd(e));
        }
    }
    Ok(())
}

impl Drop for Executor {
    /// Waits for every op the engine still has, so no memory it uses is
    /// freed under the kernel; if the engine fails, leaks that memory.
    fn drop(&mut self) {
        self.submit_engine();
        let mut reaped = Vec::new();
        while self.engine.in_flight() > 0 {
            if let Err(e) = self.engine.wait(&mut reaped) {
                log::error!(
                    "block queue: cannot reap in-flight I/O on drop ({e}); leaking its buffers"
                );
                // Release what other queues may wait for: the data writes
                // may still land, so the format aborts (leaking, never
                // publishing) their allocations.
                let (owners, commits, seqs) = self.table.take_locks_and_commits();
                for commit in commits {
                    self.format.abort(commit);
                }
                for owner in owners {
                    self.shared.rmw.unlock(owner);
                }
                // The leaked writes may still land: their clusters stay
                // referenced (aborted commits leak), so nothing waits.
                for seq in seqs {
                    self.shared.writes.end(seq);
                }
                self.table.leak();
                return;
            }
            for c in reaped.drain(..) {
                self.on_op_complete(c);
            }
            self.submit_engine();
        }
        // Freeing commits still waiting for other queues' writes: give
        // them up (the clusters leak; nothing is freed under a write).
        for slot in std::mem::take(&mut self.deferred) {
            if let Some(mut entry) = self.table.remove(slot) {
                if let Some(commit) = entry.commit.take() {
                    self.format.abort(commit);
                }
                if let Some(seq) = entry.write_seq.take() {
                    self.shared.writes.end(seq);
                }
            }
        }
    }
}
