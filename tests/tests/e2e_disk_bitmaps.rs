//! End-to-end: dirty bitmaps of running disks (docs/backup.md) under our
//! `cloud-hypervisor` with its default seccomp filters, driven with curl
//! and our `ch-remote`, and read back by tools nobody here wrote.
//!
//! - The test guest writes known ranges after bitmaps were added through
//!   the API (`wait_resize` then `io_rounds`); after `vm.shutdown`
//!   `qemu-img info` lists the persistent ones not in use, `qemu-img
//!   check` is clean, and `nbdinfo --map=qemu:dirty-bitmap:NAME` over
//!   qemu-storage-daemon's export of the image shows exactly the granules
//!   the guest wrote.
//! - `vm.disk-transaction` over two disks applies all actions or none;
//!   the error codes of docs/api.md; the ch-remote verbs.
//! - `vm.remove-device` stores the bitmaps of a hot-added disk before
//!   it answers.
//! - A VMM killed with SIGKILL leaves the image's bitmaps in use
//!   (`qemu-img info`), `qemu-img check` passes, and the next VMM keeps
//!   them inconsistent: refused (409) for use, removable.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_api_support::{have_curl, ApiVm};
use integration_tests::{json, qemu_img, qemu_img_status, TempDir};

/// `(name, flags)` of the bitmaps `qemu-img info` lists.
fn image_bitmaps(img: &str) -> Vec<(String, Vec<String>)> {
    let info = json(&qemu_img(&["info", "-U", "--output=json", img]));
    info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| {
                    let flags = b["flags"]
                        .as_array()
                        .expect("flags")
                        .iter()
                        .map(|f| f.as_str().expect("a flag").to_string())
                        .collect();
                    (b["name"].as_str().expect("name").to_string(), flags)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The running disk's bitmaps as `vm.disk-info` shows them.
fn live_bitmaps(vm: &ApiVm, id: &str) -> Vec<serde_json::Value> {
    let body = format!(r#"{{"id":"{id}"}}"#);
    let v = json(&vm.curl_ok("PUT", "vm.disk-info", Some(&body), 200));
    v[0]["dirty-bitmaps"]
        .as_array()
        .unwrap_or_else(|| panic!("no dirty-bitmaps in {v}"))
        .clone()
}

fn live_names(vm: &ApiVm, id: &str) -> Vec<String> {
    live_bitmaps(vm, id)
        .iter()
        .map(|b| b["name"].as_str().expect("name").to_string())
        .collect()
}

fn qemu_check(img: &str) {
    let out = qemu_img_status(&["check", img]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("No errors"),
        "qemu-img check {img}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The dirty extents of bitmap `name` of `img`, as nbdinfo reads them
/// from qemu-storage-daemon's read-only export of the image.
fn dirty_extents_by_qsd(dir: &TempDir, img: &str, name: &str) -> Vec<(u64, u64)> {
    // One socket per call: a stopped daemon leaves its socket behind.
    let sock = dir.file(&format!("qsd-{name}.sock"));
    let log = dir.file(&format!("qsd-{name}.log"));
    let child = Command::new("qemu-storage-daemon")
        .args([
            "--blockdev",
            &format!("driver=file,filename={img},node-name=f,read-only=on"),
            "--blockdev",
            "driver=qcow2,file=f,node-name=d,read-only=on",
            "--nbd-server",
            &format!("addr.type=unix,addr.path={sock}"),
            "--export",
            &format!("type=nbd,node-name=d,id=e,name=disk,bitmaps.0={name}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn qemu-storage-daemon");
    let mut guard = testkit::ChildGuard(child);
    let end = Instant::now() + Duration::from_secs(30);
    while !Path::new(&sock).exists() {
        assert!(
            guard.try_wait().expect("try_wait").is_none(),
            "qemu-storage-daemon exited: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(Instant::now() < end, "qemu-storage-daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let uri = format!("nbd+unix:///disk?socket={sock}");
    let out = testkit::output_within(
        Command::new("nbdinfo").args(["--json", &format!("--map=qemu:dirty-bitmap:{name}"), &uri]),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "nbdinfo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let map = json(&String::from_utf8_lossy(&out.stdout));
    map.as_array()
        .expect("an array of extents")
        .iter()
        .filter(|e| e["type"].as_u64() == Some(1))
        .map(|e| {
            (
                e["offset"].as_u64().expect("offset"),
                e["length"].as_u64().expect("length"),
            )
        })
        .collect()
}

fn tools() -> bool {
    have_curl()
        && ["qemu-img", "qemu-storage-daemon", "nbdinfo"]
            .iter()
            .all(|t| testkit::available(t, testkit::command(t)))
}

#[test]
fn the_granules_the_guest_writes_are_exactly_the_dirty_ones() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("bitmaps-guest");
    let img = dir.file("a.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    // A bitmap QEMU made: the VMM records into it from the start.
    qemu_img(&["bitmap", "--add", &img, "old"]);
    let disk = format!("path={img},id=d0");
    let mut vm = ApiVm::start(&dir, "wait_resize io_rounds=16 park", &["--disk", &disk]);
    vm.wait_for("WAIT resize");
    // The guest's block checks are done; from here it writes only the
    // last 4 KiB before the new end and 16 x 4 KiB at 8 MiB.
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"fine","granularity":512,"persistent":true}"#),
        204,
    );
    let out = vm.ch_remote(&[
        "disk-bitmap-add",
        "--disk",
        "d0",
        "--name",
        "coarse",
        "--persistent",
    ]);
    assert!(out.status.success(), "{out:?}");
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"memory"}"#),
        204,
    );
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"off","persistent":true,"disabled":true}"#),
        204,
    );
    vm.curl_ok(
        "PUT",
        "vm.resize-disk",
        Some(r#"{"id":"d0","desired_size":33554432}"#),
        204,
    );
    vm.wait_for("info parked");
    let counts: Vec<(String, u64, bool)> = live_bitmaps(&vm, "d0")
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_string(),
                b["count"].as_u64().unwrap(),
                b["recording"].as_bool().unwrap(),
            )
        })
        .collect();
    let wrote = 16 * 4096 + 4096;
    assert!(counts.contains(&("fine".into(), wrote, true)), "{counts:?}");
    assert!(
        counts.contains(&("coarse".into(), 2 * 65536, true)),
        "{counts:?}"
    );
    assert!(
        counts.contains(&("memory".into(), 2 * 65536, true)),
        "{counts:?}"
    );
    assert!(counts.contains(&("off".into(), 0, false)), "{counts:?}");
    vm.curl_ok("PUT", "vm.shutdown", None, 204);

    let names: Vec<(String, Vec<String>)> = image_bitmaps(&img);
    let auto = vec!["auto".to_string()];
    assert_eq!(
        names,
        vec![
            ("old".to_string(), auto.clone()),
            ("fine".to_string(), auto.clone()),
            ("coarse".to_string(), auto),
            ("off".to_string(), vec![]),
        ],
        "in-memory bitmaps are not stored; none is left in use"
    );
    qemu_check(&img);
    let end = 32 << 20;
    assert_eq!(
        dirty_extents_by_qsd(&dir, &img, "fine"),
        vec![(8 << 20, 16 * 4096), (end - 4096, 4096)]
    );
    assert_eq!(
        dirty_extents_by_qsd(&dir, &img, "coarse"),
        vec![(8 << 20, 65536), (end - 65536, 65536)]
    );
    assert_eq!(dirty_extents_by_qsd(&dir, &img, "off"), vec![]);
    let old = dirty_extents_by_qsd(&dir, &img, "old");
    assert!(
        old.contains(&(8 << 20, 65536)) && old.contains(&(end - 65536, 65536)),
        "{old:?}"
    );
    drop(vm);
}

#[test]
fn a_transaction_over_two_disks_is_all_or_nothing_and_errors_have_their_codes() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("bitmaps-transaction");
    let a = dir.file("a.qcow2");
    let b = dir.file("b.raw");
    qemu_img(&["create", "-q", "-f", "qcow2", &a, "16M"]);
    qemu_img(&["create", "-q", "-f", "raw", &b, "16M"]);
    let disk_a = format!("path={a},id=a");
    let disk_b = format!("path={b},id=b");
    let mut vm = ApiVm::start(
        &dir,
        "disks=2 park",
        &["--disk", &disk_a, "--disk", &disk_b],
    );
    vm.wait_for("info parked");
    let tx = |actions: &str| format!(r#"{{"actions":[{actions}]}}"#);
    vm.curl_ok(
        "PUT",
        "vm.disk-transaction",
        Some(&tx(
            r#"{"type":"bitmap-add","data":{"id":"a","name":"t","persistent":true}},
                   {"type":"bitmap-add","data":{"id":"b","name":"t"}}"#,
        )),
        204,
    );
    assert_eq!(live_names(&vm, "a"), ["t"]);
    assert_eq!(live_names(&vm, "b"), ["t"]);
    // The third action is refused: the first two are undone.
    let (status, text) = vm.curl(
        "PUT",
        "vm.disk-transaction",
        Some(&tx(r#"{"type":"bitmap-add","data":{"id":"a","name":"u"}},
                   {"type":"bitmap-remove","data":{"id":"b","name":"t"}},
                   {"type":"bitmap-add","data":{"id":"b","name":"v","granularity":1000}}"#)),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("action 2"), "{text}");
    assert_eq!(live_names(&vm, "a"), ["t"]);
    assert_eq!(live_names(&vm, "b"), ["t"]);
    let (status, text) = vm.curl(
        "PUT",
        "vm.disk-transaction",
        Some(&tx(
            r#"{"type":"bitmap-disable","data":{"id":"a","name":"t"}},
                   {"type":"bitmap-add","data":{"id":"b","name":"t"}}"#,
        )),
    );
    assert_eq!(status, 409, "{text}");
    assert_eq!(live_bitmaps(&vm, "a")[0]["recording"], true);

    for (endpoint, body, want) in [
        ("vm.disk-bitmap-add", r#"{"id":"a","name":"t"}"#, 409),
        ("vm.disk-bitmap-add", r#"{"id":"nope","name":"t"}"#, 404),
        (
            "vm.disk-bitmap-add",
            r#"{"id":"a","name":"g","granularity":256}"#,
            400,
        ),
        (
            "vm.disk-bitmap-add",
            r#"{"id":"a","name":"g","granularity":4294967296}"#,
            400,
        ),
        ("vm.disk-bitmap-add", r#"{"id":"a","name":""}"#, 400),
        (
            "vm.disk-bitmap-add",
            r#"{"id":"b","name":"p","persistent":true}"#,
            400,
        ),
        ("vm.disk-bitmap-remove", r#"{"id":"a","name":"nope"}"#, 404),
        ("vm.disk-bitmap-clear", r#"{"id":"nope","name":"t"}"#, 404),
        ("vm.disk-bitmap-enable", r#"{"id":"a","name":"nope"}"#, 404),
        (
            "vm.disk-bitmap-merge",
            r#"{"id":"a","name":"t","sources":["nope"]}"#,
            404,
        ),
        ("vm.disk-bitmap-disable", r#"{"id":"a","name":"t"}"#, 204),
        ("vm.disk-bitmap-enable", r#"{"id":"a","name":"t"}"#, 204),
        ("vm.disk-bitmap-clear", r#"{"id":"a","name":"t"}"#, 204),
    ] {
        let (status, text) = vm.curl("PUT", endpoint, Some(body));
        assert_eq!(status, want, "{endpoint} {body}: {text}");
    }

    let ok = |args: &[&str]| {
        let out = vm.ch_remote(args);
        assert!(out.status.success(), "ch-remote {args:?}: {out:?}");
    };
    ok(&[
        "disk-bitmap-add",
        "--disk",
        "a",
        "--name",
        "c",
        "--granularity",
        "4K",
    ]);
    ok(&[
        "disk-bitmap-merge",
        "--disk",
        "a",
        "--name",
        "c",
        "--sources",
        "t",
    ]);
    ok(&["disk-bitmap-disable", "--disk", "a", "--name", "c"]);
    ok(&["disk-bitmap-enable", "--disk", "a", "--name", "c"]);
    ok(&["disk-bitmap-clear", "--disk", "a", "--name", "c"]);
    let file = dir.file("tx.json");
    std::fs::write(
        &file,
        tx(r#"{"type":"bitmap-remove","data":{"id":"a","name":"c"}},
              {"type":"bitmap-remove","data":{"id":"b","name":"t"}}"#),
    )
    .unwrap();
    ok(&["disk-transaction", &file]);
    assert_eq!(live_names(&vm, "a"), ["t"]);
    assert!(live_names(&vm, "b").is_empty());
    let out = vm.ch_remote(&["disk-bitmap-remove", "--disk", "a", "--name", "c"]);
    assert!(!out.status.success(), "{out:?}");
    let (status, _) = vm.shutdown();
    assert!(status.success());
    assert_eq!(
        image_bitmaps(&a),
        vec![("t".to_string(), vec!["auto".to_string()])]
    );
    qemu_check(&a);
}

#[test]
fn a_killed_vmm_leaves_its_bitmaps_in_use_and_the_next_one_refuses_them() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("bitmaps-kill");
    let img = dir.file("a.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    qemu_img(&["bitmap", "--add", &img, "old"]);
    let disk = format!("path={img},id=d0");
    let mut vm = ApiVm::start(&dir, "park", &["--disk", &disk]);
    vm.wait_for("info parked");
    assert_eq!(
        image_bitmaps(&img),
        vec![(
            "old".to_string(),
            vec!["in-use".to_string(), "auto".to_string()]
        )],
        "marked in use while the VMM holds the image"
    );
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"new","persistent":true}"#),
        204,
    );
    // SIGKILL: nothing is written back. The killed process's file
    // locks go once the kernel has torn down its io_uring rings, which
    // it does on its own, tens of milliseconds after the process.
    drop(vm);
    e2e_support::wait_unlocked(&img);
    assert_eq!(
        image_bitmaps(&img),
        vec![(
            "old".to_string(),
            vec!["in-use".to_string(), "auto".to_string()]
        )]
    );
    qemu_check(&img);

    let dir2 = TempDir::new("bitmaps-kill-again");
    let mut vm = ApiVm::start(&dir2, "park", &["--disk", &disk]);
    vm.wait_for("info parked");
    let old = &live_bitmaps(&vm, "d0")[0];
    assert_eq!(
        (&old["name"], &old["inconsistent"], &old["recording"]),
        (&json(r#""old""#), &json("true"), &json("false"))
    );
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"next"}"#),
        204,
    );
    for (endpoint, body) in [
        (
            "vm.disk-bitmap-merge",
            r#"{"id":"d0","name":"next","sources":["old"]}"#,
        ),
        ("vm.disk-bitmap-enable", r#"{"id":"d0","name":"old"}"#),
        ("vm.disk-bitmap-clear", r#"{"id":"d0","name":"old"}"#),
    ] {
        let (status, text) = vm.curl("PUT", endpoint, Some(body));
        assert_eq!(status, 409, "{endpoint}: {text}");
        assert!(text.contains("inconsistent"), "{text}");
    }
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-remove",
        Some(r#"{"id":"d0","name":"old"}"#),
        204,
    );
    let (status, _) = vm.shutdown();
    assert!(status.success());
    assert_eq!(image_bitmaps(&img), vec![]);
    qemu_check(&img);
}

#[test]
fn remove_device_stores_the_bitmaps_of_a_hot_added_disk() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("bitmaps-hotplug");
    let boot = dir.file("boot.raw");
    qemu_img(&["create", "-q", "-f", "raw", &boot, "16M"]);
    let hot = dir.file("hot.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &hot, "16M"]);
    qemu_img(&["bitmap", "--add", &hot, "old"]);
    let disk = format!("path={boot}");
    let mut vm = ApiVm::start(&dir, "disks=1 wait_hotplug park", &["--disk", &disk]);
    vm.wait_for("WAIT hotplug");
    let body = format!(r#"{{"path":"{hot}","id":"hot"}}"#);
    vm.curl_ok("PUT", "vm.add-disk", Some(&body), 200);
    vm.wait_for("WAIT unplug");
    // The guest's block checks wrote the hot disk: "old" recorded them.
    let old = &live_bitmaps(&vm, "hot")[0];
    assert!(old["count"].as_u64().unwrap() > 0, "{old}");
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"hot","name":"new","persistent":true}"#),
        204,
    );
    vm.curl_ok("PUT", "vm.remove-device", Some(r#"{"id":"hot"}"#), 204);
    // Closed before the answer: stored, not in use.
    let auto = vec!["auto".to_string()];
    assert_eq!(
        image_bitmaps(&hot),
        vec![("old".to_string(), auto.clone()), ("new".to_string(), auto)]
    );
    qemu_check(&hot);
    assert!(!dirty_extents_by_qsd(&dir, &hot, "old").is_empty());
    assert_eq!(dirty_extents_by_qsd(&dir, &hot, "new"), vec![]);
    vm.wait_for("RESULT: PASS");
    let (status, _) = vm.shutdown();
    assert!(status.success());
}
