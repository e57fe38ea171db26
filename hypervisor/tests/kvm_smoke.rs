//! Runs real guest code under KVM through the crate's API: 32-bit
//! protected-mode entry, a port write and an MMIO read reach userspace as
//! exits; irqfd, ioeventfd and MSI routes are accepted by the kernel.
//! Skips (with a message) when /dev/kvm is not usable.

use hypervisor::{IoEventAddress, MsiMessage, VcpuExit, Vm};
use vmm_sys_util::eventfd::EventFd;

const MEM_SIZE: usize = 1 << 20;

/// Anonymous guest RAM that unmaps on drop.
struct Ram(*mut u8);

impl Ram {
    fn new() -> Ram {
        // SAFETY: anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Ram(p.cast())
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= MEM_SIZE);
        // SAFETY: in bounds of our mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.add(at), bytes.len()) };
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.0.cast(), MEM_SIZE) };
    }
}

fn vm_or_skip() -> Option<std::sync::Arc<Vm>> {
    match Vm::new() {
        Ok(vm) => Some(vm),
        Err(e) => {
            testkit::available("KVM", Err(e.to_string()));
            None
        }
    }
}

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
    // SAFETY: `ram` stays mapped until after the VM (and its vCPU) is
    // dropped at the end of this test: locals drop in reverse order.
    unsafe { vm.map_memory(0, 0, MEM_SIZE as u64, ram.0 as u64) }.unwrap();
    let mut vcpu = vm.create_vcpu(0, 1).unwrap();
    vcpu.enter_protected_mode(0x1000, 0x6000).unwrap();
    match vcpu.run().unwrap() {
        VcpuExit::IoOut(port, data) => assert_eq!((port, data.to_vec()), (0x80, vec![0x42])),
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
