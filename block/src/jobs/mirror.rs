//! The mirror job (docs/block-jobs.md): copies a running disk to a
//! target while the guest writes, until the target is in sync.
//!
//! Its owner (the VMM) makes a [`Mirror`] from the running source and
//! its opened [`MirrorTarget`], calls [`Mirror::attach`] while the
//! disk's queues are paused, and starts [`Mirror::run`] on the job's
//! thread. In background mode the attach puts the job's dirty bitmap on
//! the source's write seam (every guest write completing from then on
//! is marked); in write-blocking mode it installs the job's filter
//! ([`MirrorWrites`]), which writes every completing guest write to the
//! target before the guest sees it, and marks the bitmap only where it
//! cannot (discards, failed writes); the copier then takes the granules
//! of each batch ([`GranuleClaims`](super::granule_claims)) so that it
//! never writes an old copy over a mirrored write. The thread:
//! 1. walks the source's block status and copies what is allocated
//!    (`sync=full`: data anywhere in the chain; `sync=top`: what the top
//!    image holds, its zero clusters as zeroes); unallocated and zero
//!    ranges are not copied, so the target stays sparse;
//! 2. copies what the bitmap marks, clearing a granule's bit before it
//!    reads it (a write completing after that read marks it again), until
//!    the bitmap is clean: the job is `ready`, and stays in this loop.
//!
//! A write-blocking job whose filter failed to write the target fails
//! with that reason; the guest's writes go on.
//!
//! Complete and a cancel at ready belong to the owner: it parks the
//! thread, pauses the disk's queues and calls [`Mirror::sync_rest`] (the
//! last dirty granules, nothing in flight; a write-blocking filter comes
//! off the seam there), then switches the disk to
//! [`Mirror::take_target`] or leaves it. Whatever way the thread ends,
//! the owner then calls [`Mirror::release`], which detaches the bitmap
//! or filter and closes (and, if the job made it, removes) a target
//! nobody took:
//! the thread itself never opens or removes a file, so its owner may
//! confine it to I/O on the queues it was given.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::copy::{ranges_to_copy, Copied, Copier, ExtentAction, Hold, BATCH, CHUNK, MAX_RANGES};
use super::job::{Flow, JobShared, JobState};
use super::mirror_target::{MirrorTarget, SyncMode};
use super::write_blocking::MirrorWrites;
use crate::disk::Disk;
use crate::formats::format::status_within;
use crate::formats::Format;
use crate::live::DirtyBitmap;

/// How long a ready job with nothing dirty sleeps before it looks again.
const IDLE: Duration = Duration::from_millis(20);

/// How a mirror follows the guest's writes (QEMU's `copy-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorMode {
    /// A dirty bitmap records them; the job copies them again.
    Background,
    /// Each is written to the target before the guest sees it complete.
    WriteBlocking,
}

impl MirrorMode {
    pub fn name(self) -> &'static str {
        match self {
            MirrorMode::Background => "background",
            MirrorMode::WriteBlocking => "write-blocking",
        }
    }
}

/// See the module docs.
pub struct Mirror {
    /// `None` once released: the source's files close (and unlock) as
    /// soon as the device lets go of them too.
    source: Mutex<Option<Disk>>,
    sync: SyncMode,
    bitmap: Arc<DirtyBitmap>,
    /// The write-blocking filter (`None` in background mode).
    writes: Option<Arc<MirrorWrites>>,
    /// The job's queues; `None` once released.
    copier: Mutex<Option<Copier>>,
    /// `None` once taken (complete) or released.
    target: Mutex<Option<MirrorTarget>>,
    /// The target read zeroes everywhere when the job began.
    target_was_zero: bool,
    /// Where the next look for dirty granules starts: the job sweeps the
    /// disk round and round, so granules the guest keeps writing do not
    /// starve the others.
    cursor: Mutex<u64>,
}

impl Mirror {
    /// A mirror of `source` into `target` whose dirty bitmap has
    /// `granularity` (a power of two, 512 B to 2 GiB).
    pub fn new(
        source: Disk,
        target: MirrorTarget,
        sync: SyncMode,
        granularity: u64,
        mode: MirrorMode,
    ) -> Result<Mirror, String> {
        let bitmap = Arc::new(DirtyBitmap::new(granularity, source.size())?);
        let writes = (mode == MirrorMode::WriteBlocking)
            .then(|| Arc::new(MirrorWrites::new(target.image.disk(), bitmap.clone())));
        let copier = Copier::new(&source, target.image.disk())
            .map_err(|e| format!("cannot make the job's queues: {}", ch_log::error_chain(&e)))?;
        Ok(Mirror {
            target_was_zero: target.reads_zero,
            source: Mutex::new(Some(source)),
            sync,
            bitmap,
            writes,
            copier: Mutex::new(Some(copier)),
            target: Mutex::new(Some(target)),
            cursor: Mutex::new(0),
        })
    }

    /// The job's dirty bitmap: what the copier still has to copy.
    pub fn bitmap(&self) -> &Arc<DirtyBitmap> {
        &self.bitmap
    }

    pub fn mode(&self) -> MirrorMode {
        match self.writes {
            Some(_) => MirrorMode::WriteBlocking,
            None => MirrorMode::Background,
        }
    }

    /// The write-blocking filter, if the job has one.
    pub fn writes(&self) -> Option<&Arc<MirrorWrites>> {
        self.writes.as_ref()
    }

    /// Puts the job on the source's write seam (see the module docs); the
    /// owner calls it with the disk's queues paused, before the job
    /// starts.
    pub fn attach(&self) {
        let Some(source) = lock(&self.source).clone() else {
            return;
        };
        match &self.writes {
            Some(w) => w.install(source.live()),
            None => source.live().bitmaps().attach_internal(self.bitmap.clone()),
        }
    }

    /// Takes the job off the source's seam.
    fn detach(&self, source: &Disk) {
        match &self.writes {
            Some(w) => w.remove(source.live()),
            None => source.live().bitmaps().detach_internal(&self.bitmap),
        }
    }

    /// Why the write-blocking filter failed, if it did.
    fn writes_failed(&self) -> Result<(), String> {
        match self.writes.as_ref().and_then(|w| w.failed()) {
            Some(why) => Err(why.to_string()),
            None => Ok(()),
        }
    }

    /// The job's body (see the module docs): returns when cancelled or
    /// stopped, or with the reason it failed.
    pub fn run(&self, job: &JobShared) -> Result<Option<JobState>, String> {
        let end = self.first_pass(job).and_then(|flow| match flow {
            Flow::Go => self.follow(job),
            Flow::Stop => Ok(None),
        });
        if end.is_err() {
            // Nothing stays in flight behind a failure.
            let _ = self.with_copier(|c| c.finish());
        }
        end
    }

    /// Step 1: the allocated data.
    fn first_pass(&self, job: &JobShared) -> Result<Flow, String> {
        let Some(source) = lock(&self.source).clone() else {
            return Err("the job was released".into());
        };
        let size = source.size();
        let format = source.format().clone();
        drop(source);
        // What to copy and what to zero, from the block status.
        let (sync, target_was_zero) = (self.sync, self.target_was_zero);
        let (copy, zero) = ranges_to_copy(format.as_ref(), size, |s| match sync {
            SyncMode::Full if s.data => ExtentAction::Copy,
            SyncMode::Full if !target_was_zero => ExtentAction::Zero,
            SyncMode::Full => ExtentAction::Skip,
            SyncMode::Top if s.present && s.depth == 0 && s.data => ExtentAction::Copy,
            // A zero cluster of the top hides the backing data.
            SyncMode::Top if s.present && s.depth == 0 => ExtentAction::Zero,
            // The rest is read through the target's backing file; on an
            // existing target it must not hide it.
            SyncMode::Top if !target_was_zero => ExtentAction::Zero,
            SyncMode::Top => ExtentAction::Skip,
            // An active commit: the layers above the target's depth.
            SyncMode::Above(base) if s.present && s.depth < base && s.data => ExtentAction::Copy,
            SyncMode::Above(base) if s.present && s.depth < base => ExtentAction::Zero,
            SyncMode::Above(_) => ExtentAction::Skip,
        })?;
        job.add_total(copy.iter().map(|r| r.1).sum());
        for (offset, len) in zero {
            if job.between_chunks() == Flow::Stop {
                return Ok(Flow::Stop);
            }
            self.zero_target(&format, offset, len)?;
        }
        let mut batch = Vec::with_capacity(BATCH);
        for (offset, len) in copy {
            for chunk in chunks(offset, len, CHUNK) {
                batch.push(chunk);
                if batch.len() == BATCH {
                    if self.copy_batch(job, &batch, self.target_was_zero)? == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                    batch.clear();
                }
            }
        }
        if !batch.is_empty() {
            return self.copy_batch(job, &batch, self.target_was_zero);
        }
        Ok(Flow::Go)
    }

    /// Makes the target read zeroes where the source did at the start
    /// of the first pass. In write-blocking mode a guest write may have
    /// been mirrored there since (and is not in the bitmap): under the
    /// copier's claim (no mirroring in flight there), a range the source
    /// now holds data in is marked for the copier instead of zeroed.
    pub(super) fn zero_target(
        &self,
        format: &Arc<dyn Format>,
        offset: u64,
        len: u64,
    ) -> Result<(), String> {
        let Some(writes) = &self.writes else {
            return self.with_copier(|c| c.zero(offset, len));
        };
        // No batch being written may hold these granules (see below).
        self.with_copier(|c| c.settle(&[(offset, len)], writes.claims().granule()))?;
        let _claim = writes.claims().copier([(offset, len)]);
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let s = status_within(format.as_ref(), pos, end)
                .map_err(|e| format!("block status at {pos}: {}", ch_log::error_chain(&e)))?;
            let data = match self.sync {
                SyncMode::Full => s.data,
                SyncMode::Top => s.present && s.depth == 0 && s.data,
                SyncMode::Above(base) => s.present && s.depth < base && s.data,
            };
            if data {
                self.bitmap.mark(offset, len);
                return Ok(());
            }
            pos += s.len;
        }
        self.with_copier(|c| c.zero(offset, len))
    }

    /// Step 2: what the guest wrote, until told to stop.
    fn follow(&self, job: &JobShared) -> Result<Option<JobState>, String> {
        loop {
            if self.between_batches(job)? == Flow::Stop {
                return Ok(None);
            }
            self.writes_failed()?;
            let batch = self.take_dirty();
            if batch.is_empty() {
                // Nothing was dirty at this look, so every guest write
                // before it has been read: in sync once those writes
                // are on the target. A guest that goes on writing dirties
                // the bitmap again meanwhile, which a ready job follows
                // as before (looking again here would never end under a
                // guest that never stops).
                if self.with_copier(|c| Ok(c.writing()))? {
                    self.finish_writes(job)?;
                }
                if job.state() == JobState::Running {
                    log::info!("job {}: ready (the target is in sync)", job.id());
                    job.set_state(JobState::Ready);
                }
                job.idle(IDLE);
                continue;
            }
            job.add_total(batch.iter().map(|r| r.1).sum());
            if self.copy_batch(job, &batch, false)? == Flow::Stop {
                return Ok(None);
            }
        }
    }

    /// Up to [`MAX_RANGES`] dirty ranges ([`BATCH`] chunks' bytes at
    /// most), from the cursor on and round to the start, each cleared in
    /// the bitmap now.
    fn take_dirty(&self) -> Vec<(u64, u64)> {
        let step = CHUNK.max(self.bitmap.granularity());
        let budget = BATCH as u64 * CHUNK;
        let mut cursor = lock(&self.cursor);
        let mut batch = Vec::new();
        let mut bytes = 0;
        for from_start in [false, true] {
            for (offset, len) in self.bitmap.extents() {
                let end = offset + len;
                // The first sweep takes what lies past the cursor, the
                // second what lies before it.
                let (start, stop) = if from_start {
                    (offset, end.min(*cursor))
                } else {
                    (offset.max(*cursor), end)
                };
                if start >= stop {
                    continue;
                }
                for (o, l) in chunks(start, stop - start, step) {
                    if self.bitmap.take_range(o, l) {
                        batch.push((o, l));
                        bytes += l;
                    }
                    if batch.len() == MAX_RANGES || bytes >= budget {
                        *cursor = o + l;
                        return batch;
                    }
                }
            }
        }
        *cursor = batch.last().map_or(0, |&(o, l)| o + l);
        batch
    }

    /// Starts copying `batch` (its writes left in flight while the next
    /// batch is read: see [`Copier::start`]), then checks between
    /// batches.
    fn copy_batch(
        &self,
        job: &JobShared,
        batch: &[(u64, u64)],
        target_zero: bool,
    ) -> Result<Flow, String> {
        let copied = self.start_claimed(batch, target_zero)?;
        job.add_progress(copied.bytes);
        // The rate limit paces what is started: a batch's writes run
        // while the job waits.
        job.pace(batch.iter().map(|r| r.1).sum());
        self.writes_failed()?;
        self.between_batches(job)
    }

    /// [`JobShared::between_chunks`], with the copier's writes finished
    /// first when the thread is asked to park or end (the owner may
    /// then use the copier on its own thread).
    fn between_batches(&self, job: &JobShared) -> Result<Flow, String> {
        job.between_chunks_after(|| self.finish_writes(job))
    }

    /// Waits for the copier's writes in flight and counts them done.
    fn finish_writes(&self, job: &JobShared) -> Result<(), String> {
        let copied = self.with_copier(|c| {
            c.finish()?;
            Ok(c.take_finished())
        })?;
        job.add_progress(copied.bytes);
        Ok(())
    }

    /// Starts copying `batch`, holding its granules against the
    /// write-blocking filter's mirroring from before the read until the
    /// write is done; returns what finished writing meanwhile.
    fn start_claimed(&self, batch: &[(u64, u64)], target_zero: bool) -> Result<Copied, String> {
        self.with_copier(|c| {
            let hold = match &self.writes {
                Some(w) => {
                    // A granule is claimed by one batch at a time.
                    c.settle(batch, w.claims().granule())?;
                    Some(Box::new(w.claims().copier(batch.iter().copied())) as Hold)
                }
                None => None,
            };
            c.start(batch, target_zero, hold)?;
            Ok(c.take_finished())
        })
    }

    /// Copies `batch` as [`Mirror::start_claimed`] does and waits until
    /// the target has it (and everything before it).
    #[cfg(test)]
    pub(super) fn copy_claimed(
        &self,
        batch: &[(u64, u64)],
        target_zero: bool,
    ) -> Result<Copied, String> {
        let mut copied = self.start_claimed(batch, target_zero)?;
        let rest = self.with_copier(|c| {
            c.finish()?;
            Ok(c.take_finished())
        })?;
        copied.bytes += rest.bytes;
        copied.zero += rest.zero;
        Ok(copied)
    }

    /// Tests: `f` runs between each batch's read and write.
    #[cfg(test)]
    pub(super) fn set_after_read(&self, f: Box<dyn FnMut() + Send>) {
        if let Some(c) = lock(&self.copier).as_mut() {
            c.after_read = Some(f);
        }
    }

    fn with_copier<T>(
        &self,
        f: impl FnOnce(&mut Copier) -> Result<T, String>,
    ) -> Result<T, String> {
        match lock(&self.copier).as_mut() {
            Some(c) => f(c),
            None => Err("the job was released".into()),
        }
    }

    /// Copies every granule still dirty (the owner calls it with the
    /// disk's queues paused and the thread parked: the target is then
    /// the source's copy). A write-blocking filter comes off the seam
    /// here: from this instant the guest's writes are not mirrored.
    pub fn sync_rest(&self, job: &JobShared) -> Result<(), String> {
        self.writes_failed()?;
        if let (Some(w), Some(source)) = (&self.writes, lock(&self.source).clone()) {
            w.remove(source.live());
        }
        loop {
            let batch = self.take_dirty();
            if batch.is_empty() {
                return self.finish_writes(job);
            }
            job.add_total(batch.iter().map(|r| r.1).sum());
            let copied = self.start_claimed(&batch, false)?;
            job.add_progress(copied.bytes);
        }
    }

    /// Flushes the target (the owner calls it before the pause of a
    /// complete, so the switch has little left to make durable).
    pub fn flush_target(&self) -> Result<(), String> {
        match lock(&self.target).as_ref() {
            Some(t) => t
                .image
                .disk()
                .flush()
                .map_err(|e| format!("flushing the target: {}", ch_log::error_chain(&e))),
            None => Err("the target is gone".into()),
        }
    }

    /// The target, for the disk to run on (complete); the job's queues
    /// stay until [`Mirror::release`], for [`Mirror::sync_rest`] in the
    /// switch's pause.
    pub fn take_target(&self) -> Option<MirrorTarget> {
        lock(&self.target).take()
    }

    /// Detaches the bitmap or filter and closes a target nobody took (a target the
    /// job created is removed unless `keep_target`: a cancel at ready
    /// leaves a consistent copy).
    pub fn release_keeping(&self, keep_target: bool) {
        lock(&self.copier).take();
        if let Some(source) = lock(&self.source).take() {
            self.detach(&source);
        }
        if let Some(mut t) = lock(&self.target).take() {
            if keep_target {
                t.keep();
            }
            let path = t.path().display().to_string();
            if let Err(e) = t.close() {
                log::error!(
                    "closing the mirror target {path}: {}",
                    ch_log::error_chain(&e)
                );
            }
        }
    }

    /// [`Mirror::release_keeping`] of a job that did not reach a copy:
    /// a target it created is removed.
    pub fn release(&self) {
        self.release_keeping(false);
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.release_keeping(true);
    }
}

/// `offset..offset + len` in pieces of at most `step` bytes, cut at
/// multiples of `step`.
fn chunks(offset: u64, len: u64, step: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let next = ((pos / step + 1) * step).min(end);
        let r = (pos, next - pos);
        pos = next;
        Some(r)
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
