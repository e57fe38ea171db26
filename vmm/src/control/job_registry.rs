//! The VMM's block jobs: one at a time per disk, listed until a new job
//! of the same disk replaces them or the VM stops, when every job still
//! running is cancelled and its thread waited for (so no job outlives
//! the disks it reads).
//!
//! Jobs enter through [`JobRegistry::insert`] (made by
//! `disk_jobs.rs`), leave as their status ([`JobRegistry::statuses`])
//! and are found by id or disk for complete and cancel.

use std::path::PathBuf;
use std::sync::Arc;

use block::jobs::{Commit, Job, JobStatus, Mirror, Stream};

/// What a job copies with: a mirror (an active commit is one too), or a
/// stream or a commit below the active image, which its owner finishes
/// by relinking the chain (`chain_switch.rs`).
pub(super) enum JobWork {
    Mirror(Arc<Mirror>),
    Stream(Arc<Stream>, Relink),
    Commit(Arc<Commit>, Relink),
}

/// The backing link a stream or commit rewrites once its copy is done.
#[derive(Clone, Debug)]
pub(super) struct Relink {
    /// The image whose header changes, and its depth in the chain (0:
    /// the active image).
    pub overlay: PathBuf,
    pub depth: u32,
    /// Its new backing file's name and format (none: it stands alone).
    pub backing: Option<(String, &'static str)>,
}

impl JobWork {
    /// Lets go of what the job holds (see each type's `release`).
    pub fn release(&self) {
        match self {
            JobWork::Mirror(m) => m.release(),
            JobWork::Stream(s, _) => s.release(),
            JobWork::Commit(c, _) => c.release(),
        }
    }

    pub fn mirror(&self) -> Option<&Arc<Mirror>> {
        match self {
            JobWork::Mirror(m) => Some(m),
            _ => None,
        }
    }

    /// A stream or commit whose copy is done: its owner relinks.
    pub fn copied(&self) -> bool {
        match self {
            JobWork::Mirror(_) => false,
            JobWork::Stream(s, _) => s.copied(),
            JobWork::Commit(c, _) => c.copied(),
        }
    }
}

/// One job the VMM runs.
pub(super) struct RegisteredJob {
    pub job: Job,
    pub work: JobWork,
}

/// See the module docs.
#[derive(Default)]
pub(super) struct JobRegistry {
    jobs: Vec<RegisteredJob>,
    made: u64,
}

impl JobRegistry {
    /// A new job id ("job-N", N counting from 1 for the VMM's life).
    pub fn next_id(&mut self) -> String {
        self.made += 1;
        format!("job-{}", self.made)
    }

    /// The job that has not ended on disk `disk`, if any.
    pub fn active_on(&self, disk: &str) -> Option<&RegisteredJob> {
        self.jobs
            .iter()
            .find(|j| j.job.shared().disk() == disk && !j.job.status().state.is_final())
    }

    /// Why `what` cannot run on `disk` now (a job holds it), or `None`.
    pub fn busy(&self, disk: &str) -> Option<String> {
        self.active_on(disk).map(|j| {
            format!(
                "disk '{disk}' has block job '{}' (cancel or complete it first)",
                j.job.shared().id()
            )
        })
    }

    /// Adds a job; an ended job of the same disk goes.
    pub fn insert(&mut self, job: RegisteredJob) {
        self.reap();
        let disk = job.job.shared().disk().to_string();
        self.jobs.retain(|j| j.job.shared().disk() != disk);
        self.jobs.push(job);
    }

    /// The streams and commits whose copy is done and that have not
    /// ended yet: their owner relinks the chain (`chain_switch.rs`).
    pub fn copied(&self) -> Vec<String> {
        self.jobs
            .iter()
            .filter(|j| j.work.copied() && !j.job.status().state.is_final())
            .map(|j| j.job.shared().id().to_string())
            .collect()
    }

    pub fn find_mut(&mut self, id: &str) -> Option<&mut RegisteredJob> {
        self.jobs.iter_mut().find(|j| j.job.shared().id() == id)
    }

    /// Every job's status; jobs whose thread ended on its own (failed)
    /// are released first: their bitmap detached, their target closed
    /// (and removed if the job made it), on this thread, which may
    /// remove files where a job's thread may not.
    pub fn statuses(&mut self) -> Vec<JobStatus> {
        self.reap();
        self.jobs.iter().map(|j| j.job.status()).collect()
    }

    /// Releases the jobs that ended on their own (see `statuses`).
    pub fn reap(&mut self) {
        for j in &mut self.jobs {
            if j.job.finished() && j.job.status().state == block::jobs::JobState::Failed {
                j.job.join();
                j.work.release();
            }
        }
    }

    /// Cancels every job that has not ended and waits for its thread
    /// (the VM stops); they stay listed with their final state.
    pub fn end_all(&mut self) {
        for j in &mut self.jobs {
            if !j.job.status().state.is_final() {
                log::info!("job {}: cancelled (the VM stops)", j.job.shared().id());
            }
            j.job.cancel();
            j.job.join();
            // A stream or commit whose copy ended but was not relinked.
            j.job.shared().set_state(block::jobs::JobState::Cancelled);
            j.work.release();
        }
    }

    /// Ends and forgets the jobs of disk `disk` (it left the VM).
    pub fn forget_disk(&mut self, disk: &str) {
        for j in self
            .jobs
            .iter_mut()
            .filter(|j| j.job.shared().disk() == disk)
        {
            j.job.cancel();
            j.job.join();
            j.work.release();
        }
        self.jobs.retain(|j| j.job.shared().disk() != disk);
    }
}
