//! The commit job of a layer below the active image (docs/block-jobs.md):
//! copies what an intermediate backing file (`top`), and the layers
//! between it and the base, hold into the base while the guest runs; the
//! guest writes neither (it writes the active image above them).
//!
//! Its owner (the VMM) makes a [`Commit`] from a disk over `top`'s open
//! format (reads through `top` down the chain), the base opened
//! writable beside the running chain's read-only open of it
//! ([`crate::ExclusiveImage::open_beside`]), and the base's depth below
//! `top`; [`Commit::run`], on the job's thread, walks `top`'s block
//! status and copies every range a layer above the base decides (data
//! copied, zeroes written as zeroes) through [`super::copy`].
//!
//! Why the running chain stays right meanwhile: every range written into
//! the base is one that `top` (or a layer between) decides, so no guest
//! read reaches the base there, and the base's other clusters keep their
//! data; the running chain's read-only open of the base may cache tables
//! that are stale only for those ranges.
//!
//! The job then ends with the copy done ([`Commit::copied`]) and its
//! state still `running`: the owner closes the base
//! ([`Commit::close_base`]), points the image above `top` at the base
//! and switches the disk to the active image reopened over that chain,
//! then marks it completed. A cancel or a failure leaves the base with
//! part of the copy, in ranges the chain above it decides: every image
//! still reads as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::copy::{ranges_to_copy, Copier, ExtentAction, BATCH, CHUNK};
use super::job::{Flow, JobShared, JobState};
use crate::disk::Disk;
use crate::exclusive::ExclusiveImage;

/// See the module docs.
pub struct Commit {
    /// A disk over `top`'s open format; `None` once released.
    top: Mutex<Option<Disk>>,
    /// The base, writable; `None` once closed or released.
    base: Mutex<Option<ExclusiveImage>>,
    copier: Mutex<Option<Copier>>,
    /// The base's depth below `top`: layers above it are copied.
    base_depth: u32,
    copied: AtomicBool,
}

impl Commit {
    pub fn new(top: Disk, base: ExclusiveImage, base_depth: u32) -> Result<Commit, String> {
        if base_depth == 0 {
            return Err("the base cannot be the top".into());
        }
        let copier = Copier::new(&top, base.disk())
            .map_err(|e| format!("cannot make the job's queues: {}", ch_log::error_chain(&e)))?;
        Ok(Commit {
            top: Mutex::new(Some(top)),
            base: Mutex::new(Some(base)),
            copier: Mutex::new(Some(copier)),
            base_depth,
            copied: AtomicBool::new(false),
        })
    }

    /// Whether [`Commit::run`] copied everything (the owner may relink).
    pub fn copied(&self) -> bool {
        self.copied.load(Ordering::Acquire)
    }

    /// The job's body (see the module docs).
    pub fn run(&self, job: &JobShared) -> Result<Option<JobState>, String> {
        let Some(top) = lock(&self.top).clone() else {
            return Err("the job was released".into());
        };
        let size = top.size();
        let format = top.format().clone();
        drop(top);
        let base_depth = self.base_depth;
        let (copy, zero) = ranges_to_copy(format.as_ref(), size, |s| {
            match (s.present && s.depth < base_depth, s.data) {
                (true, true) => ExtentAction::Copy,
                (true, false) => ExtentAction::Zero,
                (false, _) => ExtentAction::Skip,
            }
        })?;
        job.add_total(copy.iter().map(|r| r.1).sum());
        for (offset, len) in zero {
            if job.between_chunks() == Flow::Stop {
                return Ok(None);
            }
            self.with_copier(|c| c.zero(offset, len))?;
        }
        let mut batch = Vec::with_capacity(BATCH);
        let mut pieces = copy.into_iter().flat_map(|(o, l)| pieces(o, l)).peekable();
        while pieces.peek().is_some() {
            batch.clear();
            batch.extend(pieces.by_ref().take(BATCH));
            if job.between_chunks() == Flow::Stop {
                return Ok(None);
            }
            // The base may hold other data there: zeroes are written.
            let copied = self.with_copier(|c| c.copy(&batch, false))?;
            job.add_done(copied.bytes);
        }
        self.copied.store(true, Ordering::Release);
        Ok(None)
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

    /// Closes the base (its metadata written, marked clean, synced, its
    /// second open's locks dropped): the owner, once the copy is done,
    /// before the chain is relinked.
    pub fn close_base(&self) -> Result<(), String> {
        lock(&self.copier).take();
        match lock(&self.base).take() {
            Some(b) => b
                .close()
                .map_err(|e| format!("closing the base: {}", ch_log::error_chain(&e))),
            None => Err("the base is closed already".into()),
        }
    }

    /// Drops the job's queues and closes the base if still open (a
    /// cancel or a failure: what was copied stays; see the module docs).
    pub fn release(&self) {
        lock(&self.copier).take();
        lock(&self.top).take();
        if let Some(b) = lock(&self.base).take() {
            let path = b.disk().options().path.display().to_string();
            if let Err(e) = b.close() {
                log::error!(
                    "closing the commit's base {path}: {}",
                    ch_log::error_chain(&e)
                );
            }
        }
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        self.release();
    }
}

/// `offset..offset + len` in pieces of at most [`CHUNK`] bytes, cut at
/// multiples of it.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        (pos < end).then(|| {
            let next = ((pos / CHUNK + 1) * CHUNK).min(end);
            let piece = (pos, next - pos);
            pos = next;
            piece
        })
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
