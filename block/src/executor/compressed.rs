//! The compressed-read pipeline of one queue: read a compressed cluster's
//! bytes on the engine, inflate them (on the process's inflate pool, or
//! in this queue's thread for zstd), and join every read of the cluster
//! planned meanwhile onto that one read and inflation.
//!
//! The op builder asks [`CompressedReads::cached`] and
//! [`CompressedReads::leading`] while it builds a read (a cached cluster
//! needs no I/O; a cluster this queue is reading now gets an
//! `AwaitInflate` op, see [`inflate_join`](super::inflate_join)). When a
//! leader's read is reaped its buffer enters [`CompressedReads::inflate`];
//! finished inflations leave through [`CompressedReads::take_finished`]
//! and the executor copies each piece into its request, caches the
//! cluster ([`CompressedReads::finished_cluster`]) and serves the waiters.
//!
//! zstd clusters wait in a backlog; each drain inflates at most
//! [`INFLATIONS_PER_DRAIN`] of them ([`CompressedReads::inflate_some`])
//! and, if more are left, the executor signals its eventfd so the caller
//! drains again at once. The requests finished so far thus go back to the
//! caller (which resubmits) instead of all waiting for a whole burst of
//! completions to inflate: with no bound, 4 KiB random reads of a zstd
//! image at QD 32 kept the disk a third idle (completions arrive in
//! bursts of up to the depth).

use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use super::inflate_join::InflateJoins;
use super::shared::DiskShared;
use crate::aligned::AlignedBuf;
use crate::executor::inflate::InflateCache;
use crate::executor::inflate_pool::{inflates_in_queue, InflateDone, InflateJob, InflateReplies};
use crate::formats::CompressedExtent;
use block_engines::OpToken;

/// Clusters a drain inflates in the queue's thread before it hands the
/// requests finished so far back (the best of 1, 2, 4, 8, 16 and
/// unbounded in interleaved runs).
pub const INFLATIONS_PER_DRAIN: usize = 2;

/// See the module docs.
pub(super) struct CompressedReads {
    /// Holds the disk's inflate cache, shared by its queues.
    shared: Arc<DiskShared>,
    /// Where the inflate pool posts this queue's finished inflations.
    replies: Arc<InflateReplies>,
    /// Inflations finished in this thread, and the recycled vector the
    /// pool's replies are taken into.
    finished: Vec<InflateDone>,
    /// Reaped compressed reads this queue inflates itself, oldest first.
    backlog: VecDeque<InflateJob>,
    /// Compressed clusters being read, and the reads waiting for them.
    joins: InflateJoins,
}

impl CompressedReads {
    /// The pipeline of a queue whose completion eventfd is `eventfd`.
    pub fn new(eventfd: Arc<EventFd>, shared: Arc<DiskShared>) -> Self {
        CompressedReads {
            shared,
            replies: Arc::new(InflateReplies::new(eventfd)),
            finished: Vec::new(),
            backlog: VecDeque::new(),
            joins: InflateJoins::default(),
        }
    }

    /// The disk's inflate cache (a poisoned lock only means another
    /// queue panicked; the cache is still consistent).
    fn cache(&self) -> MutexGuard<'_, InflateCache> {
        self.shared
            .inflated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The inflated cluster of `ext`, if the disk has it cached.
    pub fn cached(&self, ext: &CompressedExtent) -> Option<Arc<Vec<u8>>> {
        self.cache().get(ext)
    }

    /// Whether a read of this queue is fetching the cluster of `ext` now.
    pub fn leading(&self, ext: &CompressedExtent) -> bool {
        self.joins.leading(ext)
    }

    /// A leader's read op is pushed (again, after a short read: no change).
    pub fn lead(&mut self, ext: &CompressedExtent) {
        self.joins.lead(ext);
    }

    /// A waiter's op is pushed; false if no leader reads the cluster.
    pub fn wait(&mut self, ext: &CompressedExtent, token: OpToken) -> bool {
        self.joins.wait(ext, token)
    }

    /// The leader's cluster is inflated (or failed): the waiters to serve.
    pub fn waiters(&mut self, ext: &CompressedExtent) -> Vec<OpToken> {
        self.joins.finish(ext)
    }

    /// Inflates the compressed bytes at `skip` of `input`, which the
    /// leader op `tag` has read: on the pool, or later in this queue.
    pub fn inflate(&mut self, tag: OpToken, ext: CompressedExtent, input: AlignedBuf, skip: usize) {
        let job = InflateJob {
            tag,
            ext,
            input,
            skip,
            replies: self.replies.clone(),
        };
        if inflates_in_queue(ext.algorithm) {
            self.backlog.push_back(job);
        } else {
            crate::executor::inflate_pool::submit(job);
        }
    }

    /// Inflates up to [`INFLATIONS_PER_DRAIN`] backlog clusters (their
    /// results join this drain); true if any is left for the next drain.
    pub fn inflate_some(&mut self) -> bool {
        for _ in 0..INFLATIONS_PER_DRAIN {
            let Some(job) = self.backlog.pop_front() else {
                return false;
            };
            self.finished.push(job.inflate());
        }
        !self.backlog.is_empty()
    }

    /// Whether clusters wait to be inflated in this queue.
    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Every inflation finished for this queue (hand the vector back with
    /// [`CompressedReads::recycle`]).
    pub fn take_finished(&mut self) -> Vec<InflateDone> {
        let mut done = std::mem::take(&mut self.finished);
        self.replies.take(&mut done);
        done
    }

    /// Returns the (drained) vector of [`CompressedReads::take_finished`].
    pub fn recycle(&mut self, done: Vec<InflateDone>) {
        debug_assert!(done.is_empty());
        self.finished = done;
    }

    /// Caches an inflated cluster for every queue of the disk.
    pub fn finished_cluster(&self, ext: &CompressedExtent, data: Arc<Vec<u8>>) {
        self.cache().insert(ext, data);
    }
}
