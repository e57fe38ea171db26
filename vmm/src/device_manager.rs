//! Builds the machine's devices: the serial port, the i8042 reset line,
//! the ACPI sleep and reset registers, the PCI host bridge with its
//! hotplug registers, and one virtio-blk device behind virtio-pci per
//! disk (in-VMM, or a vhost-user front end:
//! [`crate::vhost_user_disks`]), kept by id in the
//! [`DiskRegistry`], which also adds and removes disks while the guest
//! runs.
//!
//! Disks are opened first ([`open_disks`], on the control loop, before
//! the VM exists, so a bad image fails fast); [`DeviceManager::new`] then
//! takes them, or the previous boot's devices ([`Carried`], a reboot:
//! the disks with their open images and counters, the serial port with
//! its output), and leaves the port and MMIO buses the vCPU threads
//! dispatch to. [`DeviceManager::carry_out`] hands them on again.

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use block::ExclusiveImage;
use hypervisor::Vm;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{BootConfig, LocalDiskConfig, SeccompMode, SerialMode};
use crate::devices::acpi_pm::{self, AcpiPm};
use crate::devices::bus::Bus;
use crate::devices::cmos::Cmos;
use crate::devices::ged::{self, GedEvents};
use crate::devices::i8042::I8042;
use crate::devices::pci::{PciConfigPorts, PciDevices, PciMmioWindow};
use crate::devices::pci_hotplug::{self, PciHotplug};
use crate::devices::serial::{forward_stdin, SerialPort};
use crate::disk_registry::{CarriedDisk, DiskRegistry};
use crate::exit::ExitSignal;
use crate::layout::{
    ACPI_PM_PORT, CMOS_PORT, COM1_IRQ, COM1_PORT, GED_EVENT_PORT, GED_IRQ, I8042_PORT,
    PCI_CONFIG_PORT, PCI_HOTPLUG_PORT, PCI_MMIO_END, PCI_MMIO_START, POWER_BUTTON_IRQ,
};
use crate::pci_attach::{KvmNotifyRegistry, PciAttach};
use crate::seccomp::{self, ThreadKind};

pub use crate::device_error::DeviceError;
pub use crate::disk_registry::OpenedDisk;

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
            // Before any guest write: the image's persistent dirty bitmaps
            // are loaded and marked in use (a crash leaves them
            // inconsistent); a failure leaves the image as it was.
            if let Err(source) = image.attach_persistent_bitmaps() {
                let path = c.options.path.display().to_string();
                if let Err(e) = image.close() {
                    log::warn!("disk {path}: closing after the refusal failed: {e}");
                }
                return Err(DeviceError::OpenDisk { path, source });
            }
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

/// The serial port and the eventfd of its interrupt: a reboot moves
/// both to the next VM (the irqfd is registered with each).
pub struct SerialLine {
    port: Arc<Mutex<SerialPort>>,
    irq: EventFd,
    /// Whether the port takes the VMM's stdin.
    tty: bool,
}

/// What a new machine's devices start from.
pub enum Devices {
    /// Disks opened for this boot.
    Fresh(Vec<OpenedDisk>),
    /// The previous boot's devices (a reboot).
    Carried(Carried),
}

/// What a reboot takes from one machine to the next.
pub struct Carried {
    pub disks: Vec<CarriedDisk>,
    serial: SerialLine,
}

impl Carried {
    /// Shuts every carried device down (a reboot that could not build
    /// its machine): drained, flushed, closed, unlocked.
    pub fn shut_down(self) {
        for mut d in self.disks {
            d.device.shutdown();
            log::info!("disk {}: closed", d.id);
        }
        if self.serial.tty {
            let _ = forward_stdin(None, SeccompMode::Off);
        }
    }
}

pub struct DeviceManager {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pci: Arc<Mutex<PciDevices>>,
    /// Every disk on the bus, by id.
    pub disks: DiskRegistry,
    /// The ACPI PCI hotplug registers.
    pub hotplug: Arc<Mutex<PciHotplug>>,
    /// The GED's own events (the power button).
    ged: Arc<Mutex<GedEvents>>,
    serial: SerialLine,
}

impl DeviceManager {
    /// The devices of a new machine: `start`'s disks (opened for it, or
    /// carried from the previous boot) in their slots, then the legacy
    /// devices. On failure the disks it was given are shut down.
    pub fn new(
        vm: &Arc<Vm>,
        mem: &Arc<GuestMemoryMmap>,
        boot: &BootConfig,
        start: Devices,
        exit: Arc<ExitSignal>,
        eject: EventFd,
        seccomp: SeccompMode,
    ) -> Result<Self, DeviceError> {
        let mut pio = Bus::default();
        let mut mmio = Bus::default();
        let pci = Arc::new(Mutex::new(PciDevices::default()));
        let (disks, serial) = match start {
            Devices::Fresh(disks) => (StartDisks::Fresh(disks), None),
            Devices::Carried(c) => (StartDisks::Carried(c.disks), Some(c.serial)),
        };
        // Queue workers get their own seccomp filter, installed in the
        // thread that activates each device (workers inherit it).
        let worker_filters = match seccomp::filters(ThreadKind::QueueWorker, seccomp) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                disks.close();
                return Err(DeviceError::Seccomp(e));
            }
        };
        let mut registry = DiskRegistry::new(PciAttach {
            vm: vm.clone(),
            mem: mem.clone(),
            pci: pci.clone(),
            worker_filters,
        });
        if let Err(e) = disks.attach(&mut registry, boot) {
            registry.shut_down_all();
            return Err(e);
        }
        let wired = wire_platform(
            vm, boot, &mut pio, &mut mmio, &pci, &exit, eject, serial, seccomp,
        );
        let Platform {
            hotplug,
            ged,
            serial,
        } = match wired {
            Ok(w) => w,
            Err(e) => {
                registry.shut_down_all();
                return Err(e);
            }
        };
        Ok(DeviceManager {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            pci,
            disks: registry,
            hotplug,
            ged,
            serial,
        })
    }

    /// Presses the ACPI power button: the guest gets the GED's event and
    /// a notify on `\_SB.PWRB`.
    pub fn press_power_button(&self) {
        self.ged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .press_power_button();
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
        if self.serial.tty {
            let _ = forward_stdin(None, SeccompMode::Off);
        }
    }

    /// For a reboot (the vCPUs are stopped): every disk off the bus,
    /// drained and reset with its image open, and the serial port.
    pub fn carry_out(mut self) -> Carried {
        Carried {
            disks: self.disks.carry_out(),
            serial: self.serial,
        }
    }
}

/// A new machine's disks.
enum StartDisks {
    Fresh(Vec<OpenedDisk>),
    Carried(Vec<CarriedDisk>),
}

impl StartDisks {
    /// Puts every disk on the bus (carried ones in their old slots); on
    /// failure, the ones not yet attached are closed.
    fn attach(self, registry: &mut DiskRegistry, boot: &BootConfig) -> Result<(), DeviceError> {
        match self {
            StartDisks::Fresh(disks) => {
                if disks.len() + boot.vhost_user_disks.len() > max_disks() {
                    StartDisks::Fresh(disks).close();
                    return Err(DeviceError::TooManyDisks(max_disks()));
                }
                let mut rest = disks.into_iter();
                while let Some(d) = rest.next() {
                    if let Err(e) = registry.add_local(d) {
                        StartDisks::Fresh(rest.collect()).close();
                        return Err(e);
                    }
                }
                for c in &boot.vhost_user_disks {
                    registry.add_vhost_user(c)?;
                }
            }
            StartDisks::Carried(disks) => {
                let mut rest = disks.into_iter();
                while let Some(d) = rest.next() {
                    if let Err(e) = registry.attach_carried(d) {
                        StartDisks::Carried(rest.collect()).close();
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    fn close(self) {
        match self {
            StartDisks::Fresh(disks) => {
                for d in disks {
                    if let Err(e) = d.image.close() {
                        log::error!("disk {}: closing: {e}", d.config.options.path.display());
                    }
                }
            }
            StartDisks::Carried(disks) => {
                for mut d in disks {
                    d.device.shutdown();
                }
            }
        }
    }
}

/// What [`wire_platform`] leaves.
struct Platform {
    hotplug: Arc<Mutex<PciHotplug>>,
    ged: Arc<Mutex<GedEvents>>,
    serial: SerialLine,
}

/// The platform around the disks: the PCI config ports and MMIO window,
/// the hotplug and GED event registers and the legacy devices.
#[allow(clippy::too_many_arguments)]
fn wire_platform(
    vm: &Arc<Vm>,
    boot: &BootConfig,
    pio: &mut Bus,
    mmio: &mut Bus,
    pci: &Arc<Mutex<PciDevices>>,
    exit: &Arc<ExitSignal>,
    eject: EventFd,
    serial: Option<SerialLine>,
    seccomp: SeccompMode,
) -> Result<Platform, DeviceError> {
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
    let hotplug = Arc::new(Mutex::new(PciHotplug::new(ged_irq, eject)));
    pio.insert(
        u64::from(PCI_HOTPLUG_PORT),
        pci_hotplug::REGISTER_BYTES,
        hotplug.clone(),
    )
    .map_err(DeviceError::Bus)?;
    let button_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
    vm.register_irqfd(&button_irq, POWER_BUTTON_IRQ)
        .map_err(DeviceError::Kvm)?;
    let ged = Arc::new(Mutex::new(GedEvents::new(button_irq)));
    pio.insert(u64::from(GED_EVENT_PORT), ged::REGISTER_BYTES, ged.clone())
        .map_err(DeviceError::Bus)?;
    let serial = match serial {
        Some(s) => s,
        None => serial_line(&boot.serial, seccomp)?,
    };
    vm.register_irqfd(&serial.irq, COM1_IRQ)
        .map_err(DeviceError::Kvm)?;
    add_legacy_devices(pio, &serial, exit)?;
    Ok(Platform {
        hotplug,
        ged,
        serial,
    })
}

/// A new serial port writing where `mode` says (a file is created, as
/// upstream creates it), taking stdin with `Tty`.
fn serial_line(mode: &SerialMode, seccomp: SeccompMode) -> Result<SerialLine, DeviceError> {
    let out: Box<dyn io::Write + Send> = match mode {
        SerialMode::Tty => Box::new(io::stdout()),
        SerialMode::Off => Box::new(io::sink()),
        SerialMode::File(p) => {
            Box::new(File::create(p).map_err(|source| DeviceError::SerialFile {
                path: p.display().to_string(),
                source,
            })?)
        }
    };
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
    let clone = irq.try_clone().map_err(DeviceError::EventFd)?;
    let port = Arc::new(Mutex::new(SerialPort::new(clone, out)));
    let tty = *mode == SerialMode::Tty;
    if tty {
        forward_stdin(Some(port.clone()), seccomp).map_err(DeviceError::SerialInput)?;
    }
    Ok(SerialLine { port, irq, tty })
}

/// The serial port, the i8042 reset line, the CMOS clock and the ACPI
/// sleep/reset registers.
fn add_legacy_devices(
    pio: &mut Bus,
    serial: &SerialLine,
    exit: &Arc<ExitSignal>,
) -> Result<(), DeviceError> {
    pio.insert(u64::from(COM1_PORT), 8, serial.port.clone())
        .map_err(DeviceError::Bus)?;
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
