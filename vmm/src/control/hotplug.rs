//! `vm.add-disk` and `vm.remove-device`: ACPI PCI hotplug.
//!
//! Adding opens the image (its lock taken), puts a new virtio-blk
//! function in the first free slot and raises the hotplug event; the
//! guest's ACPI (`PCNT`) sees the slot's bit and rescans it. Removing
//! raises the event with the slot's bit in the "remove" register; the
//! guest releases the device and ejects the slot (`_EJ0`), and only then
//! does the function leave the bus: drained, flushed, closed, its lock
//! released, before the answer goes out. A guest that does not eject
//! within [`EJECT_TIMEOUT`] (or a paused VM, which cannot) gets the
//! function taken away all the same, as a surprise removal.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use super::{status, Control, PendingRemoval, VmState};
use crate::api::endpoint::Responder;
use crate::api::types::PciDeviceInfo;
use crate::api::ApiResponse;
use crate::config::{DiskConfig, ResolvedDisk};
use crate::device_manager::{open_disk, DeviceError};
use crate::disk_registry::DiskBackend;

/// How long a removal waits for the guest to eject the slot.
pub const EJECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Control {
    fn lock_hotplug(&self) -> std::sync::MutexGuard<'_, crate::devices::pci_hotplug::PciHotplug> {
        self.devices
            .hotplug
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn add_disk(&mut self, asked: DiskConfig) -> ApiResponse {
        let config = match asked.resolve() {
            Ok(ResolvedDisk::Local(c)) => c,
            Ok(ResolvedDisk::VhostUser(_)) => {
                return ApiResponse::error(
                    400,
                    &[
                        "invalid disk configuration",
                        "'vhost_user' = true is not supported here: vhost-user disks are given at boot (--disk vhost_user=on)",
                    ],
                )
            }
            Err(e) => {
                return ApiResponse::error(400, &["invalid disk configuration", &e.to_string()])
            }
        };
        if let Some(r) = self.refuse_when_shut("vm.add-disk") {
            return r;
        }
        if let Some(id) = &config.id {
            if self.devices.disks.find(id).is_some() {
                return ApiResponse::error(409, &[&format!("a disk with id '{id}' exists")]);
            }
        }
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
        };
        for d in self.devices.disks.iter() {
            if let DiskBackend::Local { config: c, .. } = &d.backend {
                if same(&c.options.path, &config.options.path) {
                    return ApiResponse::error(
                        409,
                        &[&format!(
                            "{} is disk '{}' already",
                            config.options.path.display(),
                            d.id
                        )],
                    );
                }
            }
        }
        let failed = |e: DeviceError| {
            ApiResponse::from_error_in(status::of_device(&e), Some("cannot add the disk"), &e)
        };
        let opened = match open_disk(&config) {
            Ok(o) => o,
            Err(e) => return failed(e),
        };
        let (id, slot, bdf) = match self.devices.disks.add_local(opened) {
            Ok(d) => (d.id.clone(), d.function.slot, d.function.bdf()),
            Err(e) => return failed(e),
        };
        self.lock_hotplug().announce_added(slot);
        log::info!("disk {id} hot-added at {bdf}");
        ApiResponse::json(&PciDeviceInfo { id, bdf })
    }

    pub(crate) fn remove_device(&mut self, id: String, reply: Responder) {
        let refused = if let Some(r) = self.refuse_when_shut("vm.remove-device") {
            Some(r)
        } else if self.removals.iter().any(|r| r.id == id) {
            Some(ApiResponse::error(
                409,
                &[&format!("disk '{id}' is being removed already")],
            ))
        } else if self.devices.disks.find(&id).is_none() {
            Some(ApiResponse::error(
                404,
                &[&format!("no device with id '{id}'")],
            ))
        } else {
            None
        };
        if let Some(r) = refused {
            reply.send(r);
            return;
        }
        let slot = self
            .devices
            .disks
            .find(&id)
            .map(|d| d.function.slot)
            .unwrap_or_default();
        if self.state == VmState::Paused {
            // A paused guest cannot eject: take the device away now.
            reply.send(self.finish_removal(&id));
            return;
        }
        self.lock_hotplug().request_removal(slot);
        log::info!("disk {id}: asked the guest to eject slot {slot}");
        self.removals.push(PendingRemoval {
            id,
            slot,
            deadline: Instant::now() + EJECT_TIMEOUT,
            reply,
        });
    }

    /// The guest ejected slots: finish the removals waiting for them (and
    /// remove a disk the guest ejected unasked).
    pub(super) fn on_eject(&mut self) {
        let slots = self.lock_hotplug().take_ejected();
        for slot in slots {
            if let Some(i) = self.removals.iter().position(|r| r.slot == slot) {
                let r = self.removals.remove(i);
                log::info!("disk {}: the guest ejected slot {slot}", r.id);
                r.reply.send(self.finish_removal(&r.id));
            } else if let Some(id) = self.devices.disks.find_by_slot(slot).map(|d| d.id.clone()) {
                log::info!("disk {id}: the guest ejected slot {slot} unasked; removing it");
                let _ = self.finish_removal(&id);
            }
        }
    }

    /// Removals whose guest did not eject in time go ahead anyway.
    pub(super) fn expire_removals(&mut self) {
        let now = Instant::now();
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.removals)
            .into_iter()
            .partition(|r| r.deadline <= now);
        self.removals = waiting;
        for r in late {
            log::warn!(
                "disk {}: the guest did not eject slot {} within {EJECT_TIMEOUT:?}; removing it anyway",
                r.id,
                r.slot
            );
            r.reply.send(self.finish_removal(&r.id));
        }
    }

    /// Every waiting removal, now (the VM is going away).
    pub(super) fn finish_removals_now(&mut self) {
        for r in std::mem::take(&mut self.removals) {
            r.reply.send(self.finish_removal(&r.id));
        }
    }

    /// Takes disk `id` off the bus, then drains, flushes and closes it,
    /// and answers once its image is closed and unlocked.
    fn finish_removal(&mut self, id: &str) -> ApiResponse {
        let Some(closed) = self.retire_disk(id) else {
            return ApiResponse::error(404, &[&format!("no device with id '{id}'")]);
        };
        match closed {
            Ok(()) => ApiResponse::no_content(),
            Err(e) => ApiResponse::error(
                500,
                &[
                    &format!("disk '{id}' was removed, but closing its image failed"),
                    &e,
                ],
            ),
        }
    }

    /// Takes disk `id` off the bus, then drains, flushes and closes it;
    /// when this returns its image's files are closed and its locks
    /// released. `None` if there is no such disk; the error says why
    /// closing failed (the disk is gone all the same).
    pub(super) fn retire_disk(&mut self, id: &str) -> Option<Result<(), String>> {
        let disk = self.devices.disks.detach(id)?;
        let slot = disk.function.slot;
        self.lock_hotplug().forget(slot);
        let closed = match disk.device() {
            Some(dev) => dev
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .close()
                .map_err(|e| ch_log::error_chain(&e)),
            None => Ok(()),
        };
        disk.function
            .function
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .shutdown();
        let handle = disk.device().cloned();
        drop(disk);
        // A vCPU in the middle of an access may hold the function a
        // moment longer; the image's files (and locks) go with the last
        // reference.
        if let Some(h) = handle {
            let deadline = Instant::now() + Duration::from_secs(2);
            while Arc::strong_count(&h) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        match &closed {
            Ok(()) => log::info!("disk {id}: taken off slot {slot} and closed"),
            Err(e) => {
                log::error!("disk {id}: taken off slot {slot}; closing its image failed: {e}")
            }
        }
        Some(closed)
    }
}
