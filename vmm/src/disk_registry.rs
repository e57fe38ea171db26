//! The disks on the PCI bus, by id: the boot-time `--disk`s and the ones
//! `vm.add-disk` hot-plugs, each with its PCI function and, for an in-VMM
//! disk, the owner's handle on its [`BlockDevice`] (pause, resize,
//! snapshot, counters).
//!
//! Enters as opened disks and vhost-user configs (or, after a reboot, as
//! the previous machine's [`CarriedDisk`]s, back in their slots); leaves
//! as [`AttachedDisk`]s that the control loop looks up by id, on
//! [`DiskRegistry::detach`] as a disk taken off the bus whose device the
//! caller shuts down, and on [`DiskRegistry::carry_out`] as the devices
//! a reboot moves to the next machine.
//!
//! Each function reports its driver's activations and resets on the
//! event monitor (`virtio-device` `activated`/`reset`, with the id).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use virtio_devices::block::{BlockDevice, BlockDeviceConfig, SharedBlockDevice};
use virtio_devices::transport::{DeviceEvent, VirtioPciDevice};
use virtio_devices::VirtioDevice;

use block::ExclusiveImage;

use crate::config::{next_free_disk_id, LocalDiskConfig, VhostUserDiskConfig};
use crate::device_error::DeviceError;
use crate::pci_attach::{AttachedFunction, PciAttach};

/// A disk opened from its config, by its owner (the tools that
/// resize and snapshot it come along).
pub struct OpenedDisk {
    pub config: LocalDiskConfig,
    pub image: ExclusiveImage,
}

/// What serves a disk.
pub enum DiskBackend {
    /// Our virtio-blk device over an image we opened.
    Local {
        config: Box<LocalDiskConfig>,
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

/// A disk between two machines (a reboot): off the bus, its device reset
/// with its image still open and locked.
pub struct CarriedDisk {
    pub id: String,
    pub slot: usize,
    pub backend: DiskBackend,
    pub device: Box<dyn VirtioDevice>,
}

/// Reports `id`'s activations and resets on the event monitor.
fn observe(function: &AttachedFunction, id: &str) {
    let id = id.to_string();
    function
        .function
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .set_event_observer(Arc::new(move |e| {
            let event = match e {
                DeviceEvent::Activated => "activated",
                DeviceEvent::Reset => "reset",
            };
            crate::events::emit("virtio-device", event, &[("id", &id)]);
        }));
}

/// The function `f` wraps, once no vCPU holds it any more (they are
/// stopped; one in the middle of an access lets go at once).
fn unwrap_function(f: Arc<Mutex<VirtioPciDevice>>) -> Option<VirtioPciDevice> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut f = f;
    loop {
        match Arc::try_unwrap(f) {
            Ok(m) => return Some(m.into_inner().unwrap_or_else(PoisonError::into_inner)),
            Err(back) if Instant::now() < deadline => {
                f = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return None,
        }
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

    pub fn find_mut(&mut self, id: &str) -> Option<&mut AttachedDisk> {
        self.disks.iter_mut().find(|d| d.id == id)
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
        let function = self
            .attach
            .add(Box::new(shared), d.config.num_queues, None)?;
        observe(&function, &id);
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
            backend: DiskBackend::Local {
                config: Box::new(config),
                device,
            },
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
        let function = self.attach.add(Box::new(dev), c.num_queues, None)?;
        observe(&function, &id);
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

    /// Puts a disk carried from the previous machine back in its slot.
    pub fn attach_carried(&mut self, c: CarriedDisk) -> Result<(), DeviceError> {
        let queues = match &c.backend {
            DiskBackend::Local { config, .. } => config.num_queues,
            DiskBackend::VhostUser { config } => config.num_queues,
        };
        let function = self.attach.add(c.device, queues, Some(c.slot))?;
        observe(&function, &c.id);
        log::info!("disk {}: back at PCI {}", c.id, function.bdf());
        self.disks.push(AttachedDisk {
            id: c.id,
            backend: c.backend,
            function,
        });
        Ok(())
    }

    /// Every disk off the bus, its device reset (workers drained and
    /// stopped) with its image open: what a reboot moves to the next
    /// machine. The vCPUs must be stopped. A function still held after
    /// that (which would be a bug) loses its disk: it is shut down, not
    /// carried.
    pub fn carry_out(&mut self) -> Vec<CarriedDisk> {
        let mut carried = Vec::new();
        for d in std::mem::take(&mut self.disks) {
            self.attach.remove(&d.function);
            let AttachedDisk {
                id,
                backend,
                function,
            } = d;
            let slot = function.slot;
            let shared = function.function.clone();
            drop(function);
            match unwrap_function(shared) {
                Some(f) => carried.push(CarriedDisk {
                    id,
                    slot,
                    backend,
                    device: f.into_device(),
                }),
                None => log::error!("disk {id}: its function is still in use; it is not carried"),
            }
        }
        carried
    }

    /// Shuts every disk's device down (a machine that failed to start).
    pub fn shut_down_all(&mut self) {
        for d in std::mem::take(&mut self.disks) {
            self.attach.remove(&d.function);
            d.function
                .function
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .shutdown();
        }
    }
}
