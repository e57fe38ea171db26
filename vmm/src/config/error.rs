//! [`ConfigError`]: why a command line cannot run, in the command line's
//! own words (`--disk: ...`), for every option parser of this folder and
//! for `main` to print.

use ch_util::kv::KvError;
use thiserror::Error;

use super::disk_resolve::DiskConfigError;
use super::vm_config_error::VmConfigError;

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
