//! [`MirrorWrites`]: the write-blocking mirror's filter on the source's
//! write seam (docs/block-jobs.md, docs/live-operations.md): every guest
//! write that completes while it is installed is written to the target
//! before the guest sees its completion.
//!
//! The owner installs it on the source's [`LiveState`] with the disk's
//! queues paused ([`MirrorWrites::install`]); each queue then makes its
//! handle ([`MirrorWritesQueue`], a `CompletionHookQueue`), which makes
//! its own queue on the target on the queue's thread the first time it
//! mirrors (an io_uring queue has one issuer thread). Completions enter
//! the handle as a queue hands them out:
//! - a successful write or write-zeroes is submitted to the target (the
//!   same op, offset and memory: guest memory is shared, owned buffers
//!   are copied), all of a batch at once, holding guest shares of their
//!   granules (`granule_claims`) until the target has them; a successful
//!   flush then flushes the target (what the guest made durable is
//!   durable on both);
//! - a discard, a failed write (part of it may have landed) and writes
//!   of one batch that overlap each other (their order on the source is
//!   not known) mark the job's dirty bitmap instead, or as well: the
//!   job copies those granules from the source again;
//! - reads pass.
//!
//! A target write that fails fails the job: the first reason is kept
//! ([`MirrorWrites::failed`]), the job's thread returns it, and nothing
//! is mirrored from then on. The guest's completion is never changed: it
//! carries the source's result. Removing the filter
//! ([`MirrorWrites::remove`]) stops the mirroring first and waits for
//! the handles that are mirroring now, so that the target can be closed
//! even where the queues were not paused; a queue drops its handle (and
//! its queue on the target) when it next looks at the seam.
//!
//! The filter holds the target [`Disk`], the source's state holds the
//! filter while it is installed; [`MirrorWrites::remove`] ends that
//! cycle.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::copy::run_all;
use super::granule_claims::GranuleClaims;
use crate::disk::{Disk, DiskQueue};
use crate::live::{CompletionHook, CompletionHookQueue, DirtyBitmap, LiveState};
use crate::request::{BlockRequest, Completion, IoMemory, RequestOp};

/// See the module docs.
pub struct MirrorWrites {
    target: Disk,
    claims: Arc<GranuleClaims>,
    /// The job's bitmap: what the copier must copy (again).
    bitmap: Arc<DirtyBitmap>,
    /// Guest writes per claim granule from their submission to the end
    /// of their mirroring: two at once on one granule (from different
    /// queues) went to the source in an order this filter does not know.
    in_flight: Box<[AtomicU32]>,
    failed: OnceLock<String>,
    /// Set by [`MirrorWrites::remove`]: nothing is mirrored from then on.
    closed: AtomicBool,
    /// Handles mirroring right now.
    active: AtomicUsize,
    /// Tests: target writes fail as on a full target.
    #[cfg(test)]
    pub(super) fail_writes: AtomicBool,
}

impl std::fmt::Debug for MirrorWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorWrites")
            .field("target", &self.target.options().path)
            .field("granule", &self.claims.granule())
            .field("failed", &self.failed.get())
            .finish()
    }
}

impl MirrorWrites {
    /// A filter that mirrors to `target` and marks `bitmap` (the job's)
    /// where the copier must copy.
    pub fn new(target: &Disk, bitmap: Arc<DirtyBitmap>) -> MirrorWrites {
        let claims = Arc::new(GranuleClaims::new(bitmap.granularity(), bitmap.size()));
        let granules = claims.granules(0, bitmap.size()).end as usize;
        MirrorWrites {
            in_flight: (0..granules).map(|_| AtomicU32::new(0)).collect(),
            claims,
            target: target.clone(),
            bitmap,
            failed: OnceLock::new(),
            closed: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            #[cfg(test)]
            fail_writes: AtomicBool::new(false),
        }
    }

    /// The granules the copier takes around each batch.
    pub fn claims(&self) -> &Arc<GranuleClaims> {
        &self.claims
    }

    /// Why mirroring a guest write failed, if it did (the job fails).
    pub fn failed(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    fn fail(&self, why: String) {
        if self.failed.set(why.clone()).is_ok() {
            log::error!("write-blocking mirror: {why}; the guest's writes go on unmirrored");
        }
    }

    /// Installs the filter on `source`'s seam (its queues paused: every
    /// write completing from then on is mirrored).
    pub fn install(self: &Arc<Self>, source: &LiveState) {
        source.set_completion_hook(Some(self.clone() as Arc<dyn CompletionHook>));
    }

    /// Stops the mirroring, waits for the handles mirroring now and takes
    /// the filter off `source`'s seam (see the module docs).
    pub fn remove(self: &Arc<Self>, source: &LiveState) {
        self.closed.store(true, Ordering::SeqCst);
        let mut waited = Duration::ZERO;
        while self.active.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_micros(100));
            waited += Duration::from_micros(100);
            if waited == Duration::from_secs(30) {
                log::warn!("write-blocking mirror: a queue is still writing the target after 30 s");
            }
        }
        let ours = source
            .filters()
            .1
            .mirror
            .as_ref()
            .is_some_and(|h| std::ptr::addr_eq(Arc::as_ptr(h), Arc::as_ptr(self)));
        if ours {
            source.set_completion_hook(None);
        }
    }

    /// Enters a handle's mirroring (false: closed or failed, do nothing).
    fn enter(&self) -> bool {
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) || self.failed.get().is_some() {
            self.active.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn leave(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a write other than this one (counted too) is in flight on
    /// a granule of `offset..offset + len`.
    fn another_in_flight(&self, offset: u64, len: u64) -> bool {
        self.claims
            .granules(offset, len)
            .any(|g| self.in_flight[g as usize].load(Ordering::SeqCst) > 1)
    }
}

impl CompletionHook for MirrorWrites {
    fn queue_handle(self: Arc<Self>) -> Box<dyn CompletionHookQueue> {
        Box::new(MirrorWritesQueue {
            filter: self,
            target: None,
            done: Vec::new(),
        })
    }
}

/// One queue's handle (see the module docs).
pub struct MirrorWritesQueue {
    filter: Arc<MirrorWrites>,
    /// This queue's own queue on the target, made on its thread.
    target: Option<DiskQueue>,
    done: Vec<Completion>,
}

impl CompletionHookQueue for MirrorWritesQueue {
    fn before_write(&mut self, offset: u64, len: u64) {
        let filter = &self.filter;
        for g in filter.claims.granules(offset, len) {
            filter.in_flight[g as usize].fetch_add(1, Ordering::SeqCst);
        }
    }

    fn completed(&mut self, done: &[Completion]) {
        if !done
            .iter()
            .any(|c| c.changes_data() || c.op == RequestOp::Flush)
        {
            return;
        }
        let filter = self.filter.clone();
        if filter.enter() {
            if let Err(why) = self.mirror(&filter, done) {
                filter.fail(why);
            }
            filter.leave();
        }
        // These writes are mirrored (or never will be): no longer in flight.
        for c in done.iter().filter(|c| c.changes_data()) {
            for g in filter.claims.granules(c.offset, c.len) {
                let _ = filter.in_flight[g as usize].fetch_update(
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                    |n| n.checked_sub(1),
                );
            }
        }
    }
}

impl MirrorWritesQueue {
    fn mirror(&mut self, filter: &MirrorWrites, done: &[Completion]) -> Result<(), String> {
        let mut writes = Vec::new();
        let mut flush = false;
        for c in done {
            match (c.op, &c.result) {
                (RequestOp::Flush, Ok(_)) => flush = true,
                (RequestOp::Write | RequestOp::WriteZeroes { .. }, Ok(_)) => {
                    if filter.another_in_flight(c.offset, c.len) {
                        // Its order against the other on the source is
                        // not known: the copier copies what the source
                        // holds once both are through.
                        filter.bitmap.mark(c.offset, c.len);
                    }
                    writes.push(BlockRequest {
                        user_data: writes.len() as u64,
                        op: c.op,
                        offset: c.offset,
                        memory: share(&c.memory),
                    })
                }
                // A discard's result is the format's to choose; a failed
                // write's bytes are unknown: copy them from the source.
                (op, _) if op.changes_data() => filter.bitmap.mark(c.offset, c.len),
                _ => {}
            }
        }
        mark_overlaps(&filter.bitmap, &writes);
        if writes.is_empty() && !flush {
            return Ok(());
        }
        let target = match self.target.as_mut() {
            Some(q) => q,
            None => self.target.insert(filter.target.queue().map_err(|e| {
                format!(
                    "a queue on the target for a guest queue: {}",
                    ch_log::error_chain(&e)
                )
            })?),
        };
        if !writes.is_empty() {
            let _claim = filter
                .claims
                .guest(writes.iter().map(|w| (w.offset, w.len())));
            #[cfg(test)]
            if filter.fail_writes.load(Ordering::Relaxed) {
                return Err("writing the target at a guest write's offset: no space".into());
            }
            let n = writes.len();
            run_all(target, &mut self.done, writes, n).map_err(|(at, e)| {
                format!(
                    "writing the target at {at} (a guest write): {}",
                    ch_log::error_chain(&e)
                )
            })?;
        }
        if flush {
            let req = BlockRequest {
                user_data: 0,
                op: RequestOp::Flush,
                offset: 0,
                memory: IoMemory::None,
            };
            run_all(target, &mut self.done, [req], 1).map_err(|(_, e)| {
                format!(
                    "flushing the target (a guest flush): {}",
                    ch_log::error_chain(&e)
                )
            })?;
        }
        Ok(())
    }
}

/// The memory of a completed write, for the same write to the target.
fn share(memory: &IoMemory) -> IoMemory {
    match memory {
        IoMemory::None => IoMemory::None,
        IoMemory::Guest { mem, segments } => IoMemory::Guest {
            mem: mem.clone(),
            segments: segments.clone(),
        },
        IoMemory::Owned(v) => IoMemory::Owned(v.clone()),
        IoMemory::Aligned(a) => IoMemory::Owned(a.as_slice().to_vec()),
    }
}

/// Writes of one batch that overlap each other went to the source in an
/// order nobody knows: their ranges are marked for the copier.
fn mark_overlaps(bitmap: &DirtyBitmap, writes: &[BlockRequest]) {
    if writes.len() < 2 {
        return;
    }
    let mut ranges: Vec<(u64, u64)> = writes.iter().map(|w| (w.offset, w.len())).collect();
    ranges.sort_unstable();
    for (i, &(offset, len)) in ranges.iter().enumerate() {
        for &(o, l) in ranges[i + 1..].iter().take_while(|r| r.0 < offset + len) {
            bitmap.mark(offset, len);
            bitmap.mark(o, l);
        }
    }
}
