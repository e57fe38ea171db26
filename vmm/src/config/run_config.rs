//! What the process runs ([`RunConfig`]): the command line's result,
//! made by [`super::args`] and read by `crate::vm` to start the VMM, and
//! the seccomp mode every thread's filter is installed in
//! ([`SeccompMode`]).

use std::path::PathBuf;

use super::api_socket::{ApiSocketConfig, EventMonitorConfig};
use super::vm_config::VmConfig;

/// `--seccomp true|false|log`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeccompMode {
    /// Kill the process on a syscall outside the allow-list.
    #[default]
    Enforce,
    /// No filter.
    Off,
    /// Allow everything, but log syscalls outside the allow-list (audit log).
    Log,
}

/// What the process was asked to run: a VM described on the command
/// line (created and booted at once), or none (`--api-socket` alone: a
/// VMM waiting for `vm.create`), and the VMM's own settings.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub vm: Option<VmConfig>,
    pub seccomp: SeccompMode,
    /// Number of `-v`: 0 = warn, 1 = info, 2 = debug, 3+ = trace.
    pub verbosity: u8,
    /// `--api-socket`: the HTTP API's Unix socket, if any.
    pub api_socket: Option<ApiSocketConfig>,
    /// `--event-monitor`: where events are written, if anywhere.
    pub event_monitor: Option<EventMonitorConfig>,
    /// `--log-file`: where log records go instead of stderr.
    pub log_file: Option<PathBuf>,
}
