//! The daemon's life: block the exit signals (every thread started later
//! inherits the mask, so only [`run`]'s `sigwait` sees them), open the
//! image, start the exports, wait for SIGTERM or SIGINT, stop the exports
//! in reverse order and close the image clean.

use block::{BlockError, ExclusiveImage};
use thiserror::Error;

use crate::args::DaemonConfig;
use crate::export::{self, ExportError};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cannot block the exit signals")]
    SignalMask(#[source] std::io::Error),
    #[error("--image")]
    Open(#[source] BlockError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("cannot close {path} clean")]
    Close {
        path: String,
        #[source]
        source: BlockError,
    },
}

fn exit_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is valid storage; sigemptyset then
    // initialises it, and sigaddset only adds valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread
/// it starts afterwards).
fn block_exit_signals() -> Result<libc::sigset_t, DaemonError> {
    let set = exit_signals();
    // SAFETY: `set` is an initialised signal set; the old mask is not read.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(DaemonError::SignalMask(std::io::Error::from_raw_os_error(
            rc,
        )));
    }
    Ok(set)
}

/// Waits for one signal of `set` (blocked in this thread).
fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    loop {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set and `sig` a writable
        // int; sigwait only writes the signal number.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return sig;
        }
    }
}

pub fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    let signals = block_exit_signals()?;
    let path = config.image.path.display().to_string();
    // The daemon owns the image; its exports get queues (and FUSE a
    // resizer), never the other tool capabilities.
    let image = ExclusiveImage::open(&config.image).map_err(DaemonError::Open)?;
    let mut running = Vec::new();
    for export_config in config.exports {
        match export::start(&image, export_config) {
            Ok(e) => {
                log::info!("exporting {path}: {}", e.describe());
                running.push(e);
            }
            Err(e) => {
                let _ = stop_all(running);
                let _ = image.close();
                return Err(e.into());
            }
        }
    }
    let sig = wait_for_signal(&signals);
    log::info!("signal {sig}: stopping");
    let stopped = stop_all(running);
    image
        .close()
        .map_err(|source| DaemonError::Close { path, source })?;
    stopped.map_err(DaemonError::from)
}

/// Stops every export, newest first; returns the first error.
fn stop_all(running: Vec<Box<dyn export::Export>>) -> Result<(), ExportError> {
    let mut first = Ok(());
    for e in running.into_iter().rev() {
        let name = e.describe();
        if let Err(err) = e.stop() {
            log::error!("stopping {name}: {err}");
            if first.is_ok() {
                first = Err(err);
            }
        }
    }
    first
}
