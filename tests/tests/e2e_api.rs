//! End-to-end: the API socket (`--api-socket`) with the test guest under
//! the real `cloud-hypervisor`, driven with `curl --unix-socket` and
//! `ch-remote`: ping, info, counters that match what the guest did,
//! pause/resume with I/O running across it, vm.shutdown (the disk closed
//! and unlocked at its answer) then vmm.shutdown, an owner-only socket
//! removed at exit; `ch-remote --version`.

mod e2e_api_support;
mod e2e_support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use e2e_api_support::{guest_counts, have_curl, ApiVm};
use e2e_support::{check_clean, create_lazy_qcow2, dirty_flag};
use integration_tests::{json, qemu_img, qemu_io, TempDir};

#[test]
fn ping_info_counters_and_shutdown_with_curl() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-basic");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "64M");
    let disk = format!("path={img},id=data,num_queues=2");
    let mut vm = ApiVm::start(&dir, "disks=1 counts park", &["--disk", &disk]);
    let mode = std::fs::metadata(&vm.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the API socket must be owner-only");
    let serial = vm.wait_for("info parked");

    let ping = json(&vm.curl_ok("GET", "vmm.ping", None, 200));
    assert_eq!(ping["version"], env!("CARGO_PKG_VERSION"));
    let pid = ping["pid"].as_u64().expect("pid");
    // The API's threads run under their own seccomp filter (three
    // programs: clone3 refused, file opening failed with EACCES, then the
    // allow-list), not the main one.
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let mut api_threads = 0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "api" {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap();
            assert!(status.contains("Seccomp:\t2"), "{status}");
            assert!(status.contains("Seccomp_filters:\t3"), "{status}");
            api_threads += 1;
        }
    }
    assert_eq!(api_threads, 1);

    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["disks"][0]["id"], "data");
    assert_eq!(info["config"]["disks"][0]["num_queues"], 2);
    assert_eq!(info["config"]["disks"][0]["path"], img.as_str());
    // Upstream's layout: the disk's node under its PCI function's.
    let tree = &info["device_tree"];
    assert_eq!(tree["data"]["parent"], "_virtio-pci-data", "{tree}");
    assert_eq!(tree["_virtio-pci-data"]["pci_bdf"], "0000:00:01.0");
    assert_eq!(tree["_virtio-pci-data"]["children"][0], "data");
    assert_eq!(info["config"]["disks"][0]["image_type"], "Qcow2");

    // The guest's own count of what it asked, against the VMM's.
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    let ours = &counters["data"];
    for (key, want) in guest_counts(&serial, 0) {
        assert_eq!(ours[&key].as_u64(), Some(want), "{key}: {counters}");
    }
    assert_eq!(ours["in_flight"], 0);
    assert!(ours["read_ops"].as_u64().unwrap() > 10);
    let (min, avg, max) = (
        ours["write_latency_min"].as_u64().unwrap(),
        ours["write_latency_avg"].as_u64().unwrap(),
        ours["write_latency_max"].as_u64().unwrap(),
    );
    assert!(min > 0 && min <= avg && avg <= max, "{ours}");

    // vm.shutdown stops the VM, closes the disk, keeps the VMM.
    vm.curl_ok("PUT", "vm.shutdown", None, 204);
    assert!(
        !dirty_flag(&img),
        "the disk is closed cleanly by vm.shutdown"
    );
    // ... and unlocked by the time it answers: qemu-img check, which
    // takes the image's lock, works at once.
    check_clean(&img);
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Created");
    // As Cloud Hypervisor answers them: 500, the VM is not running.
    for (m, e) in [("PUT", "vm.pause"), ("PUT", "vm.shutdown")] {
        let body = vm.curl_ok(m, e, None, 500);
        assert!(body.contains("not running"), "{body}");
    }
    vm.curl_ok("GET", "vmm.ping", None, 200);
    let socket = vm.socket.clone();
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        !std::path::Path::new(&socket).exists(),
        "socket left behind"
    );
    check_clean(&img);
}

#[test]
fn pause_drains_and_resume_loses_nothing() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-pause");
    let img = dir.file("d.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    let rounds = 40;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={img}")],
    );
    vm.wait_for("ok   round 5\n");
    vm.curl_ok("PUT", "vm.pause", None, 204);
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    assert_eq!(counters["_disk0"]["in_flight"], 0, "{counters}");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Paused");
    // Nothing moves while paused: no serial output, no I/O.
    let before = vm.serial_text();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(vm.serial_text(), before, "the guest ran while paused");
    let again = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    assert_eq!(again, counters, "I/O while paused");
    vm.curl_ok("PUT", "vm.pause", None, 500);
    vm.curl_ok("PUT", "vm.resume", None, 204);
    vm.curl_ok("PUT", "vm.resume", None, 500);
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    // Every round is on the disk, as the guest wrote it.
    let cmds: Vec<String> = (0..rounds)
        .map(|r| format!("read -P {} {} 4k", 0x20 + r, (8 << 20) + r * 4096))
        .collect();
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io("raw", &img, &cmds);
}

#[test]
fn ch_remote_drives_the_api() {
    let dir = TempDir::new("api-ch-remote");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "16M");
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 wait_resize park",
        &["--disk", &format!("path={img}")],
    );
    vm.wait_for("WAIT resize");
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        json(&ok(vm.ch_remote(&["ping"])))["version"],
        env!("CARGO_PKG_VERSION")
    );
    // Printed as Cloud Hypervisor's ch-remote prints its own, no socket
    // needed.
    for flag in ["--version", "-V"] {
        let out = testkit::output_within(
            std::process::Command::new(integration_tests::project_bin("vmm", "ch-remote"))
                .arg(flag),
            testkit::COMMAND_LIMIT,
        );
        assert!(out.status.success(), "{flag}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("ch-remote v{}\n", env!("CARGO_PKG_VERSION"))
        );
    }
    assert_eq!(json(&ok(vm.ch_remote(&["info"])))["state"], "Running");
    ok(vm.ch_remote(&["resize-disk", "--disk", "_disk0", "--size", "32M"]));
    // Smaller needs --shrink; qcow2 does not shrink even then.
    for shrink in [&[][..], &["--shrink"][..]] {
        let mut args = vec!["resize-disk", "--disk", "_disk0", "--size", "16M"];
        args.extend(shrink);
        let out = vm.ch_remote(&args);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("(400)"), "{err}");
    }
    vm.wait_for("reading at the new end fails");
    vm.wait_for("info parked");
    ok(vm.ch_remote(&["pause"]));
    ok(vm.ch_remote(&["resume"]));
    ok(vm.ch_remote(&["snapshot-disk", "--disk", "_disk0", "--name", "cli"]));
    let info = json(&ok(vm.ch_remote(&["disk-info", "_disk0"])));
    assert_eq!(info[0]["virtual-size"], 32 << 20);
    assert_eq!(info[0]["snapshots"][0]["name"], "cli");
    let counters = json(&ok(vm.ch_remote(&["counters"])));
    assert!(counters["_disk0"]["write_ops"].as_u64().unwrap() > 0);
    // Errors: the status and the VMM's reason, exit 1; usage errors 2.
    let out = vm.ch_remote(&["remove-device", "nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("404") && err.contains("nosuch"), "{err}");
    let out = vm.ch_remote(&["boot"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("500") && err.contains("already booted"),
        "{err}"
    );
    assert_eq!(vm.ch_remote(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        vm.ch_remote(&["resize-disk", "--disk", "_disk0"])
            .status
            .code(),
        Some(2)
    );
    ok(vm.ch_remote(&["shutdown"]));
    ok(vm.ch_remote(&["shutdown-vmm"]));
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&img);
    let v = json(&qemu_img(&["info", "--output=json", &img]));
    assert_eq!(v["virtual-size"], 32 << 20);
}
