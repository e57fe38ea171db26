//! End-to-end: the test guest boots with its disk on an NBD server
//! nobody here wrote (qemu-nbd, qemu-storage-daemon, nbdkit's file
//! plugin), passes its checks, and its write pattern is in the image the
//! server exported. With qemu-storage-daemon (multi-conn) each of the two
//! queues has a connection of its own. A disk whose server went away
//! before the end fails its last flush: `vm.shutdown` says so (500) and
//! the VMM exits non-zero with the reason, also on SIGTERM.

mod e2e_api_support;
mod e2e_support;

use e2e_api_support::{have_curl, ApiVm};
use e2e_support::{boot, check_clean, check_pattern, test_guest};
use integration_tests::{json, qemu_img, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

fn boot_on(kind: Kind) {
    if !testkit::has_command(NbdServer::tool(kind)) || !testkit::has_command("qemu-img") {
        return;
    }
    let dir = TempDir::new("e2e-nbd");
    let fmt = if kind == Kind::NbdkitFile {
        "raw"
    } else {
        "qcow2"
    };
    let img = dir.file(&format!("disk.{fmt}"));
    qemu_img(&["create", "-q", "-f", fmt, &img, "64M"]);
    let server = NbdServer::start(
        kind,
        std::path::Path::new(&img),
        fmt,
        &dir.path().join("nbd.sock"),
        true,
    );
    let disk = format!("path={},num_queues=2", server.uri);
    let b = boot(
        &dir,
        test_guest(),
        &["--cmdline", "disks=1", "--disk", &disk],
    );
    assert!(
        b.serial.lines().any(|l| l == "RESULT: PASS"),
        "guest did not pass.\nserial:\n{}\nstderr:\n{}",
        b.serial,
        b.stderr
    );
    assert!(b.status.success(), "VMM exit {}: {}", b.status, b.stderr);
    if kind == Kind::QemuStorageDaemon {
        assert!(
            b.stderr.contains("one connection per queue"),
            "{}",
            b.stderr
        );
    }
    drop(server);
    if fmt == "qcow2" {
        check_clean(&img);
    }
    check_pattern(fmt, &img, 2);
}

#[test]
fn boots_from_qemu_nbd() {
    boot_on(Kind::QemuNbd);
}

#[test]
fn boots_from_qemu_storage_daemon() {
    boot_on(Kind::QemuStorageDaemon);
}

#[test]
fn boots_from_nbdkit() {
    boot_on(Kind::NbdkitFile);
}

/// Boots the parked test guest on a raw disk over NBD (qemu-nbd), then
/// kills the server: the disk's last flush cannot reach it.
fn vm_whose_server_is_gone(dir: &TempDir) -> ApiVm {
    let img = dir.file("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    let mut server = NbdServer::start(
        Kind::QemuNbd,
        std::path::Path::new(&img),
        "raw",
        &dir.path().join("nbd.sock"),
        true,
    );
    let disk = format!("path={},id=nbd", server.uri);
    let mut vm = ApiVm::start(dir, "disks=1 park", &["--disk", &disk]);
    vm.wait_for("RESULT: PASS");
    server.kill();
    vm
}

/// The exit and the log tell a supervisor that the last flush failed.
fn assert_failed_close(status: std::process::ExitStatus, stderr: &str) {
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("cloud-hypervisor: the VM ended (")
            && last.contains("but closing its disks failed: disk 'nbd': ")
            && last.contains("Input/output error"),
        "{stderr}"
    );
}

#[test]
fn a_last_flush_that_fails_at_vm_shutdown_is_answered_and_exits_non_zero() {
    if !have_curl() || !testkit::has_command("qemu-nbd") {
        return;
    }
    let dir = TempDir::new("e2e-nbd-gone");
    let vm = vm_whose_server_is_gone(&dir);
    let (status, body) = vm.curl("PUT", "vm.shutdown", None);
    assert_eq!(status, 500, "{body}");
    let chain = json(&body);
    assert_eq!(chain[0], "the VM is shut down, but closing disks failed");
    assert!(chain[1].as_str().unwrap().contains("disk 'nbd'"), "{body}");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Created");
    let (status, stderr) = vm.shutdown();
    assert_failed_close(status, &stderr);
}

#[test]
fn a_last_flush_that_fails_at_sigterm_exits_non_zero() {
    if !have_curl() || !testkit::has_command("qemu-nbd") {
        return;
    }
    let dir = TempDir::new("e2e-nbd-gone-term");
    let mut vm = vm_whose_server_is_gone(&dir);
    let pid = json(&vm.curl_ok("GET", "vmm.ping", None, 200))["pid"]
        .as_u64()
        .expect("pid");
    testkit::signal(pid as u32, "TERM").unwrap_or_else(|e| panic!("{e}"));
    let (status, stderr) = vm.wait_exit();
    assert_failed_close(status, &stderr);
    assert!(stderr.contains("VM exit: Signal(15)"), "{stderr}");
}
