//! `--disk vhost_user=on,socket=PATH[,num_queues=N][,queue_size=N][,id=NAME]`
//! (or a `DiskConfig` with `vhost_user: true`): a virtio-blk disk served
//! by a vhost-user backend, Cloud Hypervisor's spelling.
//!
//! Parsed like any disk ([`super::disk::parse_disk`]); what it resolves
//! to is a [`VhostUserDiskConfig`] ([`super::disk_resolve`]). The image
//! and its I/O belong to the backend, so the fields that describe them
//! are refused there with a message saying so. That guest RAM must be
//! shared is checked once every option is known (`--memory shared=on`).

use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostUserDiskConfig {
    pub socket: PathBuf,
    pub num_queues: u16,
    pub queue_size: u16,
    pub id: Option<String>,
}
