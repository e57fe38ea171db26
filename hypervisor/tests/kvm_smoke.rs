//! Runs real guest code under KVM through the crate's API: 32-bit
//! protected-mode entry, a port write and an MMIO read reach userspace as
//! exits; irqfd, ioeventfd and MSI routes are accepted by the kernel.
//! Skips (with a message) when /dev/kvm is not usable.

use hypervisor::{IoEventAddress, MsiMessage, VcpuExit, Vm};
use vmm_sys_util::eventfd::EventFd;

mod support;

use std::time::Duration;

use support::{vm_or_skip, with_deadline, Ram, MEM_SIZE};

#[test]
fn protected_mode_guest_exits_on_pio_and_mmio() {
    let Some(vm) = vm_or_skip() else { return };
    let mut ram = Ram::new();
    // mov al, 0x42; out 0x80, al; mov eax, [0xd0000000]; jmp $
    ram.write(
        0x1000,
        &[
            0xb0, 0x42, 0xe6, 0x80, 0xa1, 0x00, 0x00, 0x00, 0xd0, 0xeb, 0xfe,
        ],
    );
    // SAFETY: `ram` moves into the closure with the VM and is dropped
    // last there, after the vCPU and the VM.
    unsafe { vm.map_memory(0, 0, MEM_SIZE as u64, ram.0 as u64) }.unwrap();
    with_deadline(Duration::from_secs(60), move || {
        let ram = ram;
        let (mut vcpu, _) = vm.create_vcpu(0, 1, &Default::default()).unwrap();
        vcpu.enter_protected_mode(0x1000, 0x6000).unwrap();
        match vcpu.run().unwrap() {
            VcpuExit::IoOut(port, data) => {
                assert_eq!((port, data.to_vec()), (0x80, vec![0x42]))
            }
            other => panic!("expected a port write, got {other:?}"),
        }
        match vcpu.run().unwrap() {
            VcpuExit::MmioRead(addr, data) => {
                assert_eq!((addr, data.len()), (0xd000_0000, 4));
                data.copy_from_slice(&[1, 2, 3, 4]);
            }
            other => panic!("expected an MMIO read, got {other:?}"),
        }
        drop(vcpu);
        drop(vm);
        drop(ram);
    });
}

#[test]
fn irqfd_ioeventfd_and_msi_routes_are_accepted() {
    let Some(vm) = vm_or_skip() else { return };
    let gsi = Vm::FIRST_MSI_GSI + 3;
    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    vm.register_irqfd(&irq, gsi).unwrap();
    vm.set_msi_route(
        gsi,
        Some(MsiMessage {
            address: 0xfee0_0000,
            data: 0x41,
        }),
    )
    .unwrap();
    irq.write(1).unwrap();
    vm.set_msi_route(gsi, None).unwrap();
    vm.unregister_irqfd(&irq, gsi).unwrap();

    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let addr = IoEventAddress::Mmio(0xe000_3000);
    vm.register_ioevent(&kick, addr).unwrap();
    assert!(
        vm.register_ioevent(&kick, addr).is_err(),
        "duplicate registration"
    );
    vm.unregister_ioevent(&kick, addr).unwrap();
    vm.set_irq_line(4, true).unwrap();
    vm.set_irq_line(4, false).unwrap();
}
