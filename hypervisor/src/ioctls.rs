//! The KVM ioctl request numbers the VMM's threads issue after set-up,
//! for seccomp filters that allow `ioctl` only with these requests
//! (the vCPU thread: run, MSI routing when the guest programs MSI-X,
//! ioeventfd moves when it moves a BAR, the legacy IRQ line, and the
//! register, FPU and event calls that complete an instruction KVM's
//! emulator gave up on, see `emulation`; the thread that makes VMs:
//! [`BUILD_IOCTLS`], what `Vm::new` and `Vm::create_vcpu` send).
//!
//! Numbers are computed from the Linux `_IO`/`_IOW` encoding and the
//! argument structs' sizes in kvm-bindings; the tests pin them to the
//! values in `<linux/kvm.h>` on x86_64.

use kvm_bindings::{
    kvm_cpuid2, kvm_fpu, kvm_ioeventfd, kvm_irq_level, kvm_irq_routing, kvm_irqfd, kvm_lapic_state,
    kvm_msi, kvm_msrs, kvm_pit_config, kvm_regs, kvm_sregs, kvm_userspace_memory_region,
    kvm_vcpu_events, kvm_xsave,
};

const KVMIO: u64 = 0xae;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const fn io(nr: u64) -> u64 {
    (KVMIO << 8) | nr
}

const fn iow(nr: u64, size: usize) -> u64 {
    (IOC_WRITE << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

const fn ior(nr: u64, size: usize) -> u64 {
    (IOC_READ << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

const fn iowr(nr: u64, size: usize) -> u64 {
    ((IOC_READ | IOC_WRITE) << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

pub const KVM_RUN: u64 = io(0x80);
pub const KVM_GET_REGS: u64 = ior(0x81, std::mem::size_of::<kvm_regs>());
pub const KVM_SET_REGS: u64 = iow(0x82, std::mem::size_of::<kvm_regs>());
pub const KVM_GET_SREGS: u64 = ior(0x83, std::mem::size_of::<kvm_sregs>());
pub const KVM_GET_XSAVE: u64 = ior(0xa4, std::mem::size_of::<kvm_xsave>());
pub const KVM_GET_VCPU_EVENTS: u64 = ior(0x9f, std::mem::size_of::<kvm_vcpu_events>());
pub const KVM_SET_VCPU_EVENTS: u64 = iow(0xa0, std::mem::size_of::<kvm_vcpu_events>());
pub const KVM_IRQ_LINE: u64 = iow(0x61, std::mem::size_of::<kvm_irq_level>());
pub const KVM_SET_GSI_ROUTING: u64 = iow(0x6a, std::mem::size_of::<kvm_irq_routing>());
pub const KVM_IRQFD: u64 = iow(0x76, std::mem::size_of::<kvm_irqfd>());
pub const KVM_IOEVENTFD: u64 = iow(0x79, std::mem::size_of::<kvm_ioeventfd>());
pub const KVM_SIGNAL_MSI: u64 = iow(0xa5, std::mem::size_of::<kvm_msi>());

pub const KVM_GET_API_VERSION: u64 = io(0x00);
pub const KVM_CREATE_VM: u64 = io(0x01);
pub const KVM_CHECK_EXTENSION: u64 = io(0x03);
pub const KVM_GET_VCPU_MMAP_SIZE: u64 = io(0x04);
pub const KVM_GET_SUPPORTED_CPUID: u64 = iowr(0x05, std::mem::size_of::<kvm_cpuid2>());
pub const KVM_CREATE_VCPU: u64 = io(0x41);
pub const KVM_SET_USER_MEMORY_REGION: u64 =
    iow(0x46, std::mem::size_of::<kvm_userspace_memory_region>());
pub const KVM_SET_TSS_ADDR: u64 = io(0x47);
pub const KVM_SET_IDENTITY_MAP_ADDR: u64 = iow(0x48, std::mem::size_of::<u64>());
pub const KVM_CREATE_IRQCHIP: u64 = io(0x60);
pub const KVM_CREATE_PIT2: u64 = iow(0x77, std::mem::size_of::<kvm_pit_config>());
pub const KVM_SET_SREGS: u64 = iow(0x84, std::mem::size_of::<kvm_sregs>());
pub const KVM_SET_MSRS: u64 = iow(0x89, std::mem::size_of::<kvm_msrs>());
pub const KVM_SET_FPU: u64 = iow(0x8d, std::mem::size_of::<kvm_fpu>());
pub const KVM_GET_LAPIC: u64 = ior(0x8e, std::mem::size_of::<kvm_lapic_state>());
pub const KVM_SET_LAPIC: u64 = iow(0x8f, std::mem::size_of::<kvm_lapic_state>());
pub const KVM_SET_CPUID2: u64 = iow(0x90, std::mem::size_of::<kvm_cpuid2>());
pub const KVM_GET_CPUID2: u64 = iowr(0x91, std::mem::size_of::<kvm_cpuid2>());

/// Every request making a VM sends (`Vm::new`, guest RAM, the devices'
/// interrupts and notifications, `Vm::create_vcpu` and the boot vCPU's
/// entry state).
pub const BUILD_IOCTLS: &[u64] = &[
    KVM_GET_API_VERSION,
    KVM_CREATE_VM,
    KVM_CHECK_EXTENSION,
    KVM_GET_VCPU_MMAP_SIZE,
    KVM_GET_SUPPORTED_CPUID,
    KVM_CREATE_VCPU,
    KVM_SET_USER_MEMORY_REGION,
    KVM_SET_TSS_ADDR,
    KVM_SET_IDENTITY_MAP_ADDR,
    KVM_CREATE_IRQCHIP,
    KVM_CREATE_PIT2,
    KVM_SET_GSI_ROUTING,
    KVM_IRQFD,
    KVM_IOEVENTFD,
    KVM_GET_REGS,
    KVM_SET_REGS,
    KVM_GET_SREGS,
    KVM_SET_SREGS,
    KVM_SET_MSRS,
    KVM_SET_FPU,
    KVM_GET_LAPIC,
    KVM_SET_LAPIC,
    KVM_SET_CPUID2,
    KVM_GET_CPUID2,
];

/// Every request a vCPU thread may issue while the guest runs.
pub const VCPU_THREAD_IOCTLS: &[u64] = &[
    KVM_RUN,
    KVM_IRQ_LINE,
    KVM_SET_GSI_ROUTING,
    KVM_IOEVENTFD,
    KVM_SIGNAL_MSI,
    KVM_GET_REGS,
    KVM_SET_REGS,
    KVM_GET_SREGS,
    KVM_GET_XSAVE,
    KVM_GET_VCPU_EVENTS,
    KVM_SET_VCPU_EVENTS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_linux_kvm_h() {
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_IRQ_LINE, 0x4008_ae61);
        assert_eq!(KVM_SET_GSI_ROUTING, 0x4008_ae6a);
        assert_eq!(KVM_IRQFD, 0x4020_ae76);
        assert_eq!(KVM_IOEVENTFD, 0x4040_ae79);
        assert_eq!(KVM_SIGNAL_MSI, 0x4020_aea5);
        assert_eq!(KVM_GET_REGS, 0x8090_ae81);
        assert_eq!(KVM_SET_REGS, 0x4090_ae82);
        assert_eq!(KVM_GET_SREGS, 0x8138_ae83);
        assert_eq!(KVM_GET_XSAVE, 0x9000_aea4);
        assert_eq!(KVM_GET_VCPU_EVENTS, 0x8040_ae9f);
        assert_eq!(KVM_SET_VCPU_EVENTS, 0x4040_aea0);
        assert_eq!(KVM_GET_API_VERSION, 0xae00);
        assert_eq!(KVM_CREATE_VM, 0xae01);
        assert_eq!(KVM_CHECK_EXTENSION, 0xae03);
        assert_eq!(KVM_GET_VCPU_MMAP_SIZE, 0xae04);
        assert_eq!(KVM_GET_SUPPORTED_CPUID, 0xc008_ae05);
        assert_eq!(KVM_CREATE_VCPU, 0xae41);
        assert_eq!(KVM_SET_USER_MEMORY_REGION, 0x4020_ae46);
        assert_eq!(KVM_SET_TSS_ADDR, 0xae47);
        assert_eq!(KVM_SET_IDENTITY_MAP_ADDR, 0x4008_ae48);
        assert_eq!(KVM_CREATE_IRQCHIP, 0xae60);
        assert_eq!(KVM_CREATE_PIT2, 0x4040_ae77);
        assert_eq!(KVM_SET_SREGS, 0x4138_ae84);
        assert_eq!(KVM_SET_MSRS, 0x4008_ae89);
        assert_eq!(KVM_SET_FPU, 0x41a0_ae8d);
        assert_eq!(KVM_GET_LAPIC, 0x8400_ae8e);
        assert_eq!(KVM_SET_LAPIC, 0x4400_ae8f);
        assert_eq!(KVM_SET_CPUID2, 0x4008_ae90);
        assert_eq!(KVM_GET_CPUID2, 0xc008_ae91);
    }
}
