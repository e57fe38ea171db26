//! `vm.disk-stream` and `vm.disk-commit` (docs/block-jobs.md): block jobs
//! that change a running disk's backing chain.
//!
//! Both start in order, so that a refusal loses nothing: the disk is
//! checked (known 404, in-VMM and writable 400, no other job and no
//! backup on it 409), the chain is read (`block::jobs::layers_of`) and
//! the request's `base` and `top` are found in it (400 when they are
//! not files of the chain, when top is not above base, when the disk
//! has no backing file); only then is anything opened for writing.
//!
//! - A stream ([`block::jobs::Stream`]) populates the active image;
//!   when its copy is done, [`super::chain_switch`] rewrites the active
//!   image's backing link and switches the disk to the image reopened
//!   over the new chain.
//! - A commit of a layer below the active image
//!   ([`block::jobs::Commit`]) copies it into its base, opened writable
//!   beside the running chain; at its end the image above `top` is
//!   relinked to the base the same way.
//! - An active commit is a mirror ([`block::jobs::Mirror`] with
//!   `SyncMode::Above`) whose target is the base: it reaches `ready`, and
//!   `vm.disk-job-complete` switches the disk onto the base as a mirror's
//!   complete does (`disk_jobs.rs`).

use std::sync::Arc;

use block::jobs::{
    find_layer, layers_of, Commit, Job, JobShared, JobState, Layer, Mirror, MirrorMode,
    MirrorTarget, Stream, SyncMode,
};
use block::live::{check_granularity, DEFAULT_GRANULARITY};
use block::{Disk, DiskOptions, ExclusiveImage, ImageType};

use super::job_registry::{JobWork, RegisteredJob, Relink};
use super::{status, Control};
use crate::api::types::{DiskCommitBody, DiskStreamBody};
use crate::api::ApiResponse;
use crate::events::emit;
use crate::seccomp::{self, ThreadKind};

const STREAM: &str = "vm.disk-stream";
const COMMIT: &str = "vm.disk-commit";

/// A job's body, as its thread runs it.
type Body = Box<dyn FnOnce(&JobShared) -> Result<Option<JobState>, String> + Send>;

impl Control {
    pub(crate) fn disk_stream(&mut self, body: DiskStreamBody) -> ApiResponse {
        match self.start_stream(body) {
            Ok(id) => ApiResponse::json(&serde_json::json!({ "job": id })),
            Err(r) => r,
        }
    }

    pub(crate) fn disk_commit(&mut self, body: DiskCommitBody) -> ApiResponse {
        match self.start_commit(body) {
            Ok(id) => ApiResponse::json(&serde_json::json!({ "job": id })),
            Err(r) => r,
        }
    }

    fn start_stream(&mut self, body: DiskStreamBody) -> Result<String, ApiResponse> {
        let bad = |why: String| ApiResponse::error(400, &[STREAM, &why]);
        let (disk, layers) = self.chain_job_disk(&body.id, STREAM)?;
        let base = match &body.base {
            None => None,
            Some(name) => Some(layer_named(&layers, name, "base", STREAM)?),
        };
        if base == Some(0) {
            return Err(bad(format!(
                "base '{}' is the disk's active image",
                body.base.as_deref().unwrap_or_default()
            )));
        }
        if layers[0].format.info().extended_l2 == Some(true) {
            return Err(bad(format!(
                "{} has extended L2 entries (subclusters); streaming into it is not supported",
                layers[0].path.display()
            )));
        }
        let relink = Relink {
            overlay: layers[0].path.clone(),
            depth: 0,
            backing: base.map(|b| new_backing(&layers, 0, b)),
        };
        let context = format!("{STREAM}: disk '{}'", body.id);
        let stream = Arc::new(
            Stream::new(disk, base.map(|b| b as u32))
                .map_err(|why| ApiResponse::error(500, &[&context, &why]))?,
        );
        let id = self.jobs.next_id();
        let shared = JobShared::new(&id, "stream", &body.id, body.speed.unwrap_or(0));
        let s = stream.clone();
        let job = self
            .spawn_chain_job(shared, &context, Box::new(move |j| s.run(j)))
            .inspect_err(|_| stream.release())?;
        log::info!(
            "{STREAM}: job {id} streams disk '{}' down to {}",
            body.id,
            base.map_or("the end of its chain".into(), |b| layers[b]
                .path
                .display()
                .to_string())
        );
        emit("job", "started", &[("id", &id), ("disk", &body.id)]);
        self.jobs.insert(RegisteredJob {
            job,
            work: JobWork::Stream(stream, relink),
        });
        Ok(id)
    }

    fn start_commit(&mut self, body: DiskCommitBody) -> Result<String, ApiResponse> {
        let bad = |why: String| ApiResponse::error(400, &[COMMIT, &why]);
        let (disk, layers) = self.chain_job_disk(&body.id, COMMIT)?;
        let top = match &body.top {
            None => 0,
            Some(name) => layer_named(&layers, name, "top", COMMIT)?,
        };
        let base = match &body.base {
            None => layers.len() - 1,
            Some(name) => layer_named(&layers, name, "base", COMMIT)?,
        };
        if base <= top {
            return Err(bad(format!(
                "top {} is not above base {} in the disk's chain",
                layers[top].path.display(),
                layers[base].path.display()
            )));
        }
        let granularity = body.granularity.unwrap_or(DEFAULT_GRANULARITY);
        check_granularity(granularity).map_err(bad)?;
        let context = format!("{COMMIT}: disk '{}'", body.id);
        // The base, writable beside the running chain's open of it.
        let base_layer = &layers[base];
        let opts = DiskOptions {
            path: base_layer.path.clone(),
            image_type: ImageType::Format(base_layer.format_name()),
            readonly: false,
            snapshot: None,
            no_backing: false,
            keep_persistent_bitmaps: false,
            ..disk.options().clone()
        };
        let base_image = ExclusiveImage::open_beside(&opts).map_err(|e| {
            let context = format!("{context}: cannot open the base {}", opts.path.display());
            ApiResponse::from_error_in(status::of_block(&e), Some(&context), &e)
        })?;
        let id = self.jobs.next_id();
        let shared = JobShared::new(&id, "commit", &body.id, body.speed.unwrap_or(0));
        if top == 0 {
            return self.start_active_commit(
                (disk, base_image, base as u32, granularity),
                shared,
                &context,
            );
        }
        // The base's persistent bitmaps record what the commit writes.
        base_image
            .attach_persistent_bitmaps()
            .map_err(|e| ApiResponse::from_error_in(status::of_block(&e), Some(&context), &e))?;
        let top_layer = &layers[top];
        let top_opts = DiskOptions {
            path: top_layer.path.clone(),
            image_type: ImageType::Format(top_layer.format_name()),
            readonly: true,
            ..disk.options().clone()
        };
        let top_disk = Disk::from_format(top_layer.format.clone(), &top_opts)
            .map_err(|e| ApiResponse::from_error_in(status::of_block(&e), Some(&context), &e))?;
        let commit = Arc::new(
            Commit::new(top_disk, base_image, (base - top) as u32)
                .map_err(|why| ApiResponse::error(500, &[&context, &why]))?,
        );
        let relink = Relink {
            overlay: layers[top - 1].path.clone(),
            depth: (top - 1) as u32,
            backing: Some(new_backing(&layers, top - 1, base)),
        };
        let c = commit.clone();
        let job = self
            .spawn_chain_job(shared, &context, Box::new(move |j| c.run(j)))
            .inspect_err(|_| commit.release())?;
        log::info!(
            "{COMMIT}: job {id} commits {} into {} (disk '{}')",
            layers[top].path.display(),
            layers[base].path.display(),
            body.id
        );
        emit("job", "started", &[("id", &id), ("disk", &body.id)]);
        self.jobs.insert(RegisteredJob {
            job,
            work: JobWork::Commit(commit, relink),
        });
        Ok(id)
    }

    /// An active commit: a mirror of the disk's layers above the base
    /// into the base.
    fn start_active_commit(
        &mut self,
        (disk, base, depth, granularity): (Disk, ExclusiveImage, u32, u64),
        shared: Arc<JobShared>,
        context: &str,
    ) -> Result<String, ApiResponse> {
        let disk_id = shared.disk().to_string();
        let base_path = base.disk().options().path.display().to_string();
        let mirror = Mirror::new(
            disk.clone(),
            MirrorTarget::opened(base),
            SyncMode::Above(depth),
            granularity,
            MirrorMode::Background,
        )
        .map(Arc::new)
        .map_err(|why| ApiResponse::error(500, &[context, &why]))?;
        let attached = self.with_disks_paused(&[&disk_id], COMMIT, |_| {
            mirror.attach();
            Ok(())
        });
        if let Err(r) = attached {
            mirror.release_keeping(true);
            return Err(r);
        }
        let m = mirror.clone();
        let job = self
            .spawn_chain_job(shared.clone(), context, Box::new(move |j| m.run(j)))
            .inspect_err(|_| mirror.release_keeping(true))?;
        let id = shared.id().to_string();
        log::info!("{COMMIT}: job {id} commits disk '{disk_id}' (active) into {base_path}");
        emit("job", "started", &[("id", &id), ("disk", &disk_id)]);
        self.jobs.insert(RegisteredJob {
            job,
            work: JobWork::Mirror(mirror),
        });
        Ok(id)
    }

    /// The disk of a stream or commit and its chain, checked (see the
    /// module docs).
    fn chain_job_disk(&self, id: &str, what: &str) -> Result<(Disk, Vec<Layer>), ApiResponse> {
        let disk = {
            let d = self.local_disk(id, what)?;
            d.lock_device().expect("local_disk checked").disk().clone()
        };
        if disk.readonly() {
            return Err(ApiResponse::error(
                400,
                &[what, &format!("disk '{id}' is read-only")],
            ));
        }
        if let Some(why) = self.jobs.busy(id) {
            return Err(ApiResponse::error(409, &[what, &why]));
        }
        self.refuse_if_backing_up(id, what)?;
        let layers = layers_of(&disk);
        if layers.len() < 2 {
            let why = format!(
                "disk '{id}' runs on {} ({}) with no backing file",
                layers[0].path.display(),
                layers[0].format_name()
            );
            return Err(ApiResponse::error(400, &[what, &why]));
        }
        if layers[0].format.info().data_file.is_some() {
            let why = format!(
                "{} has an external data file; not supported here",
                layers[0].path.display()
            );
            return Err(ApiResponse::error(400, &[what, &why]));
        }
        Ok((disk, layers))
    }

    /// Starts a job's thread (on the builder thread: the control loop may
    /// not start threads), confined to a block job's system calls; it
    /// wakes the control loop when it ends.
    fn spawn_chain_job(
        &self,
        shared: Arc<JobShared>,
        context: &str,
        body: Body,
    ) -> Result<Job, ApiResponse> {
        let mode = self.seccomp;
        let wake = self.job_ended.clone();
        let job_body = move |s: &JobShared| {
            let r = seccomp::apply(ThreadKind::BlockJob, mode)
                .map_err(|e| {
                    format!(
                        "cannot confine the job's thread: {}",
                        ch_log::error_chain(&e)
                    )
                })
                .and_then(|()| body(s));
            let _ = wake.write(1);
            r
        };
        match self.builder.run(move || Job::spawn(shared, job_body)) {
            Some(Ok(j)) => Ok(j),
            Some(Err(e)) => Err(ApiResponse::from_error_in(
                500,
                Some(&format!("{context}: cannot start the job's thread")),
                &e,
            )),
            None => Err(ApiResponse::error(
                500,
                &[
                    context,
                    "cannot start the job's thread: the vm-builder thread is gone",
                ],
            )),
        }
    }
}

/// The index of the layer a request names as `role` (400 if none).
fn layer_named(layers: &[Layer], name: &str, role: &str, what: &str) -> Result<usize, ApiResponse> {
    find_layer(layers, name).ok_or_else(|| {
        let chain: Vec<String> = layers
            .iter()
            .map(|l| l.path.display().to_string())
            .collect();
        let why = format!(
            "{role} '{name}' is not a file of the disk's chain ({})",
            chain.join(" -> ")
        );
        ApiResponse::error(400, &[what, &why])
    })
}

/// The backing link the image at depth `overlay` gets: the layer at
/// depth `base`'s name and format.
fn new_backing(layers: &[Layer], overlay: usize, base: usize) -> (String, &'static str) {
    let name = block::jobs::chain::backing_name(
        &layers[overlay].path,
        &layers[base],
        &layers[base - 1].path,
    );
    (name, layers[base].format_name())
}
