//! End-to-end: PCI hotplug through the API with the test guest. A
//! hot-added disk is announced to the guest (the register the DSDT's
//! hotplug method reads), passes the guest's block checks, and is
//! removed when the guest ejects it (as the slot's `_EJ0` does); the
//! answer comes after the image is closed and unlocked, so qemu-img opens
//! it at once. A guest that does not eject, or a paused one, gets the disk
//! taken away all the same. Bad add-disk requests are refused with the
//! status Cloud Hypervisor gives.

mod e2e_api_support;
mod e2e_support;

use std::time::{Duration, Instant};

use e2e_api_support::{have_curl, ApiVm};
use e2e_support::{check_clean, check_pattern, create_lazy_qcow2, dirty_flag};
use integration_tests::{json, qemu_img, TempDir};

#[test]
fn a_hot_added_disk_is_used_by_the_guest_and_removed_at_its_eject() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-hotplug");
    let boot = dir.file("boot.raw");
    qemu_img(&["create", "-q", "-f", "raw", &boot, "16M"]);
    let hot = dir.file("hot.qcow2");
    create_lazy_qcow2(&hot, "16M");
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 wait_hotplug park",
        &["--disk", &format!("path={boot}")],
    );
    vm.wait_for("WAIT hotplug");
    let body = format!(r#"{{"path":"{hot}","num_queues":2}}"#);
    let added = json(&vm.curl_ok("PUT", "vm.add-disk", Some(&body), 200));
    assert_eq!(added["id"], "_disk1");
    assert_eq!(added["bdf"], "0000:00:02.0");
    let serial = vm.wait_for("hot-added disk1 passed the block checks");
    assert!(
        serial.contains("slot 2 announced: 1af4:1042, disk1"),
        "{serial}"
    );
    vm.wait_for("WAIT unplug");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(info["config"]["disks"][1]["id"], "_disk1");
    assert_eq!(
        info["device_tree"]["_virtio-pci-_disk1"]["pci_bdf"],
        "0000:00:02.0"
    );
    assert_eq!(
        info["device_tree"]["_disk1"]["parent"],
        "_virtio-pci-_disk1"
    );
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    assert!(
        counters["_disk1"]["write_ops"].as_u64().unwrap() > 0,
        "{counters}"
    );
    vm.curl_ok("PUT", "vm.remove-device", Some(r#"{"id":"_disk1"}"#), 204);
    // Closed, clean and unlocked before the answer: qemu-img (which takes
    // the image's locks) opens it at once.
    assert!(!dirty_flag(&hot));
    check_clean(&hot);
    check_pattern("qcow2", &hot, 2);
    vm.wait_for("slot 2 ejected and empty");
    vm.wait_for("RESULT: PASS");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(
        info["config"]["disks"].as_array().unwrap().len(),
        1,
        "{info}"
    );
    let body = vm.curl_ok("PUT", "vm.remove-device", Some(r#"{"id":"_disk1"}"#), 404);
    assert!(body.contains("_disk1"), "{body}");
    // The slot is free again: a new disk takes it.
    let again = json(&vm.curl_ok(
        "PUT",
        "vm.add-disk",
        Some(&format!(r#"{{"path":"{hot}","id":"again"}}"#)),
        200,
    ));
    assert_eq!(again["bdf"], "0000:00:02.0");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    // The removal waited for the guest's eject, not for the timeout.
    assert!(stderr.contains("the guest ejected slot 2"), "{stderr}");
    assert!(!stderr.contains("did not eject"), "{stderr}");
    check_clean(&hot);
}

#[test]
fn removal_goes_ahead_without_the_guest() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-unplug-forced");
    let boot = dir.file("boot.raw");
    qemu_img(&["create", "-q", "-f", "raw", &boot, "16M"]);
    let (a, b) = (dir.file("a.qcow2"), dir.file("b.qcow2"));
    create_lazy_qcow2(&a, "8M");
    create_lazy_qcow2(&b, "8M");
    // This guest never looks at the hotplug registers.
    let mut vm = ApiVm::start(&dir, "disks=1 park", &["--disk", &format!("path={boot}")]);
    vm.wait_for("info parked");
    for (p, id) in [(&a, "a"), (&b, "b")] {
        vm.curl_ok(
            "PUT",
            "vm.add-disk",
            Some(&format!(r#"{{"path":"{p}","id":"{id}"}}"#)),
            200,
        );
    }
    // A paused guest cannot eject: the disk goes at once.
    vm.curl_ok("PUT", "vm.pause", None, 204);
    let start = Instant::now();
    vm.curl_ok("PUT", "vm.remove-device", Some(r#"{"id":"a"}"#), 204);
    assert!(start.elapsed() < Duration::from_secs(5));
    check_clean(&a);
    vm.curl_ok("PUT", "vm.resume", None, 204);
    // A running guest that ignores the request: the VMM waits for the
    // eject (10 s), then removes the disk anyway.
    let start = Instant::now();
    vm.curl_ok("PUT", "vm.remove-device", Some(r#"{"id":"b"}"#), 204);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(9),
        "answered after {waited:?}"
    );
    check_clean(&b);
    assert!(!dirty_flag(&b));
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("did not eject"), "{stderr}");
}

#[test]
fn bad_add_disk_requests_are_refused_and_the_vm_goes_on() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-add-bad");
    let boot = dir.file("boot.qcow2");
    create_lazy_qcow2(&boot, "16M");
    let other = dir.file("other.qcow2");
    create_lazy_qcow2(&other, "8M");
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 park",
        &["--disk", &format!("path={boot},id=root")],
    );
    vm.wait_for("info parked");
    for (body, status, word) in [
        (format!(r#"{{"path":"{other}","id":"root"}}"#), 409, "root"),
        (format!(r#"{{"path":"{boot}"}}"#), 409, "root"),
        (
            format!(r#"{{"path":"{other}","num_queues":0}}"#),
            400,
            "num_queues",
        ),
        (
            format!(r#"{{"path":"{other}","queue_size":3}}"#),
            400,
            "queue_size",
        ),
        (
            format!(r#"{{"path":"{other}","iommu":true}}"#),
            400,
            "iommu",
        ),
        (
            format!(r#"{{"path":"{other}","pci_segment":1}}"#),
            400,
            "pci_segment",
        ),
        (
            format!(r#"{{"path":"{other}","rate_limit_group":"g"}}"#),
            400,
            "rate_limit_group",
        ),
        (
            format!(r#"{{"path":"{other}","lock_granularity":"Full"}}"#),
            400,
            "lock_granularity",
        ),
        (
            format!(r#"{{"path":"{other}","sparse":false}}"#),
            400,
            "sparse",
        ),
        (
            format!(r#"{{"vhost_user":true,"vhost_socket":"{other}"}}"#),
            400,
            "vhost_user",
        ),
        (
            format!(r#"{{"path":"{other}","disable_io_uring":true,"engine":"io_uring"}}"#),
            400,
            "disable_io_uring",
        ),
        (
            format!(r#"{{"path":"{other}","readonly":"yes"}}"#),
            400,
            "readonly: invalid type",
        ),
        (r#"{"num_queues":1}"#.to_string(), 400, "path"),
        // A path that names nothing is the caller's mistake.
        (
            r#"{"path":"/nonexistent/x.qcow2"}"#.to_string(),
            400,
            "nonexistent",
        ),
        (
            format!(r#"{{"path":"{other}","engine":"warp"}}"#),
            400,
            "engine",
        ),
    ] {
        let (got, text) = vm.curl("PUT", "vm.add-disk", Some(&body));
        assert_eq!(got, status, "{body}: {text}");
        assert!(text.contains(word), "{body}: {text}");
    }
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(
        info["config"]["disks"].as_array().unwrap().len(),
        1,
        "{info}"
    );
    // The refused requests left the image free: the next add works.
    // Unknown fields are ignored, as upstream ignores them, and logged.
    let added = json(&vm.curl_ok(
        "PUT",
        "vm.add-disk",
        Some(&format!(r#"{{"path":"{other}","x_future":1}}"#)),
        200,
    ));
    assert_eq!(added["id"], "_disk0");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("vm.add-disk: ignored unknown field(s) x_future"),
        "{stderr}"
    );
    check_clean(&boot);
    check_clean(&other);
}
