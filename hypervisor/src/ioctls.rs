//! The KVM ioctl request numbers the VMM's threads issue after set-up,
//! for seccomp filters that allow `ioctl` only with these requests
//! (the vCPU thread: run, MSI routing when the guest programs MSI-X,
//! ioeventfd moves when it moves a BAR, the legacy IRQ line, and the
//! register, FPU and event calls that complete an instruction KVM's
//! emulator gave up on, see `emulation`).
//!
//! Numbers are computed from the Linux `_IO`/`_IOW` encoding and the
//! argument structs' sizes in kvm-bindings; the tests pin them to the
//! values in `<linux/kvm.h>` on x86_64.

use kvm_bindings::{
    kvm_ioeventfd, kvm_irq_level, kvm_irq_routing, kvm_irqfd, kvm_msi, kvm_regs, kvm_sregs,
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
    }
}
