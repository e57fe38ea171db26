//! End-to-end: `vm.disk-mirror` to an NBD export (the disk moves to
//! another machine's storage; here a qemu-storage-daemon on a Unix
//! socket) while the test guest writes stamped rounds, in background and
//! in write-blocking mode (the export then holds the source plus every
//! round), and a target that
//! fills up mid-job (nbdkit's error filter answering ENOSPC once a
//! trigger file exists): the job fails with the reason, the guest sees
//! no error and the disk stays on its source, and a later mirror of the
//! same disk works; likewise an export that goes away mid-job (nbdkit
//! killed), in both modes. And a mirror that runs through a `vm.reboot`
//! (the disks are carried over) completes after it.
//!
//! The VMM runs with its default seccomp filter throughout.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_api_support::{
    assert_source_plus_rounds, have_curl, job, stamp, wait_job, ApiVm, ROUND_BASE, ROUND_LEN,
};
use integration_tests::{json, qemu_img, qemu_io, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

const MIB: u64 = 1 << 20;

#[test]
fn a_disk_moves_to_an_nbd_export_under_writes() {
    move_to_nbd("background");
}

#[test]
fn a_disk_moves_to_an_nbd_export_under_writes_write_blocking() {
    move_to_nbd("write-blocking");
}

/// Mirrors the guest's disk to an NBD export in `mode` while the guest
/// writes, completes, and checks the export holds every write.
fn move_to_nbd(mode: &str) {
    if !have_curl() || !testkit::has_command(NbdServer::tool(Kind::QemuStorageDaemon)) {
        return;
    }
    let dir = TempDir::new(&format!("mirror-nbd-{mode}"));
    let source = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &source, "64M"]);
    qemu_io("qcow2", &source, &["write -P 0x5a 12M 1M"]);
    let remote = dir.file("remote.raw");
    qemu_img(&["create", "-q", "-f", "raw", &remote, "64M"]);
    let server = NbdServer::start(
        Kind::QemuStorageDaemon,
        Path::new(&remote),
        "raw",
        &dir.path().join("nbd.sock"),
        true,
    );
    let rounds = 150u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={source},id=d0")],
    );
    vm.wait_for("ok   round 5\n");
    let out = vm.ch_remote(&[
        "disk-mirror",
        "--disk",
        "d0",
        "--target",
        &server.uri,
        "--mode",
        mode,
        "--wait",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    vm.curl_ok(
        "PUT",
        "vm.disk-job-complete",
        Some(r#"{"job":"job-1"}"#),
        204,
    );
    assert_eq!(job(&vm, "job-1")["state"], "completed");
    let info = json(&vm.curl_ok("GET", "vm.info", None, 200));
    assert_eq!(
        info["config"]["disks"][0]["path"],
        server.uri.as_str(),
        "{info}"
    );
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
    drop(server);
    let data = std::fs::read(&remote).unwrap();
    for r in 0..rounds {
        let off = (ROUND_BASE + r * ROUND_LEN) as usize;
        assert!(
            data[off..off + ROUND_LEN as usize]
                .iter()
                .all(|&b| b == stamp(r)),
            "round {r} is not on the export"
        );
    }
    let at = (12 * MIB) as usize;
    assert!(data[at..at + MIB as usize].iter().all(|&b| b == 0x5a));
    // The source is closed clean.
    e2e_support::check_clean(&source);
    // The export is the source at the switch plus the rounds after it.
    assert_source_plus_rounds(&dir, &source, &remote, rounds);
}

#[test]
fn a_target_that_fills_up_fails_the_job_and_never_the_guest() {
    if !have_curl() || !testkit::has_command("nbdkit") {
        return;
    }
    let dir = TempDir::new("mirror-enospc");
    let source = dir.file("src.raw");
    qemu_img(&["create", "-q", "-f", "raw", &source, "64M"]);
    qemu_io("raw", &source, &["write -P 0x5a 16M 32M"]);
    let sock = dir.file("full.sock");
    let trigger = dir.file("full-now");
    // Every write fails with ENOSPC while the trigger file exists.
    let server = nbdkit(
        &sock,
        &[
            "--filter=error",
            "memory",
            "64M",
            "error-pwrite=ENOSPC",
            "error-zero=ENOSPC",
            "error-rate=100%",
            &format!("error-file={trigger}"),
        ],
    );
    let vm = guest_writing_rounds(&dir, &source);
    // 32 MiB at 8 MiB/s: the export fills up half-way.
    let uri = format!("nbd+unix:///?socket={sock}");
    let body = format!(r#"{{"id":"d0","target":"{uri}","speed":8388608}}"#);
    vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200);
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&trigger, b"").unwrap();
    let local = job_1_failed_and_the_source_serves_on(&vm, &dir, &source, "writing the target");
    vm.curl_ok(
        "PUT",
        "vm.disk-job-complete",
        Some(r#"{"job":"job-2"}"#),
        204,
    );
    guest_saw_no_error(vm);
    e2e_support::check_clean(&local);
    drop(server);
}

/// Rounds the fault tests' guest writes and reads back.
const ROUNDS: u64 = 150;

/// The test guest on `source` as disk d0, writing [`ROUNDS`] stamped
/// rounds; returns once it is in its third.
fn guest_writing_rounds(dir: &TempDir, source: &str) -> ApiVm {
    let mut vm = ApiVm::start(
        dir,
        &format!("disks=1 io_rounds={ROUNDS} park"),
        &["--disk", &format!("path={source},id=d0")],
    );
    vm.wait_for("ok   round 3\n");
    vm
}

/// After job-1 failed mid-copy: its error names `reason`, the disk is
/// still on `source`, and a new mirror (job-2, to a local qcow2) reaches
/// ready. Returns that target's path.
fn job_1_failed_and_the_source_serves_on(
    vm: &ApiVm,
    dir: &TempDir,
    source: &str,
    reason: &str,
) -> String {
    let failed = wait_job(vm, "job-1", "failed");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains(reason), "{failed}");
    assert!(failed["bytes_done"].as_u64().unwrap() > 0, "{failed}");
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], source, "{info}");
    let local = dir.file("local.qcow2");
    let body = format!(r#"{{"id":"d0","target":"{local}"}}"#);
    let answer = json(&vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200));
    assert_eq!(answer["job"], "job-2", "{answer}");
    wait_job(vm, "job-2", "ready");
    local
}

/// The guest read every one of its [`ROUNDS`] back (it never saw an
/// error) and the VMM shut down cleanly under its seccomp filter.
fn guest_saw_no_error(mut vm: ApiVm) {
    vm.wait_for(&format!("ok   all {ROUNDS} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
}

/// Starts `nbdkit -f -U SOCK ARGS` and waits for its socket.
fn nbdkit(sock: &str, args: &[&str]) -> testkit::ChildGuard {
    let server = testkit::ChildGuard(
        Command::new("nbdkit")
            .args(["--exit-with-parent", "-f", "-U", sock])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit"),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !Path::new(sock).exists() {
        assert!(Instant::now() < end, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

#[test]
fn an_nbd_target_that_goes_away_fails_the_job_and_never_the_guest() {
    target_goes_away("background");
}

#[test]
fn an_nbd_target_that_goes_away_fails_a_write_blocking_job_and_never_the_guest() {
    target_goes_away("write-blocking");
}

/// Mirrors to an nbdkit export, kills the export mid-job while the guest
/// writes: the job fails naming the target, the guest sees no error, the
/// disk stays on its source (clean at the end) and a new mirror works.
fn target_goes_away(mode: &str) {
    if !have_curl() || !testkit::has_command("nbdkit") {
        return;
    }
    let dir = TempDir::new(&format!("mirror-gone-{mode}"));
    let source = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &source, "64M"]);
    qemu_io("qcow2", &source, &["write -P 0x5a 16M 32M"]);
    let sock = dir.file("gone.sock");
    let mut server = nbdkit(&sock, &["memory", "64M"]);
    let vm = guest_writing_rounds(&dir, &source);
    // 32 MiB at 8 MiB/s: the export goes away part-way.
    let uri = format!("nbd+unix:///?socket={sock}");
    let body =
        format!(r#"{{"id":"d0","target":"{uri}","format":"raw","mode":"{mode}","speed":8388608}}"#);
    vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200);
    std::thread::sleep(Duration::from_millis(1500));
    server.kill().expect("kill nbdkit");
    server.wait().expect("reap nbdkit");
    let local = job_1_failed_and_the_source_serves_on(&vm, &dir, &source, "target");
    vm.curl_ok("PUT", "vm.disk-job-cancel", Some(r#"{"job":"job-2"}"#), 204);
    guest_saw_no_error(vm);
    e2e_support::check_clean(&source);
    e2e_support::check_clean(&local);
}

#[test]
fn a_mirror_goes_on_across_a_reboot_and_completes_after_it() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("mirror-reboot");
    let source = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &source, "64M"]);
    qemu_io("qcow2", &source, &["write -P 0x5a 16M 16M"]);
    let target = dir.file("dst.qcow2");
    let mut vm = ApiVm::start(
        &dir,
        "disks=1 park",
        &["--disk", &format!("path={source},id=d0")],
    );
    vm.wait_for("info parked");
    // 16 MiB at 4 MiB/s: running through the reboot.
    let body = format!(r#"{{"id":"d0","target":"{target}","speed":4194304}}"#);
    vm.curl_ok("PUT", "vm.disk-mirror", Some(&body), 200);
    vm.curl_ok("PUT", "vm.reboot", None, 204);
    let after = job(&vm, "job-1");
    assert!(
        after["state"] == "running" || after["state"] == "ready",
        "{after}"
    );
    vm.wait_for_count("info parked", 2);
    // The rebooted guest wrote its block checks again: the job follows.
    wait_job(&vm, "job-1", "ready");
    vm.curl_ok(
        "PUT",
        "vm.disk-job-complete",
        Some(r#"{"job":"job-1"}"#),
        204,
    );
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], target.as_str(), "{info}");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    e2e_support::check_clean(&target);
    e2e_support::check_clean(&source);
    let out = integration_tests::qemu_img_status(&["compare", &source, &target]);
    // The guest wrote nothing after the switch but the block checks'
    // last flush: the target is the source at the switch.
    assert!(
        out.status.success(),
        "qemu-img compare: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}
