//! The end of a stream or of a commit below the active image: once the
//! job's thread says its copy is done (the `job_ended` eventfd of the
//! control loop, or a read of the job list), the backing link is
//! rewritten and the running disk moves to its image reopened over the
//! new chain. docs/block-jobs.md describes it for users.
//!
//! In order, so that a failure leaves the disk on a chain that reads the
//! same:
//! 1. a commit's base is closed (its metadata written, marked clean);
//! 2. the link is rewritten: the active image's through the device's own
//!    open (under its metadata lock, while the guest runs), an
//!    intermediate image's through a second open of its header. Both
//!    chains read the same from here on (the layers dropped hold
//!    nothing the new link does not reach), so the running disk may
//!    still read through the old one;
//! 3. the active image is flushed, then, with the disk's queues paused,
//!    its open is closed (marked clean), the image is opened again
//!    beside it (`block::ExclusiveImage::open_beside`: the file once
//!    more, with the new chain from its header), and the device takes it
//!    ([`BlockDevice::swap_prepared`]; the dirty bitmaps move with it);
//! 4. after the resume the old open is closed and dropped: the backing
//!    files no longer in the chain close and are unlocked.
//!
//! A failure before the swap leaves the disk on its old open (which
//! reads the same) and fails the job with the reason.
//!
//! [`BlockDevice::swap_prepared`]: virtio_devices::block::BlockDevice::swap_prepared

use block::{DiskOptions, ExclusiveImage, ImageType};

use super::job_registry::{JobWork, Relink};
use super::Control;
use crate::api::client::error_text;
use crate::events::emit;

const WHAT: &str = "block job";

impl Control {
    /// Finishes every stream and commit whose copy is done.
    pub(super) fn finish_chain_jobs(&mut self) {
        for id in self.jobs.copied() {
            self.finish_chain_job(&id);
        }
    }

    fn finish_chain_job(&mut self, id: &str) {
        let Some(j) = self.jobs.find_mut(id) else {
            return;
        };
        j.job.join();
        let shared = j.job.shared().clone();
        let (disk_id, kind) = (shared.disk().to_string(), shared.status().kind);
        let (relink, commit) = match &j.work {
            JobWork::Stream(s, r) => {
                s.release();
                (r.clone(), None)
            }
            JobWork::Commit(c, r) => (r.clone(), Some(c.clone())),
            JobWork::Mirror(_) => return,
        };
        let result = commit
            .map_or(Ok(()), |c| c.close_base())
            .and_then(|()| self.relink(&disk_id, &relink))
            .and_then(|()| self.reopen_running(&disk_id));
        match result {
            Ok(()) => {
                shared.set_state(block::jobs::JobState::Completed);
                log::info!(
                    "{kind} job {id}: done; {} now has backing file {}",
                    relink.overlay.display(),
                    relink.backing.as_ref().map_or("none", |b| b.0.as_str())
                );
                emit("job", "completed", &[("id", id), ("disk", &disk_id)]);
            }
            Err(why) => {
                log::error!("{kind} job {id}: {why}");
                shared.fail(why);
                emit("job", "failed", &[("id", id), ("disk", &disk_id)]);
            }
        }
        if let Some(j) = self.jobs.find_mut(id) {
            j.work.release();
        }
    }

    /// Step 2: the new backing link in the overlay's header.
    fn relink(&mut self, disk_id: &str, relink: &Relink) -> Result<(), String> {
        let (name, format) = match &relink.backing {
            Some((n, f)) => (Some(n.as_str()), Some(*f)),
            None => (None, None),
        };
        let failed = |e: block::BlockError| {
            format!(
                "rewriting the backing link of {}: {}",
                relink.overlay.display(),
                ch_log::error_chain(&e)
            )
        };
        let d = self
            .local_disk(disk_id, WHAT)
            .map_err(|r| error_text(r.body.as_deref().unwrap_or_default()))?;
        let dev = d.lock_device().expect("local_disk checked");
        if relink.depth == 0 {
            let image = dev
                .image()
                .ok_or_else(|| "the disk's image has no owner's open to rewrite".to_string())?;
            return image.tools().set_backing_file(name, format).map_err(failed);
        }
        // An intermediate image: its header only, through a second open.
        let opts = DiskOptions {
            path: relink.overlay.clone(),
            image_type: ImageType::Format("qcow2"),
            readonly: false,
            no_backing: true,
            keep_persistent_bitmaps: true,
            records_bitmaps: false,
            snapshot: None,
            ..dev.disk().options().clone()
        };
        drop(dev);
        let image = ExclusiveImage::open_beside(&opts).map_err(failed)?;
        image
            .tools()
            .set_backing_file(name, format)
            .map_err(failed)?;
        image.close().map_err(failed)
    }

    /// Steps 3 and 4: the disk moves to its image opened again.
    fn reopen_running(&mut self, disk_id: &str) -> Result<(), String> {
        let old = {
            let d = self
                .local_disk(disk_id, WHAT)
                .map_err(|r| error_text(r.body.as_deref().unwrap_or_default()))?;
            d.lock_device().expect("local_disk checked").disk().clone()
        };
        old.flush()
            .map_err(|e| format!("flushing the disk: {}", ch_log::error_chain(&e)))?;
        let path = old.options().path.display().to_string();
        let switched = self.with_disks_paused(&[disk_id], WHAT, |devices| {
            let fail = |why: String| crate::api::ApiResponse::error(500, &[&why]);
            // Nothing is in flight: the file is consistent and clean for
            // the open beside it.
            old.format()
                .close()
                .map_err(|e| fail(format!("closing {path}: {}", ch_log::error_chain(&e))))?;
            let image = ExclusiveImage::open_beside(old.options()).map_err(|e| {
                fail(format!(
                    "opening {path} over its new chain: {}",
                    ch_log::error_chain(&e)
                ))
            })?;
            image.adopt_persistent_bitmaps();
            let prepared = devices[0]
                .prepare_switch(image)
                .map_err(|e| fail(ch_log::error_chain(&e)))?;
            let out = devices[0]
                .swap_prepared(prepared)
                .map_err(|e| fail(ch_log::error_chain(&e)))?;
            // The new open stores the bitmaps it took over.
            old.live().forget_sink();
            Ok(out)
        });
        let out = switched.map_err(|r| error_text(r.body.as_deref().unwrap_or_default()))?;
        if let Err(e) = out.close() {
            log::warn!("{WHAT}: closing the old open of {path}: {e}");
        }
        Ok(())
    }
}
