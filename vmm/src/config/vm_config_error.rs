//! [`VmConfigError`]: why a `VmConfig` cannot be booted here, each
//! naming the field, as [`super::boot_config`] finds it; the API answers
//! with it and the command line's [`super::error::ConfigError`] carries
//! it.

use thiserror::Error;

use super::disk_resolve::DiskConfigError;
use super::vm_config::Unimplemented;

/// A config that cannot be booted here; each names the field.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum VmConfigError {
    #[error(transparent)]
    Unimplemented(#[from] Unimplemented),
    #[error("'{0}' is required")]
    Missing(&'static str),
    #[error("bad value '{value}' for '{field}': {reason}")]
    BadValue {
        field: String,
        value: String,
        reason: String,
    },
    #[error("disks[{index}]: {error}")]
    Disk {
        index: usize,
        error: DiskConfigError,
    },
    #[error("two disks share the id '{0}'")]
    DuplicateDiskId(String),
    #[error(
        "a vhost-user disk needs memory.shared (--memory shared=on): the backend maps guest RAM"
    )]
    VhostUserNeedsSharedMemory,
}
