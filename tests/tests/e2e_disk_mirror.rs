//! End-to-end: `vm.disk-mirror` while the test guest writes stamped
//! rounds (`io_rounds=N`: round r writes 4 KiB of its stamp at 8 MiB +
//! r * 4 KiB, reads it back; at the end every round is read back again).
//!
//! - a raw disk with data outside the rounds mirrors to a new qcow2
//!   target and a qcow2 disk to a new raw target: `ch-remote disk-mirror
//!   --wait` returns at ready, `disk-job-complete --wait` switches the
//!   disk (with the raw target, the VM paused around the complete and
//!   `qemu-img compare` finds the target equal to the closed source); the
//!   guest keeps writing and reads every round back through the target;
//!   after shutdown the target passes `qemu-img check`, holds every
//!   round and the old data, is sparse where the disk never held data,
//!   and the source is closed clean and unlocked; after shutdown the
//!   target is byte for byte the closed source plus every round;
//! - the same in write-blocking mode (completed under writes), and a
//!   write-blocking cancel at ready: a consistent copy, no longer
//!   written, not locked;
//! - cancel before ready (a rate limit keeps the job running) stops the
//!   job and removes the target it made; cancel at ready leaves the disk
//!   on its source and the target a consistent copy (with the VM paused
//!   around the cancel, `qemu-img compare` finds it equal to the disk;
//!   after the guest went on, a prefix of whole rounds);
//! - bad requests get their status and leave no file behind; `sync=top`
//!   gives a target over the same backing file;
//! - a VMM killed mid-mirror leaves the source clean.
//!
//! The VMM runs with its default seccomp filter throughout.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;
use std::time::Duration;

use e2e_api_support::{
    assert_source_plus_rounds, guest_view, have_curl, job, locked, rounds_held, wait_job, ApiVm,
};
use e2e_support::check_clean;
use integration_tests::{json, qemu_img, qemu_io, TempDir};

const MIB: u64 = 1 << 20;

/// Bytes `qemu-img map` says hold data in `start..start + len`.
fn data_bytes(image: &str, start: u64, len: u64) -> u64 {
    let map = json(&qemu_img(&["map", "-U", "--output=json", image]));
    map.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| {
            let (s, l) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            (s + l).min(start + len).saturating_sub(s.max(start))
        })
        .sum()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Mirrors the guest's disk (`source`, format `fmt`) to a new `target`
/// of `target_fmt` in `mode` while the guest writes, completes, and
/// checks it all.
fn mirror_and_complete(fmt: &str, target_fmt: &str, mode: &str) {
    let dir = TempDir::new(&format!("mirror-{fmt}-{target_fmt}-{mode}"));
    let source = dir.file(&format!("src.{fmt}"));
    qemu_img(&["create", "-q", "-f", fmt, &source, "64M"]);
    // Data the guest never touches (its block checks write the first
    // 8 MiB, its rounds the next 600 KiB).
    qemu_io(
        fmt,
        &source,
        &["write -P 0x5a 12M 1M", "write -P 0x6b 40M 512K"],
    );
    let target = dir.file(&format!("dst.{target_fmt}"));
    let rounds = 150u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={source},id=d0,num_queues=2")],
    );
    vm.wait_for("ok   round 5\n");
    let out = vm.ch_remote(&[
        "disk-mirror",
        "--disk",
        "d0",
        "--target",
        &target,
        "--format",
        target_fmt,
        "--mode",
        mode,
        "--wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(r#"{"job":"job-1"}"#), "{text}");
    assert!(text.contains(r#""state":"ready""#), "{text}");
    // The guest is still writing rounds.
    let serial = vm.serial_text();
    assert!(
        !serial.contains(&format!("ok   all {rounds} rounds")),
        "the guest finished before the mirror was ready: make it write longer"
    );
    let ready = job(&vm, "job-1");
    assert_eq!(ready["type"], "mirror", "{ready}");
    assert_eq!(ready["disk"], "d0", "{ready}");
    assert!(
        ready["bytes_done"].as_u64().unwrap() >= MIB + MIB / 2,
        "{ready}"
    );
    // A raw target is read as the VMM wrote it: the VM paused around the
    // complete, it is the closed source byte for byte (a qcow2 target's
    // newest metadata may still be in the VMM's cache; that direction
    // completes under writes, as write-blocking mirrors do).
    let paused = target_fmt == "raw" && mode == "background";
    if paused {
        vm.curl_ok("PUT", "vm.pause", None, 204);
    }
    let out = vm.ch_remote(&["disk-job-complete", "job-1", "--wait"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""state":"completed""#),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    if paused {
        let out = integration_tests::qemu_img_status(&[
            "compare", "-U", "-f", fmt, "-F", "raw", &source, &target,
        ]);
        assert!(
            out.status.success(),
            "qemu-img compare: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        vm.curl_ok("PUT", "vm.resume", None, 204);
    }
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], target.as_str(), "{info}");
    // The source is closed: another tool may write it now.
    assert!(!locked(&source), "the source is still locked");
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
    if target_fmt == "qcow2" {
        check_clean(&target);
    }
    if fmt == "qcow2" {
        check_clean(&source);
    }
    let view = guest_view(&dir, &target, "target");
    assert_eq!(rounds_held(&view, rounds, &target), rounds);
    let at = (12 * MIB) as usize;
    assert!(view[at..at + MIB as usize].iter().all(|&b| b == 0x5a));
    let at = (40 * MIB) as usize;
    assert!(view[at..at + (MIB / 2) as usize].iter().all(|&b| b == 0x6b));
    // Sparse: nothing was ever written in 16M..40M nor past 41M.
    assert_eq!(data_bytes(&target, 16 * MIB, 24 * MIB), 0);
    assert_eq!(data_bytes(&target, 41 * MIB, 23 * MIB), 0);
    // The source holds the rounds written before the switch, whole.
    let before = rounds_held(&guest_view(&dir, &source, "source"), rounds, &source);
    assert!(before > 5 && before < rounds, "{before}");
    // The target is the source at the switch plus the rounds after it.
    assert_source_plus_rounds(&dir, &source, &target, rounds);
}

#[test]
fn a_raw_disk_mirrors_to_a_new_qcow2_and_switches_under_writes() {
    if !have_curl() {
        return;
    }
    mirror_and_complete("raw", "qcow2", "background");
}

#[test]
fn a_qcow2_disk_mirrors_to_a_new_raw_and_switches_under_writes() {
    if !have_curl() {
        return;
    }
    mirror_and_complete("qcow2", "raw", "background");
}

#[test]
fn write_blocking_mirrors_a_raw_disk_to_a_new_qcow2_and_switches_under_writes() {
    if !have_curl() {
        return;
    }
    mirror_and_complete("raw", "qcow2", "write-blocking");
}

#[test]
fn write_blocking_mirrors_a_qcow2_disk_to_a_new_raw_and_switches_under_writes() {
    if !have_curl() {
        return;
    }
    mirror_and_complete("qcow2", "raw", "write-blocking");
}

/// Cancel at ready in write-blocking mode: the disk stays on its source,
/// the target is a consistent copy of that instant (the VM paused around
/// the cancel: `qemu-img compare` finds it equal to the disk), the
/// guest's writes are no longer sent to it, and the VMM lets go of it
/// (its lock) at once.
#[test]
fn write_blocking_cancel_at_ready_keeps_a_copy_and_lets_go_of_it() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("mirror-wb-cancel");
    let source = dir.file("src.raw");
    qemu_img(&["create", "-q", "-f", "raw", &source, "64M"]);
    qemu_io("raw", &source, &["write -P 0x5a 20M 16M"]);
    let rounds = 150u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={source},id=d0,num_queues=2")],
    );
    vm.wait_for("ok   round 3\n");
    let copy = dir.file("copy.raw");
    let body = format!(r#"{{"id":"d0","target":"{copy}","format":"raw","mode":"write-blocking"}}"#);
    let answer = json(&vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200));
    assert_eq!(answer["job"], "job-1", "{answer}");
    wait_job(&vm, "job-1", "ready");
    // The guest writes more rounds; the job stays ready.
    let serial = vm.serial_text();
    let seen = serial.matches("ok   round ").count();
    vm.wait_for_count("ok   round ", seen + 3);
    assert_eq!(job(&vm, "job-1")["state"], "ready");
    vm.curl_ok("PUT", "vm.pause", None, 204);
    vm.curl_ok("PUT", "vm.disk-job-cancel", Some(r#"{"job":"job-1"}"#), 204);
    assert_eq!(job(&vm, "job-1")["state"], "cancelled");
    let out = integration_tests::qemu_img_status(&[
        "compare", "-U", "-f", "raw", "-F", "raw", &source, &copy,
    ]);
    assert!(
        out.status.success(),
        "qemu-img compare: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let at_cancel = guest_view(&dir, &copy, "at-cancel");
    vm.curl_ok("PUT", "vm.resume", None, 204);
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    // The queues dropped their handles on the copy at the resume: no
    // lock is left on it, and the rounds after the cancel are not there.
    assert!(!locked(&copy), "the VMM still holds the copy");
    assert_eq!(guest_view(&dir, &copy, "after"), at_cancel);
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], source.as_str(), "{info}");
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
    let copied = rounds_held(&at_cancel, rounds, &copy);
    assert!(copied > 3 && copied < rounds, "{copied}");
    assert_eq!(
        rounds_held(&guest_view(&dir, &source, "source"), rounds, &source),
        rounds
    );
    let at = (20 * MIB) as usize;
    assert!(at_cancel[at..at + (16 * MIB) as usize]
        .iter()
        .all(|&b| b == 0x5a));
}

#[test]
fn cancel_before_ready_removes_the_target_and_at_ready_keeps_a_copy() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("mirror-cancel");
    // Raw: qemu-img reads the running disk as the guest left it (a
    // qcow2 image's newest metadata may still be in the VMM's cache).
    let source = dir.file("src.raw");
    qemu_img(&["create", "-q", "-f", "raw", &source, "64M"]);
    qemu_io("raw", &source, &["write -P 0x5a 20M 16M"]);
    let rounds = 150u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={source},id=d0")],
    );
    vm.wait_for("ok   round 3\n");
    // 16 MiB at 1 MiB/s: still running when cancelled.
    let slow = dir.file("slow.qcow2");
    let body = format!(r#"{{"id":"d0","target":"{slow}","speed":1048576}}"#);
    let answer = json(&vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200));
    assert_eq!(answer["job"], "job-1", "{answer}");
    std::thread::sleep(Duration::from_millis(300));
    let running = job(&vm, "job-1");
    assert_eq!(running["state"], "running", "{running}");
    assert_eq!(running["speed"], 1048576, "{running}");
    // Complete before ready: 409; the job goes on.
    let (status, text) = vm.curl("PUT", "vm.disk-job-complete", Some(r#"{"job":"job-1"}"#));
    assert_eq!(status, 409, "{text}");
    // A second job on the busy disk: 409.
    let other = dir.file("other.qcow2");
    let (status, text) = vm.curl(
        "PUT",
        "vm.disk-mirror",
        Some(&format!(r#"{{"id":"d0","target":"{other}"}}"#)),
    );
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("job-1"), "{text}");
    assert!(!Path::new(&other).exists());
    let out = vm.ch_remote(&["disk-job-cancel", "job-1", "--wait"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cancelled = job(&vm, "job-1");
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert!(
        cancelled["bytes_done"].as_u64() < cancelled["bytes_total"].as_u64(),
        "{cancelled}"
    );
    assert!(!Path::new(&slow).exists(), "the target the job made stays");
    // Cancel at ready: the disk stays on its source, the target is a
    // consistent copy of that instant.
    let copy = dir.file("copy.raw");
    let body = format!(r#"{{"id":"d0","target":"{copy}","format":"raw"}}"#);
    let answer = json(&vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200));
    assert_eq!(answer["job"], "job-2", "{answer}");
    wait_job(&vm, "job-2", "ready");
    // With the VM paused the source stands still: the copy left by the
    // cancel is the disk, byte for byte.
    vm.curl_ok("PUT", "vm.pause", None, 204);
    vm.curl_ok("PUT", "vm.disk-job-cancel", Some(r#"{"job":"job-2"}"#), 204);
    assert_eq!(job(&vm, "job-2")["state"], "cancelled");
    let out = integration_tests::qemu_img_status(&[
        "compare", "-U", "-f", "raw", "-F", "raw", &source, &copy,
    ]);
    assert!(
        out.status.success(),
        "qemu-img compare: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    vm.curl_ok("PUT", "vm.resume", None, 204);
    let (status, text) = vm.curl("PUT", "vm.disk-job-cancel", Some(r#"{"job":"job-2"}"#));
    assert_eq!(status, 409, "{text}");
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], source.as_str(), "{info}");
    let copied = rounds_held(&guest_view(&dir, &copy, "copy"), rounds, &copy);
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
    let all = guest_view(&dir, &source, "source");
    assert_eq!(rounds_held(&all, rounds, &source), rounds);
    assert!(copied > 3 && copied < rounds, "{copied}");
    let view = guest_view(&dir, &copy, "copy");
    let at = (20 * MIB) as usize;
    assert!(view[at..at + (16 * MIB) as usize]
        .iter()
        .all(|&b| b == 0x5a));
}

#[test]
fn bad_requests_get_their_status_and_leave_no_file() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("mirror-bad");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "16M"]);
    let img = dir.file("d.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &base, "-F", "qcow2", &img,
    ]);
    let ro = dir.file("ro.raw");
    qemu_img(&["create", "-q", "-f", "raw", &ro, "16M"]);
    let small = dir.file("small.raw");
    qemu_img(&["create", "-q", "-f", "raw", &small, "8M"]);
    let taken = dir.file("taken.qcow2");
    std::fs::write(&taken, b"someone's file").unwrap();
    let mut vm = ApiVm::start(
        &dir,
        "disks=2 park",
        &[
            "--disk",
            &format!("path={img},id=d"),
            "--disk",
            &format!("path={ro},id=ro,readonly=on"),
        ],
    );
    vm.wait_for("info parked");
    let files_before = listing(&dir);
    let new = dir.file("new.qcow2");
    let cases: Vec<(String, u16, &str)> = vec![
        (
            format!(r#"{{"id":"d","target":"{taken}"}}"#),
            409,
            "exists already",
        ),
        (
            format!(r#"{{"id":"d","target":"{img}"}}"#),
            409,
            "running image",
        ),
        (
            format!(r#"{{"id":"d","target":"{img}","existing":true}}"#),
            409,
            "running image",
        ),
        (
            format!(r#"{{"id":"d","target":"{base}","existing":true}}"#),
            409,
            "backing file",
        ),
        (
            format!(r#"{{"id":"d","target":"{small}","existing":true,"format":"raw"}}"#),
            400,
            "must be equal",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","existing":true}}"#),
            400,
            "does not exist",
        ),
        (
            format!(r#"{{"id":"nope","target":"{new}"}}"#),
            404,
            "no disk with id 'nope'",
        ),
        (
            format!(r#"{{"id":"ro","target":"{new}"}}"#),
            400,
            "read-only",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","sync":"none"}}"#),
            400,
            "sync",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","mode":"fast"}}"#),
            400,
            "mode",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","format":"vmdk"}}"#),
            400,
            "qcow2 or raw",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","granularity":1000}}"#),
            400,
            "granularity",
        ),
        (
            format!(r#"{{"id":"d","target":"{new}","sync":"top","format":"raw"}}"#),
            400,
            "needs a qcow2 target",
        ),
        (r#"{"id":"d"}"#.to_string(), 400, "target"),
    ];
    for (request, want, says) in &cases {
        let (status, text) = vm.curl("PUT", "vm.disk-mirror", Some(request));
        assert_eq!(status, *want, "{request}: {text}");
        assert!(text.contains(says), "{request}: {text}");
        assert_eq!(listing(&dir), files_before, "{request} left a file");
    }
    assert_eq!(std::fs::read(&taken).unwrap(), b"someone's file");
    for endpoint in ["vm.disk-job-complete", "vm.disk-job-cancel"] {
        let (status, text) = vm.curl("PUT", endpoint, Some(r#"{"job":"job-9"}"#));
        assert_eq!(status, 404, "{endpoint}: {text}");
    }
    assert_eq!(vm.curl_ok("GET", "vm.disk-jobs", None, 200), "[]");
    // sync=top over the backing chain: the target gets the same backing
    // file and only the top's data.
    let top = dir.file("top.qcow2");
    let answer = json(&vm.curl_ok(
        "PUT",
        "vm.disk-mirror",
        Some(&format!(r#"{{"id":"d","target":"{top}","sync":"top"}}"#)),
        200,
    ));
    let id = answer["job"].as_str().unwrap().to_string();
    wait_job(&vm, &id, "ready");
    vm.curl_ok(
        "PUT",
        "vm.disk-job-complete",
        Some(&format!(r#"{{"job":"{id}"}}"#)),
        204,
    );
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d"}"#), 200));
    assert_eq!(info[0]["filename"], top.as_str(), "{info}");
    assert!(
        info[1]["filename"]
            .as_str()
            .unwrap()
            .ends_with("/base.qcow2"),
        "{info}"
    );
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
    check_clean(&top);
    check_clean(&img);
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

#[test]
fn a_vmm_killed_mid_mirror_leaves_the_source_clean() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("mirror-kill");
    let source = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &source, "64M"]);
    qemu_io("qcow2", &source, &["write -P 0x5a 16M 32M"]);
    let target = dir.file("dst.qcow2");
    let rounds = 150u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={source},id=d0")],
    );
    vm.wait_for("ok   round 3\n");
    // 32 MiB at 8 MiB/s: killed half-way.
    let body = format!(r#"{{"id":"d0","target":"{target}","speed":8388608}}"#);
    vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200);
    std::thread::sleep(Duration::from_millis(1500));
    let running = job(&vm, "job-1");
    assert_eq!(running["state"], "running", "{running}");
    // SIGKILL: nothing is closed.
    drop(vm);
    e2e_support::wait_unlocked(&source);
    check_clean(&source);
    // The partial target is a qcow2 image without errors (its metadata
    // as far as it was written; docs/block-jobs.md says what it holds).
    let out = integration_tests::qemu_img_status(&["check", &target]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("No errors"),
        "qemu-img check {target}: {text}"
    );
}
