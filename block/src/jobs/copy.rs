//! Copies ranges of a running disk to another image through a job's own
//! queues: one [`DiskQueue`] on the source (reads) and one on the
//! target (writes), each on its disk's engine, so a job never shares a
//! queue with the guest or the blocking helpers.
//!
//! Ranges enter in batches ([`Copier::copy`]); every range of a batch is
//! read at once (one submission), then every one whose bytes are not all
//! zero is written at once; a range that reads as zeroes is skipped on a
//! target that reads zeroes there already, else written as zeroes with
//! unmap allowed (the target stays sparse). Errors leave saying which
//! side failed and where.
//!
//! A queue is used by one thread (its io_uring ring takes the first
//! thread that uses it as its only issuer), and a job's copier is used by
//! the job's thread and, for the last dirty granules of a complete or a
//! cancel, by its owner's: a copier used on another thread than before
//! makes new queues on its disks first.

use std::thread::ThreadId;

use crate::disk::{Disk, DiskQueue};
use crate::error::BlockError;
use crate::request::{BlockRequest, Completion, IoMemory, RequestOp};

/// The most bytes one range of a batch may have.
pub const CHUNK: u64 = 1 << 20;
/// Ranges a batch of whole chunks holds (what is in flight at once).
pub const BATCH: usize = 8;
/// Ranges a batch of small ranges may hold (dirty granules), at most
/// [`BATCH`] chunks' bytes in all.
pub const MAX_RANGES: usize = 64;

/// What a copy did to the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    /// Bytes read from the source (all of the batch).
    pub bytes: u64,
    /// Bytes that read as zeroes (skipped, or written as zeroes).
    pub zero: u64,
}

/// A job's queues on its source and target.
pub struct Copier {
    source: DiskQueue,
    target: DiskQueue,
    disks: (Disk, Disk),
    /// The thread that uses the queues.
    user: Option<ThreadId>,
    done: Vec<Completion>,
    /// Tests: runs between a batch's read and its write.
    #[cfg(test)]
    pub(super) after_read: Option<Box<dyn FnMut() + Send>>,
}

impl Copier {
    pub fn new(source: &Disk, target: &Disk) -> Result<Copier, BlockError> {
        Ok(Copier {
            source: source.queue()?,
            target: target.queue()?,
            disks: (source.clone(), target.clone()),
            user: None,
            done: Vec::with_capacity(BATCH),
            #[cfg(test)]
            after_read: None,
        })
    }

    /// New queues when the calling thread is not the one that used these.
    fn queues_for_this_thread(&mut self) -> Result<(), String> {
        let me = std::thread::current().id();
        match self.user {
            Some(t) if t == me => {}
            None => self.user = Some(me),
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

    /// Copies every `(offset, len)` of `ranges` (each at most [`CHUNK`],
    /// at most [`MAX_RANGES`] of them); `target_zero` says the target reads
    /// zeroes in all of them now (zero ranges are then not written).
    pub fn copy(&mut self, ranges: &[(u64, u64)], target_zero: bool) -> Result<Copied, String> {
        self.queues_for_this_thread()?;
        let reads = ranges
            .iter()
            .enumerate()
            .map(|(i, &(offset, len))| BlockRequest {
                user_data: i as u64,
                op: RequestOp::Read,
                offset,
                memory: IoMemory::Owned(vec![0; len as usize]),
            });
        let read = run_all(&mut self.source, &mut self.done, reads, ranges.len())
            .map_err(|(at, e)| format!("reading the source at {at}: {}", chain(&e)))?;
        #[cfg(test)]
        if let Some(f) = self.after_read.as_mut() {
            f();
        }
        let mut copied = Copied::default();
        let mut writes = Vec::with_capacity(read.len());
        for (offset, data) in read {
            let len = data.len() as u64;
            copied.bytes += len;
            if is_zero(&data) {
                copied.zero += len;
                if !target_zero {
                    writes.push(BlockRequest {
                        user_data: writes.len() as u64,
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
                    user_data: writes.len() as u64,
                    op: RequestOp::Write,
                    offset,
                    memory: IoMemory::Owned(data),
                });
            }
        }
        let n = writes.len();
        run_all(&mut self.target, &mut self.done, writes, n)
            .map_err(|(at, e)| format!("writing the target at {at}: {}", chain(&e)))?;
        Ok(copied)
    }

    /// Makes `len` bytes at `offset` of the target read as zeroes.
    pub fn zero(&mut self, offset: u64, len: u64) -> Result<(), String> {
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
