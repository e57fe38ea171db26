//! The command line (`cloud-hypervisor --kernel ... --disk ...`) and
//! the VM's configuration, which the API shares.
//!
//! [`args::parse_args`] parses argv (clap) and hands each option's value
//! to its group's parser ([`disk`], [`cpus`], [`memory`], [`serial`],
//! [`api_socket`]), all built on the generic `key=value` syntax of
//! `block::options::kv`. The VM's options become Cloud Hypervisor's
//! [`VmConfig`] ([`vm_config`]), the type `vm.create`'s body is too; a
//! disk is its [`DiskConfig`] ([`disk_config`], `vm.add-disk`'s body).
//! One function checks a `VmConfig` for both ways in and builds the
//! [`BootConfig`] a VM is made from ([`boot_config`], disks by
//! [`disk_resolve`] into a [`LocalDiskConfig`] ([`local_disk`]) or a
//! [`VhostUserDiskConfig`]). The command line's result is a
//! [`RunConfig`] (or help / version); nothing is opened until it is.

pub mod api_socket;
pub mod args;
pub mod boot_config;
pub mod cpus;
pub mod disk;
pub mod disk_config;
pub mod disk_resolve;
pub mod local_disk;
pub mod memory;
pub mod serial;
pub mod size;
pub mod vhost_user_disk;
pub mod vm_config;

use std::path::PathBuf;

use block::options::kv::KvError;
use thiserror::Error;

pub use api_socket::{ApiSocketConfig, EventMonitorConfig};
pub use args::{parse_args, Command};
pub use boot_config::{BootConfig, VmConfigError};
pub use disk_config::DiskConfig;
pub use disk_resolve::{DiskConfigError, ResolvedDisk};
pub use local_disk::LocalDiskConfig;
pub use memory::MemoryConfig;
pub use serial::SerialMode;
pub use vhost_user_disk::VhostUserDiskConfig;
pub use vm_config::VmConfig;

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

/// The id of the `n`-th disk that was given none (Cloud Hypervisor's
/// names: `_disk0`, `_disk1`, ...).
pub fn default_disk_id(n: usize) -> String {
    format!("_disk{n}")
}

/// The first default id not in `taken`, counting from `*next` (which is
/// left past it).
pub fn next_free_disk_id(next: &mut usize, taken: &[&str]) -> String {
    loop {
        let id = default_disk_id(*next);
        *next += 1;
        if !taken.contains(&id.as_str()) {
            return id;
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A command line clap refuses, as clap renders it (with usage).
    #[error("{0}")]
    Usage(String),
    /// One of upstream's flags this VMM does not implement.
    #[error("--{flag} is not supported by this VMM: {why}")]
    Unsupported {
        flag: &'static str,
        why: &'static str,
    },
    #[error("--disk: {0}")]
    Disk(#[from] DiskConfigError),
    #[error("--kernel is required (or --api-socket alone, for a VM made through the API)")]
    MissingKernel,
    /// The VM the options describe cannot be booted here.
    #[error("{}", cli_names(.0))]
    Vm(#[from] VmConfigError),
}

/// `e` with the command line's names for the config's fields.
fn cli_names(e: &VmConfigError) -> String {
    match e {
        VmConfigError::Disk { error, .. } => format!("--disk: {error}"),
        VmConfigError::DuplicateDiskId(_) => format!("--disk: {e}"),
        VmConfigError::VhostUserNeedsSharedMemory => {
            "--disk vhost_user=on needs --memory shared=on (the backend maps guest RAM)".into()
        }
        other => other.to_string(),
    }
}
