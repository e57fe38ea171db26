//! End-to-end: the test guest boots with its disk on an NBD server
//! nobody here wrote (qemu-nbd, qemu-storage-daemon, nbdkit's file
//! plugin), passes its checks, and its write pattern is in the image the
//! server exported. With qemu-storage-daemon (multi-conn) each of the two
//! queues has a connection of its own.

mod e2e_support;

use e2e_support::{boot, check_clean, check_pattern, test_guest};
use integration_tests::{qemu_img, TempDir};
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
