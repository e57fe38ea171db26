//! Builds the machine's devices: the serial port, the i8042 reset line,
//! the ACPI sleep and reset registers, the PCI host bridge with its
//! hotplug registers, and one virtio-blk device behind virtio-pci per
//! `--disk` (in-VMM, or a vhost-user front end:
//! [`crate::vhost_user_disks`]), kept by id in the
//! [`DiskRegistry`], which also adds and removes disks while the guest
//! runs.
//!
//! Disks are opened first ([`open_disks`], before the VM exists, so a bad
//! image fails fast); [`DeviceManager::new`] then takes them and leaves the
//! port and MMIO buses the vCPU threads dispatch to.

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use block::{BlockError, ExclusiveImage};
use hypervisor::Vm;
use thiserror::Error;
use virtio_devices::block::BlockDeviceError;
use virtio_devices::transport::TransportError;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{LocalDiskConfig, SerialMode, VmConfig};
use crate::devices::acpi_pm::{self, AcpiPm};
use crate::devices::bus::{Bus, BusOverlap};
use crate::devices::cmos::Cmos;
use crate::devices::i8042::I8042;
use crate::devices::pci::{PciConfigPorts, PciDevices, PciMmioWindow};
use crate::devices::pci_hotplug::{self, PciHotplug};
use crate::devices::serial::{spawn_stdin_reader, SerialPort};
use crate::disk_registry::DiskRegistry;
use crate::layout::{
    ACPI_PM_PORT, CMOS_PORT, COM1_IRQ, COM1_PORT, GED_IRQ, I8042_PORT, PCI_CONFIG_PORT,
    PCI_HOTPLUG_PORT, PCI_MMIO_END, PCI_MMIO_START,
};
use crate::pci_attach::{KvmNotifyRegistry, PciAttach};
use crate::seccomp::{self, ThreadKind};
use crate::vm::ExitSignal;

#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("cannot open disk {path}")]
    OpenDisk {
        path: String,
        #[source]
        source: BlockError,
    },
    #[error("cannot create virtio-blk device for {path}")]
    CreateBlock {
        path: String,
        #[source]
        source: BlockDeviceError,
    },
    #[error("cannot create virtio-pci transport")]
    Transport(#[source] TransportError),
    #[error("cannot open serial output file {path}")]
    SerialFile {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the serial input thread")]
    SerialInput(#[source] io::Error),
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("KVM rejected an interrupt or notification set-up")]
    Kvm(#[source] hypervisor::HypervisorError),
    #[error("device address conflict")]
    Bus(#[source] BusOverlap),
    #[error("cannot build the queue workers' seccomp filter")]
    Seccomp(#[source] crate::seccomp::SeccompError),
    #[error("disk {path} has the backing file {backing}, and backing_files is off")]
    BackingFilesOff { path: String, backing: String },
    #[error("too many disks: the PCI bus and MMIO window hold {0}")]
    TooManyDisks(usize),
    #[error("cannot set up a vhost-user disk")]
    VhostUser(#[source] virtio_devices::vhost_user_blk::VhostUserBlkError),
}

/// A disk opened from its `--disk` config, by its owner (the tools that
/// resize and snapshot it come along).
pub struct OpenedDisk {
    pub config: LocalDiskConfig,
    pub image: ExclusiveImage,
}

/// Opens every disk (format probe, backing chain, locks, engine choice)
/// and logs one line per disk with the engine in use.
pub fn open_disks(configs: &[LocalDiskConfig]) -> Result<Vec<OpenedDisk>, DeviceError> {
    let max = max_disks();
    if configs.len() > max {
        return Err(DeviceError::TooManyDisks(max));
    }
    configs.iter().map(open_disk).collect()
}

/// Opens one disk (see [`open_disks`]).
pub fn open_disk(c: &LocalDiskConfig) -> Result<OpenedDisk, DeviceError> {
    {
        {
            let image =
                ExclusiveImage::open(&c.options).map_err(|source| DeviceError::OpenDisk {
                    path: c.options.path.display().to_string(),
                    source,
                })?;
            let disk = image.disk();
            if !c.backing_files {
                if let Some(backing) = disk.format().info().backing_filename {
                    let path = c.options.path.display().to_string();
                    if let Err(e) = image.close() {
                        log::warn!("disk {path}: closing after the refusal failed: {e}");
                    }
                    return Err(DeviceError::BackingFilesOff { path, backing });
                }
            }
            let disk = image.disk();
            log::info!(
                "disk {}: {} bytes, engine {} (asked {}), cache={}, {}{}",
                c.options.path.display(),
                disk.size(),
                disk.engine(),
                c.options.engine,
                c.options.cache,
                if c.options.readonly {
                    "read-only"
                } else {
                    "read-write"
                },
                if c.options.direct { ", O_DIRECT" } else { "" },
            );
            Ok(OpenedDisk {
                config: c.clone(),
                image,
            })
        }
    }
}

fn max_disks() -> usize {
    crate::pci_attach::max_functions()
}

pub struct DeviceManager {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pci: Arc<Mutex<PciDevices>>,
    /// Every disk on the bus, by id.
    pub disks: DiskRegistry,
    /// The ACPI PCI hotplug registers.
    pub hotplug: Arc<Mutex<PciHotplug>>,
}

impl DeviceManager {
    pub fn new(
        vm: &Arc<Vm>,
        mem: &Arc<GuestMemoryMmap>,
        config: &VmConfig,
        disks: Vec<OpenedDisk>,
        exit: Arc<ExitSignal>,
    ) -> Result<Self, DeviceError> {
        let mut pio = Bus::default();
        let mut mmio = Bus::default();
        add_legacy_devices(vm, config, &mut pio, &exit)?;

        let pci = Arc::new(Mutex::new(PciDevices::default()));
        pio.insert(
            u64::from(PCI_CONFIG_PORT),
            8,
            Arc::new(Mutex::new(PciConfigPorts::new(
                pci.clone(),
                Arc::new(KvmNotifyRegistry { vm: vm.clone() }),
            ))),
        )
        .map_err(DeviceError::Bus)?;
        mmio.insert(
            PCI_MMIO_START,
            PCI_MMIO_END - PCI_MMIO_START,
            Arc::new(Mutex::new(PciMmioWindow::new(pci.clone()))),
        )
        .map_err(DeviceError::Bus)?;
        let ged_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
        vm.register_irqfd(&ged_irq, GED_IRQ)
            .map_err(DeviceError::Kvm)?;
        let hotplug = Arc::new(Mutex::new(
            PciHotplug::new(ged_irq).map_err(DeviceError::EventFd)?,
        ));
        pio.insert(
            u64::from(PCI_HOTPLUG_PORT),
            pci_hotplug::REGISTER_BYTES,
            hotplug.clone(),
        )
        .map_err(DeviceError::Bus)?;

        // Queue workers get their own seccomp filter, installed in the
        // thread that activates each device (workers inherit it).
        let worker_filters = Arc::new(
            seccomp::filters(ThreadKind::QueueWorker, config.seccomp)
                .map_err(DeviceError::Seccomp)?,
        );
        if disks.len() + config.vhost_user_disks.len() > max_disks() {
            return Err(DeviceError::TooManyDisks(max_disks()));
        }
        let mut registry = DiskRegistry::new(PciAttach {
            vm: vm.clone(),
            mem: mem.clone(),
            pci: pci.clone(),
            worker_filters,
        });
        for d in disks {
            registry.add_local(d)?;
        }
        for c in &config.vhost_user_disks {
            registry.add_vhost_user(c)?;
        }
        Ok(DeviceManager {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            pci,
            disks: registry,
            hotplug,
        })
    }

    /// Stops every device: workers drain their queues, disks flush and
    /// close.
    pub fn shutdown(&self) {
        let functions = self
            .pci
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .functions();
        for f in functions {
            f.lock().unwrap_or_else(PoisonError::into_inner).shutdown();
        }
    }
}

/// The serial port (and its input thread), the i8042 reset line, the
/// CMOS clock and the ACPI sleep/reset registers.
fn add_legacy_devices(
    vm: &Arc<Vm>,
    config: &VmConfig,
    pio: &mut Bus,
    exit: &Arc<ExitSignal>,
) -> Result<(), DeviceError> {
    let out: Box<dyn io::Write + Send> = match &config.serial {
        SerialMode::Tty => Box::new(io::stdout()),
        SerialMode::Off => Box::new(io::sink()),
        SerialMode::File(p) => {
            Box::new(File::create(p).map_err(|source| DeviceError::SerialFile {
                path: p.display().to_string(),
                source,
            })?)
        }
    };
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
    vm.register_irqfd(&serial_irq, COM1_IRQ)
        .map_err(DeviceError::Kvm)?;
    let serial = Arc::new(Mutex::new(SerialPort::new(serial_irq, out)));
    pio.insert(u64::from(COM1_PORT), 8, serial.clone())
        .map_err(DeviceError::Bus)?;
    if config.serial == SerialMode::Tty {
        spawn_stdin_reader(serial, config.seccomp).map_err(DeviceError::SerialInput)?;
    }
    pio.insert(
        u64::from(I8042_PORT),
        5,
        Arc::new(Mutex::new(I8042::new(exit.clone()))),
    )
    .map_err(DeviceError::Bus)?;
    pio.insert(u64::from(CMOS_PORT), 2, Arc::new(Mutex::new(Cmos::new())))
        .map_err(DeviceError::Bus)?;
    pio.insert(
        u64::from(ACPI_PM_PORT),
        acpi_pm::PORT_COUNT,
        Arc::new(Mutex::new(AcpiPm::new(exit.clone()))),
    )
    .map_err(DeviceError::Bus)?;
    Ok(())
}
