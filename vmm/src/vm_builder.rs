//! The `vm-builder` thread: where VMs are made, for the first boot and
//! for every `vm.boot` and reboot after it.
//!
//! Making a VM needs what no other thread may do once the VMM runs:
//! open `/dev/kvm` and create a VM and its vCPUs, map guest RAM (a
//! memfd for shared memory), read the kernel, connect vhost-user
//! backends, start threads (vCPUs, the serial input). The control loop's
//! own filter has none of that (it parses hot-added images and API
//! requests), so the loop hands the work here as a job and waits for
//! the result; this thread was started before any filter existed and
//! runs under its own ([`crate::seccomp`], `Builder`). Threads it starts
//! inherit its filter and add their own on top.
//!
//! Enters as a closure sent by [`VmBuilder::run`]; leaves as the
//! closure's result, back on the calling thread.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, sync_channel, Sender};

type Job = Box<dyn FnOnce() + Send>;

/// The handle the control loop keeps.
pub struct VmBuilder {
    jobs: Sender<Job>,
}

impl VmBuilder {
    /// Starts the thread; it runs `confine` (installs its seccomp filter)
    /// before taking any job.
    pub fn start(
        confine: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> std::io::Result<VmBuilder> {
        Self::start_named("vm-builder", confine)
    }

    /// A job thread like the builder under another name (and the filter
    /// `confine` installs): the NBD export thread (`crate::nbd_exports`)
    /// is one.
    pub fn start_named(
        name: &'static str,
        confine: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) -> std::io::Result<VmBuilder> {
        let (jobs, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = confine() {
                    log::error!("{name}: {e}; it runs no job");
                    return;
                }
                for job in rx {
                    // A panicking job must not take the thread with it.
                    if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                        log::error!("{name}: a job panicked");
                    }
                }
            })?;
        Ok(VmBuilder { jobs })
    }

    /// Runs `work` on the builder thread and waits for its result;
    /// `None` if the thread is gone (or the job panicked).
    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = tx.send(work());
        });
        self.jobs.send(job).ok()?;
        rx.recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_the_builder_thread_in_order() {
        let b = VmBuilder::start(|| Ok(())).unwrap();
        let name = b.run(|| std::thread::current().name().map(String::from));
        assert_eq!(name, Some(Some("vm-builder".into())));
        assert_eq!(b.run(|| 2 + 2), Some(4));
        // A panic is reported as no result; the thread goes on.
        assert_eq!(b.run(|| -> u8 { panic!("boom") }), None);
        assert_eq!(b.run(|| 5), Some(5));
    }

    #[test]
    fn a_thread_that_cannot_confine_itself_builds_nothing() {
        let b = VmBuilder::start(|| Err("no filter".into())).unwrap();
        assert_eq!(b.run(|| 1), None);
    }
}
