//! The disks on the PCI bus, by id: the boot-time `--disk`s and the ones
//! `vm.add-disk` hot-plugs, each with its PCI function and, for an in-VMM
//! disk, the owner's handle on its [`BlockDevice`] (pause, resize,
//! snapshot, counters).
//!
//! Enters as opened disks and vhost-user configs; leaves as
//! [`AttachedDisk`]s that the control loop looks up by id, and, on
//! [`DiskRegistry::detach`], as a disk taken off the bus whose device the
//! caller shuts down.

use std::sync::{Arc, Mutex, PoisonError};

use virtio_devices::block::{BlockDevice, BlockDeviceConfig, SharedBlockDevice};

use crate::config::{next_free_disk_id, LocalDiskConfig, VhostUserDiskConfig};
use crate::device_manager::{DeviceError, OpenedDisk};
use crate::pci_attach::{AttachedFunction, PciAttach};

/// What serves a disk.
pub enum DiskBackend {
    /// Our virtio-blk device over an image we opened.
    Local {
        config: LocalDiskConfig,
        device: Arc<Mutex<BlockDevice>>,
    },
    /// A vhost-user backend serves it; we only forward.
    VhostUser { config: VhostUserDiskConfig },
}

/// A disk on the bus.
pub struct AttachedDisk {
    pub id: String,
    pub backend: DiskBackend,
    pub function: AttachedFunction,
}

impl AttachedDisk {
    /// The owner's handle of an in-VMM disk's device.
    pub fn device(&self) -> Option<&Arc<Mutex<BlockDevice>>> {
        match &self.backend {
            DiskBackend::Local { device, .. } => Some(device),
            DiskBackend::VhostUser { .. } => None,
        }
    }

    /// Locks an in-VMM disk's device.
    pub fn lock_device(&self) -> Option<std::sync::MutexGuard<'_, BlockDevice>> {
        self.device()
            .map(|d| d.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

pub struct DiskRegistry {
    attach: PciAttach,
    disks: Vec<AttachedDisk>,
    /// Where the search for the next default id starts.
    next_default: usize,
}

impl DiskRegistry {
    pub fn new(attach: PciAttach) -> Self {
        DiskRegistry {
            attach,
            disks: Vec::new(),
            next_default: 0,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &AttachedDisk> {
        self.disks.iter()
    }

    pub fn find(&self, id: &str) -> Option<&AttachedDisk> {
        self.disks.iter().find(|d| d.id == id)
    }

    pub fn find_by_slot(&self, slot: usize) -> Option<&AttachedDisk> {
        self.disks.iter().find(|d| d.function.slot == slot)
    }

    /// A default id (`_diskN`) no disk has.
    pub fn fresh_id(&mut self) -> String {
        let taken: Vec<&str> = self.disks.iter().map(|d| d.id.as_str()).collect();
        next_free_disk_id(&mut self.next_default, &taken)
    }

    fn id_for(&mut self, id: &Option<String>) -> String {
        match id {
            Some(id) => id.clone(),
            None => self.fresh_id(),
        }
    }

    /// Puts an opened disk behind virtio-pci in the first free slot.
    pub fn add_local(&mut self, d: OpenedDisk) -> Result<&AttachedDisk, DeviceError> {
        let path = d.config.options.path.display().to_string();
        let id = self.id_for(&d.config.id);
        let blk_config = BlockDeviceConfig {
            num_queues: d.config.num_queues,
            queue_size: d.config.queue_size,
            serial: d.config.serial.clone().unwrap_or_default().into_bytes(),
            rate_limit: d.config.rate_limit,
            queue_affinity: d.config.queue_affinity.clone(),
            poll_us: d.config.poll_us,
            ..Default::default()
        };
        let dev = BlockDevice::with_image(d.image, blk_config).map_err(|source| {
            DeviceError::CreateBlock {
                path: path.clone(),
                source,
            }
        })?;
        let shared = SharedBlockDevice::new(dev);
        let device = shared.handle();
        let function = self.attach.add(Box::new(shared), d.config.num_queues)?;
        log::info!(
            "disk {id} ({path}): virtio-blk at PCI {}, BAR0 {:#x}, {} queue(s) of {}",
            function.bdf(),
            function.bar,
            d.config.num_queues,
            d.config.queue_size
        );
        let mut config = d.config;
        config.id = Some(id.clone());
        self.disks.push(AttachedDisk {
            id,
            backend: DiskBackend::Local { config, device },
            function,
        });
        Ok(self.disks.last().expect("just pushed"))
    }

    /// Connects a vhost-user disk and puts it behind virtio-pci.
    pub fn add_vhost_user(
        &mut self,
        c: &VhostUserDiskConfig,
    ) -> Result<&AttachedDisk, DeviceError> {
        let id = self.id_for(&c.id);
        let (dev, capacity) = crate::vhost_user_disks::connect(c)?;
        let function = self.attach.add(Box::new(dev), c.num_queues)?;
        log::info!(
            "disk {id} ({}): vhost-user-blk ({capacity} bytes) at PCI {}, BAR0 {:#x}, \
             {} queue(s) of {}",
            c.socket.display(),
            function.bdf(),
            function.bar,
            c.num_queues,
            c.queue_size
        );
        let mut config = c.clone();
        config.id = Some(id.clone());
        self.disks.push(AttachedDisk {
            id,
            backend: DiskBackend::VhostUser { config },
            function,
        });
        Ok(self.disks.last().expect("just pushed"))
    }

    /// Takes disk `id` off the bus and out of the registry; the caller
    /// shuts its device down (drain, flush, close, unlock).
    pub fn detach(&mut self, id: &str) -> Option<AttachedDisk> {
        let i = self.disks.iter().position(|d| d.id == id)?;
        let disk = self.disks.remove(i);
        self.attach.remove(&disk.function);
        Some(disk)
    }
}
