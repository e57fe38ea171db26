//! A KVM virtual machine: memory slots, the in-kernel irqchip (PIC, IOAPIC,
//! LAPICs) and PIT, irqfds, ioeventfds and the GSI routing table.
//!
//! The VMM hands in host mappings of guest RAM, eventfds and MSI messages;
//! KVM then delivers interrupts and queue notifications without a trip
//! through userspace. The GSI routing table is kept here because
//! `KVM_SET_GSI_ROUTING` replaces the whole table at once: GSIs 0..24 are
//! the legacy PIC/IOAPIC pins, GSIs from [`Vm::FIRST_MSI_GSI`] carry MSI
//! routes that the virtio-pci transport updates as the guest programs its
//! MSI-X table.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use kvm_bindings::{
    kvm_irq_routing_entry, kvm_pit_config, kvm_userspace_memory_region, CpuId, KvmIrqRouting,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::cpu_model::CpuModel;
use crate::error::{HypervisorError, Result};
use crate::io_event::IoEventAddress;
use crate::vcpu::Vcpu;

/// An MSI message as the guest programs it into an MSI-X table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

#[derive(Clone, Copy, Debug)]
enum Route {
    /// A legacy pin: PIC (chip 0/1) and/or IOAPIC (chip 2).
    Irqchip {
        chip: u32,
        pin: u32,
    },
    Msi(MsiMessage),
}

/// Number of IOAPIC pins (and legacy GSIs).
const IOAPIC_PINS: u32 = 24;
/// KVM refuses routing tables larger than this.
const MAX_ROUTES: usize = 4096;

/// A KVM VM. Shared (`Arc`) between the vCPU threads and the devices that
/// update MSI routes.
pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
    supported_cpuid: CpuId,
    /// GSI -> routes (a legacy GSI below 16 has both a PIC and an IOAPIC
    /// route).
    routes: Mutex<BTreeMap<u32, Vec<Route>>>,
}

impl Vm {
    /// The first GSI free for MSI routes.
    pub const FIRST_MSI_GSI: u32 = IOAPIC_PINS;

    /// Opens /dev/kvm and creates a VM with the in-kernel irqchip and PIT.
    pub fn new() -> Result<Arc<Vm>> {
        let kvm = Kvm::new().map_err(HypervisorError::OpenKvm)?;
        let api = kvm.get_api_version();
        if api != 12 {
            return Err(HypervisorError::ApiVersion(api));
        }
        for (cap, name) in [
            (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
            (Cap::Irqfd, "KVM_CAP_IRQFD"),
            (Cap::Ioeventfd, "KVM_CAP_IOEVENTFD"),
            (Cap::IrqRouting, "KVM_CAP_IRQ_ROUTING"),
            (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
            (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
            (Cap::Pit2, "KVM_CAP_PIT2"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(HypervisorError::MissingCapability(name));
            }
        }
        let supported_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(HypervisorError::GetSupportedCpuid)?;
        let fd = kvm.create_vm().map_err(HypervisorError::CreateVm)?;
        // Three pages just below the 4 GiB boundary's legacy BIOS area, which
        // our memory layout never uses for RAM or MMIO.
        fd.set_tss_address(0xfffb_d000)
            .map_err(HypervisorError::SetTssAddress)?;
        fd.set_identity_map_address(0xfffb_c000)
            .map_err(HypervisorError::SetTssAddress)?;
        fd.create_irq_chip()
            .map_err(HypervisorError::CreateIrqChip)?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(HypervisorError::CreatePit)?;

        let mut routes = BTreeMap::new();
        for gsi in 0..IOAPIC_PINS {
            let mut r = Vec::new();
            if gsi < 16 && gsi != 2 {
                let (chip, pin) = if gsi < 8 {
                    (KVM_IRQCHIP_PIC_MASTER, gsi)
                } else {
                    (KVM_IRQCHIP_PIC_SLAVE, gsi - 8)
                };
                r.push(Route::Irqchip { chip, pin });
            }
            // ISA IRQ 0 (the PIT) is wired to IOAPIC pin 2, as on PCs.
            let pin = if gsi == 0 { 2 } else { gsi };
            if gsi != 2 {
                r.push(Route::Irqchip {
                    chip: KVM_IRQCHIP_IOAPIC,
                    pin,
                });
            }
            routes.insert(gsi, r);
        }
        let vm = Vm {
            kvm,
            fd,
            supported_cpuid,
            routes: Mutex::new(routes),
        };
        {
            let routes = vm.routes.lock().unwrap_or_else(PoisonError::into_inner);
            vm.commit_routes(&routes)?;
        }
        Ok(Arc::new(vm))
    }

    /// Maximum number of vCPUs KVM recommends.
    pub fn max_vcpus(&self) -> usize {
        self.kvm.get_nr_vcpus()
    }

    /// Maps host memory into the guest physical address space.
    ///
    /// # Safety
    ///
    /// `host_addr..host_addr+size` must be a valid mapping owned by the
    /// caller that stays mapped for as long as the VM exists (or until the
    /// slot is removed), and no other slot may overlap `guest_addr`.
    pub unsafe fn map_memory(
        &self,
        slot: u32,
        guest_addr: u64,
        size: u64,
        host_addr: u64,
    ) -> Result<()> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: guest_addr,
            memory_size: size,
            userspace_addr: host_addr,
        };
        // SAFETY: the caller guarantees the host range is a live mapping
        // that outlives the slot (this function's contract).
        unsafe { self.fd.set_user_memory_region(region) }.map_err(|source| {
            HypervisorError::SetMemoryRegion {
                slot,
                guest_addr,
                size,
                source,
            }
        })
    }

    /// Signals GSI `gsi` whenever `fd` is written.
    pub fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<()> {
        self.fd
            .register_irqfd(fd, gsi)
            .map_err(|source| HypervisorError::RegisterIrqfd { gsi, source })
    }

    pub fn unregister_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<()> {
        self.fd
            .unregister_irqfd(fd, gsi)
            .map_err(|source| HypervisorError::UnregisterIrqfd { gsi, source })
    }

    /// Signals `fd` on any guest write to `addr` (any size, any value),
    /// without a userspace exit.
    pub fn register_ioevent(&self, fd: &EventFd, addr: IoEventAddress) -> Result<()> {
        self.fd
            .register_ioevent(fd, &addr.into(), NoDatamatch)
            .map_err(|e| HypervisorError::RegisterIoevent(addr, e))
    }

    pub fn unregister_ioevent(&self, fd: &EventFd, addr: IoEventAddress) -> Result<()> {
        self.fd
            .unregister_ioevent(fd, &addr.into(), NoDatamatch)
            .map_err(|e| HypervisorError::UnregisterIoevent(addr, e))
    }

    /// Routes `gsi` to `msg` (`None` removes the route, so writes to the
    /// GSI's irqfd are dropped). GSIs below [`Vm::FIRST_MSI_GSI`] are the
    /// legacy pins and are not touched.
    pub fn set_msi_route(&self, gsi: u32, msg: Option<MsiMessage>) -> Result<()> {
        if gsi < Self::FIRST_MSI_GSI {
            return Ok(());
        }
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        match msg {
            Some(m) => {
                if !routes.contains_key(&gsi) && routes.len() >= MAX_ROUTES {
                    return Err(HypervisorError::GsiRoutingFull(routes.len()));
                }
                routes.insert(gsi, vec![Route::Msi(m)]);
            }
            None => {
                if routes.remove(&gsi).is_none() {
                    return Ok(());
                }
            }
        }
        self.commit_routes(&routes)
    }

    fn commit_routes(&self, routes: &BTreeMap<u32, Vec<Route>>) -> Result<()> {
        let mut entries = Vec::new();
        for (&gsi, rs) in routes {
            for r in rs {
                let mut e = kvm_irq_routing_entry {
                    gsi,
                    ..Default::default()
                };
                match *r {
                    Route::Irqchip { chip, pin } => {
                        e.type_ = KVM_IRQ_ROUTING_IRQCHIP;
                        e.u.irqchip.irqchip = chip;
                        e.u.irqchip.pin = pin;
                    }
                    Route::Msi(m) => {
                        e.type_ = KVM_IRQ_ROUTING_MSI;
                        // Truncations intended: the message address is
                        // split into its two 32-bit halves.
                        e.u.msi.address_lo = m.address as u32;
                        e.u.msi.address_hi = (m.address >> 32) as u32;
                        e.u.msi.data = m.data;
                    }
                }
                entries.push(e);
            }
        }
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| HypervisorError::GsiRoutingFull(entries.len()))?;
        self.fd
            .set_gsi_routing(&table)
            .map_err(HypervisorError::SetGsiRouting)
    }

    /// Raises or lowers a legacy interrupt line.
    pub fn set_irq_line(&self, irq: u32, active: bool) -> Result<()> {
        self.fd
            .set_irq_line(irq, active)
            .map_err(|source| HypervisorError::SetIrqLine { irq, source })
    }

    /// Creates vCPU `id` of `count` with CPUID (KVM's supported table as
    /// `model` hides it), MSRs, FPU and LAPIC set up. Returns the named
    /// features the model hides that the vCPU still reports after
    /// `KVM_SET_CPUID2` (some hosts' KVM puts features back).
    pub fn create_vcpu(
        &self,
        id: u8,
        count: u8,
        model: &CpuModel,
    ) -> Result<(Vcpu, Vec<&'static str>)> {
        let fd = self
            .fd
            .create_vcpu(u64::from(id))
            .map_err(|source| HypervisorError::CreateVcpu { id, source })?;
        let vcpu = Vcpu::new(fd, id);
        let mut table = self.supported_cpuid.clone();
        model.apply(&mut table);
        let cpuid = crate::cpuid::for_vcpu(&table, id, count);
        vcpu.set_cpuid(&cpuid)?;
        let still_visible = model.still_visible(&vcpu.cpuid()?);
        vcpu.setup_msrs()?;
        vcpu.setup_fpu()?;
        vcpu.setup_lapic()?;
        Ok((vcpu, still_visible))
    }
}
