//! End-to-end: `vm.disk-snapshot-external` while the test guest writes
//! stamped rounds to every disk (`io_rounds=N rounds_all`: round r goes
//! to disk0, then disk1, ...). A group of a raw and a qcow2 disk switches
//! to new qcow2 overlays at one instant; the guest keeps writing and
//! reads every round back through the overlays; after shutdown qemu-img
//! finds every image clean, each overlay's chain is overlay -> base, each
//! base holds exactly the rounds written before the instant (the same
//! instant on both disks: crash-consistent) and each overlay exactly the
//! rest. A disk whose qcow2 image has an NBD backing file snapshots the
//! same way (its overlay over the qcow2, over the export). Bad requests
//! (a disk being removed among them) get their status and leave no file
//! behind.
//! The VMM runs with its default seccomp filter throughout.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;

use e2e_api_support::{
    curl_raw, guest_view, have_curl, rounds_held_with, ApiVm, ROUND_BASE, ROUND_LEN,
};
use e2e_support::check_clean;
use integration_tests::{json, qemu_create_overlay, qemu_img, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

/// The overlays' cluster size (qcow2's default).
const CLUSTER: u64 = 64 << 10;

/// The guest's stamp of round `r` on disk `k` (tests/guest api_checks.c).
fn stamp(k: u64, r: u64) -> u8 {
    (0x20 + (r + 0x31 * k) % 0xC0) as u8
}

/// How many rounds of disk `k` `data` holds: a prefix of whole rounds,
/// the rest zeroes (never a round half there, never a gap).
fn rounds_held(data: &[u8], k: u64, rounds: u64, what: &str) -> u64 {
    rounds_held_with(data, rounds, what, |r| stamp(k, r))
}

/// The guest ranges the top image of `image` itself holds (depth 0 in
/// `qemu-img map`), as (start, length).
fn top_ranges(image: &str) -> Vec<(u64, u64)> {
    let map = json(&qemu_img(&["map", "--output=json", image]));
    map.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["depth"] == 0 && e["data"] == true)
        .map(|e| (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect()
}

fn in_top(ranges: &[(u64, u64)], off: u64) -> bool {
    ranges.iter().any(|&(s, l)| off >= s && off < s + l)
}

/// `qemu-img info --backing-chain`: the filenames, top first.
fn chain(image: &str) -> Vec<String> {
    let v = json(&qemu_img(&[
        "info",
        "--backing-chain",
        "--output=json",
        image,
    ]));
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["filename"].as_str().unwrap().to_string())
        .collect()
}

fn canonical(p: &str) -> String {
    Path::new(p).canonicalize().unwrap().display().to_string()
}

#[test]
fn a_group_of_raw_and_qcow2_disks_switches_at_one_instant_under_writes() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-snap-ext");
    let raw = dir.file("a.raw");
    let qcow = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
    qemu_img(&["create", "-q", "-f", "qcow2", &qcow, "16M"]);
    let (raw_ov, qcow_ov) = (dir.file("a.ov.qcow2"), dir.file("b.ov.qcow2"));
    let events = dir.file("events.json");
    let rounds = 60u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=2 io_rounds={rounds} rounds_all park"),
        &[
            "--disk",
            &format!("path={raw},id=ra"),
            "--disk",
            &format!("path={qcow},id=qc,num_queues=2"),
            "--event-monitor",
            &format!("path={events}"),
        ],
    );
    vm.wait_for("ok   round 5\n");
    let out = vm.ch_remote(&[
        "disk-snapshot-external",
        "--disk",
        &format!("id=ra,overlay={raw_ov}"),
        "--disk",
        &format!("id=qc,overlay={qcow_ov}"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The live disk's chain is the overlay over its old image, which
    // other tools may now read (a reader's lock only).
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"qc"}"#), 200));
    assert_eq!(info[0]["filename"], qcow_ov.as_str(), "{info}");
    assert_eq!(info[0]["backing-filename"], canonical(&qcow), "{info}");
    assert_eq!(info[1]["filename"], canonical(&qcow), "{info}");
    qemu_img(&["info", &qcow]);
    let config = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(config["config"]["disks"][0]["path"], raw_ov.as_str());
    vm.wait_for(&format!("ok   all {rounds} rounds read back on 2 disks"));
    vm.wait_for("RESULT: PASS");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("2 disks switched in"),
        "the parked time is logged: {stderr}"
    );
    let ev = std::fs::read_to_string(&events).unwrap();
    for id in ["ra", "qc"] {
        assert!(
            ev.contains("\"external-snapshotted\"") && ev.contains(&format!("\"{id}\"")),
            "{ev}"
        );
    }
    for image in [&raw_ov, &qcow_ov, &qcow] {
        check_clean(image);
    }
    assert_eq!(chain(&raw_ov), [raw_ov.clone(), canonical(&raw)]);
    assert_eq!(chain(&qcow_ov), [qcow_ov.clone(), canonical(&qcow)]);
    // Each base holds the rounds before the instant, whole; the overlay
    // holds every later one and none of the earlier.
    let mut split = Vec::new();
    for (k, base, overlay) in [(0u64, &raw, &raw_ov), (1, &qcow, &qcow_ov)] {
        let before = rounds_held(
            &guest_view(&dir, base, &format!("base{k}")),
            k,
            rounds,
            base,
        );
        let all = rounds_held(
            &guest_view(&dir, overlay, &format!("ov{k}")),
            k,
            rounds,
            overlay,
        );
        assert_eq!(all, rounds, "{overlay} shows every round");
        // The overlay's own clusters (64 KiB: 16 rounds each) are the
        // ones a later round was written to, and only those.
        let top = top_ranges(overlay);
        let per_cluster = CLUSTER / ROUND_LEN;
        for c in 0..rounds.div_ceil(per_cluster) {
            let last = ((c + 1) * per_cluster).min(rounds) - 1;
            assert_eq!(
                in_top(&top, ROUND_BASE + c * CLUSTER),
                last >= before,
                "disk {k}: cluster of rounds {}..={last} (base holds {before} rounds) \
                 in the overlay's own clusters",
                c * per_cluster
            );
        }
        split.push(before);
    }
    // Round 5 was done before the request; the guest writes disk0's
    // round r, then disk1's: one instant leaves disk1 equal to disk0 or
    // one round behind.
    assert!(split[0] >= 6 && split[0] < rounds, "{split:?}");
    assert!(
        split[1] == split[0] || split[1] + 1 == split[0],
        "not one instant: {split:?}"
    );
}

#[test]
fn a_qcow2_disk_over_an_nbd_backing_file_snapshots() {
    // qemu-storage-daemon serves several connections: vm.disk-info
    // opens the chain a second time.
    if !have_curl() || !testkit::has_command(NbdServer::tool(Kind::QemuStorageDaemon)) {
        return;
    }
    let dir = TempDir::new("api-snap-ext-nbd");
    let base = dir.file("base.raw");
    qemu_img(&["create", "-q", "-f", "raw", &base, "16M"]);
    let server = NbdServer::start(
        Kind::QemuStorageDaemon,
        Path::new(&base),
        "raw",
        &dir.path().join("nbd.sock"),
        false,
    );
    let top = dir.file("top.qcow2");
    qemu_create_overlay(&top, &server.uri, "raw");
    let ov = dir.file("top.ov.qcow2");
    let rounds = 30u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={top},id=t")],
    );
    vm.wait_for("ok   round 3\n");
    vm.curl_ok(
        "PUT",
        "vm.disk-snapshot-external",
        Some(&format!(r#"{{"disks":[{{"id":"t","overlay":"{ov}"}}]}}"#)),
        204,
    );
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"t"}"#), 200));
    let names: Vec<&str> = info
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["filename"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{info}");
    assert_eq!(
        names[..2],
        [ov.as_str(), canonical(&top).as_str()],
        "{info}"
    );
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&ov);
    check_clean(&top);
    let before = rounds_held(&guest_view(&dir, &top, "top"), 0, rounds, &top);
    assert!((4..rounds).contains(&before), "{before}");
    assert_eq!(
        rounds_held(&guest_view(&dir, &ov, "ov"), 0, rounds, &ov),
        rounds
    );
    drop(server);
}

#[test]
fn bad_requests_get_their_status_and_leave_no_file() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-snap-ext-bad");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "16M"]);
    let img = dir.file("d.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &base, "-F", "qcow2", &img,
    ]);
    let other = dir.file("e.raw");
    qemu_img(&["create", "-q", "-f", "raw", &other, "16M"]);
    let ro = dir.file("ro.raw");
    qemu_img(&["create", "-q", "-f", "raw", &ro, "16M"]);
    let taken = dir.file("taken.qcow2");
    std::fs::write(&taken, b"someone's file").unwrap();
    let leaving = dir.file("leaving.raw");
    qemu_img(&["create", "-q", "-f", "raw", &leaving, "16M"]);
    let mut vm = ApiVm::start(
        &dir,
        "disks=4 park",
        &[
            "--disk",
            &format!("path={img},id=d"),
            "--disk",
            &format!("path={other},id=e"),
            "--disk",
            &format!("path={ro},id=ro,readonly=on"),
            "--disk",
            &format!("path={leaving},id=leaving"),
        ],
    );
    vm.wait_for("info parked");
    // A disk being removed (this guest never ejects: the VMM waits 10 s
    // for it) is busy: 409.
    let socket = vm.socket.clone();
    let removal = std::thread::spawn(move || {
        curl_raw(
            &socket,
            "PUT",
            "http://localhost/api/v1/vm.remove-device",
            Some(r#"{"id":"leaving"}"#),
        )
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let busy = format!(
        r#"{{"disks":[{{"id":"leaving","overlay":"{}"}}]}}"#,
        dir.file("leaving.ov")
    );
    let (status, text) = vm.curl("PUT", "vm.disk-snapshot-external", Some(&busy));
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("being removed"), "{text}");
    assert!(!Path::new(&dir.file("leaving.ov")).exists());
    assert_eq!(removal.join().unwrap().0, 204);
    let files_before = listing(&dir);
    let new = dir.file("new.qcow2");
    let new2 = dir.file("new2.qcow2");
    let body = |pairs: &[(&str, &str)]| {
        let list: Vec<String> = pairs
            .iter()
            .map(|(id, ov)| format!(r#"{{"id":"{id}","overlay":"{ov}"}}"#))
            .collect();
        format!(r#"{{"disks":[{}]}}"#, list.join(","))
    };
    let cases: Vec<(String, u16, &str)> = vec![
        (body(&[("d", &taken)]), 409, "exists already"),
        (body(&[("d", &img)]), 409, "is the disk's running image"),
        (body(&[("d", &base)]), 409, "is a backing file"),
        (body(&[("nope", &new)]), 404, "no disk with id 'nope'"),
        (body(&[("d", &new), ("d", &new2)]), 400, "listed twice"),
        (body(&[("d", &new), ("e", &new)]), 400, "named twice"),
        (body(&[("ro", &new)]), 400, "read-only"),
        (body(&[]), 400, "empty"),
        // The first overlay is made, the second refused: the first is
        // removed again and neither disk switched.
        (body(&[("e", &new), ("d", &taken)]), 409, "exists already"),
        (r#"{"disks":[{"id":"d"}]}"#.to_string(), 400, "overlay"),
    ];
    for (request, want, says) in &cases {
        let (status, text) = vm.curl("PUT", "vm.disk-snapshot-external", Some(request));
        assert_eq!(status, *want, "{request}: {text}");
        assert!(text.contains(says), "{request}: {text}");
        assert_eq!(listing(&dir), files_before, "{request} left a file");
    }
    assert_eq!(std::fs::read(&taken).unwrap(), b"someone's file");
    // ch-remote refuses a malformed --disk before asking.
    let out = vm.ch_remote(&["disk-snapshot-external", "--disk", "id=d"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("overlay="),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The disks still run on their images, and a good request works.
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"e"}"#), 200));
    assert_eq!(info[0]["filename"], other.as_str(), "{info}");
    vm.curl_ok(
        "PUT",
        "vm.disk-snapshot-external",
        Some(&body(&[("d", &new), ("e", &new2)])),
        204,
    );
    // The same overlay again: it is now the running image.
    let (status, text) = vm.curl(
        "PUT",
        "vm.disk-snapshot-external",
        Some(&body(&[("d", &new)])),
    );
    assert_eq!(status, 409, "{text}");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("SIGSYS"), "{stderr}");
    for image in [&new, &new2, &img] {
        check_clean(image);
    }
    assert_eq!(chain(&new), [new.clone(), canonical(&img), base.clone()]);
}

/// The folder's file names, sorted.
fn listing(dir: &TempDir) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".sock") && n != "serial.log")
        .collect();
    names.sort();
    names
}
