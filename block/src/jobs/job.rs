//! One block job's shared record and its thread: the state, progress,
//! error and rate limit anyone may read at any time ([`JobStatus`]), and
//! the requests its owner makes of the thread (cancel, park, stop), which
//! the thread sees between two chunks ([`JobShared::between_chunks`]).
//!
//! The owner holds a [`Job`] (the thread's handle and the shared record);
//! the thread runs the job's body with a `&JobShared`. Parking is how an
//! owner takes over a job that reached `ready` for a moment (a mirror's
//! complete switches the disk and copies the last dirty granules itself):
//! [`Job::park`] returns once the thread is idle between two chunks, and
//! [`Job::unpark`] lets it go on (or [`Job::stop`] ends it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::rate::RateLimit;

/// A job's state (the names QEMU and libvirt show; QEMU's transitional
/// ones — paused, standby, waiting, pending, aborting — are not kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Made, its thread not yet copying.
    Created,
    Running,
    /// In sync with its source: it may be completed (a mirror).
    Ready,
    Completed,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Created => "created",
            JobState::Running => "running",
            JobState::Ready => "ready",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Whether the job has ended (its thread has nothing more to do).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }
}

/// What a job's status shows, as read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct JobStatus {
    pub id: String,
    /// "mirror".
    pub kind: &'static str,
    /// The disk's id.
    pub disk: String,
    pub state: JobState,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes per second over the last second or so.
    pub rate: u64,
    /// The rate limit in bytes per second (0: none).
    pub speed: u64,
    pub error: Option<String>,
}

impl JobStatus {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "type": self.kind,
            "disk": self.disk,
            "state": self.state.name(),
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "rate": self.rate,
            "speed": self.speed,
            "error": self.error,
        })
    }
}

/// What the owner asked of the thread.
#[derive(Debug, Default)]
struct Requests {
    cancel: bool,
    /// Stop at the next chunk boundary and wait there.
    park: bool,
    /// The thread is parked (waiting for `park` to go).
    parked: bool,
    /// End without changing the state (the owner sets it).
    stop: bool,
    /// The thread has returned from the job's body.
    ended: bool,
}

/// Where the thread goes after a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Go,
    /// Cancelled or stopped: return.
    Stop,
}

/// The record a job's thread and its owner share.
#[derive(Debug)]
pub struct JobShared {
    id: String,
    kind: &'static str,
    disk: String,
    state: Mutex<(JobState, Option<String>)>,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    /// (when, bytes_done then) of the last two rate samples.
    rate_window: Mutex<RateWindow>,
    limit: RateLimit,
    requests: Mutex<Requests>,
    wake: Condvar,
    cancelled: AtomicBool,
}

#[derive(Debug)]
struct RateWindow {
    since: Instant,
    done_then: u64,
    rate: u64,
}

impl JobShared {
    pub fn new(id: &str, kind: &'static str, disk: &str, speed: u64) -> Arc<JobShared> {
        Arc::new(JobShared {
            id: id.to_string(),
            kind,
            disk: disk.to_string(),
            state: Mutex::new((JobState::Created, None)),
            bytes_done: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            rate_window: Mutex::new(RateWindow {
                since: Instant::now(),
                done_then: 0,
                rate: 0,
            }),
            limit: RateLimit::new(speed),
            requests: Mutex::new(Requests::default()),
            wake: Condvar::new(),
            cancelled: AtomicBool::new(false),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn disk(&self) -> &str {
        &self.disk
    }

    pub fn state(&self) -> JobState {
        lock(&self.state).0
    }

    /// Moves to `state` unless the job has ended already.
    pub fn set_state(&self, state: JobState) {
        let mut s = lock(&self.state);
        if !s.0.is_final() {
            s.0 = state;
        }
    }

    /// Ends the job failed with `why` (unless it has ended already).
    pub fn fail(&self, why: String) {
        let mut s = lock(&self.state);
        if !s.0.is_final() {
            *s = (JobState::Failed, Some(why));
        }
    }

    /// Adds `bytes` to the work found to do.
    pub fn add_total(&self, bytes: u64) {
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` more were copied; waits as the rate limit asks (waking
    /// early for a cancel or a park).
    pub fn add_done(&self, bytes: u64) {
        self.add_progress(bytes);
        self.pace(bytes);
    }

    /// `bytes` more were copied (no wait: see [`JobShared::pace`]).
    pub fn add_progress(&self, bytes: u64) {
        let done = self.bytes_done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        {
            let mut w = lock(&self.rate_window);
            let dt = w.since.elapsed();
            if dt >= Duration::from_millis(500) {
                w.rate = ((done - w.done_then) as f64 / dt.as_secs_f64()) as u64;
                w.since = Instant::now();
                w.done_then = done;
            }
        }
    }

    /// `bytes` more are being copied: waits as the rate limit asks
    /// (waking early for a cancel or a park).
    pub fn pace(&self, bytes: u64) {
        if let Some(wait) = self.limit.account(bytes) {
            let r = lock(&self.requests);
            let _ = self
                .wake
                .wait_timeout_while(r, wait, |r| !(r.cancel || r.park || r.stop));
        }
    }

    pub fn set_speed(&self, speed: u64) {
        self.limit.set(speed);
    }

    pub fn status(&self) -> JobStatus {
        let (state, error) = lock(&self.state).clone();
        let rate = {
            let w = lock(&self.rate_window);
            // A job idle for a while (ready, nothing dirty) copies at 0.
            if w.since.elapsed() > Duration::from_secs(2) {
                0
            } else {
                w.rate
            }
        };
        JobStatus {
            id: self.id.clone(),
            kind: self.kind,
            disk: self.disk.clone(),
            state,
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self
                .bytes_total
                .load(Ordering::Relaxed)
                .max(self.bytes_done.load(Ordering::Relaxed)),
            rate: if state.is_final() { 0 } else { rate },
            speed: self.limit.get(),
            error,
        }
    }

    /// Whether a cancel was asked for (the thread may look mid-chunk).
    pub fn cancel_requested(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The thread's check between two chunks: parks while the owner
    /// asks it to, and says whether to go on.
    pub fn between_chunks(&self) -> Flow {
        let mut r = lock(&self.requests);
        loop {
            if r.cancel || r.stop {
                return Flow::Stop;
            }
            if !r.park {
                return Flow::Go;
            }
            if !r.parked {
                r.parked = true;
                self.wake.notify_all();
            }
            r = self.wake.wait(r).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`JobShared::between_chunks`] for a thread with I/O in flight:
    /// when a cancel, a stop or a park is asked for, `settle` (which
    /// waits for that I/O) runs first, so the thread never parks or ends
    /// with I/O in flight; otherwise the thread goes on at once.
    pub fn between_chunks_after(
        &self,
        settle: impl FnOnce() -> Result<(), String>,
    ) -> Result<Flow, String> {
        let asked = {
            let r = lock(&self.requests);
            r.cancel || r.stop || r.park
        };
        if asked {
            settle()?;
            // Nothing is submitted from here to the check.
            return Ok(self.between_chunks());
        }
        Ok(Flow::Go)
    }

    /// The thread has nothing to do now: waits up to `max` for a request
    /// (then checks [`JobShared::between_chunks`] again).
    pub fn idle(&self, max: Duration) {
        let r = lock(&self.requests);
        let _ = self
            .wake
            .wait_timeout_while(r, max, |r| !(r.cancel || r.park || r.stop));
    }

    fn request(&self, f: impl FnOnce(&mut Requests)) {
        let mut r = lock(&self.requests);
        f(&mut r);
        self.wake.notify_all();
    }
}

/// The owner's handle: the shared record and the thread.
pub struct Job {
    shared: Arc<JobShared>,
    thread: Option<JoinHandle<()>>,
}

impl Job {
    /// Starts `body` on a thread of its own, named after the job. The
    /// body returns the job's final state, or why it failed; a cancel
    /// it saw ends it `cancelled` whatever it returns.
    pub fn spawn(
        shared: Arc<JobShared>,
        body: impl FnOnce(&JobShared) -> Result<Option<JobState>, String> + Send + 'static,
    ) -> std::io::Result<Job> {
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("job-{}", shared.id))
            .spawn(move || {
                s.set_state(JobState::Running);
                let end = body(&s);
                match end {
                    _ if s.cancel_requested() => s.set_state(JobState::Cancelled),
                    Ok(Some(state)) => s.set_state(state),
                    Ok(None) => {}
                    Err(why) => {
                        log::error!("job {}: {why}", s.id);
                        s.fail(why);
                    }
                }
                s.request(|r| r.ended = true);
            })?;
        Ok(Job {
            shared,
            thread: Some(thread),
        })
    }

    pub fn shared(&self) -> &Arc<JobShared> {
        &self.shared
    }

    pub fn status(&self) -> JobStatus {
        self.shared.status()
    }

    /// Asks the thread to stop at its next chunk boundary as cancelled.
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Relaxed);
        self.shared.request(|r| r.cancel = true);
    }

    /// Waits (at most `timeout`) until the thread is parked between two
    /// chunks, or has ended; true when it is parked or ended.
    pub fn park(&self, timeout: Duration) -> bool {
        self.shared.request(|r| r.park = true);
        let r = lock(&self.shared.requests);
        let (r, _) = self
            .shared
            .wake
            .wait_timeout_while(r, timeout, |r| !(r.parked || r.ended))
            .unwrap_or_else(|p| p.into_inner());
        r.parked || r.ended
    }

    /// Lets a parked thread go on.
    pub fn unpark(&self) {
        self.shared.request(|r| {
            r.park = false;
            r.parked = false;
        });
    }

    /// Ends the thread with the state its owner set, and waits for it.
    pub fn stop(&mut self) {
        self.shared.request(|r| r.stop = true);
        self.join();
    }

    /// Waits for the thread to end.
    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                self.shared.fail("the job's thread panicked".into());
            }
        }
    }

    /// Whether the thread has returned from the job's body.
    pub fn finished(&self) -> bool {
        lock(&self.shared.requests).ended
    }
}

impl Drop for Job {
    /// A job dropped by its owner is cancelled and waited for: its
    /// thread never outlives the disks it reads.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.cancel();
            self.join();
        }
    }
}

/// A poisoned lock only means a thread panicked holding it; the values
/// behind these locks are replaced whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body that counts chunks until told to stop.
    fn counting(
        chunks: Arc<AtomicU64>,
    ) -> impl FnOnce(&JobShared) -> Result<Option<JobState>, String> {
        move |s| {
            while s.between_chunks() == Flow::Go {
                chunks.fetch_add(1, Ordering::Relaxed);
                s.add_done(4096);
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(None)
        }
    }

    #[test]
    fn park_holds_the_thread_between_chunks_until_unparked() {
        let chunks = Arc::new(AtomicU64::new(0));
        let mut job = Job::spawn(
            JobShared::new("j", "test", "d", 0),
            counting(chunks.clone()),
        )
        .unwrap();
        assert!(job.park(Duration::from_secs(10)));
        let held = chunks.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(chunks.load(Ordering::Relaxed), held, "a parked job copied");
        assert_eq!(job.status().state, JobState::Running);
        job.unpark();
        let deadline = Instant::now() + Duration::from_secs(10);
        while chunks.load(Ordering::Relaxed) == held {
            assert!(Instant::now() < deadline, "the job did not go on");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Stop ends it with the state its owner set.
        job.shared().set_state(JobState::Completed);
        job.stop();
        assert!(job.finished());
        let s = job.status();
        assert_eq!((s.state, s.error, s.rate), (JobState::Completed, None, 0));
        assert!(s.bytes_done >= 4096 && s.bytes_total == s.bytes_done);
    }

    #[test]
    fn cancel_ends_cancelled_and_a_failure_keeps_its_reason() {
        let chunks = Arc::new(AtomicU64::new(0));
        let mut job = Job::spawn(JobShared::new("j", "test", "d", 0), counting(chunks)).unwrap();
        job.cancel();
        job.join();
        assert_eq!(job.status().state, JobState::Cancelled);
        // A final state stays.
        job.shared().set_state(JobState::Running);
        assert_eq!(job.status().state, JobState::Cancelled);
        let mut failing = Job::spawn(JobShared::new("k", "test", "d", 0), |_| {
            Err("the target is full".to_string())
        })
        .unwrap();
        failing.join();
        let s = failing.status();
        assert_eq!(s.state, JobState::Failed);
        assert_eq!(s.error.as_deref(), Some("the target is full"));
        assert_eq!(s.to_json()["state"], "failed");
        // Parking an ended job returns at once.
        assert!(failing.park(Duration::from_secs(1)));
    }

    #[test]
    fn a_rate_limited_job_wakes_for_a_cancel() {
        let chunks = Arc::new(AtomicU64::new(0));
        // 4 KiB at 1 KiB/s: each chunk waits seconds.
        let mut job = Job::spawn(JobShared::new("j", "test", "d", 1024), counting(chunks)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        job.cancel();
        job.join();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(job.status().state, JobState::Cancelled);
    }
}
