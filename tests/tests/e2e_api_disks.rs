//! End-to-end: operations on a running disk through the API, with the
//! test guest using it: resize (raw grows, and shrinks when the request
//! says `"shrink": true`; qcow2 only grows)
//! seen by the guest through the config change interrupt; an internal
//! snapshot taken while the guest writes, which qemu-img lists and which
//! holds a consistent prefix of the guest's writes; the live image's
//! `ch-img info` with its backing chain.

mod e2e_api_support;
mod e2e_support;

use e2e_api_support::{have_curl, ApiVm};
use e2e_support::check_clean;
use integration_tests::{json, qemu_create_overlay, qemu_img, qemu_io, TempDir};

fn resize(vm: &ApiVm, size: u64) -> (u16, String) {
    vm.curl(
        "PUT",
        "vm.resize-disk",
        Some(&format!(r#"{{"id":"_disk0","desired_size":{size}}}"#)),
    )
}

#[test]
fn raw_disk_grows_under_the_guest_then_shrinks() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-resize-raw");
    let img = dir.file("d.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 wait_resize park",
        &["--disk", &format!("path={img}")],
    );
    vm.wait_for("WAIT resize capacity=32768");
    assert_eq!(resize(&vm, 32 << 20).0, 204);
    let serial = vm.wait_for("reading at the new end fails");
    assert!(
        serial.contains(
            "capacity 32768 -> 65536 sectors, config generation 0 -> 1, 1 config interrupt(s)"
        ),
        "{serial}"
    );
    vm.wait_for("info parked");
    // Raw may shrink, but only when asked to in so many words (as
    // `ch-img resize --shrink`): a size below the current one alone is
    // refused, naming both sizes, and nothing changes.
    let (status, body) = resize(&vm, 24 << 20);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("33554432") && body.contains("25165824") && body.contains("shrink"),
        "{body}"
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    vm.curl_ok(
        "PUT",
        "vm.resize-disk",
        Some(r#"{"id":"_disk0","desired_size":25165824,"shrink":true}"#),
        204,
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 24 << 20);
    for bad in [0u64, 1000] {
        let (status, body) = resize(&vm, bad);
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("multiple of 512"), "{body}");
    }
    let (status, body) = vm.curl(
        "PUT",
        "vm.resize-disk",
        Some(r#"{"id":"nosuch","desired_size":1048576}"#),
    );
    assert_eq!(status, 404, "{body}");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 24 << 20);
    // The grown area the guest did not write reads as zeroes.
    qemu_io("raw", &img, &["read -P 0 16777216 8M"]);
}

#[test]
fn qcow2_disk_grows_under_the_guest_and_refuses_to_shrink() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-resize-qcow2");
    let img = dir.file("d.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 wait_resize park",
        &["--disk", &format!("path={img}")],
    );
    vm.wait_for("WAIT resize");
    assert_eq!(resize(&vm, 64 << 20).0, 204);
    vm.wait_for("capacity 32768 -> 131072 sectors");
    vm.wait_for("info parked");
    let (status, body) = resize(&vm, 32 << 20);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("only grow"), "{body}");
    // Beyond what the image can hold: a clear failure, the disk goes on.
    let (status, body) = resize(&vm, 1 << 62);
    assert_eq!(status, 400, "{body}");
    vm.curl_ok("GET", "vm.counters", None, 200);
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"_disk0"}"#), 200));
    assert_eq!(info[0]["virtual-size"], 64 << 20);
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&img);
    let v = json(&qemu_img(&["info", "--output=json", &img]));
    assert_eq!(v["virtual-size"], 64 << 20);
    // What the guest wrote at the new end is there.
    qemu_io(
        "qcow2",
        &img,
        &[&format!("read -P 0x5a {} 4k", (64 << 20) - 4096)],
    );
}

#[test]
fn snapshot_taken_while_the_guest_writes_holds_a_prefix_of_its_writes() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-snapshot");
    let img = dir.file("d.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    let rounds = 40u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={img},num_queues=2")],
    );
    vm.wait_for("ok   round 5\n");
    vm.curl_ok(
        "PUT",
        "vm.snapshot-disk",
        Some(r#"{"id":"_disk0","name":"mid"}"#),
        204,
    );
    let body = vm.curl_ok(
        "PUT",
        "vm.snapshot-disk",
        Some(r#"{"id":"_disk0","name":"mid"}"#),
        409,
    );
    assert!(body.contains("exists"), "{body}");
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    let list = qemu_img(&["snapshot", "-l", &img]);
    assert!(list.contains("mid"), "{list}");
    check_clean(&img);
    // The snapshot holds rounds 0..k whole and nothing after: it was
    // taken between two of the guest's requests.
    let snap = dir.file("mid.raw");
    qemu_img(&[
        "convert",
        "-l",
        "snapshot.name=mid",
        "-O",
        "raw",
        &img,
        &snap,
    ]);
    let data = std::fs::read(&snap).unwrap();
    let mut written = 0;
    for r in 0..rounds {
        let off = (8 << 20) + r as usize * 4096;
        let block = &data[off..off + 4096];
        let want = 0x20 + r as u8;
        if block.iter().all(|&b| b == want) {
            assert_eq!(
                written, r,
                "round {r} is in the snapshot but an earlier one is not"
            );
            written += 1;
        } else {
            assert!(
                block.iter().all(|&b| b == 0),
                "round {r} is half written in the snapshot"
            );
        }
    }
    assert!(
        (6..rounds).contains(&written),
        "{written} rounds in the snapshot"
    );
    // The live disk has them all.
    let cmds: Vec<String> = (0..rounds)
        .map(|r| format!("read -P {} {} 4k", 0x20 + r, (8 << 20) + r * 4096))
        .collect();
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io("qcow2", &img, &cmds);
}

#[test]
fn disk_info_reports_the_live_backing_chain() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-disk-info");
    let base = dir.file("base.qcow2");
    let top = dir.file("top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "16M"]);
    qemu_create_overlay(&top, &base, "qcow2");
    let raw = dir.file("r.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "8M"]);
    let mut vm = ApiVm::start(
        &dir,
        "disks=2 park",
        &[
            "--disk",
            &format!("path={top},id=top"),
            "--disk",
            &format!("path={raw}"),
        ],
    );
    vm.wait_for("info parked");
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"top"}"#), 200));
    let chain = info.as_array().expect("a list, one entry per layer");
    assert_eq!(chain.len(), 2, "{info}");
    assert_eq!(chain[0]["filename"], top.as_str());
    assert_eq!(chain[0]["format"], "qcow2");
    assert_eq!(chain[0]["full-backing-filename"], base.as_str());
    assert_eq!(chain[1]["filename"], base.as_str());
    assert_eq!(chain[1]["virtual-size"], 16 << 20);
    // What qemu-img says about the same chain.
    let q = json(&qemu_img(&[
        "info",
        "-U",
        "--backing-chain",
        "--output=json",
        &top,
    ]));
    for i in 0..2 {
        for key in ["virtual-size", "format", "cluster-size"] {
            assert_eq!(chain[i][key], q[i][key], "layer {i} {key}");
        }
    }
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"_disk0"}"#), 200));
    assert_eq!(info[0]["format"], "raw");
    assert_eq!(info[0]["virtual-size"], 8 << 20);
    vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"nosuch"}"#), 404);
    let body = vm.curl_ok(
        "PUT",
        "vm.snapshot-disk",
        Some(r#"{"id":"_disk0","name":"x"}"#),
        400,
    );
    assert!(body.contains("qcow2"), "{body}");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
}
