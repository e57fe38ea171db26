//! Shared by the e2e_*.rs test files: locating (or building) the
//! `cloud-hypervisor` binary and the test guest, booting with a timeout
//! and the serial port in a file, and hand-assembled tiny guests (a PVH
//! ELF and a bzImage) for boot paths the test guest does not take.
//!
//! How a run ends: the test guest and the tiny guests power off (ACPI
//! S5, [`ACPI_POWEROFF`]), which ends the VMM; a guest that resets is
//! rebooted by the VMM, so a test of a reset waits for the second boot
//! and stops the VMM itself ([`boot_until`]).
#![allow(dead_code)]

pub mod vhost_user_daemon;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::{qemu_img, TempDir};

/// Generous: the guest needs about a second; CI machines are slow and
/// guest code is emulated.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cloud-hypervisor`: `$CH_BIN_DIR/cloud-hypervisor` when
/// scripts/run-tests.sh built it, else built once per test process into
/// this test's target dir ([`integration_tests::project_bin`]).
pub fn vmm_binary() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| integration_tests::project_bin("vmm", "cloud-hypervisor"))
}

/// The test guest ELF: `$CH_TEST_GUEST`, else built by
/// scripts/build-test-guest.sh (which prints its path last).
pub fn test_guest() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("CH_TEST_GUEST") {
            return PathBuf::from(p);
        }
        let out = testkit::output_within(
            Command::new("bash").arg(repo().join("scripts/build-test-guest.sh")),
            testkit::COMMAND_LIMIT,
        );
        assert!(
            out.status.success(),
            "building the test guest failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = stdout.lines().last().expect("guest path on stdout").trim();
        PathBuf::from(path)
    })
}

/// Waits for `child` with a deadline; kills it (and fails) on timeout.
#[track_caller]
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    testkit::exit_within(child, "the child process", timeout)
}

pub struct Boot {
    pub status: ExitStatus,
    pub serial: String,
    pub stderr: String,
}

/// Boots `kernel` with extra arguments; serial goes to a file.
pub fn boot(dir: &TempDir, kernel: &Path, args: &[&str]) -> Boot {
    run_vmm(dir, kernel, args, None)
}

/// Boots `kernel` until the serial output satisfies `done` (a guest that
/// reboots: the second boot's output, say), then stops the VMM with
/// SIGTERM; fails if that does not happen within [`BOOT_TIMEOUT`].
pub fn boot_until(
    dir: &TempDir,
    kernel: &Path,
    args: &[&str],
    done: impl Fn(&str) -> bool,
) -> Boot {
    run_vmm(dir, kernel, args, Some(&done))
}

fn run_vmm(
    dir: &TempDir,
    kernel: &Path,
    args: &[&str],
    done: Option<&dyn Fn(&str) -> bool>,
) -> Boot {
    let serial = dir.file("serial.log");
    let mut child = Command::new(vmm_binary())
        .arg("--kernel")
        .arg(kernel)
        .args(["--serial", &format!("file={serial}"), "-v"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cloud-hypervisor");
    let mut err_pipe = child.stderr.take().expect("stderr pipe");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    if let Some(done) = done {
        let start = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&serial).unwrap_or_default();
            if done(&text) {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the VMM ended ({status}) before the guest got there:\n{text}");
            }
            if start.elapsed() > BOOT_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the guest did not get there within {BOOT_TIMEOUT:?}:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        testkit::signal(child.id(), "TERM").expect("SIGTERM to the VMM");
    }
    let status = wait_with_timeout(&mut child, BOOT_TIMEOUT);
    let stderr = reader.join().unwrap_or_default();
    let serial = std::fs::read_to_string(&serial).unwrap_or_default();
    Boot {
        status,
        serial,
        stderr,
    }
}

/// An ELF64 with a PT_NOTE holding XEN_ELFNOTE_PHYS32_ENTRY and one
/// PT_LOAD of 32-bit `code` at 1 MiB.
pub fn pvh_elf(code: &[u8]) -> Vec<u8> {
    const ENTRY: u64 = 0x10_0000;
    const CODE_OFF: u64 = 0x100;
    let mut f = vec![0u8; CODE_OFF as usize];
    // ELF header.
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&ENTRY.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
    f[56..58].copy_from_slice(&2u16.to_le_bytes()); // phnum
    let note_off = 64 + 2 * 56;
    let phdr = |f: &mut Vec<u8>, at: usize, ty: u32, off: u64, addr: u64, size: u64| {
        f[at..at + 4].copy_from_slice(&ty.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
        f[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
        f[at + 16..at + 24].copy_from_slice(&addr.to_le_bytes());
        f[at + 24..at + 32].copy_from_slice(&addr.to_le_bytes());
        f[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        f[at + 40..at + 48].copy_from_slice(&size.to_le_bytes());
        f[at + 48..at + 56].copy_from_slice(&4u64.to_le_bytes());
    };
    phdr(&mut f, 64, 1, CODE_OFF, ENTRY, code.len() as u64); // PT_LOAD
    phdr(&mut f, 120, 4, note_off as u64, 0, 20); // PT_NOTE
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes()); // namesz
    note.extend_from_slice(&4u32.to_le_bytes()); // descsz
    note.extend_from_slice(&18u32.to_le_bytes()); // XEN_ELFNOTE_PHYS32_ENTRY
    note.extend_from_slice(b"Xen\0");
    note.extend_from_slice(&(ENTRY as u32).to_le_bytes());
    f[note_off..note_off + 20].copy_from_slice(&note);
    f.extend_from_slice(code);
    f
}

/// 32-bit code: print "Hi\n" on COM1, then `tail`.
pub fn hello_then(tail: &[u8]) -> Vec<u8> {
    let mut c = vec![0x66, 0xba, 0xf8, 0x03]; // mov dx, 0x3f8
    for ch in b"Hi\n" {
        c.extend_from_slice(&[0xb0, *ch, 0xee]); // mov al, ch; out dx, al
    }
    c.extend_from_slice(tail);
    c
}

pub const SPIN: &[u8] = &[0xeb, 0xfe]; // jmp $
/// A reset: the VMM reboots the guest.
pub const I8042_RESET: &[u8] = &[0xb0, 0xfe, 0xe6, 0x64, 0xeb, 0xfe]; // out 0x64, 0xfe; jmp $
/// ACPI S5 through the sleep control register at 0x600 (the FADT's):
/// the VMM ends. The same bytes in 32- and 64-bit code.
pub const ACPI_POWEROFF: &[u8] = &[
    0x66, 0xba, 0x00, 0x06, // mov dx, 0x600
    0xb0, 0x34, // mov al, SLP_TYP 5 << 2 | SLP_EN
    0xee, // out dx, al
    0xeb, 0xfe, // jmp $
];

/// A new qcow2 image at `path` with lazy refcounts on (so the dirty bit
/// shows whether the VMM closed it cleanly).
pub fn create_lazy_qcow2(path: &str, size: &str) {
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "lazy_refcounts=on",
        path,
        size,
    ]);
}

/// Checks the test guest's documented write pattern (tests/guest/README.md)
/// for `queues` queues in `image`.
pub fn check_pattern(fmt: &str, image: &str, queues: u64) {
    for q in 0..queues {
        let b = q * 262_144;
        integration_tests::qemu_io(
            fmt,
            image,
            &[
                &format!("read -P {} {b} 64k", 0x40 + q),
                &format!("read -P {} {} 4k", 0x80 + q, b + 65_536),
                &format!("read -P 0 {} 60k", b + 69_632),
                &format!("read -P 0 {} 64k", b + 196_608),
            ],
        );
    }
}

/// `qemu-img check` must report no errors.
pub fn check_clean(image: &str) {
    let out = qemu_img(&["check", image]);
    assert!(out.contains("No errors"), "qemu-img check {image}: {out}");
}

/// The `dirty-flag` of a qcow2 image as qemu-img reports it.
pub fn dirty_flag(image: &str) -> bool {
    let info = qemu_img(&["info", "--output=json", "-U", image]);
    let v = integration_tests::json(&info);
    v["dirty-flag"]
        .as_bool()
        .expect("dirty-flag in qemu-img info")
}

/// A minimal bzImage: one setup sector after the boot sector, a header
/// for boot protocol 2.15 (64-bit capable, loaded high at 1 MiB), and a
/// protected-mode part whose 64-bit entry (`startup_64`, 0x200 in) is
/// `code64`.
pub fn bzimage(code64: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 1024];
    f[0x1f1] = 1; // setup_sects
    f[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    f[0x202..0x206].copy_from_slice(b"HdrS");
    f[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    f[0x211] = 1; // loadflags: LOADED_HIGH
    f[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
    f[0x236..0x238].copy_from_slice(&1u16.to_le_bytes()); // XLF_KERNEL_64
    f[0x238..0x23c].copy_from_slice(&2048u32.to_le_bytes()); // cmdline_size
    let mut kernel = vec![0xf4u8; 0x200]; // hlt: the 32-bit entry is unused
    kernel.extend_from_slice(code64);
    f.extend_from_slice(&kernel);
    f
}

/// Waits (up to 10 s) until qemu-img can take the image's locks: a
/// killed process's file locks go once the kernel has torn down its
/// io_uring rings, on its own, a moment after the process.
pub fn wait_unlocked(img: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = integration_tests::qemu_img_status(&["info", img]);
        if out.status.success() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{img} still locked 10 s after its VMM was killed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
