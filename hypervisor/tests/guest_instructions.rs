//! Guest instructions whose effect must be the hardware's on any host:
//! INT3 and FWAIT (which the VMM completes itself where KVM's instruction
//! emulator gives up on them, see `hypervisor::emulation`), an instruction
//! such a host cannot emulate (the VM must stop with a report naming it),
//! and CPUID under a CPU model (the VMM must say which hidden features
//! the guest still sees). On a host whose KVM runs guest code natively
//! the hardware does the same, so every assertion holds there too.
//! Skips (with a message) when /dev/kvm is not usable.

use std::time::Duration;

use hypervisor::{BaseModel, CpuModel, InternalErrorOutcome, Vcpu, VcpuExit};

mod support;

use support::{
    vm_or_skip, with_deadline, write_long_mode_tables, Ram, GDT, GDT_LIMIT, MEM_SIZE, PML4,
};

const CODE: usize = 0x1000;
const FX_PENDING: usize = 0x3000;
const FX_CLEAN: usize = 0x3200;

/// What a vCPU did next, as the test sees it.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// `out` to a port with the value written.
    Out(u16, u32),
    /// An internal error the VMM would stop on, with its report.
    Fatal(hypervisor::InternalError),
}

/// Runs until the next port write or fatal internal error; completed
/// INT3/FWAIT emulation failures are handled on the way, as the VMM's
/// vCPU loop does.
fn next_event(vcpu: &mut Vcpu) -> Event {
    loop {
        match vcpu.run().expect("KVM_RUN") {
            VcpuExit::IoOut(port, data) => {
                let mut v = [0u8; 4];
                v[..data.len()].copy_from_slice(data);
                return Event::Out(port, u32::from_le_bytes(v));
            }
            VcpuExit::InternalError => match vcpu.handle_internal_error().expect("complete") {
                InternalErrorOutcome::Completed(_) => continue,
                InternalErrorOutcome::Fatal(report) => return Event::Fatal(report),
            },
            VcpuExit::Interrupted => continue,
            other => panic!("unexpected exit {other:?}"),
        }
    }
}

/// Long mode with one handler per exception vector, and two FXSAVE
/// images.
fn write_tables(ram: &mut Ram) {
    write_long_mode_tables(ram, 31, |vector| {
        // push rax; mov al, VECTOR; out 0x81, al; mov rax, [rsp+8] (the
        // pushed RIP); out 0x82, eax; clts; fxrstor [FX_CLEAN]; pop rax;
        // iretq
        let mut code = vec![0x50, 0xb0, vector, 0xe6, 0x81, 0x48, 0x8b, 0x44, 0x24, 0x08];
        code.extend([0xe7, 0x82, 0x0f, 0x06, 0x0f, 0xae, 0x0c, 0x25]);
        code.extend((FX_CLEAN as u32).to_le_bytes());
        code.extend([0x58, 0x48, 0xcf]);
        code
    });
    // FXSAVE images: FCW at 0, FSW at 2, MXCSR at 24. The first has a
    // zero-divide flagged (ZE, and ES) and unmasked; the second is clean.
    let mut pending = [0u8; 512];
    pending[0..2].copy_from_slice(&0x037bu16.to_le_bytes());
    pending[2..4].copy_from_slice(&0x0084u16.to_le_bytes());
    pending[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
    ram.write(FX_PENDING, &pending);
    let mut clean = [0u8; 512];
    clean[0..2].copy_from_slice(&0x037fu16.to_le_bytes());
    clean[24..28].copy_from_slice(&0x1f80u32.to_le_bytes());
    ram.write(FX_CLEAN, &clean);
}

#[test]
fn int3_and_fwait_behave_as_on_hardware() {
    let Some(vm) = vm_or_skip() else { return };
    let mut ram = Ram::new();
    write_tables(&mut ram);
    #[rustfmt::skip]
    let code: &[u8] = &[
        0x0f, 0x01, 0x1c, 0x25, 0xf0, 0x05, 0x00, 0x00, // 00: lidt [0x5f0]
        0x66, 0xb8, 0x18, 0x00,                   // 08: mov ax, 0x18
        0x8e, 0xd8, 0x8e, 0xc0, 0x8e, 0xd0,       // 0c: mov ds/es/ss, ax
        0xbc, 0x00, 0x80, 0x00, 0x00,             // 12: mov esp, 0x8000
        0xcc,                                     // 17: int3
        0xb0, 0x01, 0xe6, 0x80,                   // 18: out 0x80, 1
        0x9b,                                     // 1c: fwait (nothing pending)
        0xb0, 0x02, 0xe6, 0x80,                   // 1d: out 0x80, 2
        0x0f, 0x20, 0xc0,                         // 21: mov rax, cr0
        0x83, 0xc8, 0x2a,                         // 24: or eax, MP|TS|NE
        0x0f, 0x22, 0xc0,                         // 27: mov cr0, rax
        0x9b,                                     // 2a: fwait (#NM; handler clears TS)
        0xb0, 0x03, 0xe6, 0x80,                   // 2b: out 0x80, 3
        0x0f, 0x20, 0xe0,                         // 2f: mov rax, cr4
        0x0d, 0x00, 0x02, 0x00, 0x00,             // 32: or eax, OSFXSR
        0x0f, 0x22, 0xe0,                         // 37: mov cr4, rax
        0x0f, 0xae, 0x0c, 0x25, 0x00, 0x30, 0x00, 0x00, // 3a: fxrstor [0x3000] (ZE pending)
        0x9b,                                     // 42: fwait (#MF; handler loads a clean FSW)
        0xb0, 0x04, 0xe6, 0x80,                   // 43: out 0x80, 4
        0xeb, 0xfe,                               // 47: jmp $
    ];
    ram.write(CODE, code);
    let base = CODE as u32;
    let expected = [
        Event::Out(0x81, 3),
        Event::Out(0x82, base + 0x18), // #BP is a trap: RIP past the INT3
        Event::Out(0x80, 1),
        Event::Out(0x80, 2),
        Event::Out(0x81, 7),
        Event::Out(0x82, base + 0x2a), // faults: RIP on the FWAIT
        Event::Out(0x80, 3),
        Event::Out(0x81, 16),
        Event::Out(0x82, base + 0x42),
        Event::Out(0x80, 4),
    ];
    // SAFETY: `ram` moves into the closure with the VM and outlives it:
    // the vCPU and the VM are dropped at the closure's end, before `ram`
    // (locals drop in reverse order, and `ram` was captured first).
    unsafe { vm.map_memory(0, 0, MEM_SIZE as u64, ram.0 as u64) }.unwrap();
    with_deadline(Duration::from_secs(60), move || {
        let ram = ram;
        let (mut vcpu, _) = vm.create_vcpu(0, 1, &CpuModel::default()).unwrap();
        vcpu.enter_long_mode(CODE as u64, 0, PML4 as u64, GDT as u64, GDT_LIMIT)
            .unwrap();
        for want in expected {
            let got = next_event(&mut vcpu);
            // Port 0x82 carries the low 32 bits of RIP; the others a byte.
            let got = match got {
                Event::Out(p, v) if p != 0x82 => Event::Out(p, v & 0xff),
                other => other,
            };
            assert_eq!(got, want);
        }
        drop(vcpu);
        drop(vm);
        drop(ram);
    });
}

#[test]
fn cpu_model_and_an_instruction_the_host_cannot_emulate() {
    let Some(vm) = vm_or_skip() else { return };
    let mut ram = Ram::new();
    #[rustfmt::skip]
    let code: &[u8] = &[
        0xb8, 0x01, 0x00, 0x00, 0x00, 0x31, 0xc9, // 00: mov eax, 1; xor ecx, ecx
        0x0f, 0xa2, 0x89, 0xc8, 0xe7, 0x80,       // 07: cpuid; out 0x80, ecx
        0xb8, 0x07, 0x00, 0x00, 0x00, 0x31, 0xc9, // 0d: mov eax, 7; xor ecx, ecx
        0x0f, 0xa2, 0x89, 0xd8, 0xe7, 0x80,       // 14: cpuid; out 0x80, ebx
        0xf3, 0x0f, 0xb8, 0xc3,                   // 1a: popcnt eax, ebx
        0xe7, 0x80,                               // 1e: out 0x80, eax
        0xeb, 0xfe,                               // 20: jmp $
    ];
    ram.write(CODE, code);
    // SAFETY: as above, `ram` outlives the VM it is mapped into.
    unsafe { vm.map_memory(0, 0, MEM_SIZE as u64, ram.0 as u64) }.unwrap();
    with_deadline(Duration::from_secs(60), move || {
        let ram = ram;
        let model = CpuModel {
            base: BaseModel::X86_64V1,
            hidden: vec![],
        };
        let (mut vcpu, still_visible) = vm.create_vcpu(0, 1, &model).unwrap();
        vcpu.enter_protected_mode(CODE as u64, 0).unwrap();
        let Event::Out(_, leaf1_ecx) = next_event(&mut vcpu) else {
            panic!("cpuid 1")
        };
        let Event::Out(_, leaf7_ebx) = next_event(&mut vcpu) else {
            panic!("cpuid 7")
        };
        // The model hides each of these; the guest sees one exactly when
        // the VMM was told KVM put it back.
        for (name, seen) in [
            ("cx16", leaf1_ecx & (1 << 13)),
            ("popcnt", leaf1_ecx & (1 << 23)),
            ("xsave", leaf1_ecx & (1 << 26)),
            ("avx2", leaf7_ebx & (1 << 5)),
        ] {
            assert_eq!(
                seen != 0,
                still_visible.contains(&name),
                "{name}: {still_visible:?}"
            );
        }
        match next_event(&mut vcpu) {
            // Run natively: the hardware counted the bits.
            Event::Out(0x80, v) => assert_eq!(v, leaf7_ebx.count_ones()),
            Event::Fatal(report) => {
                assert_eq!(report.rip, Some(CODE as u64 + 0x1a), "{report}");
                let bytes = report.instruction.as_deref().unwrap_or_default();
                assert!(bytes.starts_with(&[0xf3, 0x0f, 0xb8, 0xc3]), "{report}");
                let text = report.to_string();
                assert!(text.contains("instruction bytes f3 0f b8 c3"), "{text}");
            }
            other => panic!("unexpected {other:?}"),
        }
        drop(vcpu);
        drop(vm);
        drop(ram);
    });
}
