//! Builds the machine's devices: the serial port, the i8042 reset line,
//! the ACPI sleep and reset registers,
//! the PCI host bridge, and one virtio-blk device behind virtio-pci per
//! `--disk` (in-VMM, or a vhost-user front end: [`crate::vhost_user_disks`]), wired to KVM (irqfds routed to the guest's MSI-X messages,
//! ioeventfds on each queue's notify address).
//!
//! Disks are opened first ([`open_disks`], before the VM exists, so a bad
//! image fails fast); [`DeviceManager::new`] then takes them and leaves the
//! port and MMIO buses the vCPU threads dispatch to.

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use block::{BlockError, Disk};
use hypervisor::{IoEventAddress, Vm};
use thiserror::Error;
use virtio_devices::block::{BlockDevice, BlockDeviceConfig, BlockDeviceError};
use virtio_devices::transport::virtio_pci::BAR_SIZE;
use virtio_devices::transport::{MsiMessage, MsiRouter, TransportError, VirtioPciDevice};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{DiskConfig, SerialMode, VmConfig};
use crate::devices::acpi_pm::{self, AcpiPm};
use crate::devices::bus::{Bus, BusOverlap};
use crate::devices::cmos::Cmos;
use crate::devices::i8042::I8042;
use crate::devices::pci::{NotifyRegistry, PciConfigPorts, PciDevices, PciMmioWindow};
use crate::devices::serial::{spawn_stdin_reader, SerialPort};
use crate::layout::{
    ACPI_PM_PORT, CMOS_PORT, COM1_IRQ, COM1_PORT, I8042_PORT, PCI_CONFIG_PORT, PCI_MMIO_END,
    PCI_MMIO_START,
};
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
    #[error("too many disks: the PCI bus and MMIO window hold {0}")]
    TooManyDisks(usize),
    #[error("cannot set up a vhost-user disk")]
    VhostUser(#[source] virtio_devices::vhost_user_blk::VhostUserBlkError),
}

/// A disk opened from its `--disk` config.
pub struct OpenedDisk {
    pub config: DiskConfig,
    pub disk: Disk,
}

/// Opens every disk (format probe, backing chain, locks, engine choice)
/// and logs one line per disk with the engine in use.
pub fn open_disks(configs: &[DiskConfig]) -> Result<Vec<OpenedDisk>, DeviceError> {
    let max = max_disks();
    if configs.len() > max {
        return Err(DeviceError::TooManyDisks(max));
    }
    configs
        .iter()
        .map(|c| {
            let disk = Disk::open(&c.options).map_err(|source| DeviceError::OpenDisk {
                path: c.options.path.display().to_string(),
                source,
            })?;
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
                disk,
            })
        })
        .collect()
}

fn max_disks() -> usize {
    let by_window = ((PCI_MMIO_END - PCI_MMIO_START) / u64::from(BAR_SIZE)) as usize;
    by_window.min(crate::devices::pci::MAX_DEVICES - 1)
}

/// Routes one device's MSI-X vectors: vector `v` is GSI `base_gsi + v`.
struct KvmMsiRouter {
    vm: Arc<Vm>,
    base_gsi: u32,
}

impl MsiRouter for KvmMsiRouter {
    fn set_route(&self, vector: u16, msg: Option<MsiMessage>) -> io::Result<()> {
        let msg = msg.map(|m| hypervisor::MsiMessage {
            address: m.address,
            data: m.data,
        });
        self.vm
            .set_msi_route(self.base_gsi + u32::from(vector), msg)
            .map_err(io::Error::other)
    }
}

/// Notify ioeventfds as KVM MMIO ioeventfds.
struct KvmNotifyRegistry {
    vm: Arc<Vm>,
}

impl NotifyRegistry for KvmNotifyRegistry {
    fn register(&self, addr: u64, fd: &EventFd) -> io::Result<()> {
        self.vm
            .register_ioevent(fd, IoEventAddress::Mmio(addr))
            .map_err(io::Error::other)
    }
    fn unregister(&self, addr: u64, fd: &EventFd) -> io::Result<()> {
        self.vm
            .unregister_ioevent(fd, IoEventAddress::Mmio(addr))
            .map_err(io::Error::other)
    }
}

/// What putting a virtio device behind virtio-pci needs.
pub(crate) struct PciAttach<'a> {
    pub vm: &'a Arc<Vm>,
    pub mem: &'a Arc<GuestMemoryMmap>,
    pub pci: &'a Arc<Mutex<PciDevices>>,
    pub worker_filters: &'a Arc<Vec<seccompiler::BpfProgram>>,
}

impl PciAttach<'_> {
    /// Puts `dev` (with `num_queues` queues) behind virtio-pci as device
    /// number `index`: irqfds routed from GSI `next_gsi` on, ioeventfds on
    /// its notify addresses, the queue workers' seccomp filter. Returns the
    /// PCI slot and BAR0 address.
    pub fn add(
        &self,
        dev: Box<dyn virtio_devices::VirtioDevice>,
        num_queues: u16,
        index: usize,
        next_gsi: &mut u32,
    ) -> Result<(usize, u32), DeviceError> {
        let vm = self.vm;
        let vectors = VirtioPciDevice::vectors_needed(usize::from(num_queues));
        let mut irqfds = Vec::with_capacity(vectors);
        for v in 0..vectors as u32 {
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
            vm.register_irqfd(&fd, *next_gsi + v)
                .map_err(DeviceError::Kvm)?;
            irqfds.push(fd);
        }
        let router = Arc::new(KvmMsiRouter {
            vm: vm.clone(),
            base_gsi: *next_gsi,
        });
        *next_gsi += vectors as u32;
        // Pre-assigned BARs, one per function, inside the window.
        let bar = PCI_MMIO_START + index as u64 * u64::from(BAR_SIZE);
        let bar = u32::try_from(bar).map_err(|_| DeviceError::TooManyDisks(index))?;
        let mut pci_dev = VirtioPciDevice::new(dev, self.mem.clone(), bar, irqfds, router)
            .map_err(DeviceError::Transport)?;
        if !self.worker_filters.is_empty() {
            let programs = self.worker_filters.clone();
            pci_dev.set_activation_hook(Arc::new(move || {
                seccomp::apply_programs(&programs).map_err(|e| e.to_string())
            }));
        }
        for (addr, fd) in pci_dev.notify_eventfds().map_err(DeviceError::EventFd)? {
            vm.register_ioevent(&fd, IoEventAddress::Mmio(addr))
                .map_err(DeviceError::Kvm)?;
        }
        let slot = self
            .pci
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(Arc::new(Mutex::new(pci_dev)))
            .ok_or(DeviceError::TooManyDisks(index))?;
        Ok((slot, bar))
    }
}

pub struct DeviceManager {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pci: Arc<Mutex<PciDevices>>,
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

        // Queue workers get their own seccomp filter, installed in the
        // thread that activates each device (workers inherit it).
        let worker_filters = Arc::new(
            seccomp::filters(ThreadKind::QueueWorker, config.seccomp)
                .map_err(DeviceError::Seccomp)?,
        );
        let mut next_gsi = Vm::FIRST_MSI_GSI;
        let disk_count = disks.len();
        if disk_count + config.vhost_user_disks.len() > max_disks() {
            return Err(DeviceError::TooManyDisks(max_disks()));
        }
        for (i, d) in disks.into_iter().enumerate() {
            let path = d.config.options.path.display().to_string();
            let blk_config = BlockDeviceConfig {
                num_queues: d.config.num_queues,
                queue_size: d.config.queue_size,
                serial: d.config.serial.clone().unwrap_or_default().into_bytes(),
                rate_limit: d.config.rate_limit,
                queue_affinity: d.config.queue_affinity.clone(),
                poll_us: d.config.poll_us,
                ..Default::default()
            };
            let dev = BlockDevice::new(d.disk, blk_config).map_err(|source| {
                DeviceError::CreateBlock {
                    path: path.clone(),
                    source,
                }
            })?;
            let attach = PciAttach {
                vm,
                mem,
                pci: &pci,
                worker_filters: &worker_filters,
            };
            let (slot, bar) = attach.add(Box::new(dev), d.config.num_queues, i, &mut next_gsi)?;
            log::info!(
                "disk {path}: virtio-blk at PCI 00:{slot:02x}.0, BAR0 {bar:#x}, {} queue(s) of {}",
                d.config.num_queues,
                d.config.queue_size
            );
        }
        let attach = PciAttach {
            vm,
            mem,
            pci: &pci,
            worker_filters: &worker_filters,
        };
        crate::vhost_user_disks::add_vhost_user_disks(
            &attach,
            &config.vhost_user_disks,
            disk_count,
            &mut next_gsi,
        )?;
        Ok(DeviceManager {
            pio: Arc::new(pio),
            mmio: Arc::new(mmio),
            pci,
        })
    }

    /// Stops every device: workers drain their queues, disks flush and
    /// close.
    pub fn shutdown(&self) {
        let functions: Vec<_> = self
            .pci
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .functions()
            .to_vec();
        for f in functions {
            f.lock().unwrap_or_else(PoisonError::into_inner).shutdown();
        }
    }
}
