//! The `nbd-export` thread: where the VMM's NBD exports (the
//! point-in-time views of `vm.disk-backup-begin`) are started and
//! stopped.
//!
//! Serving NBD needs what the control loop's filter withholds (making,
//! binding and listening on sockets, starting the accept and connection
//! threads), so the loop hands the start and the stop of an export here
//! as a job and waits for its result, as it does with the `vm-builder`
//! ([`crate::vm_builder`], whose job thread this reuses). The thread is
//! started before any filter exists and runs under its own
//! ([`crate::seccomp`], `NbdExport`); the accept and connection threads
//! the server starts inherit it.
//!
//! Enters as a closure ([`run`]); leaves as its result on the caller's
//! thread, `None` when the thread is not running (a VMM built without
//! [`crate::vm::prepare_process`]) or the job panicked.

use std::sync::OnceLock;

use crate::vm_builder::VmBuilder;

static EXPORTS: OnceLock<VmBuilder> = OnceLock::new();

/// Starts the thread; `confine` installs its seccomp filter before it
/// takes any job. Later calls start nothing.
pub fn start(confine: impl FnOnce() -> Result<(), String> + Send + 'static) -> std::io::Result<()> {
    if EXPORTS.get().is_some() {
        return Ok(());
    }
    let thread = VmBuilder::start_named("nbd-export", confine)?;
    let _ = EXPORTS.set(thread);
    Ok(())
}

/// Runs `work` on the export thread and waits for its result.
pub fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    EXPORTS.get()?.run(work)
}
