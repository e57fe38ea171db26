//! The VMM process around its VM: the threads started before any
//! seccomp filter ([`prepare_process`]: the SIGSYS report, the NBD
//! connector, the NBD export thread, the `vm-builder`), the API server (`--api-socket`), and
//! the control loop ([`crate::control`]) on the main thread, which
//! creates, boots, reboots and shuts down the VM (the command line's at
//! once, or whatever `vm.create` asks for) until the VMM ends (a guest
//! power-off, SIGTERM/SIGINT, `vmm.shutdown`, or a fatal error); then
//! the VM is stopped and every disk drained, flushed and closed.
//!
//! Enters as the checked command line; leaves as an [`ExitReason`] that
//! `main` turns into the process exit code, or an error (also when the
//! VMM ended as asked but a disk failed its last flush or close: the
//! exit status must tell a supervisor so).

use std::sync::Arc;

use crate::api::{ApiReceiver, ApiServer};
use crate::config::{ApiSocketConfig, EventMonitorConfig, RunConfig, SeccompMode};
use crate::control::Control;
pub use crate::exit::{ExitReason, ExitSignal};
use crate::seccomp::{self, ThreadKind};
use crate::vm_builder::VmBuilder;
pub use crate::vm_error::VmError;

/// What the process needs before it opens a disk or installs a filter:
/// glibc's arena limit fixed, the SIGSYS report installed, the NBD
/// connector thread (every NBD connection is opened there), the
/// `nbd-export` thread (backup exports are served from there) and the
/// `vm-builder` thread (every VM is made there) started, each under its
/// own filter ([`crate::seccomp`]).
pub fn prepare_process(mode: SeccompMode) -> Result<VmBuilder, VmError> {
    seccomp::fix_malloc_arena_limit();
    seccomp::sigsys::install().map_err(VmError::Sigsys)?;
    let confine = |kind| {
        let programs = seccomp::filters(kind, mode).map_err(VmError::Seccomp)?;
        Ok::<_, VmError>(move || {
            seccomp::apply_programs(&programs).map_err(|e| ch_log::error_chain(&e))
        })
    };
    block::engines::nbd::start_connector(confine(ThreadKind::Nbd)?)
        .map_err(VmError::NbdConnector)?;
    crate::nbd_exports::start(confine(ThreadKind::NbdExport)?).map_err(VmError::NbdExports)?;
    VmBuilder::start(confine(ThreadKind::Builder)?).map_err(VmError::Builder)
}

/// Starts the event monitor (`--event-monitor`): its file opened, its
/// thread under its own filter; reports the VMM starting.
pub fn start_event_monitor(to: &EventMonitorConfig, mode: SeccompMode) -> Result<(), VmError> {
    let out = open_event_monitor(to)?;
    let programs = seccomp::filters(ThreadKind::EventMonitor, mode).map_err(VmError::Seccomp)?;
    crate::events::start(out, move || {
        seccomp::apply_programs(&programs).map_err(|e| ch_log::error_chain(&e))
    })
    .map_err(VmError::EventMonitor)?;
    crate::events::emit("vmm", "starting", &[]);
    Ok(())
}

/// The event monitor's file: created (truncated) at `path=`, as
/// upstream's, or the inherited descriptor `fd=`, which must be open for
/// writing.
fn open_event_monitor(to: &EventMonitorConfig) -> Result<std::fs::File, VmError> {
    use std::os::fd::FromRawFd;
    let bad = |what: String| VmError::EventMonitorFile(what);
    match to {
        EventMonitorConfig::Path(p) => {
            std::fs::File::create(p).map_err(|e| bad(format!("cannot create {}: {e}", p.display())))
        }
        EventMonitorConfig::Fd(fd) => {
            // SAFETY: F_GETFL only reads the descriptor's flags.
            let flags = unsafe { libc::fcntl(*fd, libc::F_GETFL) };
            if flags < 0 {
                let e = std::io::Error::last_os_error();
                return Err(bad(format!("fd={fd} is not open: {e}")));
            }
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                return Err(bad(format!("fd={fd} is not open for writing")));
            }
            // SAFETY: the descriptor is open (checked above) and the
            // command line hands it to us: nothing else in the process
            // owns it.
            Ok(unsafe { std::fs::File::from_raw_fd(*fd) })
        }
    }
}

/// Opens the API socket and starts its threads (before the VM exists, so
/// a socket that cannot be made fails fast).
fn start_api(config: &RunConfig) -> Result<Option<(ApiServer, ApiReceiver<Control>)>, VmError> {
    let Some(cfg) = &config.api_socket else {
        return Ok(None);
    };
    let listener = crate::api::socket::listen(cfg).map_err(VmError::ApiSocket)?;
    let (receiver, sender) = crate::api::channel().map_err(VmError::ApiServer)?;
    let filters = seccomp::filters(ThreadKind::Api, config.seccomp).map_err(VmError::Seccomp)?;
    let path = match cfg {
        ApiSocketConfig::Path(p) => Some(p.clone()),
        ApiSocketConfig::Fd(_) => None,
    };
    let table = Arc::new(crate::endpoints::table());
    let server =
        ApiServer::start(listener, table, sender, filters, path).map_err(VmError::ApiServer)?;
    Ok(Some((server, receiver)))
}

/// Runs the VMM to its end: the command line's VM (if any) is created
/// and booted, then the control loop serves the guest's and the API's
/// requests.
pub fn run(config: RunConfig, builder: VmBuilder) -> Result<ExitReason, VmError> {
    let exit = Arc::new(ExitSignal::new().map_err(VmError::ExitEventFd)?);
    crate::signals::install(exit.eventfd()).map_err(VmError::Signals)?;
    let (server, api) = match start_api(&config)? {
        Some((s, r)) => (Some(s), Some(r)),
        None => (None, None),
    };
    let result = run_control(config, builder, &exit, api);
    if let Some(s) = server {
        s.stop();
    }
    result
}

fn run_control(
    config: RunConfig,
    builder: VmBuilder,
    exit: &Arc<ExitSignal>,
    api: Option<ApiReceiver<Control>>,
) -> Result<ExitReason, VmError> {
    let mut control =
        Control::new(config.seccomp, builder, exit.clone(), api).map_err(VmError::Control)?;
    // From here on the main thread runs under its own filter: the
    // command line's VM boots the way vm.boot boots one.
    seccomp::apply(ThreadKind::Main, config.seccomp).map_err(VmError::Seccomp)?;
    if let Some(vm) = config.vm {
        control.create(vm);
        if let Err(e) = control.boot() {
            control.end();
            return Err(e);
        }
    }
    let result = control.run().map_err(VmError::Control);
    match &result {
        Ok(reason) => log::info!("VM exit: {reason:?}"),
        Err(e) => log::error!("VM exit: {}", ch_log::error_chain(e)),
    }
    control.end();
    match (result, control.close_failures()) {
        (Ok(reason), failures)
            if !failures.is_empty() && !matches!(reason, ExitReason::Fatal(_)) =>
        {
            Err(VmError::CloseDisks {
                reason,
                failures: failures.join("; "),
            })
        }
        (result, _) => result,
    }
}
