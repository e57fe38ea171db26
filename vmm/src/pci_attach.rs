//! Putting a virtio device behind virtio-pci on bus 0 and taking it off
//! again (boot-time disks and hotplug alike).
//!
//! A function gets the first free slot; its BAR 0, its GSIs and its
//! notify addresses all follow from the slot, so a slot freed by an
//! unplug is reused with the same resources. [`PciAttach::add`] wires
//! KVM (irqfds routed to the guest's MSI-X messages, ioeventfds on the
//! queues' notify addresses) and leaves an [`AttachedFunction`];
//! [`PciAttach::remove`] takes the function off the bus and undoes the
//! wiring, after which no vCPU and no guest notification reaches it.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use hypervisor::{IoEventAddress, Vm};
use virtio_devices::transport::virtio_pci::BAR_SIZE;
use virtio_devices::transport::{MsiMessage, MsiRouter, VirtioPciDevice};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::config::local_disk::MAX_QUEUES;
use crate::device_error::DeviceError;
use crate::devices::pci::{NotifyRegistry, PciDevices};
use crate::layout::{PCI_MMIO_END, PCI_MMIO_START};
use crate::seccomp;

/// GSIs set aside per slot: one per queue and one for config changes.
const GSIS_PER_SLOT: u32 = MAX_QUEUES as u32 + 1;

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
pub(crate) struct KvmNotifyRegistry {
    pub vm: Arc<Vm>,
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

/// How many functions the bus and the MMIO window hold.
pub fn max_functions() -> usize {
    let by_window = ((PCI_MMIO_END - PCI_MMIO_START) / u64::from(BAR_SIZE)) as usize;
    by_window.min(crate::devices::pci::MAX_DEVICES - 1)
}

/// A function on the bus, with what its removal must undo.
pub struct AttachedFunction {
    pub slot: usize,
    pub bar: u32,
    pub function: Arc<Mutex<VirtioPciDevice>>,
    base_gsi: u32,
    /// Clones of the irqfds (vector `v` at `base_gsi + v`).
    irqfds: Vec<EventFd>,
}

impl AttachedFunction {
    /// `0000:00:SS.0`, Cloud Hypervisor's spelling of the address.
    pub fn bdf(&self) -> String {
        format!("0000:00:{:02x}.0", self.slot)
    }
}

/// What putting a virtio device behind virtio-pci needs.
pub struct PciAttach {
    pub vm: Arc<Vm>,
    pub mem: Arc<GuestMemoryMmap>,
    pub pci: Arc<Mutex<PciDevices>>,
    pub worker_filters: Arc<Vec<seccompiler::BpfProgram>>,
}

impl PciAttach {
    fn lock_pci(&self) -> std::sync::MutexGuard<'_, PciDevices> {
        self.pci.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `dev` (with `num_queues` queues) behind virtio-pci in `slot`
    /// (a reboot puts each disk back where it was), or in the first free
    /// one.
    pub fn add(
        &self,
        dev: Box<dyn virtio_devices::VirtioDevice>,
        num_queues: u16,
        slot: Option<usize>,
    ) -> Result<AttachedFunction, DeviceError> {
        let max = max_functions();
        let slot = match slot {
            Some(s) => Some(s),
            None => self.lock_pci().free_slot(),
        }
        .filter(|&s| (1..=max).contains(&s))
        .ok_or(DeviceError::TooManyDisks(max))?;
        let vm = &self.vm;
        let base_gsi = Vm::FIRST_MSI_GSI + (slot as u32 - 1) * GSIS_PER_SLOT;
        let vectors = VirtioPciDevice::vectors_needed(usize::from(num_queues));
        let mut irqfds = Vec::with_capacity(vectors);
        let mut clones = Vec::with_capacity(vectors);
        for v in 0..vectors as u32 {
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(DeviceError::EventFd)?;
            vm.register_irqfd(&fd, base_gsi + v)
                .map_err(DeviceError::Kvm)?;
            clones.push(fd.try_clone().map_err(DeviceError::EventFd)?);
            irqfds.push(fd);
        }
        let router = Arc::new(KvmMsiRouter {
            vm: vm.clone(),
            base_gsi,
        });
        let bar = PCI_MMIO_START + (slot as u64 - 1) * u64::from(BAR_SIZE);
        let bar = u32::try_from(bar).map_err(|_| DeviceError::TooManyDisks(max))?;
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
        let function = Arc::new(Mutex::new(pci_dev));
        if !self.lock_pci().insert(slot, function.clone()) {
            return Err(DeviceError::TooManyDisks(max));
        }
        Ok(AttachedFunction {
            slot,
            bar,
            function,
            base_gsi,
            irqfds: clones,
        })
    }

    /// Takes `f` off the bus and out of KVM: its slot reads as empty, the
    /// guest's notifications and the device's interrupts go nowhere. The
    /// device itself is left to the caller (shut it down first).
    pub fn remove(&self, f: &AttachedFunction) {
        self.lock_pci().remove(f.slot);
        let notify = f
            .function
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .notify_eventfds();
        match notify {
            Ok(fds) => {
                for (addr, fd) in fds {
                    if let Err(e) = self.vm.unregister_ioevent(&fd, IoEventAddress::Mmio(addr)) {
                        log::warn!("slot {}: cannot unregister a notify ioeventfd: {e}", f.slot);
                    }
                }
            }
            Err(e) => log::warn!("slot {}: cannot clone the notify eventfds: {e}", f.slot),
        }
        for (v, fd) in f.irqfds.iter().enumerate() {
            let gsi = f.base_gsi + v as u32;
            if let Err(e) = self.vm.unregister_irqfd(fd, gsi) {
                log::warn!(
                    "slot {}: cannot unregister the irqfd of GSI {gsi}: {e}",
                    f.slot
                );
            }
            if let Err(e) = self.vm.set_msi_route(gsi, None) {
                log::warn!(
                    "slot {}: cannot drop the MSI route of GSI {gsi}: {e}",
                    f.slot
                );
            }
        }
    }
}
