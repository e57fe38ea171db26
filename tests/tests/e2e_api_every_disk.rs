//! End-to-end: every API endpoint, through every `ch-remote` verb, under
//! the default (enforcing) seccomp filter, with every kind of disk: a
//! local raw image, a qcow2 image, a qcow2 overlay whose backing file is
//! an NBD export, a raw disk over NBD and a vhost-user disk that
//! `ch-storage-daemon` serves. The test guest uses them all, then one
//! hot-added overlay over NBD (its queues open their own connections:
//! the server is multi-conn); then each verb runs on each disk, each
//! kind is hot-added and removed again, and the vhost-user disk is
//! removed; dirty bitmaps are added to each (persistent where it can
//! be) and some removed in one transaction; each in-VMM one is served
//! by a point-in-time backup (the vhost-user one refuses); then the
//! in-VMM ones get
//! external snapshots as one group (their bitmaps move to the new tops).
//! The VMM must stay up
//! through all of it (no SIGSYS: NBD sockets are opened on the NBD
//! connector thread), answer each request with the status the docs give
//! (a caller's mistake is 4xx), and every one of its threads runs under
//! a filter. `vm.shutdown` leaves every local image closed and unlocked
//! when it answers.

mod e2e_api_support;
mod e2e_support;

use std::process::Output;

use e2e_api_support::{have_curl, ApiVm};
use e2e_support::vhost_user_daemon::Daemon;
use e2e_support::{check_clean, create_lazy_qcow2};
use integration_tests::{json, qemu_img, qemu_img_status, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

/// SIGSYS's number on x86-64 (signal(7)).
const SIGSYS: u32 = 31;

/// The status line `ch-remote` prints for a failed request, and its
/// exit code.
fn refused(out: &Output, status: u16) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("({status})")), "want {status}: {err}");
    err
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every thread of the VMM runs under a seccomp filter; the NBD client
/// threads under their own (two programs: clone3 refused, then the
/// allow-list), the NBD export thread under its own (three: file opening
/// refused too).
/// The process catches SIGSYS (the report of a call a filter traps).
fn every_thread_is_filtered(pid: u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .expect("SigCgt");
    assert!(caught & (1 << (SIGSYS - 1)) != 0, "{status}");
    let mut nbd_threads = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        assert!(status.contains("Seccomp:\t2"), "{}: {status}", comm.trim());
        let comm = comm.trim();
        if ["nbd-export", "nbd-accept", "nbd-conn"].contains(&comm) {
            // The export threads: file opening refused too.
            assert!(status.contains("Seccomp_filters:\t3"), "{comm}: {status}");
        } else if comm.starts_with("nbd-") {
            assert!(status.contains("Seccomp_filters:\t2"), "{comm}: {status}");
            nbd_threads += 1;
        }
    }
    // The connector and at least one reply thread per boot export.
    assert!(nbd_threads >= 3, "{nbd_threads} NBD threads");
}

#[test]
fn every_verb_with_every_kind_of_disk_under_the_default_filter() {
    if !have_curl()
        || !testkit::has_command("qemu-storage-daemon")
        || !testkit::has_command("qemu-nbd")
        || !testkit::has_command("nbdcopy")
    {
        return;
    }
    let dir = TempDir::new("api-every-disk");
    let raw = dir.file("raw.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
    let qcow2 = dir.file("d.qcow2");
    create_lazy_qcow2(&qcow2, "16M");
    // The backing export (read-only) and the raw disk's export, both
    // multi-conn; a third export, qemu-nbd's, to hot-add.
    let base = dir.file("base.raw");
    qemu_img(&["create", "-q", "-f", "raw", &base, "16M"]);
    let base_server = NbdServer::start(
        Kind::QemuStorageDaemon,
        std::path::Path::new(&base),
        "raw",
        &dir.path().join("base.sock"),
        false,
    );
    let overlay = dir.file("overlay.qcow2");
    let hot_overlay = dir.file("hot-overlay.qcow2");
    for o in [&overlay, &hot_overlay] {
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            &base_server.uri,
            "-F",
            "raw",
            o,
        ]);
    }
    let nbd_img = dir.file("nbd.raw");
    qemu_img(&["create", "-q", "-f", "raw", &nbd_img, "16M"]);
    let nbd_server = NbdServer::start(
        Kind::QemuStorageDaemon,
        std::path::Path::new(&nbd_img),
        "raw",
        &dir.path().join("nbd.sock"),
        true,
    );
    let hot_nbd_img = dir.file("hot-nbd.raw");
    qemu_img(&["create", "-q", "-f", "raw", &hot_nbd_img, "16M"]);
    let hot_nbd_server = NbdServer::start(
        Kind::QemuNbd,
        std::path::Path::new(&hot_nbd_img),
        "raw",
        &dir.path().join("hot-nbd.sock"),
        true,
    );
    let vu_img = dir.file("vu.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &vu_img, "16M"]);
    let vu_socket = dir.file("vu.sock");
    let daemon = Daemon::start(&dir, &vu_img, &vu_socket, 1);

    let disks = [
        format!("path={raw},id=raw"),
        format!("path={qcow2},id=qcow2"),
        format!("path={overlay},id=overlay,num_queues=2"),
        format!("path={},id=nbd,num_queues=2", nbd_server.uri),
        format!("vhost_user=on,socket={vu_socket},id=vu"),
    ];
    let mut args = vec!["--memory", "size=128M,shared=on"];
    for d in &disks {
        args.extend(["--disk", d.as_str()]);
    }
    let mut vm = ApiVm::start(&dir, "disks=5 wait_hotplug park", &args);
    vm.wait_for("WAIT hotplug");
    let pid = json(&ok(&vm.ch_remote(&["ping"])))["pid"]
        .as_u64()
        .expect("pid");
    every_thread_is_filtered(pid);

    // A hot-added overlay over NBD, driven by the guest on two queues.
    let hot = format!("path={hot_overlay},id=hot,num_queues=2");
    let added = json(&ok(&vm.ch_remote(&["add-disk", &hot])));
    assert_eq!(added["id"], "hot");
    vm.wait_for("hot-added disk5 passed the block checks");
    vm.wait_for("WAIT unplug");
    let info = json(&ok(&vm.ch_remote(&["disk-info", "hot"])));
    assert_eq!(info[1]["filename"], base_server.uri.as_str(), "{info}");
    ok(&vm.ch_remote(&["remove-device", "hot"]));
    vm.wait_for("RESULT: PASS");
    check_clean(&hot_overlay);

    // Every verb on every disk.
    assert_eq!(json(&ok(&vm.ch_remote(&["info"])))["state"], "Running");
    let counters = json(&ok(&vm.ch_remote(&["counters"])));
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        assert!(
            counters[id]["write_ops"].as_u64().unwrap() > 0,
            "{id}: {counters}"
        );
    }
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        let info = json(&ok(&vm.ch_remote(&["disk-info", id])));
        assert_eq!(info[0]["virtual-size"], 16 << 20, "{id}: {info}");
    }
    let overlay_info = json(&ok(&vm.ch_remote(&["disk-info", "overlay"])));
    assert_eq!(
        overlay_info[0]["backing-filename"],
        base_server.uri.as_str()
    );
    assert_eq!(overlay_info[1]["format"], "raw");
    let err = refused(&vm.ch_remote(&["disk-info", "vu"]), 400);
    assert!(err.contains("vhost-user"), "{err}");
    for id in ["raw", "qcow2", "overlay"] {
        ok(&vm.ch_remote(&["resize-disk", "--disk", id, "--size", "20M"]));
    }
    // What an NBD export cannot do is the caller's mistake, said so.
    let err = refused(
        &vm.ch_remote(&["resize-disk", "--disk", "nbd", "--size", "20M"]),
        400,
    );
    assert!(err.contains("resiz"), "{err}");
    refused(
        &vm.ch_remote(&["resize-disk", "--disk", "vu", "--size", "20M"]),
        400,
    );
    // Shrinking needs --shrink.
    let err = refused(
        &vm.ch_remote(&["resize-disk", "--disk", "raw", "--size", "8M"]),
        400,
    );
    assert!(
        err.contains(&(20u64 << 20).to_string()) && err.contains(&(8u64 << 20).to_string()),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 20 << 20);
    ok(&vm.ch_remote(&["resize-disk", "--disk", "raw", "--size", "8M", "--shrink"]));
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 8 << 20);
    let err = refused(
        &vm.ch_remote(&["resize-disk", "--disk", "qcow2", "--size", "8M", "--shrink"]),
        400,
    );
    assert!(err.contains("only grow"), "{err}");
    for id in ["qcow2", "overlay"] {
        ok(&vm.ch_remote(&["snapshot-disk", "--disk", id, "--name", "s1"]));
        refused(
            &vm.ch_remote(&["snapshot-disk", "--disk", id, "--name", "s1"]),
            409,
        );
    }
    for id in ["raw", "nbd", "vu"] {
        refused(
            &vm.ch_remote(&["snapshot-disk", "--disk", id, "--name", "s1"]),
            400,
        );
    }
    // Dirty bitmaps: in memory on every local kind, persistent where the
    // top image is a writable qcow2, refused for the vhost-user disk.
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        ok(&vm.ch_remote(&["disk-bitmap-add", "--disk", id, "--name", "b"]));
    }
    for id in ["qcow2", "overlay"] {
        ok(&vm.ch_remote(&[
            "disk-bitmap-add",
            "--disk",
            id,
            "--name",
            "p",
            "--persistent",
        ]));
    }
    for id in ["raw", "nbd"] {
        refused(
            &vm.ch_remote(&[
                "disk-bitmap-add",
                "--disk",
                id,
                "--name",
                "p",
                "--persistent",
            ]),
            400,
        );
    }
    let err = refused(
        &vm.ch_remote(&["disk-bitmap-add", "--disk", "vu", "--name", "b"]),
        400,
    );
    assert!(err.contains("vhost-user"), "{err}");
    let removals: Vec<String> = ["raw", "qcow2", "overlay", "nbd"]
        .iter()
        .map(|id| format!(r#"{{"type":"bitmap-remove","data":{{"id":"{id}","name":"b"}}}}"#))
        .collect();
    let tx = dir.file("tx.json");
    std::fs::write(&tx, format!(r#"{{"actions":[{}]}}"#, removals.join(","))).unwrap();
    ok(&vm.ch_remote(&["disk-transaction", &tx]));
    // Point-in-time backups: served on every in-VMM kind (the export's
    // size is the disk's), refused for the vhost-user disk.
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        let sock = dir.file(&format!("{id}.backup.sock"));
        let scratch = dir.file(&format!("{id}.scratch.qcow2"));
        let begun = json(&ok(&vm.ch_remote(&[
            "disk-backup-begin",
            "--disk",
            id,
            "--addr",
            &format!("unix:{sock}"),
            "--scratch",
            &scratch,
        ])));
        let uri = begun["uri"].as_str().expect("uri");
        let export = json(&qemu_img(&["info", "--output=json", uri]));
        let disk = json(&ok(&vm.ch_remote(&["disk-info", id])));
        assert_eq!(export["virtual-size"], disk[0]["virtual-size"], "{id}");
        let copy = dir.file(&format!("{id}.backup.raw"));
        let read = testkit::output_within(
            std::process::Command::new("nbdcopy").args([uri, copy.as_str()]),
            testkit::COMMAND_LIMIT,
        );
        assert!(read.status.success(), "{id}: {read:?}");
        std::fs::remove_file(&copy).unwrap();
        let ended = json(&ok(&vm.ch_remote(&["disk-backup-end", "--disk", id])));
        assert_eq!(ended["status"], "completed", "{id}: {ended}");
        assert!(!std::path::Path::new(&scratch).exists());
    }
    let err = refused(
        &vm.ch_remote(&[
            "disk-backup-begin",
            "--disk",
            "vu",
            "--addr",
            &format!("unix:{}", dir.file("vu.backup.sock")),
            "--scratch",
            &dir.file("vu.scratch.qcow2"),
        ]),
        400,
    );
    assert!(err.contains("vhost-user"), "{err}");
    assert!(!std::path::Path::new(&dir.file("vu.scratch.qcow2")).exists());
    // External snapshots: every in-VMM kind in one group, at one
    // instant; the vhost-user disk is its backend's to snapshot.
    let ext = |id: &str| dir.file(&format!("{id}.ext.qcow2"));
    let specs: Vec<String> = ["raw", "qcow2", "overlay", "nbd"]
        .iter()
        .map(|id| format!("id={id},overlay={}", ext(id)))
        .collect();
    let mut verb = vec!["disk-snapshot-external"];
    for s in &specs {
        verb.extend(["--disk", s.as_str()]);
    }
    ok(&vm.ch_remote(&verb));
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        let info = json(&ok(&vm.ch_remote(&["disk-info", id])));
        assert_eq!(info[0]["filename"], ext(id).as_str(), "{id}: {info}");
    }
    let vu_ext = format!("id=vu,overlay={}", ext("vu"));
    let err = refused(
        &vm.ch_remote(&["disk-snapshot-external", "--disk", &vu_ext]),
        400,
    );
    assert!(err.contains("vhost-user"), "{err}");
    assert!(!std::path::Path::new(&ext("vu")).exists());
    ok(&vm.ch_remote(&["pause"]));
    ok(&vm.ch_remote(&["resume"]));
    every_thread_is_filtered(pid);

    // Each kind hot-added (the guest does not look), read, and removed.
    let hot_disks = [
        ("h-raw", format!("path={}", dir.file("raw.raw"))),
        ("h-qcow2", format!("path={}", dir.file("d.qcow2"))),
        ("h-overlay", format!("path={hot_overlay},num_queues=2")),
        ("h-nbd", format!("path={}", hot_nbd_server.uri)),
    ];
    // The boot disks' own images are theirs already.
    for (id, spec) in &hot_disks[..2] {
        refused(
            &vm.ch_remote(&["add-disk", &format!("{spec},id={id}")]),
            409,
        );
    }
    let (h_raw, h_qcow2) = (dir.file("h.raw"), dir.file("h.qcow2"));
    qemu_img(&["create", "-q", "-f", "raw", &h_raw, "8M"]);
    create_lazy_qcow2(&h_qcow2, "8M");
    let hot_disks = [
        ("h-raw", format!("path={h_raw}")),
        ("h-qcow2", format!("path={h_qcow2}")),
        hot_disks[2].clone(),
        hot_disks[3].clone(),
    ];
    for (id, spec) in &hot_disks {
        let added = json(&ok(&vm.ch_remote(&["add-disk", &format!("{spec},id={id}")])));
        assert_eq!(added["id"], *id);
        let info = json(&ok(&vm.ch_remote(&["disk-info", id])));
        assert!(info[0]["virtual-size"].as_u64().unwrap() > 0, "{info}");
    }
    let body = format!(r#"{{"vhost_user":true,"vhost_socket":"{vu_socket}"}}"#);
    let (status, text) = vm.curl("PUT", "vm.add-disk", Some(&body));
    assert_eq!(status, 400, "{text}");
    let err = refused(
        &vm.ch_remote(&["add-disk", "path=/nonexistent/x.qcow2"]),
        400,
    );
    assert!(err.contains("/nonexistent/x.qcow2"), "{err}");
    let counters = json(&ok(&vm.ch_remote(&["counters"])));
    assert!(counters["h-nbd"].is_object(), "{counters}");
    ok(&vm.ch_remote(&["pause"]));
    for (id, _) in &hot_disks {
        ok(&vm.ch_remote(&["remove-device", id]));
    }
    // The vhost-user disk leaves the bus like any other.
    ok(&vm.ch_remote(&["remove-device", "vu"]));
    ok(&vm.ch_remote(&["resume"]));
    check_clean(&h_qcow2);
    check_clean(&hot_overlay);
    assert!(vm.running());

    // vm.shutdown: every local image is closed and unlocked at the
    // answer (qemu-img, which takes the locks, opens each at once).
    ok(&vm.ch_remote(&["shutdown"]));
    for img in [&raw, &qcow2, &overlay] {
        let out = qemu_img_status(&["info", img]);
        assert!(
            out.status.success(),
            "{img} still locked after vm.shutdown: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    check_clean(&qcow2);
    check_clean(&overlay);
    for id in ["raw", "qcow2", "overlay", "nbd"] {
        check_clean(&ext(id));
    }
    // The persistent bitmaps moved to the new tops at the external
    // snapshot and were stored there at the close, not in use; the old
    // tops no longer hold them.
    for img in [ext("qcow2"), ext("overlay")] {
        let info = json(&qemu_img(&["info", "--output=json", &img]));
        let bitmaps = &info["format-specific"]["data"]["bitmaps"];
        assert_eq!(bitmaps[0]["name"], "p", "{img}: {info}");
        assert_eq!(
            bitmaps[0]["flags"],
            serde_json::json!(["auto"]),
            "{img}: {info}"
        );
    }
    for img in [&qcow2, &overlay] {
        let info = json(&qemu_img(&["info", "--output=json", img]));
        let bitmaps = &info["format-specific"]["data"]["bitmaps"];
        assert!(bitmaps.is_null(), "{img}: {info}");
    }
    let info = json(&ok(&vm.ch_remote(&["info"])));
    assert_eq!(info["state"], "Created");
    // The final counts stay readable.
    let last = json(&ok(&vm.ch_remote(&["counters"])));
    assert!(last["raw"]["write_ops"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(
        info["config"]["disks"].as_array().unwrap().len(),
        4,
        "{info}"
    );
    refused(&vm.ch_remote(&["pause"]), 500);
    refused(&vm.ch_remote(&["disk-info", "raw"]), 500);
    ok(&vm.ch_remote(&["ping"]));
    ok(&vm.ch_remote(&["shutdown-vmm"]));
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("seccomp"), "{stderr}");
    daemon.stop();
    check_clean(&vu_img);
    let snaps = qemu_img(&["snapshot", "-l", &qcow2]);
    assert!(snaps.contains("s1"), "{snaps}");
}
