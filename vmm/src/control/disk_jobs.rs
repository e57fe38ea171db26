//! Block jobs of running disks (docs/block-jobs.md): `vm.disk-mirror`
//! starts a mirror, `vm.disk-jobs` lists the jobs, `vm.disk-job-complete`
//! switches a ready mirror's disk to its target, `vm.disk-job-cancel`
//! stops a job.
//!
//! A mirror starts in order, so that a refusal loses nothing: the
//! request is checked (known disk 404, writable 400, no other job on it
//! 409, the options 400), the target is checked, created and opened
//! (`block::jobs::open_target`: the source itself or a backing file, an
//! existing path for a new target, a size that differs, refused before
//! anything is written), then the job's dirty bitmap (background mode)
//! or its mirroring filter (write-blocking mode) is put on the disk's
//! write seam with its queues paused (every guest write from that
//! instant on is marked or mirrored) and the job's thread starts.
//!
//! Complete (ready only, 409 otherwise): the job's thread is parked, the
//! target flushed and opened as the disk's next image
//! ([`BlockDevice::prepare_switch`]); then, with the disk's queues
//! paused, the last dirty granules are copied and the device takes the
//! target ([`BlockDevice::swap_prepared`]); after the resume the source
//! is flushed, marked clean, unlocked and closed. A failure before the
//! swap leaves the disk on its source and fails the job. A cancel at
//! ready copies the last dirty granules the same way, leaves the disk on
//! its source and the target a consistent copy of that instant; a
//! cancel before ready stops the copy and removes a target the job made.
//!
//! [`BlockDevice::prepare_switch`]: virtio_devices::block::BlockDevice::prepare_switch
//! [`BlockDevice::swap_prepared`]: virtio_devices::block::BlockDevice::swap_prepared

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use block::jobs::{
    open_target, Job, JobShared, JobState, Mirror, MirrorMode, SyncMode, TargetSpec,
};
use block::live::{check_granularity, DEFAULT_GRANULARITY};
use block::ImageType;

use super::job_registry::{JobWork, RegisteredJob};
use super::{status, Control};
use crate::api::types::{DiskMirrorBody, JobBody};
use crate::api::ApiResponse;
use crate::disk_registry::DiskBackend;
use crate::events::emit;
use crate::seccomp::{self, ThreadKind};

/// How long complete and cancel wait for the job's thread to stop
/// between two chunks (a batch is at most a few MiB).
const PARK_TIMEOUT: Duration = Duration::from_secs(60);

impl Control {
    pub(crate) fn disk_mirror(&mut self, body: DiskMirrorBody) -> ApiResponse {
        match self.start_mirror(body) {
            Ok(id) => ApiResponse::json(&serde_json::json!({ "job": id })),
            Err(r) => r,
        }
    }

    fn start_mirror(&mut self, body: DiskMirrorBody) -> Result<String, ApiResponse> {
        const WHAT: &str = "vm.disk-mirror";
        let bad = |why: String| ApiResponse::error(400, &[WHAT, &why]);
        let sync = match body.sync.as_deref() {
            None | Some("full") => SyncMode::Full,
            Some("top") => SyncMode::Top,
            Some(other) => return Err(bad(format!("sync is full or top, not '{other}'"))),
        };
        let mirror_mode = match body.mode.as_deref() {
            None | Some("background") => MirrorMode::Background,
            Some("write-blocking") => MirrorMode::WriteBlocking,
            Some(other) => {
                return Err(bad(format!(
                    "mode is background or write-blocking, not '{other}'"
                )))
            }
        };
        let granularity = body.granularity.unwrap_or(DEFAULT_GRANULARITY);
        check_granularity(granularity).map_err(bad)?;
        let disk = {
            let d = self.local_disk(&body.id, WHAT)?;
            d.lock_device().expect("local_disk checked").disk().clone()
        };
        if disk.readonly() {
            return Err(bad(format!("disk '{}' is read-only", body.id)));
        }
        if let Some(why) = self.jobs.busy(&body.id) {
            return Err(ApiResponse::error(409, &[WHAT, &why]));
        }
        // A backup's point-in-time view reads the disk's image; the
        // mirror's complete would switch the disk away from it.
        self.refuse_if_backing_up(&body.id, WHAT)?;
        let spec = TargetSpec {
            path: PathBuf::from(&body.target),
            format: body.format.clone(),
            existing: body.existing,
            sync,
        };
        let context = format!("{WHAT}: disk '{}'", body.id);
        let target = open_target(&disk, &spec).map_err(|e| {
            let code = match &e {
                e if e.is_conflict() => 409,
                e if e.is_refusal() => 400,
                block::jobs::TargetError::Open { source, .. }
                | block::jobs::TargetError::Create { source, .. } => status::of_block(source),
                _ => 500,
            };
            ApiResponse::from_error_in(code, Some(&context), &e)
        })?;
        let mirror = Mirror::new(disk.clone(), target, sync, granularity, mirror_mode)
            .map(Arc::new)
            .map_err(|why| ApiResponse::error(500, &[&context, &why]))?;
        // From this instant every completed guest write is marked (or,
        // write-blocking, mirrored).
        let attached = self.with_disks_paused(&[&body.id], WHAT, |_| {
            mirror.attach();
            Ok(())
        });
        if let Err(r) = attached {
            mirror.release();
            return Err(r);
        }
        let id = self.jobs.next_id();
        let shared = JobShared::new(&id, "mirror", &body.id, body.speed.unwrap_or(0));
        let m = mirror.clone();
        let mode = self.seccomp;
        let job_body = move |s: &JobShared| {
            seccomp::apply(ThreadKind::BlockJob, mode).map_err(|e| {
                format!(
                    "cannot confine the job's thread: {}",
                    ch_log::error_chain(&e)
                )
            })?;
            m.run(s)
        };
        // The control loop may not start threads; the builder may.
        let started = self.builder.run(move || Job::spawn(shared, job_body));
        let job = match started {
            Some(Ok(j)) => j,
            Some(Err(e)) => {
                mirror.release();
                return Err(ApiResponse::from_error_in(
                    500,
                    Some(&format!("{context}: cannot start the job's thread")),
                    &e,
                ));
            }
            None => {
                mirror.release();
                return Err(ApiResponse::error(
                    500,
                    &[
                        &context,
                        "cannot start the job's thread: the vm-builder thread is gone",
                    ],
                ));
            }
        };
        log::info!(
            "{WHAT}: job {id} mirrors disk '{}' to {} ({}, {})",
            body.id,
            body.target,
            if sync == SyncMode::Top { "top" } else { "full" },
            mirror_mode.name()
        );
        emit(
            "job",
            "started",
            &[("id", &id), ("disk", &body.id), ("target", &body.target)],
        );
        self.jobs.insert(RegisteredJob {
            job,
            work: JobWork::Mirror(mirror),
        });
        Ok(id)
    }

    pub(crate) fn disk_jobs(&mut self) -> ApiResponse {
        self.finish_chain_jobs();
        let list: Vec<serde_json::Value> =
            self.jobs.statuses().iter().map(|s| s.to_json()).collect();
        ApiResponse::json(&list)
    }

    pub(crate) fn disk_job_complete(&mut self, body: JobBody) -> ApiResponse {
        match self.complete_job(&body.job) {
            Ok(()) => ApiResponse::no_content(),
            Err(r) => r,
        }
    }

    fn complete_job(&mut self, id: &str) -> Result<(), ApiResponse> {
        const WHAT: &str = "vm.disk-job-complete";
        let (disk_id, state) = self.job_facts(id, WHAT)?;
        if state != JobState::Ready {
            let why = format!("job '{id}' is {}; only a ready job completes", state.name());
            return Err(ApiResponse::error(409, &[WHAT, &why]));
        }
        let context = format!("{WHAT}: job '{id}'");
        let (mirror, shared) = self.park_job(id, &context)?;
        let fail = |this: &mut Control, why: String| -> ApiResponse {
            shared.fail(why.clone());
            if let Some(j) = this.jobs.find_mut(id) {
                j.job.stop();
            }
            mirror.release();
            ApiResponse::error(500, &[&context, &why])
        };
        if let Err(why) = mirror.flush_target() {
            return Err(fail(self, why));
        }
        let Some(target) = mirror.take_target() else {
            return Err(fail(self, "the target is gone".into()));
        };
        let target_path = target.path().to_owned();
        let target_type = ImageType::Format(target.image.disk().format().name());
        // A target the job made goes again if the switch does not happen.
        let created = target.created().map(ToOwned::to_owned);
        let fail = |this: &mut Control, why: String| -> ApiResponse {
            let r = fail(this, why);
            if let Some(p) = &created {
                if let Err(e) = std::fs::remove_file(p) {
                    log::warn!("{WHAT}: cannot remove the target {}: {e}", p.display());
                }
            }
            r
        };
        let image = target.into_image();
        // The disk's persistent bitmaps move to a qcow2 target at the
        // switch and are stored there.
        if let Err(e) = image.attach_persistent_bitmaps() {
            return Err(fail(self, ch_log::error_chain(&e)));
        }
        let prepared = {
            let d = match self.local_disk(&disk_id, WHAT) {
                Ok(d) => d,
                Err(_) => return Err(fail(self, format!("disk '{disk_id}' is gone"))),
            };
            let dev = d.lock_device().expect("local_disk checked");
            let source = dev.disk().clone();
            let p = dev.prepare_switch(image);
            drop(dev);
            match p {
                Ok(p) => (p, source),
                Err(e) => return Err(fail(self, ch_log::error_chain(&e))),
            }
        };
        let (prepared, source) = prepared;
        // What the source has cached goes out while the guest runs.
        if let Err(e) = source.flush() {
            return Err(fail(
                self,
                format!("flushing the source: {}", ch_log::error_chain(&e)),
            ));
        }
        let switched = self.with_disks_paused(&[&disk_id], WHAT, |devices| {
            mirror
                .sync_rest(&shared)
                .map_err(|why| ApiResponse::error(500, &[&context, &why]))?;
            devices[0]
                .swap_prepared(prepared)
                .map_err(|e| ApiResponse::from_error_in(status::of_control(&e), Some(&context), &e))
        });
        let out = match switched {
            Ok(out) => out,
            Err(r) => {
                let why = crate::api::client::error_text(r.body.as_deref().unwrap_or_default());
                let _ = fail(self, why);
                return Err(r);
            }
        };
        shared.set_state(JobState::Completed);
        if let Some(j) = self.jobs.find_mut(id) {
            j.job.stop();
        }
        mirror.release();
        let name = source.options().path.display().to_string();
        if let Err(e) = out.close() {
            log::error!("{WHAT}: closing the source {name} after the switch: {e}");
        }
        self.name_mirrored_image(&disk_id, target_path.clone(), target_type);
        log::info!(
            "{WHAT}: disk '{disk_id}' now runs on {}",
            target_path.display()
        );
        emit("job", "completed", &[("id", id), ("disk", &disk_id)]);
        Ok(())
    }

    pub(crate) fn disk_job_cancel(&mut self, body: JobBody) -> ApiResponse {
        match self.cancel_job(&body.job) {
            Ok(()) => ApiResponse::no_content(),
            Err(r) => r,
        }
    }

    fn cancel_job(&mut self, id: &str) -> Result<(), ApiResponse> {
        const WHAT: &str = "vm.disk-job-cancel";
        let (disk_id, state) = self.job_facts(id, WHAT)?;
        if state.is_final() {
            let why = format!("job '{id}' has ended ({})", state.name());
            return Err(ApiResponse::error(409, &[WHAT, &why]));
        }
        if state != JobState::Ready {
            let j = self.jobs.find_mut(id).expect("job_facts found it");
            j.job.cancel();
            j.job.join();
            // A stream or commit whose copy ended just before is
            // cancelled too (its chain is not relinked).
            j.job.shared().set_state(JobState::Cancelled);
            j.work.release();
            emit("job", "cancelled", &[("id", id), ("disk", &disk_id)]);
            return Ok(());
        }
        // At ready: the target becomes a consistent copy of this instant.
        let context = format!("{WHAT}: job '{id}'");
        let (mirror, shared) = self.park_job(id, &context)?;
        let synced = self.with_disks_paused(&[&disk_id], WHAT, |_| {
            mirror
                .sync_rest(&shared)
                .map_err(|why| ApiResponse::error(500, &[&context, &why]))
        });
        let j = self.jobs.find_mut(id).expect("job_facts found it");
        match synced {
            Ok(()) => {
                shared.set_state(JobState::Cancelled);
                j.job.stop();
                mirror.release_keeping(true);
                emit("job", "cancelled", &[("id", id), ("disk", &disk_id)]);
                Ok(())
            }
            Err(r) => {
                let why = crate::api::client::error_text(r.body.as_deref().unwrap_or_default());
                shared.fail(why);
                j.job.stop();
                mirror.release();
                Err(r)
            }
        }
    }

    /// The disk and state of job `id` (404 if unknown).
    fn job_facts(&mut self, id: &str, what: &str) -> Result<(String, JobState), ApiResponse> {
        let j = self
            .jobs
            .find_mut(id)
            .ok_or_else(|| ApiResponse::error(404, &[what, &format!("no job with id '{id}'")]))?;
        Ok((j.job.shared().disk().to_string(), j.job.status().state))
    }

    /// Parks job `id`'s thread between two chunks.
    fn park_job(
        &mut self,
        id: &str,
        context: &str,
    ) -> Result<(Arc<Mirror>, Arc<JobShared>), ApiResponse> {
        let j = self
            .jobs
            .find_mut(id)
            .ok_or_else(|| ApiResponse::error(404, &[context, "the job is gone"]))?;
        if !j.job.park(PARK_TIMEOUT) {
            j.job.unpark();
            return Err(ApiResponse::error(
                503,
                &[context, "the job did not stop between two chunks in time"],
            ));
        }
        let state = j.job.status().state;
        if state.is_final() {
            let why = format!("the job ended ({}) meanwhile", state.name());
            return Err(ApiResponse::error(409, &[context, &why]));
        }
        let mirror = j.work.mirror().cloned().ok_or_else(|| {
            ApiResponse::error(
                409,
                &[context, "the job is not a mirror or an active commit"],
            )
        })?;
        Ok((mirror, j.job.shared().clone()))
    }

    /// The disk's config names its new image (`vm.info`).
    fn name_mirrored_image(&mut self, id: &str, path: PathBuf, image_type: ImageType) {
        let Some(vm) = self.vm.as_mut() else { return };
        if let Some(d) = vm.machine.devices.disks.find_mut(id) {
            if let DiskBackend::Local { config, .. } = &mut d.backend {
                config.options.path = path;
                config.options.image_type = image_type;
            }
        }
    }
}
