//! A real Linux guest under our own cloud-hypervisor, on this project's
//! machines (whose KVM emulates guest code): runs
//! scripts/run-linux-guest.sh, which boots the small kernel of
//! scripts/build-linux-kernel.sh with the SSE-free /init of
//! tests/linux-init/ on 2 vCPUs and a 2-queue qcow2 disk, and passes only
//! if every check /init prints is ok, the VMM exits 0 on the guest's
//! power-off, `qemu-img check` is clean and `qemu-img compare` matches the
//! image the host expects (docs/linux-guests.md).
//!
//! Once through the VMM's own virtio-blk device, once with the disk
//! served by ch-storage-daemon over vhost-user, and once ending through
//! the ACPI power button: /init waits for it after its checks, the
//! script presses it with `ch-remote power-button`, and Linux's ACPI
//! button driver hands /init the KEY_POWER press that makes it power off. The kernel comes from
//! `$CH_OWN_LINUX_KERNEL` (scripts/run-tests.sh builds it first) or from
//! the build script; a kernel that cannot be built is a skip, or a
//! failure under `CH_REQUIRE_ALL=1`.

mod e2e_support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use e2e_support::{repo, vmm_binary, wait_with_timeout};
use integration_tests::project_bin;

/// The script's limit for one boot (it kills the VMM after it).
const BOOT_TIMEOUT_S: u64 = 900;

/// The two boots share a 2-core machine and emulate every guest
/// instruction: one at a time keeps each boot's time meaningful.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The guest kernel, or why there is none.
fn kernel() -> Result<PathBuf, String> {
    static KERNEL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            if let Some(k) = std::env::var_os("CH_OWN_LINUX_KERNEL") {
                return Ok(PathBuf::from(k));
            }
            let out = testkit::try_output_within(
                Command::new("bash").arg(repo().join("scripts/build-linux-kernel.sh")),
                integration_tests::BUILD_LIMIT,
            )?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            match stdout
                .lines()
                .find_map(|l| l.strip_prefix("CH_OWN_LINUX_KERNEL="))
            {
                Some(path) if out.status.success() => Ok(PathBuf::from(path)),
                _ => Err(format!(
                    "scripts/build-linux-kernel.sh failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )),
            }
        })
        .clone()
}

fn run_guest(mode: &str) {
    run_guest_with(mode, false)
}

fn run_guest_with(mode: &str, power_button: bool) {
    let kernel = match kernel() {
        Ok(k) => k,
        Err(why) => {
            testkit::available("the guest kernel", Err(why));
            return;
        }
    };
    if !testkit::has_command("qemu-img") {
        return;
    }
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts/run-linux-guest.sh"))
        .env("MODE", mode)
        .env("CH_OWN_LINUX_KERNEL", &kernel)
        .env("CH_BIN", vmm_binary())
        .env("TIMEOUT", BOOT_TIMEOUT_S.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if mode == "vhost-user" {
        cmd.env(
            "CH_DAEMON",
            project_bin("storage-daemon", "ch-storage-daemon"),
        );
    }
    if power_button {
        cmd.env("POWER_BUTTON", "1")
            .env("CH_REMOTE", project_bin("vmm", "ch-remote"));
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("run scripts/run-linux-guest.sh");
    // Read both pipes on their own threads so a full pipe cannot stall it.
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let status = wait_with_timeout(&mut child, Duration::from_secs(BOOT_TIMEOUT_S + 300));
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    println!("{out}");
    eprintln!("{err}");
    println!(
        "{mode}: script finished in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "run-linux-guest.sh ({mode}) failed: {status}"
    );
    assert!(out.contains("CHTEST done failures=0"), "{out}");
    assert!(
        err.contains(&format!("ok: {mode} boot to power-off")),
        "{err}"
    );
    if power_button {
        assert!(out.contains("CHTEST power button pressed"), "{out}");
        assert!(err.contains("pressing the power button"), "{err}");
    }
}

#[test]
fn linux_drives_the_vmm_virtio_blk_device() {
    run_guest("virtio");
}

#[test]
fn linux_drives_a_vhost_user_disk_served_by_ch_storage_daemon() {
    run_guest("vhost-user");
}

#[test]
fn linux_powers_off_through_the_acpi_power_button() {
    run_guest_with("virtio", true);
}
