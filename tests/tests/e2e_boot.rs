//! End-to-end: boot protocols and lifecycle with hand-assembled tiny
//! guests: PVH entry (start info, command line, initramfs module), the
//! 64-bit Linux boot protocol for a bzImage (long mode, zero page), the
//! i8042 reset (the VM reboots: the guest runs again), ACPI power-off
//! (the VMM ends), and SIGTERM ending a running guest with its disks
//! closed cleanly.

mod e2e_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_support::*;
use integration_tests::TempDir;
use testkit::ChildGuard;

#[test]
fn tiny_pvh_guest_prints_and_powers_off() {
    let dir = TempDir::new("e2e-tiny");
    let k = dir.file("tiny.elf");
    std::fs::write(&k, pvh_elf(&hello_then(ACPI_POWEROFF))).unwrap();
    let b = boot(&dir, Path::new(&k), &["--memory", "size=64M"]);
    assert_eq!(b.serial, "Hi\n");
    assert!(b.status.success(), "{}", b.stderr);
    assert!(b.stderr.contains("VM exit: PowerOff"), "{}", b.stderr);
}

#[test]
fn an_i8042_reset_reboots_the_guest() {
    let dir = TempDir::new("e2e-tiny-reset");
    let k = dir.file("tiny.elf");
    std::fs::write(&k, pvh_elf(&hello_then(I8042_RESET))).unwrap();
    // Each boot prints "Hi" and resets: the third line means two reboots.
    let b = boot_until(&dir, Path::new(&k), &["--memory", "size=64M"], |s| {
        s.starts_with("Hi\nHi\nHi\n")
    });
    assert!(b.status.success(), "{}", b.stderr);
    assert!(
        b.stderr.contains("reset through the i8042") && b.stderr.contains("VM rebooted"),
        "{}",
        b.stderr
    );
}

#[test]
fn sigterm_stops_a_running_guest_cleanly() {
    let dir = TempDir::new("e2e-term");
    let k = dir.file("spin.elf");
    std::fs::write(&k, pvh_elf(&hello_then(SPIN))).unwrap();
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "8M");
    let serial = dir.file("serial.log");
    let mut child = ChildGuard(
        Command::new(vmm_binary())
            .args(["--kernel", &k, "--serial", &format!("file={serial}")])
            .args(["--disk", &format!("path={img},num_queues=2")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let start = Instant::now();
    while std::fs::read_to_string(&serial).unwrap_or_default() != "Hi\n" {
        assert!(start.elapsed() < BOOT_TIMEOUT, "guest never printed");
        std::thread::sleep(Duration::from_millis(20));
    }
    testkit::signal(child.id(), "TERM").unwrap();
    let status = wait_with_timeout(&mut child, BOOT_TIMEOUT);
    assert!(status.success(), "exit after SIGTERM: {status}");
    // The image was closed cleanly: no dirty bit, no leaks.
    assert!(!dirty_flag(&img), "dirty bit left set after SIGTERM");
    check_clean(&img);
}

/// The `Seccomp:` mode of every thread of `pid` (0 none, 2 filter).
fn seccomp_modes(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        if let (Some(name), Some(mode)) = (field("Name:"), field("Seccomp:")) {
            out.push((name, mode.parse().unwrap_or(99)));
        }
    }
    out
}

/// Runs the spinning guest with `extra` args until every thread reports
/// `want`, then stops it with SIGTERM. Returns the threads seen.
fn threads_reach_seccomp_mode(extra: &[&str], want: u32) -> Vec<(String, u32)> {
    let dir = TempDir::new("e2e-seccomp");
    let k = dir.file("spin.elf");
    std::fs::write(&k, pvh_elf(&hello_then(SPIN))).unwrap();
    let mut child = ChildGuard(
        Command::new(vmm_binary())
            .args(["--kernel", &k, "--serial", "off", "--cpus", "boot=2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let start = Instant::now();
    let seen = loop {
        let modes = seccomp_modes(child.id());
        // Every thread, once both vCPUs exist (the VM is built after the
        // main, connector and builder threads have their filters).
        let vcpus = modes.iter().filter(|m| m.0.starts_with("vcpu")).count();
        if vcpus == 2 && modes.iter().all(|m| m.1 == want) {
            break modes;
        }
        assert!(
            start.elapsed() < BOOT_TIMEOUT,
            "threads never all reached seccomp mode {want}: {modes:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    testkit::signal(child.id(), "TERM").unwrap();
    let status = wait_with_timeout(&mut child, BOOT_TIMEOUT);
    assert!(status.success(), "{status}");
    seen
}

#[test]
fn seccomp_filters_cover_every_thread_by_default() {
    let seen = threads_reach_seccomp_mode(&[], 2);
    assert!(seen.iter().any(|t| t.0.starts_with("vcpu1")), "{seen:?}");
}

#[test]
fn seccomp_false_installs_no_filter() {
    threads_reach_seccomp_mode(&["--seccomp", "false"], 0);
}

#[test]
fn pvh_start_info_carries_cmdline_and_initramfs() {
    let dir = TempDir::new("e2e-pvh-info");
    // %ebx = start_info. Print '0' + nr_modules, the initramfs' first
    // byte (modlist[0].paddr), the command line's first byte, then power
    // off.
    let code = [
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0x8b, 0x43, 0x0c, // mov eax, [ebx+12]   nr_modules
        0x04, 0x30, 0xee, // add al, '0'; out
        0x8b, 0x43, 0x10, // mov eax, [ebx+16]   modlist_paddr
        0x8b, 0x00, // mov eax, [eax]       modlist[0].paddr
        0x8a, 0x00, 0xee, // mov al, [eax]; out
        0x8b, 0x43, 0x18, // mov eax, [ebx+24]   cmdline_paddr
        0x8a, 0x00, 0xee, // mov al, [eax]; out
        0xb0, 0x0a, 0xee, // '\n'
    ];
    let mut code = code.to_vec();
    code.extend_from_slice(ACPI_POWEROFF);
    let k = dir.file("info.elf");
    std::fs::write(&k, pvh_elf(&code)).unwrap();
    let initrd = dir.file("initrd");
    std::fs::write(&initrd, b"Qinitramfs").unwrap();
    let b = boot(
        &dir,
        Path::new(&k),
        &["--initramfs", &initrd, "--cmdline", "Zed console=ttyS0"],
    );
    assert_eq!(b.serial, "1QZ\n", "stderr: {}", b.stderr);
    assert!(b.status.success(), "{}", b.stderr);
}

#[test]
fn bzimage_enters_long_mode_with_the_zero_page() {
    let dir = TempDir::new("e2e-bzimage");
    // 64-bit code, %rsi = zero page: print the 'H' of "HdrS" (0x202), two
    // bytes of a 64-bit immediate (only right in long mode), '0' + the
    // e820 entry count (0x1e8), the command line's first byte (via
    // cmd_line_ptr at 0x228), then power off.
    let mut code = vec![
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0x8a, 0x86, 0x02, 0x02, 0x00, 0x00, 0xee, // mov al, [rsi+0x202]; out
        0x48, 0xb8, b'L', b'M', 0, 0, 0, 0, 0, 0, 0xee, // mov rax, imm64; out
        0x48, 0xc1, 0xe8, 0x08, 0xee, // shr rax, 8; out
        0x8a, 0x86, 0xe8, 0x01, 0x00, 0x00, // mov al, [rsi+0x1e8]
        0x04, 0x30, 0xee, // add al, '0'; out
        0x8b, 0x9e, 0x28, 0x02, 0x00, 0x00, // mov ebx, [rsi+0x228]
        0x8a, 0x03, 0xee, // mov al, [rbx]; out
        0xb0, 0x0a, 0xee, // '\n'
    ];
    code.extend_from_slice(ACPI_POWEROFF);
    let k = dir.file("bzImage");
    std::fs::write(&k, bzimage(&code)).unwrap();
    let b = boot(
        &dir,
        Path::new(&k),
        &["--cmdline", "Zed", "--memory", "size=64M"],
    );
    assert_eq!(b.serial, "HLM3Z\n", "stderr: {}", b.stderr);
    assert!(b.status.success(), "{}", b.stderr);
}

#[test]
fn unhandled_vcpu_exit_is_fatal_with_a_message() {
    let dir = TempDir::new("e2e-fatal");
    // Jump to an address with neither RAM nor a device: KVM cannot fetch
    // the next instruction and exits with an internal error.
    let mut code = hello_then(&[]);
    code.extend_from_slice(&[0xb8, 0x00, 0x00, 0x00, 0xd0, 0xff, 0xe0]); // mov eax, 0xd0000000; jmp eax
    let k = dir.file("bad.elf");
    std::fs::write(&k, pvh_elf(&code)).unwrap();
    let b = boot(&dir, Path::new(&k), &[]);
    eprintln!("VMM stderr: {}", b.stderr);
    assert_eq!(b.serial, "Hi\n");
    assert!(!b.status.success(), "exit status {}", b.status);
    assert!(
        b.stderr.contains("fatal") && b.stderr.contains("vCPU 0"),
        "{}",
        b.stderr
    );
}

#[test]
fn an_instruction_kvm_cannot_emulate_stops_the_vm_with_its_bytes() {
    let dir = TempDir::new("e2e-emulation");
    // popcnt eax, ebx, then power-off. Where KVM emulates guest code
    // (the development machines) POPCNT fails emulation: the VMM must stop
    // with the bytes, RIP and (with -v) the registers, which needs the
    // vCPU thread's seccomp filter to allow KVM_GET_REGS/SREGS. Where it
    // runs natively the guest powers off and the VMM exits 0.
    let mut code = hello_then(&[0xf3, 0x0f, 0xb8, 0xc3]);
    let popcnt_at = 0x10_0000 + code.len() as u64 - 4;
    code.extend_from_slice(ACPI_POWEROFF);
    let k = dir.file("popcnt.elf");
    std::fs::write(&k, pvh_elf(&code)).unwrap();
    let b = boot(&dir, Path::new(&k), &[]);
    eprintln!("VMM stderr: {}", b.stderr);
    assert_eq!(b.serial, "Hi\n");
    if b.status.success() {
        return;
    }
    assert_eq!(b.status.code(), Some(1), "{}", b.stderr);
    for want in [
        "fatal: vCPU 0: KVM internal error".to_string(),
        "instruction bytes f3 0f b8 c3".to_string(),
        format!("at RIP {popcnt_at:#x}"),
        format!("rip={popcnt_at:#x}"),
    ] {
        assert!(b.stderr.contains(&want), "no '{want}' in {}", b.stderr);
    }
}
