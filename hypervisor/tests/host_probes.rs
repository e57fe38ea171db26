//! Measurements of the host, not tests: what a guest's user mode gets
//! from this machine's KVM when it enters the kernel. Run with
//!
//!     cargo test -p hypervisor --test host_probes -- --ignored --nocapture
//!
//! and read the lines it prints (docs/linux-guests.md quotes them). On
//! hardware, SYSCALL from CPL 3 reaches MSR_LSTAR with CS = STAR[47:32]
//! at CPL 0, and `int 0x80` through a DPL-3 gate reaches its handler at
//! CPL 0; a host whose KVM emulates supervisor code and runs user code
//! natively may do neither.

use std::time::Duration;

use hypervisor::{CpuModel, VcpuExit};

mod support;

use support::{
    vm_or_skip, with_deadline, write_long_mode_tables, Ram, GDT, GDT_LIMIT, MEM_SIZE, PML4,
};

/// At 0x1000, CPL 0: load the IDT, set EFER.SCE, STAR (kernel CS 0x10,
/// user base 0x23), LSTAR = 0x1800, FMASK = IF, then IRETQ to user code
/// at 0x1400 (CS 0x33, SS 0x2b, RSP 0x6000).
#[rustfmt::skip]
const KERNEL: &[u8] = &[
    0x0f, 0x01, 0x1c, 0x25, 0xf0, 0x05, 0x00, 0x00, 0x66, 0xb8, 0x18, 0x00, 0x8e, 0xd8,
    0x8e, 0xd0, 0xbc, 0x00, 0x80, 0x00, 0x00, 0xb9, 0x80, 0x00, 0x00, 0xc0, 0x0f, 0x32,
    0x83, 0xc8, 0x01, 0x0f, 0x30, 0xb9, 0x81, 0x00, 0x00, 0xc0, 0x31, 0xc0, 0xba, 0x10,
    0x00, 0x23, 0x00, 0x0f, 0x30, 0xb9, 0x82, 0x00, 0x00, 0xc0, 0xb8, 0x00, 0x18, 0x00,
    0x00, 0x31, 0xd2, 0x0f, 0x30, 0xb9, 0x84, 0x00, 0x00, 0xc0, 0xb8, 0x00, 0x02, 0x00,
    0x00, 0x31, 0xd2, 0x0f, 0x30, 0x6a, 0x2b, 0x68, 0x00, 0x60, 0x00, 0x00, 0x6a, 0x02,
    0x6a, 0x33, 0x68, 0x00, 0x14, 0x00, 0x00, 0x48, 0xcf,
];

/// At LSTAR: `out 0x80, cs`, then `mov rax, cr0; out 0x84, al` (faults
/// with #GP at CPL 3), then `jmp $`.
#[rustfmt::skip]
const AT_LSTAR: &[u8] = &[
    0x66, 0x8c, 0xc8, 0x66, 0xe7, 0x80, 0x0f, 0x20, 0xc0, 0xe6, 0x84, 0xeb, 0xfe,
];

/// Every vector's handler: `out 0x81, VECTOR`, `out 0x82, [rsp]` and
/// `out 0x83, [rsp+8]` (RIP and CS, or the error code and RIP), `jmp $`.
fn handler(vector: u8) -> Vec<u8> {
    vec![
        0xb0, vector, 0xe6, 0x81, 0x48, 0x8b, 0x04, 0x24, 0xe7, 0x82, 0x48, 0x8b, 0x44, 0x24, 0x08,
        0xe7, 0x83, 0xeb, 0xfe,
    ]
}

/// Runs `user` (at 0x1400, CPL 3) and returns the port writes that follow.
fn probe(user: &'static [u8]) -> Vec<(u16, u32)> {
    let vm = vm_or_skip().expect("KVM");
    let mut ram = Ram::new();
    write_long_mode_tables(&mut ram, 0x80, handler);
    ram.write(0x1000, KERNEL);
    ram.write(0x1400, user);
    ram.write(0x1800, AT_LSTAR);
    // SAFETY: `ram` moves into the closure and is dropped there after the
    // vCPU and the VM.
    unsafe { vm.map_memory(0, 0, MEM_SIZE as u64, ram.0 as u64) }.unwrap();
    with_deadline(Duration::from_secs(30), move || {
        let ram = ram;
        let (mut vcpu, _) = vm.create_vcpu(0, 1, &CpuModel::default()).unwrap();
        vcpu.enter_long_mode(0x1000, 0, PML4 as u64, GDT as u64, GDT_LIMIT)
            .unwrap();
        let mut outs = Vec::new();
        while outs.len() < 3 {
            match vcpu.run().unwrap() {
                VcpuExit::IoOut(port, data) => {
                    let mut v = [0u8; 4];
                    v[..data.len()].copy_from_slice(data);
                    outs.push((port, u32::from_le_bytes(v)));
                }
                VcpuExit::Interrupted => {}
                other => panic!("{other:?}"),
            }
        }
        drop(vcpu);
        drop(vm);
        drop(ram);
        outs
    })
}

fn describe(outs: &[(u16, u32)]) -> String {
    outs.iter()
        .map(|(port, v)| match port {
            0x80 => format!("reached LSTAR with CS {v:#x}"),
            0x84 => "MOV from CR0 ran there (CPL 0)".to_string(),
            0x81 => format!("vector {v} delivered"),
            0x82 | 0x83 => format!("[{port:#x}] {v:#x}"),
            _ => format!("port {port:#x} <- {v:#x}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
#[ignore = "a measurement of the host: run with --ignored --nocapture"]
fn user_mode_entries_into_the_kernel() {
    // mov al, 0x77; syscall; jmp $
    let syscall = probe(&[0xb0, 0x77, 0x0f, 0x05, 0xeb, 0xfe]);
    println!(
        "SYSCALL from CPL 3 (hardware: LSTAR with CS 0x10, CR0 readable): {}",
        describe(&syscall)
    );
    // int 0x80; jmp $
    let int80 = probe(&[0xcd, 0x80, 0xeb, 0xfe]);
    println!(
        "INT 0x80 from CPL 3 through a DPL-3 gate (hardware: vector 128, CS 0x33 pushed): {}",
        describe(&int80)
    );
}
