//! What the control loop keeps of a point-in-time backup in progress
//! (`disk_backup.rs` begins and ends them): its own module so that the
//! loop's state can hold it without importing the handlers.

use std::path::PathBuf;
use std::sync::Arc;

use block::live::CopyBeforeWrite;
use block::Disk;
use nbd_server::NbdServer;

/// A backup in progress.
pub(super) struct Backup {
    pub id: String,
    /// `None` only while it is being stopped.
    pub server: Option<NbdServer>,
    pub cbw: Arc<CopyBeforeWrite>,
    pub scratch: Disk,
    pub scratch_path: PathBuf,
    pub uri: String,
}
