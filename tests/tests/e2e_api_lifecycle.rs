//! End-to-end: the VM's lifecycle through the API, as Kata Containers and
//! libvirt drive Cloud Hypervisor: a VMM started with `--api-socket`
//! alone, `vm.create` (upstream's VmConfig JSON), `vm.boot`, `vm.reboot`,
//! `vm.shutdown` then `vm.boot` again, `vm.delete`, `vmm.shutdown`, with
//! the test guest; through curl and our `ch-remote` (upstream's
//! `ch-remote` drives the same verbs in e2e_api_upstream_client). At
//! each step the disk's lock is checked (held while the VM runs, free
//! after `vm.shutdown` and `vm.delete`), and the counters go on across a
//! reboot. Guest resets (i8042, the ACPI reset register, a triple fault)
//! reboot the VM; a reboot while a resize or a snapshot is under way
//! waits for it; the power button reaches the guest; `--event-monitor`
//! reports each step in upstream's format, compared with upstream's
//! own output for the same sequence when `CH_UPSTREAM_DIR` names its
//! binaries.

mod e2e_api_support;
mod e2e_support;

use std::process::Output;

use e2e_api_support::{events, guest_counts_every_boot, have_curl, locked, vm_config, ApiVm};
use e2e_support::vhost_user_daemon::Daemon;
use e2e_support::{check_clean, create_lazy_qcow2, dirty_flag};
use integration_tests::{json, qemu_img, TempDir};
use serde_json::json;
use testkit::nbd_server::{Kind, NbdServer};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The (source, event) pairs of an event-monitor file.
fn names(path: &str) -> Vec<String> {
    events(path)
        .into_iter()
        .map(|(s, e, _)| format!("{s} {e}"))
        .collect()
}

/// Polls `done` until it holds (within the guest's deadline).
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let end = std::time::Instant::now() + e2e_api_support::GUEST_TIMEOUT;
    while !done() {
        assert!(std::time::Instant::now() < end, "no {what} in time");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The sum of every boot's COUNT line for `key`.
fn summed(serial: &str, key: &str) -> u64 {
    guest_counts_every_boot(serial, 0)
        .iter()
        .map(|boot| boot.iter().find(|(k, _)| k == key).map_or(0, |(_, v)| *v))
        .sum()
}

#[test]
fn create_boot_reboot_shutdown_boot_delete_through_curl() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-lifecycle");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "64M");
    let ev = dir.file("events.json");
    let mut vm = ApiVm::start_vmm(&dir, &["--event-monitor", &format!("path={ev}")]);

    // No VM yet: upstream's answers.
    vm.curl_ok("GET", "vmm.ping", None, 200);
    for (m, e, status) in [
        ("GET", "vm.info", 404),
        ("PUT", "vm.boot", 404),
        ("PUT", "vm.reboot", 404),
        ("PUT", "vm.pause", 500),
        ("PUT", "vm.shutdown", 500),
        ("PUT", "vm.power-button", 500),
        ("GET", "vm.counters", 500),
    ] {
        vm.curl_ok(m, e, None, status);
    }
    vm.curl_ok("PUT", "vm.delete", None, 204);

    // Bad configs: nothing is stored.
    for (body, status, word) in [
        (json!({"net": [{"tap": "t0"}]}), 400, "net"),
        (json!({"fs": [{"tag": "t", "socket": "/s"}]}), 400, "fs"),
        (json!({"vsock": {"cid": 3, "socket": "/v"}}), 400, "vsock"),
        (
            json!({"cpus": {"boot_vcpus": "two"}}),
            400,
            "cpus.boot_vcpus",
        ),
        (json!({"memory": {"size": "1G"}}), 400, "memory.size"),
        (json!({"disks": [{"path": 7}]}), 400, "disks[0].path"),
    ] {
        let text = vm.curl_ok("PUT", "vm.create", Some(&body.to_string()), status);
        assert!(text.contains(word), "{body}: {text}");
    }
    vm.curl_ok("GET", "vm.info", None, 404);
    // A config without a payload is stored (as upstream); booting it
    // says what is missing.
    vm.curl_ok("PUT", "vm.create", Some("{}"), 204);
    let text = vm.curl_ok("PUT", "vm.boot", None, 400);
    assert!(text.contains("payload.kernel"), "{text}");
    vm.curl_ok("PUT", "vm.delete", None, 204);

    // The real one, with a pinned queue (resolved under the control
    // loop's seccomp filter).
    let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
    let cpus = allowed
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let cpu: usize = cpus.split([',', '-']).next().unwrap().parse().unwrap();
    let disk = json!({"path": img, "num_queues": 2, "id": "d0",
        "queue_affinity": [{"queue_index": 0, "host_cpus": [cpu]}]});
    let config = vm_config(&dir, "disks=1 park counts", &[disk]).to_string();
    vm.curl_ok("PUT", "vm.create", Some(&config), 204);
    let text = vm.curl_ok("PUT", "vm.create", Some(&config), 500);
    assert!(text.contains("already created"), "{text}");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Created");
    assert!(info.get("device_tree").is_none(), "{info}");
    assert_eq!(info["config"]["disks"][0]["id"], "d0");
    assert!(!locked(&img), "created is not opened");

    vm.curl_ok("PUT", "vm.boot", None, 204);
    let text = vm.curl_ok("PUT", "vm.boot", None, 500);
    assert!(text.contains("already"), "{text}");
    vm.wait_for("info parked");
    assert!(locked(&img), "a running VM holds its disk's lock");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["disks"][0]["image_type"], "Qcow2");
    assert_eq!(
        info["device_tree"]["_virtio-pci-d0"]["pci_bdf"],
        "0000:00:01.0"
    );

    // Reboot: the guest runs again, the disk stays open and locked, the
    // counters go on (the VMM's are the sum of both boots' own counts).
    vm.curl_ok("PUT", "vm.reboot", None, 204);
    assert!(locked(&img));
    let serial = vm.wait_for_count("info parked", 2);
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    for key in ["read_ops", "write_ops", "write_bytes", "flushes"] {
        assert_eq!(
            counters["d0"][key].as_u64(),
            Some(summed(&serial, key)),
            "{key}: {counters}\n{serial}"
        );
    }
    // Pause across a reboot: it comes back running.
    vm.curl_ok("PUT", "vm.pause", None, 204);
    vm.curl_ok("PUT", "vm.reboot", None, 204);
    vm.wait_for_count("info parked", 3);
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Running");

    // vm.shutdown: the disk closed and unlocked at the answer; the config
    // stays; vm.boot again reopens it (the serial file starts over).
    vm.curl_ok("PUT", "vm.shutdown", None, 204);
    assert!(!locked(&img));
    assert!(!dirty_flag(&img));
    check_clean(&img);
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["state"], "Created");
    vm.curl_ok("PUT", "vm.boot", None, 204);
    vm.wait_for("info parked");
    assert!(locked(&img));

    // vm.delete shuts the VM down and drops the config.
    vm.curl_ok("PUT", "vm.delete", None, 204);
    assert!(!locked(&img));
    check_clean(&img);
    vm.curl_ok("GET", "vm.info", None, 404);
    vm.curl_ok("PUT", "vm.boot", None, 404);
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");

    let want = [
        "vmm starting",
        "vm booting",
        "vm rebooting",
        "vm booting",
        "vm deleted",
        "vm booting",
        "vm booted",
        "virtio-device activated",
        "vm rebooting",
        "vm rebooted",
        "virtio-device activated",
        "vm pausing",
        "vm paused",
        "vm rebooting",
        "vm rebooted",
        "virtio-device activated",
        "vm shutdown",
        "vm booting",
        "vm booted",
        "virtio-device activated",
        "vm shutdown",
        "vm deleted",
        "vm booting",
        "vmm shutdown",
    ];
    assert_eq!(names(&ev), want);
    let activated = &events(&ev)[7];
    assert_eq!(activated.2, json!({"id": "d0"}));
}

#[test]
fn the_same_cycle_through_our_ch_remote() {
    let dir = TempDir::new("api-lifecycle-ch-remote");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "16M");
    let mut vm = ApiVm::start_vmm(&dir, &[]);
    let file = dir.file("vm.json");
    let config = vm_config(&dir, "disks=1 park", &[json!({"path": img})]);
    std::fs::write(&file, config.to_string()).unwrap();
    ok(&vm.ch_remote(&["create", &file]));
    let out = vm.ch_remote(&["create", &file]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(500)"));
    ok(&vm.ch_remote(&["boot"]));
    vm.wait_for("info parked");
    let info = json(&ok(&vm.ch_remote(&["info"])));
    assert_eq!(info["config"]["disks"][0]["id"], "_disk0");
    ok(&vm.ch_remote(&["reboot"]));
    vm.wait_for_count("info parked", 2);
    assert!(locked(&img));
    ok(&vm.ch_remote(&["power-button"]));
    ok(&vm.ch_remote(&["shutdown"]));
    assert!(!locked(&img));
    ok(&vm.ch_remote(&["boot"]));
    vm.wait_for("info parked");
    ok(&vm.ch_remote(&["delete"]));
    assert!(!locked(&img));
    let out = vm.ch_remote(&["boot"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("(404)"));
    ok(&vm.ch_remote(&["shutdown-vmm"]));
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn guest_resets_reboot_the_vm_with_its_disk_open() {
    if !have_curl() {
        return;
    }
    for end in ["i8042", "acpi-reset", "triple"] {
        let dir = TempDir::new(&format!("api-reset-{end}"));
        let img = dir.file("d.qcow2");
        create_lazy_qcow2(&img, "64M");
        let ev = dir.file("events.json");
        let cmdline = format!("disks=1 counts end={end}");
        let disk = format!("path={img},num_queues=2");
        let monitor = format!("path={ev}");
        let args = [
            "--cpus",
            "boot=2",
            "--disk",
            &disk,
            "--event-monitor",
            &monitor,
        ];
        let mut vm = ApiVm::start(&dir, &cmdline, &args);
        // Each boot passes, then resets: a third boot means two reboots.
        let serial = vm.wait_for_count("virtio-blk test guest", 3);
        assert_eq!(serial.matches("RESULT: FAIL").count(), 0, "{serial}");
        assert!(locked(&img), "{end}: the disk stays locked across reboots");
        let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
        assert!(
            counters["_disk0"]["write_ops"].as_u64() >= Some(summed(&serial, "write_ops")),
            "{end}: the counters go on: {counters}"
        );
        let (status, stderr) = vm.shutdown();
        assert!(status.success(), "{end}: {status}: {stderr}");
        assert!(
            stderr.contains("the guest reset the machine"),
            "{end}: {stderr}"
        );
        assert!(!dirty_flag(&img), "{end}");
        check_clean(&img);
        let seen = names(&ev);
        let reboots = seen.iter().filter(|e| *e == "vm rebooted").count();
        assert!(reboots >= 2, "{end}: {seen:?}");
        assert_eq!(
            &seen[..4],
            [
                "vmm starting",
                "vm booting",
                "vm booted",
                "virtio-device activated"
            ]
        );
    }
}

#[test]
fn a_reboot_keeps_nbd_and_vhost_user_disks() {
    if !have_curl() || !testkit::has_command("qemu-nbd") {
        return;
    }
    let dir = TempDir::new("api-reboot-every-kind");
    let local = dir.file("local.qcow2");
    create_lazy_qcow2(&local, "16M");
    let nbd_img = dir.file("nbd.raw");
    qemu_img(&["create", "-q", "-f", "raw", &nbd_img, "16M"]);
    let server = NbdServer::start(
        Kind::QemuNbd,
        std::path::Path::new(&nbd_img),
        "raw",
        &dir.path().join("nbd.sock"),
        true,
    );
    let vu_img = dir.file("vu.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &vu_img, "16M"]);
    let vu_socket = dir.file("vu.sock");
    let daemon = Daemon::start(&dir, &vu_img, &vu_socket, 1);
    let disks = [
        format!("path={local},id=local"),
        format!("path={},id=nbd", server.uri),
        format!("vhost_user=on,socket={vu_socket},id=vu"),
    ];
    let mut args = vec!["--memory", "size=128M,shared=on"];
    for d in &disks {
        args.extend(["--disk", d.as_str()]);
    }
    let mut vm = ApiVm::start(&dir, "disks=3 park", &args);
    vm.wait_for("info parked");
    // Twice: the NBD connection and the vhost-user backend carry over
    // (the backend gets the new VM's memory), and the guest passes its
    // checks on all three disks again each time.
    for boots in [2, 3] {
        vm.curl_ok("PUT", "vm.reboot", None, 204);
        let serial = vm.wait_for_count("info parked", boots);
        assert_eq!(serial.matches("RESULT: PASS").count(), boots, "{serial}");
        assert!(locked(&local));
    }
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    let nbd_writes = counters["nbd"]["write_ops"].as_u64().unwrap();
    assert!(nbd_writes > 0, "{counters}");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&local);
    daemon.stop();
    drop(server);
    check_clean(&vu_img);
}

#[test]
fn a_reboot_waits_for_a_resize_or_a_snapshot_under_way() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-reboot-during");
    let img = dir.file("d.qcow2");
    create_lazy_qcow2(&img, "64M");
    let disk = format!("path={img},id=d");
    let mut vm = ApiVm::start(&dir, "disks=1 park", &["--disk", &disk]);
    vm.wait_for("info parked");
    // Both requests at once, from two clients: one at a time, in either
    // order, each answered, nothing lost.
    for (n, (endpoint, body)) in [
        ("vm.resize-disk", r#"{"id":"d","desired_size":134217728}"#),
        ("vm.snapshot-disk", r#"{"id":"d","name":"during-reboot"}"#),
    ]
    .into_iter()
    .enumerate()
    {
        let socket = vm.socket.clone();
        let url = format!("http://localhost/api/v1/{endpoint}");
        let op =
            std::thread::spawn(move || e2e_api_support::curl_raw(&socket, "PUT", &url, Some(body)));
        vm.curl_ok("PUT", "vm.reboot", None, 204);
        let (status, text) = op.join().unwrap();
        assert_eq!(status, 204, "{endpoint}: {text}");
        vm.wait_for_count("info parked", n + 2);
    }
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    let info = json(&qemu_img(&["info", "--output=json", &img]));
    assert_eq!(info["virtual-size"], 128 << 20);
    let snapshots = qemu_img(&["snapshot", "-l", &img]);
    assert!(snapshots.contains("during-reboot"), "{snapshots}");
    check_clean(&img);
}

#[test]
fn the_power_button_reaches_the_guest() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-power-button");
    let img = dir.file("d.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    let ev = dir.file("events.json");
    let disk = format!("path={img}");
    let monitor = format!("path={ev}");
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 wait_power_button",
        &["--disk", &disk, "--event-monitor", &monitor],
    );
    vm.wait_for("WAIT power-button");
    vm.curl_ok("PUT", "vm.power-button", None, 204);
    // The guest sees the GED's event and powers off, which ends the VMM.
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
    let serial = vm.serial_text();
    assert!(serial.contains("ok   power button pressed"), "{serial}");
    assert!(serial.contains("RESULT: PASS"), "{serial}");
    assert!(stderr.contains("VM exit: PowerOff"), "{stderr}");
    let seen = names(&ev);
    assert_eq!(
        &seen[seen.len() - 3..],
        ["vm shutdown", "vm deleted", "vmm shutdown"],
        "{seen:?}"
    );
}

#[test]
fn event_monitor_matches_upstreams_for_the_same_sequence() {
    let Some(upstream) = testkit::upstream_binary("cloud-hypervisor") else {
        return;
    };
    if !have_curl() {
        return;
    }
    let run = |binary: Option<&std::path::Path>, name: &str| -> String {
        let dir = TempDir::new(&format!("api-events-{name}"));
        let img = dir.file("d.qcow2");
        create_lazy_qcow2(&img, "64M");
        let ev = dir.file("events.json");
        let monitor = format!("path={ev}");
        let mut vm = match binary {
            Some(b) => ApiVm::start_vmm_with(b, &dir, &["--event-monitor", &monitor]),
            None => ApiVm::start_vmm(&dir, &["--event-monitor", &monitor]),
        };
        let disk = json!({"path": img, "num_queues": 2, "id": "d0", "image_type": "Qcow2"});
        let config = vm_config(&dir, "disks=1 park", &[disk]).to_string();
        vm.curl_ok("PUT", "vm.create", Some(&config), 204);
        vm.curl_ok("PUT", "vm.boot", None, 204);
        vm.wait_for("info parked");
        vm.curl_ok("PUT", "vm.pause", None, 204);
        vm.curl_ok("PUT", "vm.resume", None, 204);
        vm.curl_ok("PUT", "vm.reboot", None, 204);
        // Upstream starts the serial file over at a reboot, we go on: wait
        // for the second boot's driver on the monitor instead.
        wait_until("the second activation", || {
            names(&ev)
                .iter()
                .filter(|e| *e == "virtio-device activated")
                .count()
                == 2
        });
        vm.curl_ok("PUT", "vm.shutdown", None, 204);
        vm.curl_ok("PUT", "vm.delete", None, 204);
        let (status, stderr) = vm.shutdown();
        assert!(status.success(), "{name}: {status}: {stderr}");
        std::fs::read_to_string(&ev).unwrap()
    };
    let theirs = run(Some(&upstream), "upstream");
    let ours = run(None, "ours");
    // The same events, in the same order, in the same layout: only the
    // timestamps' digits differ.
    let shape = |t: &str| -> String {
        t.lines()
            .map(|l| {
                if l.trim_start().starts_with("\"secs\"") || l.trim_start().starts_with("\"nanos\"")
                {
                    l.chars().filter(|c| !c.is_ascii_digit()).collect()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        shape(&ours),
        shape(&theirs),
        "ours:\n{ours}\nupstream:\n{theirs}"
    );
}
