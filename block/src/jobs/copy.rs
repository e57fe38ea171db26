//! Copies ranges of a running disk to another image through a job's own
//! queues: one [`DiskQueue`] on the source (reads) and one on the
//! target (writes), each on its disk's engine, so a job never shares a
//! queue with the guest or the blocking helpers.
//!
//! Ranges enter in batches. [`Copier::start`] reads every range of a
//! batch at once (one submission), then submits the writes of every one
//! whose bytes are not all zero and returns without waiting for them:
//! the next batch is read while this one is written, and the target's
//! queue always has the next writes when it finishes one batch (at most
//! [`DEPTH`] batches are being written; a batch that meets one still
//! being written waits for it, so two writes of the same bytes are never
//! in flight). A range that reads as zeroes is skipped on a target that
//! reads zeroes there already, else written as zeroes with unmap allowed
//! (the target stays sparse). What finished writing is counted in
//! [`Copier::take_finished`]; [`Copier::finish`] waits for everything
//! ([`Copier::copy`] is a start and a finish). A batch's `hold` (a
//! write-blocking mirror's claim on its granules) is dropped when its
//! writes are done. Errors leave saying which side failed and where,
//! with nothing left in flight.
//!
//! A queue is used by one thread (its io_uring ring takes the first
//! thread that uses it as its only issuer), and a job's copier is used by
//! the job's thread and, for the last dirty granules of a complete or a
//! cancel, by its owner's: a copier used on another thread than before
//! makes new queues on its disks first, which it can do only with
//! nothing in flight (the job's thread finishes before it parks).

use std::collections::VecDeque;
use std::thread::ThreadId;

use crate::disk::{Disk, DiskQueue};
use crate::error::BlockError;
use crate::formats::format::status_within;
use crate::formats::{BlockStatus, Format};
use crate::request::{BlockRequest, Completion, IoMemory, RequestOp};

/// The most bytes one range of a batch may have.
pub const CHUNK: u64 = 1 << 20;
/// Ranges a batch of whole chunks holds (what is read at once).
pub const BATCH: usize = 8;
/// Ranges a batch of small ranges may hold (dirty granules), at most
/// [`BATCH`] chunks' bytes in all.
pub const MAX_RANGES: usize = 64;
/// Batches whose writes may be in flight at once.
pub const DEPTH: usize = 2;

/// What a copy did to the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Bytes read from the source (all of the batch).
    pub bytes: u64,
    /// Bytes that read as zeroes (skipped, or written as zeroes).
    pub zero: u64,
}

impl Copied {
    fn add(&mut self, other: Copied) {
        self.bytes += other.bytes;
        self.zero += other.zero;
    }
}

/// What a batch's writes keep alive until they are done.
pub type Hold = Box<dyn Send>;

/// A batch whose writes are in flight.
struct Writing {
    tag: u32,
    /// Completions not reaped yet.
    left: usize,
    /// Its ranges, sorted (for the overlap check).
    ranges: Vec<(u64, u64)>,
    copied: Copied,
    failed: Option<Failure>,
    _hold: Option<Hold>,
}

/// A job's queues on its source and target.
pub struct Copier {
    source: DiskQueue,
    target: DiskQueue,
    disks: (Disk, Disk),
    /// The thread that uses the queues.
    user: Option<ThreadId>,
    done: Vec<Completion>,
    /// Batches being written, oldest first.
    writing: VecDeque<Writing>,
    next_tag: u32,
    /// What finished writing since [`Copier::take_finished`].
    finished: Copied,
    /// Buffers of finished writes, for the next reads.
    spare: Vec<Vec<u8>>,
    /// Tests: runs between a batch's read and its write.
    #[cfg(test)]
    pub(super) after_read: Option<Box<dyn FnMut() + Send>>,
    /// Tests: the most batches seen in flight at once.
    #[cfg(test)]
    pub(super) most_writing: usize,
}

impl Copier {
    pub fn new(source: &Disk, target: &Disk) -> Result<Copier, BlockError> {
        Ok(Copier {
            source: source.queue()?,
            target: target.queue()?,
            disks: (source.clone(), target.clone()),
            user: None,
            done: Vec::with_capacity(BATCH),
            writing: VecDeque::with_capacity(DEPTH),
            next_tag: 0,
            finished: Copied::default(),
            spare: Vec::new(),
            #[cfg(test)]
            after_read: None,
            #[cfg(test)]
            most_writing: 0,
        })
    }

    /// New queues when the calling thread is not the one that used these.
    fn queues_for_this_thread(&mut self) -> Result<(), String> {
        let me = std::thread::current().id();
        match self.user {
            Some(t) if t == me => {}
            None => self.user = Some(me),
            Some(_) if !self.writing.is_empty() => {
                return Err("the copier has writes in flight on another thread".into());
            }
            Some(_) => {
                let fresh = |d: &Disk, side: &str| {
                    d.queue().map_err(|e| {
                        format!("a queue on the {side} for this thread: {}", chain(&e))
                    })
                };
                self.source = fresh(&self.disks.0, "source")?;
                self.target = fresh(&self.disks.1, "target")?;
                self.user = Some(me);
            }
        }
        Ok(())
    }

    /// Copies every `(offset, len)` of `ranges` (see [`Copier::start`])
    /// and waits until the target has them; returns what this call
    /// finished, earlier batches' writes included.
    pub fn copy(&mut self, ranges: &[(u64, u64)], target_zero: bool) -> Result<Copied, String> {
        self.start(ranges, target_zero, None)?;
        self.finish()?;
        Ok(self.take_finished())
    }

    /// Reads every `(offset, len)` of `ranges` (each at most [`CHUNK`],
    /// at most [`MAX_RANGES`] of them) and submits their writes, leaving
    /// them in flight; `target_zero` says the target reads zeroes in all
    /// of them now (zero ranges are then not written). Waits first for
    /// the batches being written that `ranges` meet, and until fewer
    /// than [`DEPTH`] are. `hold` is dropped when the writes are done.
    pub fn start(
        &mut self,
        ranges: &[(u64, u64)],
        target_zero: bool,
        hold: Option<Hold>,
    ) -> Result<(), String> {
        self.queues_for_this_thread()?;
        self.settle(ranges, 1)?;
        self.wait_writes(|w| w.len() < DEPTH)?;
        let reads: Vec<BlockRequest> = ranges
            .iter()
            .enumerate()
            .map(|(i, &(offset, len))| BlockRequest {
                user_data: i as u64,
                op: RequestOp::Read,
                offset,
                memory: IoMemory::Owned(self.buffer(len as usize)),
            })
            .collect();
        let read = match run_all(&mut self.source, &mut self.done, reads, ranges.len()) {
            Ok(read) => read,
            Err((at, e)) => {
                let why = format!("reading the source at {at}: {}", chain(&e));
                return Err(self.abandon(why));
            }
        };
        #[cfg(test)]
        if let Some(f) = self.after_read.as_mut() {
            f();
        }
        let tag = self.next_tag;
        self.next_tag = tag.wrapping_add(1);
        let mut copied = Copied::default();
        let mut writes = Vec::with_capacity(read.len());
        for (offset, data) in read {
            let len = data.len() as u64;
            copied.bytes += len;
            let user_data = u64::from(tag) << 32 | writes.len() as u64;
            if is_zero(&data) {
                copied.zero += len;
                self.recycle(data);
                if !target_zero {
                    writes.push(BlockRequest {
                        user_data,
                        op: RequestOp::WriteZeroes {
                            len,
                            may_unmap: true,
                        },
                        offset,
                        memory: IoMemory::None,
                    });
                }
            } else {
                writes.push(BlockRequest {
                    user_data,
                    op: RequestOp::Write,
                    offset,
                    memory: IoMemory::Owned(data),
                });
            }
        }
        if writes.is_empty() {
            self.finished.add(copied);
            return Ok(());
        }
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        self.writing.push_back(Writing {
            tag,
            left: writes.len(),
            ranges: sorted,
            copied,
            failed: None,
            _hold: hold,
        });
        #[cfg(test)]
        {
            self.most_writing = self.most_writing.max(self.writing.len());
        }
        self.target.submit_batch_requests(writes);
        Ok(())
    }

    /// Waits for the batches being written that meet `ranges` once both
    /// are rounded out to multiples of `grain` (a power of two).
    pub fn settle(&mut self, ranges: &[(u64, u64)], grain: u64) -> Result<(), String> {
        self.queues_for_this_thread()?;
        let meets = |w: &VecDeque<Writing>| {
            w.iter()
                .any(|b| ranges.iter().any(|&r| overlaps(&b.ranges, r, grain)))
        };
        self.wait_writes(|w| !meets(w))
    }

    /// Waits until every write is done.
    pub fn finish(&mut self) -> Result<(), String> {
        self.queues_for_this_thread()?;
        self.wait_writes(VecDeque::is_empty)
    }

    /// Whether writes are in flight.
    pub fn writing(&self) -> bool {
        !self.writing.is_empty()
    }

    /// What finished writing since the last call.
    pub fn take_finished(&mut self) -> Copied {
        std::mem::take(&mut self.finished)
    }

    /// Makes `len` bytes at `offset` of the target read as zeroes (after
    /// every write in flight).
    pub fn zero(&mut self, offset: u64, len: u64) -> Result<(), String> {
        self.queues_for_this_thread()?;
        self.finish()?;
        let req = BlockRequest {
            user_data: 0,
            op: RequestOp::WriteZeroes {
                len,
                may_unmap: true,
            },
            offset,
            memory: IoMemory::None,
        };
        run_all(&mut self.target, &mut self.done, [req], 1)
            .map(|_| ())
            .map_err(|(at, e)| format!("zeroing the target at {at}: {}", chain(&e)))
    }

    /// Reaps the target's completions until `enough` holds of the
    /// batches still being written; a failed write ends it with its
    /// reason once nothing is in flight.
    fn wait_writes(&mut self, enough: impl Fn(&VecDeque<Writing>) -> bool) -> Result<(), String> {
        while !enough(&self.writing) {
            if self.target.in_flight() == 0 {
                let why = format!("writing the target: {}", chain(&BlockError::LostCompletion));
                return Err(self.abandon(why));
            }
            self.done.clear();
            if let Err(e) = self.target.wait_completions(&mut self.done) {
                let why = format!("waiting for the target's writes: {}", chain(&e));
                return Err(self.abandon(why));
            }
            let mut failed = None;
            for c in self.done.drain(..) {
                let tag = (c.user_data >> 32) as u32;
                let Some(batch) = self.writing.iter_mut().find(|b| b.tag == tag) else {
                    continue;
                };
                batch.left -= 1;
                match c.result {
                    Ok(_) => {
                        if let Some(buf) = c.memory.into_owned() {
                            recycle(&mut self.spare, buf);
                        }
                    }
                    Err(e) => {
                        batch.failed.get_or_insert((c.offset, e));
                    }
                }
            }
            let finished = &mut self.finished;
            self.writing.retain_mut(|b| {
                if b.left > 0 {
                    return true;
                }
                match b.failed.take() {
                    Some(f) => {
                        failed.get_or_insert(f);
                    }
                    None => finished.add(b.copied),
                }
                false
            });
            if let Some((at, e)) = failed {
                let why = format!("writing the target at {at}: {}", chain(&e));
                return Err(self.abandon(why));
            }
        }
        Ok(())
    }

    /// Waits out every write still in flight (their errors dropped: the
    /// copy failed already) and hands back `why`.
    fn abandon(&mut self, why: String) -> String {
        while self.target.in_flight() > 0 {
            self.done.clear();
            if self.target.wait_completions(&mut self.done).is_err() {
                break;
            }
        }
        self.writing.clear();
        why
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        recycle(&mut self.spare, buf);
    }

    /// A buffer of `len` bytes for a read (its bytes are all overwritten
    /// by the read).
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(mut b) if b.capacity() >= len => {
                b.resize(len, 0);
                b
            }
            _ => vec![0; len],
        }
    }
}

/// Keeps `buf` for a later read, up to a batch's worth of buffers.
fn recycle(spare: &mut Vec<Vec<u8>>, buf: Vec<u8>) {
    if spare.len() < BATCH {
        spare.push(buf);
    }
}

/// Whether `(offset, len)` meets any range of `sorted` once both are
/// rounded out to multiples of `grain`.
fn overlaps(sorted: &[(u64, u64)], (offset, len): (u64, u64), grain: u64) -> bool {
    let down = |x: u64| x & !(grain - 1);
    let up = |x: u64| x.saturating_add(grain - 1) & !(grain - 1);
    let (start, end) = (down(offset), up(offset + len));
    sorted
        .iter()
        .any(|&(o, l)| down(o) < end && start < up(o + l))
}

/// The offset of the request that failed, and its error.
pub(super) type Failure = (u64, BlockError);

/// Submits `requests` (`n` of them) in one batch and waits for all;
/// returns each one's offset and owned memory in submission order, or the
/// first failure's offset and error.
pub(super) fn run_all(
    queue: &mut DiskQueue,
    done: &mut Vec<Completion>,
    requests: impl IntoIterator<Item = BlockRequest>,
    n: usize,
) -> Result<Vec<(u64, Vec<u8>)>, Failure> {
    if n == 0 {
        return Ok(Vec::new());
    }
    queue.submit_batch_requests(requests);
    done.clear();
    while done.len() < n && queue.in_flight() > 0 {
        queue.wait_completions(done).map_err(|e| (0, e))?;
    }
    if done.len() < n {
        return Err((0, BlockError::LostCompletion));
    }
    done.sort_by_key(|c| c.user_data);
    let mut out = Vec::with_capacity(n);
    let mut first_error = None;
    for c in done.drain(..) {
        match c.result {
            Ok(_) => out.push((c.offset, c.memory.into_owned().unwrap_or_default())),
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some((c.offset, e));
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Whether every byte is zero (in blocks the compiler vectorises).
fn is_zero(data: &[u8]) -> bool {
    data.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

fn chain(e: &BlockError) -> String {
    ch_log::error_chain(e)
}

/// What a job's first pass does with one extent of its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentAction {
    Copy,
    Zero,
    Skip,
}

/// Ranges of a disk as `(offset, len)`, in disk order.
pub type Ranges = Vec<(u64, u64)>;

/// Walks `format`'s block status over its `size` bytes and sorts the
/// extents by `decide` into ranges to copy and ranges to zero.
pub fn ranges_to_copy(
    format: &dyn Format,
    size: u64,
    decide: impl Fn(&BlockStatus) -> ExtentAction,
) -> Result<(Ranges, Ranges), String> {
    let (mut copy, mut zero) = (Vec::new(), Vec::new());
    let mut pos = 0;
    while pos < size {
        let s = status_within(format, pos, size)
            .map_err(|e| format!("block status at {pos}: {}", ch_log::error_chain(&e)))?;
        match decide(&s) {
            ExtentAction::Copy => copy.push((pos, s.len)),
            ExtentAction::Zero => zero.push((pos, s.len)),
            ExtentAction::Skip => {}
        }
        pos += s.len;
    }
    Ok((copy, zero))
}
