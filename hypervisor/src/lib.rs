//! KVM: the only crate in the workspace that talks to `/dev/kvm`.
//!
//! - [`vm`]: a [`Vm`] owns the KVM VM file descriptor: guest memory slots,
//!   the in-kernel irqchip and PIT, irqfds, ioeventfds and the GSI routing
//!   table (legacy pins plus MSI routes).
//! - [`vcpu`]: a [`Vcpu`] owns one vCPU: CPUID, MSRs, LAPIC and register
//!   setup for the two entry modes we boot in (32-bit flat protected mode
//!   for PVH, 64-bit long mode for the Linux boot protocol), and `run`,
//!   which turns KVM exits into the small [`VcpuExit`] enum.
//! - [`cpu_model`]: the CPU model (`--cpus model=,hide=`): which CPUID
//!   features the guest is shown.
//! - [`cpuid`]: the fixes applied to KVM's supported CPUID per vCPU.
//! - [`emulation`]: `KVM_EXIT_INTERNAL_ERROR` reports, and the INT3 and
//!   FWAIT completions for hosts whose KVM emulates guest code.
//! - [`io_event`]: [`IoEventAddress`], where a guest write signals an
//!   eventfd (the VM registers them; its errors name them).
//! - [`ioctls`]: the KVM ioctl numbers used at run time, for seccomp.
//!
//! Data enters as guest physical addresses, host mappings and eventfds from
//! the VMM; it leaves as vCPU exits. Callers never see kvm-ioctls types.

pub mod cpu_model;
pub mod cpuid;
pub mod emulation;
pub mod error;
pub mod io_event;
pub mod ioctls;
pub mod vcpu;
pub mod vm;

pub use cpu_model::{BaseModel, CpuModel, Feature};
pub use emulation::{Completion, InternalError, InternalErrorOutcome};
pub use error::HypervisorError;
pub use io_event::IoEventAddress;
pub use vcpu::{SystemEvent, Vcpu, VcpuExit};
pub use vm::{MsiMessage, Vm};
