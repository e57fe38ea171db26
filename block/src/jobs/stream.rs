//! The stream job (docs/block-jobs.md): copies the data of a running
//! disk's backing chain, down to (not including) an optional base, into
//! the disk's active image while the guest runs, so the active image can
//! then drop that part of the chain.
//!
//! Its owner (the VMM) makes a [`Stream`] of the running disk and the
//! depth of the base in its chain, and runs [`Stream::run`] on the job's
//! thread, which:
//! 1. walks the disk's block status and takes every range that a layer
//!    between the active image and the base decides (data, or with a
//!    base a zero that hides the base's data), rounded out to the active
//!    image's clusters;
//! 2. reads each chunk through the disk (what the guest would read: the
//!    backing data where the active image has none) on the job's own
//!    queue, and populates the active image with it
//!    ([`super::populate`]): only clusters still unallocated are
//!    written, decided by the format under its metadata lock, so a guest
//!    write that allocated a cluster first keeps its data, and one that
//!    comes later waits for the populate and writes over it. Without a
//!    base a chunk of zeroes is not written (a standalone image reads
//!    zeroes where it has nothing).
//!
//! The job then ends with the copy done ([`Stream::copied`]) and its
//! state still `running`: the owner rewrites the active image's backing
//! link and switches the disk to the image reopened over its new chain
//! (files are opened only there), then marks it completed. The stream
//! never touches the guest's queues; the guest's reads are the same
//! before, during and after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::copy::{run_all, CHUNK};
use super::job::{Flow, JobShared, JobState};
use super::populate::populate;
use crate::disk::{Disk, DiskQueue};
use crate::formats::format::status_within;
use crate::request::{BlockRequest, Completion, IoMemory, RequestOp};

/// See the module docs.
pub struct Stream {
    /// `None` once released.
    source: Mutex<Option<Disk>>,
    /// The job's queue on the disk (its reads); `None` once released.
    queue: Mutex<Option<DiskQueue>>,
    /// Layers at this depth and below stay (the base's depth); `None`:
    /// the whole chain is copied.
    base_depth: Option<u32>,
    copied: AtomicBool,
}

impl Stream {
    /// A stream of `source` into its active image, keeping the layers
    /// from depth `base_depth` down (none: the whole chain is copied).
    pub fn new(source: Disk, base_depth: Option<u32>) -> Result<Stream, String> {
        if base_depth == Some(0) {
            return Err("the base cannot be the active image".into());
        }
        let queue = source
            .queue()
            .map_err(|e| format!("cannot make the job's queue: {}", ch_log::error_chain(&e)))?;
        Ok(Stream {
            source: Mutex::new(Some(source)),
            queue: Mutex::new(Some(queue)),
            base_depth,
            copied: AtomicBool::new(false),
        })
    }

    /// Whether [`Stream::run`] copied everything (the owner may relink).
    pub fn copied(&self) -> bool {
        self.copied.load(Ordering::Acquire)
    }

    /// The ranges to copy (step 1 of the module docs).
    fn ranges(&self, source: &Disk) -> Result<Vec<(u64, u64)>, String> {
        let format = source.format();
        let size = source.size();
        let cluster = format.info().cluster_size.unwrap_or(65536);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut pos = 0;
        while pos < size {
            let s = status_within(format.as_ref(), pos, size)
                .map_err(|e| format!("block status at {pos}: {}", ch_log::error_chain(&e)))?;
            let above_base = self.base_depth.is_none_or(|b| s.depth < b);
            let wanted =
                s.present && s.depth >= 1 && above_base && (s.data || self.base_depth.is_some());
            if wanted {
                let start = pos / cluster * cluster;
                let end = (pos + s.len)
                    .div_ceil(cluster)
                    .saturating_mul(cluster)
                    .min(size);
                match out.last_mut() {
                    Some((o, l)) if *o + *l >= start => *l = (*l).max(end - *o),
                    _ => out.push((start, end - start)),
                }
            }
            pos += s.len;
        }
        Ok(out)
    }

    /// The job's body (see the module docs): returns when the copy is
    /// done (state unchanged: the owner completes it), cancelled or
    /// stopped, or with the reason it failed.
    pub fn run(&self, job: &JobShared) -> Result<Option<JobState>, String> {
        let Some(source) = lock(&self.source).clone() else {
            return Err("the job was released".into());
        };
        let ranges = self.ranges(&source)?;
        job.add_total(ranges.iter().map(|r| r.1).sum());
        let format = source.format().clone();
        let cluster = format.info().cluster_size.unwrap_or(65536);
        let step = CHUNK.max(cluster);
        let waker = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| format!("an eventfd: {e}"))?);
        let mut done = Vec::with_capacity(1);
        for (offset, len) in ranges {
            let end = offset + len;
            let mut pos = offset;
            while pos < end {
                if job.between_chunks() == Flow::Stop {
                    return Ok(None);
                }
                let n = step.min(end - pos);
                let data = self.read(pos, n, &mut done)?;
                if self.base_depth.is_some() || data.iter().any(|&b| b != 0) {
                    populate(format.as_ref(), pos, &data, &waker).map_err(|e| {
                        format!(
                            "writing the active image at {pos}: {}",
                            ch_log::error_chain(&e)
                        )
                    })?;
                }
                job.add_done(n);
                pos += n;
            }
        }
        self.copied.store(true, Ordering::Release);
        Ok(None)
    }

    /// Reads `len` bytes at `offset` through the disk on the job's queue.
    fn read(&self, offset: u64, len: u64, done: &mut Vec<Completion>) -> Result<Vec<u8>, String> {
        let mut q = lock(&self.queue);
        let Some(queue) = q.as_mut() else {
            return Err("the job was released".into());
        };
        let req = BlockRequest {
            user_data: 0,
            op: RequestOp::Read,
            offset,
            memory: IoMemory::Owned(vec![0; len as usize]),
        };
        let mut out = run_all(queue, done, [req], 1).map_err(|(at, e)| {
            format!(
                "reading the backing chain at {}: {}",
                at.max(offset),
                ch_log::error_chain(&e)
            )
        })?;
        Ok(out.pop().map(|(_, data)| data).unwrap_or_default())
    }

    /// Drops the job's queue and its hold on the disk (the owner calls
    /// it once the thread has ended, before the disk switches).
    pub fn release(&self) {
        lock(&self.queue).take();
        lock(&self.source).take();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
