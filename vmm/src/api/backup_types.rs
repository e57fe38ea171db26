//! The JSON bodies of `vm.disk-backup-begin` and `vm.disk-backup-end`,
//! with the field names scripts rely on (docs/api.md). Parsed by serde
//! on the API thread; the control loop runs them
//! (`crate::control::disk_backup`).

use serde::{Deserialize, Serialize};

use super::bitmap_types::TransactionAction;

/// `vm.disk-backup-begin`: serve disk `id` as it is now, read-only over
/// NBD at `addr` (`unix:PATH` or `tcp:HOST:PORT`, HOST numeric) under
/// export `name` (default: the disk's id), keeping the old data of what
/// the guest overwrites in the new qcow2 image `scratch`; `bitmap`, a
/// dirty bitmap of the disk, is offered as `qemu:dirty-bitmap:NAME` as
/// it stands at the instant. `actions` (those of `vm.disk-transaction`)
/// run at the same instant, after the bitmap was frozen: clearing it, or
/// adding the next increment's bitmap, leaves no write out.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BackupBeginBody {
    pub id: String,
    pub addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub scratch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitmap: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<TransactionAction>,
}

/// `vm.disk-backup-begin`'s answer: where the export is.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BackupBeginAnswer {
    /// `nbd+unix:///NAME?socket=PATH` or `nbd://HOST:PORT/NAME`.
    pub uri: String,
}

/// `vm.disk-backup-end`'s answer: how the backup ended.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BackupEndAnswer {
    /// `completed`, or `failed` when the view broke (a copy to the
    /// scratch image failed; the reads after it failed).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes the guest's writes made the VMM copy to the scratch image.
    pub copied_bytes: u64,
}
