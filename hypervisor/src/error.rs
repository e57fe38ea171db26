//! The hypervisor crate's error type: one variant per KVM operation that
//! can fail, each carrying the kernel's errno as its source.

use thiserror::Error;
use vmm_sys_util::errno;

pub type Result<T> = std::result::Result<T, HypervisorError>;

#[derive(Debug, Error)]
pub enum HypervisorError {
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] errno::Error),
    #[error("KVM API version {0} is not 12")]
    ApiVersion(i32),
    #[error("KVM lacks a required capability: {0}")]
    MissingCapability(&'static str),
    #[error("cannot create the KVM VM")]
    CreateVm(#[source] errno::Error),
    #[error("cannot set the TSS / identity map address")]
    SetTssAddress(#[source] errno::Error),
    #[error("cannot create the in-kernel irqchip")]
    CreateIrqChip(#[source] errno::Error),
    #[error("cannot create the in-kernel PIT")]
    CreatePit(#[source] errno::Error),
    #[error("cannot map guest memory slot {slot} at {guest_addr:#x} ({size} bytes)")]
    SetMemoryRegion {
        slot: u32,
        guest_addr: u64,
        size: u64,
        #[source]
        source: errno::Error,
    },
    #[error("cannot register irqfd for GSI {gsi}")]
    RegisterIrqfd {
        gsi: u32,
        #[source]
        source: errno::Error,
    },
    #[error("cannot unregister irqfd for GSI {gsi}")]
    UnregisterIrqfd {
        gsi: u32,
        #[source]
        source: errno::Error,
    },
    #[error("cannot register ioeventfd at {0:?}")]
    RegisterIoevent(crate::io_event::IoEventAddress, #[source] errno::Error),
    #[error("cannot unregister ioeventfd at {0:?}")]
    UnregisterIoevent(crate::io_event::IoEventAddress, #[source] errno::Error),
    #[error("cannot set the GSI routing table")]
    SetGsiRouting(#[source] errno::Error),
    #[error("GSI routing table is full ({0} entries)")]
    GsiRoutingFull(usize),
    #[error("cannot set IRQ line {irq}")]
    SetIrqLine {
        irq: u32,
        #[source]
        source: errno::Error,
    },
    #[error("cannot get the supported CPUID")]
    GetSupportedCpuid(#[source] errno::Error),
    #[error("cannot create vCPU {id}")]
    CreateVcpu {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot set CPUID on vCPU {id}")]
    SetCpuid {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot read back the CPUID of vCPU {id}")]
    GetCpuid {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot get or set the pending events of vCPU {id}")]
    Events {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot set MSRs on vCPU {id} ({set} of {wanted} accepted)")]
    SetMsrs { id: u8, set: usize, wanted: usize },
    #[error("cannot build the MSR list")]
    BuildMsrs,
    #[error("MSR ioctl failed on vCPU {id}")]
    MsrIoctl {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot get or set the LAPIC of vCPU {id}")]
    Lapic {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot get or set registers of vCPU {id}")]
    Registers {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("cannot get or set the FPU state of vCPU {id}")]
    Fpu {
        id: u8,
        #[source]
        source: errno::Error,
    },
    #[error("KVM_RUN failed on vCPU {id}")]
    Run {
        id: u8,
        #[source]
        source: errno::Error,
    },
}
