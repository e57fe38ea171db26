//! End-to-end: the ACPI tables and registers with hand-assembled tiny
//! guests. A PVH guest finds the RSDP through `hvm_start_info.rsdp_paddr`
//! and powers off through the FADT's sleep control register (S5), with a
//! qcow2 disk attached that must come out closed cleanly; a bzImage guest
//! finds the RSDP at 0xE0000 and resets through the FADT's reset register,
//! which reboots it (it runs again) with its disk still open.

mod e2e_support;

use std::path::Path;

use e2e_support::*;
use integration_tests::TempDir;

/// 32-bit: `mov dx, port; mov al, value; out dx, al; jmp $`.
fn out_then_spin(port: u16, value: u8) -> Vec<u8> {
    let p = port.to_le_bytes();
    vec![0x66, 0xba, p[0], p[1], 0xb0, value, 0xee, 0xeb, 0xfe]
}

/// SLP_TYP 5 (the DSDT's `\_S5`) in bits 2..5, SLP_EN (bit 5).
const S5_SLEEP: u8 = (5 << 2) | (1 << 5);
/// The ACPI register block (layout.rs: sleep control, status, reset).
const ACPI_PM_PORT: u16 = 0x600;

#[test]
fn pvh_guest_finds_rsdp_and_powers_off_through_s5() {
    let dir = TempDir::new("e2e-acpi-s5");
    // %ebx = start_info; rsdp_paddr is at +32. Print the RSDP's first
    // two signature bytes, then enter S5.
    let mut code = vec![
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0x8b, 0x4b, 0x20, // mov ecx, [ebx+32]
        0x8a, 0x01, 0xee, // mov al, [ecx]; out
        0x8a, 0x41, 0x01, 0xee, // mov al, [ecx+1]; out
        0xb0, 0x0a, 0xee, // '\n'
    ];
    code.extend(out_then_spin(ACPI_PM_PORT, S5_SLEEP));
    let k = dir.file("s5.elf");
    std::fs::write(&k, pvh_elf(&code)).unwrap();
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "8M");
    let disk = format!("path={img},num_queues=2");
    let b = boot(&dir, Path::new(&k), &["--disk", &disk]);
    assert_eq!(b.serial, "RS\n", "stderr: {}", b.stderr);
    assert!(b.status.success(), "{}: {}", b.status, b.stderr);
    assert!(b.stderr.contains("PowerOff"), "{}", b.stderr);
    assert!(!dirty_flag(&img), "dirty bit left set after S5");
    check_clean(&img);
}

#[test]
fn bzimage_guest_finds_rsdp_at_0xe0000_and_resets_through_the_fadt() {
    let dir = TempDir::new("e2e-acpi-reset");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "8M");
    // 64-bit: print the byte at 0xE0000 ('R' of "RSD PTR "), then write
    // the FADT's reset value to its reset register.
    let code = vec![
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0xb8, 0x00, 0x00, 0x0e, 0x00, // mov eax, 0xe0000
        0x8a, 0x00, 0xee, // mov al, [rax]; out
        0xb0, 0x0a, 0xee, // '\n'
        0x66, 0xba, 0x02, 0x06, // mov dx, 0x602
        0xb0, 0x01, 0xee, // mov al, 1; out
        0xeb, 0xfe, // jmp $
    ];
    let k = dir.file("bzImage");
    std::fs::write(&k, bzimage(&code)).unwrap();
    let disk = format!("path={img}");
    let args = ["--memory", "size=64M", "--disk", &disk];
    // The reset reboots the VM: the guest prints again.
    let b = boot_until(&dir, Path::new(&k), &args, |s| s.starts_with("R\nR\n"));
    assert!(b.status.success(), "{}: {}", b.status, b.stderr);
    assert!(b.stderr.contains("ACPI reset register"), "{}", b.stderr);
    assert!(b.stderr.contains("VM rebooted"), "{}", b.stderr);
    // The disk stayed open across the reboots, and was closed at the end.
    assert_eq!(b.stderr.matches("disk _disk0 (").count(), 1, "{}", b.stderr);
    assert!(!dirty_flag(&img), "dirty bit left set");
    check_clean(&img);
}
