//! Several running disks changed "at one instant": every listed disk's
//! queues are paused (each worker completes what it has in flight and
//! parks) before the change runs, and all of them resume after it, so no
//! guest request of any of them is in flight while it runs. Bitmap
//! transactions and groups of external snapshots go through here
//! (docs/live-operations.md, "One instant").
//!
//! The devices are locked and paused in the order given; a disk that
//! cannot be paused (its queues do not drain in time) resumes the ones
//! paused before it and nothing runs. The change gets the locked devices
//! in the same order.

use std::sync::MutexGuard;

use virtio_devices::block::BlockDevice;

use super::{status, Control};
use crate::api::ApiResponse;

impl Control {
    /// Runs `change` with the in-VMM disks `ids` locked and their queues
    /// paused together; `what` names the request in error answers. An
    /// unknown id is a 404, a vhost-user disk or one being removed a
    /// 4xx (as [`Control::local_disk`] answers), a repeated id a 400.
    pub(crate) fn with_disks_paused<T>(
        &self,
        ids: &[&str],
        what: &str,
        change: impl FnOnce(&mut [MutexGuard<'_, BlockDevice>]) -> Result<T, ApiResponse>,
    ) -> Result<T, ApiResponse> {
        for (i, id) in ids.iter().enumerate() {
            if ids[..i].contains(id) {
                return Err(ApiResponse::error(
                    400,
                    &[&format!("{what}: disk '{id}' is listed twice")],
                ));
            }
        }
        let mut disks = Vec::with_capacity(ids.len());
        for id in ids {
            disks.push(self.local_disk(id, what)?);
        }
        let mut devices: Vec<MutexGuard<'_, BlockDevice>> = disks
            .iter()
            .map(|d| d.lock_device().expect("local_disk checked"))
            .collect();
        for i in 0..devices.len() {
            if let Err(e) = devices[i].pause() {
                for dev in devices[..i].iter_mut() {
                    dev.resume();
                }
                let context = format!("{what}: cannot pause disk '{}'", ids[i]);
                return Err(ApiResponse::from_error_in(
                    status::of_control(&e),
                    Some(&context),
                    &e,
                ));
            }
        }
        let result = change(&mut devices);
        for dev in devices.iter_mut() {
            dev.resume();
        }
        result
    }
}
