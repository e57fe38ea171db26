//! Requests on one running disk: `vm.resize-disk`, `vm.snapshot-disk`,
//! `vm.disk-info`. The disk's device does the work with its queues
//! paused ([`virtio_devices::block::control`]); its errors become status
//! codes through [`super::status`] (404 is for an unknown id).
//!
//! A resize below the current size needs `shrink` (the guest's data past
//! the new end is lost), as `ch-img resize --shrink` does. Each change
//! is reported on the event monitor (`disk` `resizing`/`resized`,
//! `snapshotting`/`snapshotted`, with the disk's id).

use virtio_devices::block::{ControlError, Shrink};

use super::{status, Control};
use crate::api::ApiResponse;
use crate::disk_registry::AttachedDisk;
use crate::events::emit;

impl Control {
    /// The in-VMM disk `id`, or the answer that says why not.
    pub(super) fn local_disk(&self, id: &str, what: &str) -> Result<&AttachedDisk, ApiResponse> {
        let d = self
            .machine(what)?
            .devices
            .disks
            .find(id)
            .ok_or_else(|| ApiResponse::error(404, &[&format!("no disk with id '{id}'")]))?;
        if d.device().is_none() {
            return Err(ApiResponse::error(
                400,
                &[&format!(
                    "{what}: disk '{id}' is served by a vhost-user backend; ask the backend"
                )],
            ));
        }
        if self.removals.iter().any(|r| r.id == id) {
            return Err(ApiResponse::error(
                409,
                &[&format!("{what}: disk '{id}' is being removed")],
            ));
        }
        Ok(d)
    }

    pub(crate) fn resize_disk(&mut self, id: &str, size: u64, shrink: bool) -> ApiResponse {
        if let Err(r) = self.refuse_if_backing_up(id, "vm.resize-disk") {
            return r;
        }
        if let Some(why) = self.jobs.busy(id) {
            return ApiResponse::error(409, &["vm.resize-disk", &why]);
        }
        let d = match self.local_disk(id, "vm.resize-disk") {
            Ok(d) => d,
            Err(r) => return r,
        };
        let mut dev = d.lock_device().expect("local_disk checked");
        let mode = if shrink {
            Shrink::Allowed
        } else {
            Shrink::Refused
        };
        let size_text = size.to_string();
        emit("disk", "resizing", &[("id", id), ("size", &size_text)]);
        match dev.resize(size, mode) {
            Ok(old) => {
                log::info!("disk {id}: resized from {old} to {size} bytes");
                let old = old.to_string();
                emit(
                    "disk",
                    "resized",
                    &[("id", id), ("size", &size_text), ("old_size", &old)],
                );
                ApiResponse::no_content()
            }
            Err(e) => {
                let what = format!("cannot resize disk '{id}' to {size} bytes");
                if let ControlError::ShrinkNotAsked { .. } = e {
                    let hint = r#"ask with "shrink": true (ch-remote resize-disk --shrink)"#;
                    return ApiResponse::error(400, &[&what, &e.to_string(), hint]);
                }
                ApiResponse::from_error_in(status::of_control(&e), Some(&what), &e)
            }
        }
    }

    pub(crate) fn snapshot_disk(&mut self, id: &str, name: &str) -> ApiResponse {
        let d = match self.local_disk(id, "vm.snapshot-disk") {
            Ok(d) => d,
            Err(r) => return r,
        };
        let mut dev = d.lock_device().expect("local_disk checked");
        emit("disk", "snapshotting", &[("id", id), ("name", name)]);
        match dev.snapshot(name) {
            Ok(()) => {
                log::info!("disk {id}: internal snapshot '{name}' taken");
                emit("disk", "snapshotted", &[("id", id), ("name", name)]);
                ApiResponse::no_content()
            }
            Err(e) => {
                let what = format!("cannot snapshot disk '{id}' as '{name}'");
                ApiResponse::from_error_in(status::of_control(&e), Some(&what), &e)
            }
        }
    }

    /// `ch-img info --backing-chain --output=json` of the live image:
    /// the open image's facts (with its live `dirty-bitmaps`), then each
    /// backing file's, opened read-only.
    pub(crate) fn disk_info(&self, id: &str) -> ApiResponse {
        let d = match self.local_disk(id, "vm.disk-info") {
            Ok(d) => d,
            Err(r) => return r,
        };
        let (path, info, bitmaps) = {
            let dev = d.lock_device().expect("local_disk checked");
            let bitmaps = Self::bitmaps_json(dev.disk().live());
            (dev.disk().options().path.clone(), dev.image_info(), bitmaps)
        };
        match block::info_json::chain_json(&path, info) {
            Ok(mut v) => {
                // The running disk's dirty bitmaps, as QEMU's query-block
                // names them.
                if let Some(serde_json::Value::Object(top)) = v.first_mut() {
                    top.insert("dirty-bitmaps".into(), bitmaps);
                    if let Some(backup) = self.backup_json(id) {
                        top.insert("backup".into(), backup);
                    }
                }
                ApiResponse::json(&v)
            }
            Err(e) => ApiResponse::from_error(status::of_block(&e), &e),
        }
    }
}
