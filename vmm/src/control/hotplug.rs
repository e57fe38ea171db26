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
use crate::events::emit;

/// How long a removal waits for the guest to eject the slot.
pub const EJECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Control {
    /// Runs `f` on the running VM's hotplug registers (nothing without
    /// a VM).
    fn with_hotplug(&self, f: impl FnOnce(&mut crate::devices::pci_hotplug::PciHotplug)) {
        if let Some(vm) = &self.vm {
            f(&mut vm
                .machine
                .devices
                .hotplug
                .lock()
                .unwrap_or_else(PoisonError::into_inner));
        }
    }

    pub(super) fn disks(&self) -> Option<&crate::disk_registry::DiskRegistry> {
        self.vm.as_ref().map(|v| &v.machine.devices.disks)
    }

    fn disks_mut(&mut self) -> Option<&mut crate::disk_registry::DiskRegistry> {
        self.vm.as_mut().map(|v| &mut v.machine.devices.disks)
    }

    pub(crate) fn add_disk(&mut self, asked: DiskConfig) -> ApiResponse {
        let config = match asked.resolve() {
            Ok(ResolvedDisk::Local(c)) => *c,
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
        let disks = match self.machine("vm.add-disk") {
            Ok(m) => &m.devices.disks,
            Err(r) => return r,
        };
        if let Some(id) = &config.id {
            if disks.find(id).is_some() {
                return ApiResponse::error(409, &[&format!("a disk with id '{id}' exists")]);
            }
        }
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
        };
        for d in disks.iter() {
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
        let Some(registry) = self.disks_mut() else {
            return ApiResponse::error(500, &["vm.add-disk", "the VM is not running"]);
        };
        let (id, slot, bdf) = match registry.add_local(opened) {
            Ok(d) => (d.id.clone(), d.function.slot, d.function.bdf()),
            Err(e) => return failed(e),
        };
        self.with_hotplug(|h| h.announce_added(slot));
        self.record_disks();
        log::info!("disk {id} hot-added at {bdf}");
        let path = config.options.path.display().to_string();
        emit(
            "disk",
            "added",
            &[("id", &id), ("bdf", &bdf), ("path", &path)],
        );
        ApiResponse::json(&PciDeviceInfo { id, bdf })
    }

    pub(crate) fn remove_device(&mut self, id: String, reply: Responder) {
        let refused = if let Err(r) = self.machine("vm.remove-device") {
            Some(r)
        } else if self.removals.iter().any(|r| r.id == id) {
            Some(ApiResponse::error(
                409,
                &[&format!("disk '{id}' is being removed already")],
            ))
        } else if self.disks().and_then(|d| d.find(&id)).is_none() {
            Some(ApiResponse::error(
                404,
                &[&format!("no device with id '{id}'")],
            ))
        } else {
            self.refuse_if_backing_up(&id, "vm.remove-device")
                .err()
                .or_else(|| {
                    self.jobs
                        .busy(&id)
                        .map(|why| ApiResponse::error(409, &["vm.remove-device", &why]))
                })
        };
        if let Some(r) = refused {
            reply.send(r);
            return;
        }
        let slot = self
            .disks()
            .and_then(|d| d.find(&id))
            .map(|d| d.function.slot)
            .unwrap_or_default();
        if self.state() == VmState::Paused {
            // A paused guest cannot eject: take the device away now.
            reply.send(self.finish_removal(&id));
            return;
        }
        self.with_hotplug(|h| h.request_removal(slot));
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
        let mut slots = Vec::new();
        self.with_hotplug(|h| slots = h.take_ejected());
        // With no VM (or between two), only drain the eventfd.
        let _ = self.eject.read();
        for slot in slots {
            if let Some(i) = self.removals.iter().position(|r| r.slot == slot) {
                let r = self.removals.remove(i);
                log::info!("disk {}: the guest ejected slot {slot}", r.id);
                r.reply.send(self.finish_removal(&r.id));
            } else if let Some(id) = self
                .disks()
                .and_then(|d| d.find_by_slot(slot))
                .map(|d| d.id.clone())
            {
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
        let bdf = self
            .disks()
            .and_then(|d| d.find(id))
            .map(|d| d.function.bdf())
            .unwrap_or_default();
        let Some(closed) = self.retire_disk(id) else {
            return ApiResponse::error(404, &[&format!("no device with id '{id}'")]);
        };
        self.record_disks();
        emit("vm", "device-removed", &[("id", id), ("bdf", &bdf)]);
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
        self.jobs.forget_disk(id);
        let disk = self.disks_mut()?.detach(id)?;
        let slot = disk.function.slot;
        self.with_hotplug(|h| h.forget(slot));
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
