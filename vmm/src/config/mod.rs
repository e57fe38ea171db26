//! The command line (`cloud-hypervisor --kernel ... --disk ...`) and
//! the VM's configuration, which the API shares.
//!
//! [`args::parse_args`] parses argv (clap) and hands each option's value
//! to its group's parser ([`disk`], [`cpus`], [`memory`], [`serial`],
//! [`api_socket`]), all built on the generic `key=value` syntax of
//! `ch_util::kv`. The VM's options become Cloud Hypervisor's
//! [`VmConfig`] ([`vm_config`]), the type `vm.create`'s body is too; a
//! disk is its [`DiskConfig`] ([`disk_config`], `vm.add-disk`'s body).
//! One function checks a `VmConfig` for both ways in and builds the
//! [`BootConfig`] a VM is made from ([`boot_config`], disks by
//! [`disk_resolve`] into a [`LocalDiskConfig`] ([`local_disk`]) or a
//! [`VhostUserDiskConfig`]). The command line's result is a
//! [`RunConfig`] (or help / version); nothing is opened until it is.
//!
//! What several of these modules share sits in a module of its own below
//! them ([`error`], [`vm_config_error`], [`run_config`], [`disk_id`]); this file only declares
//! the modules and names their main types, so no child imports its
//! parent.

pub mod api_socket;
pub mod args;
pub mod boot_config;
pub mod cpus;
pub mod disk;
pub mod disk_config;
pub mod disk_id;
pub mod disk_resolve;
pub mod error;
pub mod local_disk;
pub mod memory;
pub mod run_config;
pub mod serial;
pub mod vhost_user_disk;
pub mod vm_config;
pub mod vm_config_error;

pub use api_socket::{ApiSocketConfig, EventMonitorConfig};
pub use args::{parse_args, Command};
pub use boot_config::BootConfig;
pub use disk_config::DiskConfig;
pub use disk_id::next_free_disk_id;
pub use disk_resolve::{DiskConfigError, ResolvedDisk};
pub use error::ConfigError;
pub use local_disk::LocalDiskConfig;
pub use run_config::{RunConfig, SeccompMode};
pub use serial::SerialMode;
pub use vhost_user_disk::VhostUserDiskConfig;
pub use vm_config::{MemoryConfig, VmConfig};
pub use vm_config_error::VmConfigError;
