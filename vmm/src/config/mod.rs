//! The command line: `cloud-hypervisor --kernel ... --disk ...`.
//!
//! [`args::parse_args`] parses argv (clap) and hands each option's value
//! to its group's parser ([`disk`], [`cpus`], [`memory`], [`serial`],
//! [`api_socket`]), all built on the generic `key=value` syntax of
//! `block::options::kv`. A disk is parsed into Cloud Hypervisor's
//! [`DiskConfig`] ([`disk_config`], the type the API shares) and checked
//! once by [`disk_resolve`] into a [`LocalDiskConfig`] ([`local_disk`])
//! or a [`VhostUserDiskConfig`]. The result is a complete [`VmConfig`] (or
//! help / version); nothing is opened until it is.

pub mod api_socket;
pub mod args;
pub mod cpus;
pub mod disk;
pub mod disk_config;
pub mod disk_resolve;
pub mod local_disk;
pub mod memory;
pub mod serial;
pub mod size;
pub mod vhost_user_disk;

use std::path::PathBuf;

use block::options::kv::KvError;
use thiserror::Error;

pub use api_socket::ApiSocketConfig;
pub use args::{parse_args, Command};
pub use disk_config::DiskConfig;
pub use disk_resolve::{DiskConfigError, ResolvedDisk};
pub use local_disk::LocalDiskConfig;
pub use memory::MemoryConfig;
pub use serial::SerialMode;
pub use vhost_user_disk::VhostUserDiskConfig;

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

/// Everything needed to boot.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub cmdline: String,
    pub cpus: u8,
    /// `--cpus model=,hide=`: what CPUID shows the guest.
    pub cpu_model: hypervisor::CpuModel,
    pub memory: u64,
    /// Guest RAM in a memfd mapped shared (`--memory shared=on`).
    pub shared_memory: bool,
    pub disks: Vec<LocalDiskConfig>,
    /// `--disk vhost_user=on,...`: disks a vhost-user backend serves.
    pub vhost_user_disks: Vec<VhostUserDiskConfig>,
    pub serial: SerialMode,
    pub seccomp: SeccompMode,
    /// Number of `-v`: 0 = warn, 1 = info, 2 = debug, 3+ = trace.
    pub verbosity: u8,
    /// `--api-socket`: the HTTP API's Unix socket, if any.
    pub api_socket: Option<ApiSocketConfig>,
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
    #[error("--kernel is required")]
    MissingKernel,
    #[error("two disks share the id '{0}'")]
    DuplicateDiskId(String),
    #[error("--disk vhost_user=on needs --memory shared=on (the backend maps guest RAM)")]
    VhostUserNeedsSharedMemory,
}
