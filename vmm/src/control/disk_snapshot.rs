//! `vm.disk-snapshot-external`: each listed disk gets a new qcow2
//! overlay whose backing file is its running image, and every listed
//! disk switches to its overlay at one instant (one pause of the group:
//! crash-consistent across the disks). docs/block-jobs.md describes it
//! for users.
//!
//! In order, so that a refusal loses nothing:
//! 1. every disk is checked (known 404, in-VMM 400, not being removed
//!    409, writable 400) and the list too (a disk or an overlay named
//!    twice, 400);
//! 2. every overlay is created (`block::overlay`: a path that exists,
//!    is the running image or one of its backing files is refused, 409)
//!    and opened over its disk's open image, and each device builds its
//!    queues on it ([`BlockDevice::prepare_switch`]); each running image
//!    is flushed (so that closing it after the switch is short); a
//!    failure removes the overlays made so far and nothing was switched;
//! 3. the disks' queues are paused together
//!    ([`Control::with_disks_paused`]) and each device takes its overlay
//!    ([`BlockDevice::swap_prepared`]); one failing switches the ones
//!    before it back; the queues resume;
//! 4. after the resume, each old image is flushed and marked clean (it
//!    stays open as its overlay's backing image, with a reader's locks
//!    only, so other tools may read it), the disk's config
//!    names the overlay, and the time the queues were parked is logged
//!    and reported on the event monitor.
//!
//! [`BlockDevice::prepare_switch`]: virtio_devices::block::BlockDevice::prepare_switch
//! [`BlockDevice::swap_prepared`]: virtio_devices::block::BlockDevice::swap_prepared

use std::path::Path;
use std::time::Instant;

use block::overlay::NewOverlay;
use block::{Disk, ImageType};
use virtio_devices::block::PreparedSwitch;

use super::{status, Control};
use crate::api::types::SnapshotExternalBody;
use crate::api::ApiResponse;
use crate::disk_registry::DiskBackend;
use crate::events::emit;

const WHAT: &str = "vm.disk-snapshot-external";

/// One disk of the group on its way to its overlay.
struct Member<'a> {
    id: &'a str,
    overlay: NewOverlay,
}

impl Control {
    pub(crate) fn disk_snapshot_external(&mut self, body: SnapshotExternalBody) -> ApiResponse {
        match self.snapshot_group(&body) {
            Ok(()) => ApiResponse::no_content(),
            Err(r) => r,
        }
    }

    fn snapshot_group(&mut self, body: &SnapshotExternalBody) -> Result<(), ApiResponse> {
        let running = self.check_group(body)?;
        let mut members = Vec::with_capacity(running.len());
        let mut prepared = Vec::with_capacity(running.len());
        for (req, disk) in body.disks.iter().zip(&running) {
            let context = format!("{WHAT}: disk '{}'", req.id);
            let overlay = NewOverlay::create(Path::new(&req.overlay), disk).map_err(|e| {
                ApiResponse::from_error_in(status::of_overlay(&e), Some(&context), &e)
            })?;
            members.push(Member {
                id: &req.id,
                overlay,
            });
        }
        for (m, disk) in members.iter().zip(&running) {
            let context = format!("{WHAT}: disk '{}'", m.id);
            let image = m.overlay.open(disk).map_err(|e| {
                ApiResponse::from_error_in(status::of_overlay(&e), Some(&context), &e)
            })?;
            let d = self.local_disk(m.id, WHAT)?;
            let dev = d.lock_device().expect("local_disk checked");
            let p = dev.prepare_switch(image).map_err(|e| {
                ApiResponse::from_error_in(status::of_control(&e), Some(&context), &e)
            })?;
            prepared.push(p);
        }
        // What the old tops have cached goes out now, while the guest
        // runs: their close after the switch then has little to write
        // (the overlays' reads of their backing image wait for it).
        for (m, disk) in members.iter().zip(&running) {
            if let Err(e) = disk.flush() {
                let context = format!("{WHAT}: cannot flush disk '{}'", m.id);
                return Err(ApiResponse::from_error_in(
                    status::of_block(&e),
                    Some(&context),
                    &e,
                ));
            }
        }
        for m in &members {
            let overlay = m.overlay.path().display().to_string();
            emit(
                "disk",
                "external-snapshotting",
                &[("id", m.id), ("overlay", &overlay)],
            );
        }
        let ids: Vec<&str> = members.iter().map(|m| m.id).collect();
        let started = Instant::now();
        // When every queue was parked, and when every disk had switched.
        let mut phases = (started, started);
        let outs = self.with_disks_paused(&ids, WHAT, |devices| {
            phases.0 = Instant::now();
            let mut outs = Vec::with_capacity(devices.len());
            let mut prepared = prepared.into_iter();
            for i in 0..devices.len() {
                let Some(p) = prepared.next() else { break };
                match devices[i].swap_prepared(p) {
                    Ok(out) => outs.push(out),
                    Err(e) => {
                        switch_back(&mut devices[..i], outs);
                        let context = format!("{WHAT}: cannot switch disk '{}'", ids[i]);
                        return Err(ApiResponse::from_error_in(
                            status::of_control(&e),
                            Some(&context),
                            &e,
                        ));
                    }
                }
            }
            phases.1 = Instant::now();
            Ok(outs)
        })?;
        let ended = Instant::now();
        let parked = ended - started;
        let parked_us = parked.as_micros().to_string();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        log::info!(
            "{WHAT}: {} disks switched in {:.3} ms (queues parked; pausing {:.3} ms, \
             switching {:.3} ms, resuming {:.3} ms)",
            outs.len(),
            ms(parked),
            ms(phases.0 - started),
            ms(phases.1 - phases.0),
            ms(ended - phases.1)
        );
        for out in outs {
            let base = out.disk().clone();
            let name = base.options().path.display().to_string();
            if let Err(e) = out.close() {
                log::error!("{WHAT}: closing the old top {name} after the switch: {e}");
            } else if let Err(e) = block::overlay::settle_as_backing(&base) {
                log::error!("{WHAT}: the old top {name} keeps its writer's lock: {e}");
            }
        }
        for m in members {
            let overlay = m.overlay.path().to_owned();
            m.overlay.keep();
            self.name_image(m.id, &overlay);
            let overlay = overlay.display().to_string();
            emit(
                "disk",
                "external-snapshotted",
                &[
                    ("id", m.id),
                    ("overlay", &overlay),
                    ("paused_us", &parked_us),
                ],
            );
        }
        Ok(())
    }

    /// Step 1: the running disks of the group, in the order given.
    fn check_group(&self, body: &SnapshotExternalBody) -> Result<Vec<Disk>, ApiResponse> {
        if body.disks.is_empty() {
            return Err(ApiResponse::error(
                400,
                &[WHAT, "the list of disks is empty"],
            ));
        }
        let mut running = Vec::with_capacity(body.disks.len());
        for (i, req) in body.disks.iter().enumerate() {
            let earlier = &body.disks[..i];
            if earlier.iter().any(|o| o.id == req.id) {
                let why = format!("disk '{}' is listed twice", req.id);
                return Err(ApiResponse::error(400, &[WHAT, &why]));
            }
            if earlier.iter().any(|o| o.overlay == req.overlay) {
                let why = format!("overlay {} is named twice", req.overlay);
                return Err(ApiResponse::error(400, &[WHAT, &why]));
            }
            let d = self.local_disk(&req.id, WHAT)?;
            self.refuse_if_backing_up(&req.id, WHAT)?;
            if let Some(why) = self.jobs.busy(&req.id) {
                return Err(ApiResponse::error(409, &[WHAT, &why]));
            }
            let disk = d.lock_device().expect("local_disk checked").disk().clone();
            if disk.readonly() {
                let why = format!("disk '{}' is read-only", req.id);
                return Err(ApiResponse::error(400, &[WHAT, &why]));
            }
            running.push(disk);
        }
        Ok(running)
    }

    /// The disk's config names its new top image (`vm.info`, the path
    /// a hot-added disk is compared with).
    fn name_image(&mut self, id: &str, path: &Path) {
        let Some(vm) = self.vm.as_mut() else { return };
        if let Some(d) = vm.machine.devices.disks.find_mut(id) {
            if let DiskBackend::Local { config, .. } = &mut d.backend {
                config.options.path = path.to_owned();
                config.options.image_type = ImageType::Format("qcow2");
            }
        }
    }
}

/// Puts the disks switched so far back on their old images (their
/// queues are still paused); their overlays are then unused.
fn switch_back(
    devices: &mut [std::sync::MutexGuard<'_, virtio_devices::block::BlockDevice>],
    outs: Vec<virtio_devices::block::SwitchedOut>,
) {
    for (dev, out) in devices.iter_mut().zip(outs) {
        let back: PreparedSwitch = out.into_switch_back();
        if let Err(e) = dev.swap_prepared(back) {
            log::error!("{WHAT}: a disk could not go back to its old image: {e}");
        }
    }
}
