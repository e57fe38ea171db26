//! End-to-end: `cloud-hypervisor` as a vhost-user front end. The
//! bare-metal test guest drives a virtio-blk disk that
//! `ch-storage-daemon --export type=vhost-user-blk` serves from a qcow2
//! image (`--memory shared=on --disk vhost_user=on,socket=...`); it must
//! print `RESULT: PASS`, its write pattern (tests/guest/README.md) must be
//! in the image and `qemu-img check` clean. Bad input: a missing socket,
//! unshared memory and the backend's keys are refused with messages.

mod e2e_support;

use std::process::Command;

use e2e_support::vhost_user_daemon::Daemon;
use e2e_support::{boot, check_clean, check_pattern, test_guest, vmm_binary};
use integration_tests::{qemu_img, TempDir};

/// Boots the test guest with one vhost-user disk of `queues` queues that
/// ch-storage-daemon serves from `img`; asserts PASS, a clean exit of
/// both processes and that the queues went to the backend. Returns the
/// serial output.
fn boot_through_daemon(img: &str, queues: u16, extra: &[&str]) -> String {
    let dir = TempDir::new("e2e-vu");
    let socket = dir.file("vu.sock");
    let daemon = Daemon::start(&dir, img, &socket, queues);
    let disk = format!("vhost_user=on,socket={socket},num_queues={queues}");
    let mut args = vec!["--cmdline", "disks=1", "--disk", &disk];
    args.extend(extra);
    let b = boot(&dir, test_guest(), &args);
    let daemon_log = daemon.stop();
    assert!(
        b.serial.lines().any(|l| l == "RESULT: PASS"),
        "guest did not pass.\nserial:\n{}\nstderr:\n{}\ndaemon:\n{daemon_log}",
        b.serial,
        b.stderr
    );
    assert!(b.status.success(), "VMM exit {}: {}", b.status, b.stderr);
    let handed = format!("{queues} queue(s) handed to the backend");
    assert!(b.stderr.contains(&handed), "{}", b.stderr);
    b.serial
}

#[test]
fn qcow2_two_queues_through_ch_storage_daemon() {
    let dir = TempDir::new("e2e-vu-img");
    let img = dir.file("disk.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "64M"]);
    boot_through_daemon(&img, 2, &["--memory", "size=128M,shared=on"]);
    check_clean(&img);
    check_pattern("qcow2", &img, 2);
}

/// Guest RAM above 4 GiB is a second region of the same memfd (at file
/// offset 3 GiB); the backend maps both.
#[test]
fn raw_four_queues_two_vcpus_ram_above_4g() {
    let dir = TempDir::new("e2e-vu-img");
    let img = dir.file("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    let serial = boot_through_daemon(
        &img,
        4,
        &["--cpus", "boot=2", "--memory", "size=4G,shared=on"],
    );
    assert!(
        serial.contains("0x100000000-0x140000000 type 1"),
        "{serial}"
    );
    check_pattern("raw", &img, 4);
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = testkit::output_within(
        Command::new(vmm_binary()).args(args),
        testkit::COMMAND_LIMIT,
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_socket_is_named() {
    let dir = TempDir::new("e2e-vu-missing");
    let socket = dir.file("nobody-listens.sock");
    let guest = test_guest().to_str().expect("utf-8 path").to_string();
    let (ok, err) = cli(&[
        "--kernel",
        &guest,
        "--memory",
        "size=64M,shared=on",
        "--disk",
        &format!("vhost_user=on,socket={socket}"),
        "--serial",
        "off",
    ]);
    assert!(!ok, "booted without a backend");
    assert!(err.contains("nobody-listens.sock"), "{err}");
}

#[test]
fn unshared_memory_and_backend_keys_are_refused() {
    let dir = TempDir::new("e2e-vu-bad");
    let missing_kernel = dir.file("no-such-kernel");
    for memory in [None, Some("size=64M"), Some("size=64M,shared=off")] {
        let mut args = vec!["--kernel", &missing_kernel];
        if let Some(m) = memory {
            args.extend(["--memory", m]);
        }
        args.extend(["--disk", "vhost_user=on,socket=/tmp/x.sock"]);
        let (ok, err) = cli(&args);
        assert!(!ok, "{memory:?} accepted");
        assert!(
            err.contains("vhost_user") && err.contains("shared=on"),
            "{memory:?}: {err}"
        );
        assert!(!err.contains("no-such-kernel"), "{err}");
    }
    for (key, name) in [
        ("path=/i.qcow2", "path"),
        ("readonly=on", "readonly"),
        ("direct=on", "direct"),
        ("engine=sync", "engine"),
        ("image_type=raw", "image_type"),
        ("bw_size=1,bw_refill_time=1", "rate_limiter_config"),
    ] {
        let (ok, err) = cli(&[
            "--kernel",
            &missing_kernel,
            "--memory",
            "shared=on",
            "--disk",
            &format!("vhost_user=on,socket=/tmp/x.sock,{key}"),
        ]);
        assert!(!ok, "{key} accepted");
        assert!(
            err.contains(name) && err.contains("backend"),
            "{key}: {err}"
        );
    }
    let (ok, err) = cli(&[
        "--kernel",
        &missing_kernel,
        "--memory",
        "shared=on",
        "--disk",
        "vhost_user=on",
    ]);
    assert!(!ok && err.contains("socket"), "{err}");
    let (ok, out) = {
        let out = testkit::output_within(
            Command::new(vmm_binary()).arg("--help"),
            testkit::COMMAND_LIMIT,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert!(
        ok && out.contains("vhost_user=on") && out.contains("shared=on"),
        "{out}"
    );
}
