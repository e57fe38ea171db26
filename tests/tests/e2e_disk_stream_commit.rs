//! End-to-end: `vm.disk-stream` and `vm.disk-commit` while the test
//! guest writes stamped rounds (`io_rounds=N`: round r writes 4 KiB of
//! its stamp at 8 MiB + r * 4 KiB and reads it back; at the end every
//! round is read back again).
//!
//! The chain is base.qcow2 (0x5a at 12M..13M) <- mid.qcow2 (0x6b at
//! 20M..20.5M, 0x7c over 12.5M..12.5625M, a zero cluster at 12.75M) <-
//! top.qcow2 (0x8d at 30M..30.25M), the guest running on top. Each case
//! checks, after shutdown: `qemu-img check` clean, `qemu-img info
//! --backing-chain` the expected chain, `qemu-img compare` of the disk
//! against the expected image (the chain's data as it was, the guest's
//! own scratch area as it left it, every round), and the guest's own
//! read-back of every round; while the VM runs, that the files dropped
//! from the chain are unlocked.
//!
//! - stream down to base, and with no base (top then stands alone);
//! - commit of mid into base (top is relinked to base);
//! - active commit: `--wait` returns at ready, complete switches the
//!   disk onto base; and cancel at ready, which leaves the disk on top
//!   and base a consistent superset;
//! - refusals (400, 409) that write nothing.
//!
//! The VMM runs with its default seccomp filter throughout.

mod e2e_api_support;
mod e2e_support;

use e2e_api_support::{
    guest_view, have_curl, job, locked, rounds_held, stamp, ApiVm, ROUND_BASE, ROUND_LEN,
};
use e2e_support::check_clean;
use integration_tests::{json, qemu_create_overlay, qemu_img, qemu_img_status, qemu_io, TempDir};

const ROUNDS: u64 = 150;

struct Chain {
    dir: TempDir,
    base: String,
    mid: String,
    top: String,
    /// The guest's view of top before the VM ran.
    before: Vec<u8>,
}

fn chain(name: &str) -> Chain {
    let dir = TempDir::new(name);
    let (base, mid, top) = (
        dir.file("base.qcow2"),
        dir.file("mid.qcow2"),
        dir.file("top.qcow2"),
    );
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "64M"]);
    qemu_io("qcow2", &base, &["write -P 0x5a 12M 1M"]);
    qemu_create_overlay(&mid, "base.qcow2", "qcow2");
    qemu_io(
        "qcow2",
        &mid,
        &[
            "write -P 0x6b 20M 512K",
            "write -P 0x7c 12800K 64K",
            "write -z 13056K 64K",
        ],
    );
    qemu_create_overlay(&top, "mid.qcow2", "qcow2");
    qemu_io("qcow2", &top, &["write -P 0x8d 30M 256K"]);
    let before = guest_view(&dir, &top, "before");
    Chain {
        dir,
        base,
        mid,
        top,
        before,
    }
}

/// The image's guest view as bytes (qemu-img convert to raw).
/// `qemu-img compare` of `image` against the expected disk: the chain's
/// data as it was, the guest's scratch area (the first 8 MiB, which the
/// guest checks itself) as `image` holds it, and the first `rounds`
/// rounds.
fn compare_expected(c: &Chain, image: &str, rounds: u64) {
    let now = guest_view(&c.dir, image, "now");
    let mut expect = c.before.clone();
    let scratch = ROUND_BASE as usize;
    expect[..scratch].copy_from_slice(&now[..scratch]);
    for r in 0..rounds {
        let off = (ROUND_BASE + r * ROUND_LEN) as usize;
        expect[off..off + ROUND_LEN as usize].fill(stamp(r));
    }
    let path = c.dir.file("expected.raw");
    std::fs::write(&path, &expect).unwrap();
    let out = qemu_img_status(&["compare", "-U", "-F", "raw", image, &path]);
    assert!(
        out.status.success(),
        "qemu-img compare {image}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The chain `qemu-img info --backing-chain` shows, as file names.
fn backing_chain(image: &str) -> Vec<String> {
    let info = json(&qemu_img(&[
        "info",
        "-U",
        "--backing-chain",
        "--output=json",
        image,
    ]));
    info.as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let f = i["filename"].as_str().unwrap();
            std::path::Path::new(f)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Whether the VMM holds `image` (even as a backing file, which
/// readers may share): a writer (`qemu-io`, which opens the file alone
/// read-write, as raw so that its backing file is not opened) is
/// refused its lock.
fn held(image: &str) -> bool {
    let out = integration_tests::run("qemu-io", &["-f", "raw", "-c", "read 0 512", image]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("lock"),
        "qemu-io {image}: {err}"
    );
    !out.status.success()
}

fn start(c: &Chain) -> ApiVm {
    let mut vm = ApiVm::start(
        &c.dir,
        &format!("disks=1 io_rounds={ROUNDS} park"),
        &["--disk", &format!("path={},id=d0,num_queues=2", c.top)],
    );
    vm.wait_for("ok   round 5\n");
    vm
}

fn ok(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The guest reads every round back; the VMM ends cleanly.
fn finish(mut vm: ApiVm) {
    vm.wait_for(&format!("ok   all {ROUNDS} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("SIGSYS"), "{err}");
}

fn still_writing(vm: &ApiVm) {
    assert!(
        !vm.serial_text()
            .contains(&format!("ok   all {ROUNDS} rounds")),
        "the guest finished before the job ended: make it write longer"
    );
}

fn stream(with_base: bool) {
    let c = chain(if with_base {
        "stream-base"
    } else {
        "stream-all"
    });
    let vm = start(&c);
    let mut args = vec!["disk-stream", "--disk", "d0", "--wait"];
    if with_base {
        args.extend(["--base", &c.base]);
    }
    let text = ok(&vm.ch_remote(&args));
    assert!(text.contains(r#"{"job":"job-1"}"#), "{text}");
    assert!(text.contains(r#""state":"completed""#), "{text}");
    assert!(text.contains(r#""type":"stream""#), "{text}");
    still_writing(&vm);
    // mid left the chain: closed and unlocked; base stays in use or not.
    assert!(!held(&c.mid), "mid is still held");
    assert_eq!(held(&c.base), with_base);
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert_eq!(info[0]["filename"], c.top.as_str(), "{info}");
    finish(vm);
    check_clean(&c.top);
    let want: Vec<&str> = if with_base {
        vec!["top.qcow2", "base.qcow2"]
    } else {
        vec!["top.qcow2"]
    };
    assert_eq!(backing_chain(&c.top), want);
    compare_expected(&c, &c.top, ROUNDS);
    assert_eq!(
        rounds_held(&guest_view(&c.dir, &c.top, "top"), ROUNDS, &c.top),
        ROUNDS
    );
}

#[test]
fn a_stream_down_to_base_drops_the_middle_layer_under_writes() {
    if have_curl() {
        stream(true);
    }
}

#[test]
fn a_stream_of_the_whole_chain_leaves_the_image_standing_alone() {
    if have_curl() {
        stream(false);
    }
}

#[test]
fn a_commit_of_the_middle_layer_relinks_top_to_base_under_writes() {
    if !have_curl() {
        return;
    }
    let c = chain("commit-mid");
    let mid_before = guest_view(&c.dir, &c.mid, "mid-before");
    let vm = start(&c);
    let text = ok(&vm.ch_remote(&[
        "disk-commit",
        "--disk",
        "d0",
        "--top",
        &c.mid,
        "--base",
        &c.base,
        "--wait",
    ]));
    assert!(text.contains(r#""state":"completed""#), "{text}");
    assert!(text.contains(r#""type":"commit""#), "{text}");
    still_writing(&vm);
    assert!(!held(&c.mid), "mid is still held");
    assert!(held(&c.base), "base is not held");
    finish(vm);
    check_clean(&c.top);
    check_clean(&c.base);
    assert_eq!(backing_chain(&c.top), ["top.qcow2", "base.qcow2"]);
    compare_expected(&c, &c.top, ROUNDS);
    // base now reads as base + mid did; top's own data is not in it.
    let base_now = guest_view(&c.dir, &c.base, "base-now");
    assert!(base_now == mid_before, "base is not what mid read as");
}

fn active_commit(complete: bool) {
    let c = chain(if complete {
        "commit-active"
    } else {
        "commit-cancel"
    });
    let vm = start(&c);
    let text = ok(&vm.ch_remote(&["disk-commit", "--disk", "d0", "--base", &c.base, "--wait"]));
    assert!(text.contains(r#""state":"ready""#), "{text}");
    still_writing(&vm);
    if complete {
        let text = ok(&vm.ch_remote(&["disk-job-complete", "job-1", "--wait"]));
        assert!(text.contains(r#""state":"completed""#), "{text}");
        let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
        assert_eq!(info[0]["filename"], c.base.as_str(), "{info}");
        // top and mid left the chain.
        assert!(!locked(&c.top), "top is still locked");
        assert!(!held(&c.mid), "mid is still held");
    } else {
        let text = ok(&vm.ch_remote(&["disk-job-cancel", "job-1", "--wait"]));
        assert!(text.contains(r#""state":"cancelled""#), "{text}");
        let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
        assert_eq!(info[0]["filename"], c.top.as_str(), "{info}");
    }
    finish(vm);
    if complete {
        check_clean(&c.base);
        assert_eq!(backing_chain(&c.base), ["base.qcow2"]);
        compare_expected(&c, &c.base, ROUNDS);
        assert_eq!(
            rounds_held(&guest_view(&c.dir, &c.base, "base"), ROUNDS, &c.base),
            ROUNDS
        );
    } else {
        check_clean(&c.top);
        check_clean(&c.base);
        assert_eq!(
            backing_chain(&c.top),
            ["top.qcow2", "mid.qcow2", "base.qcow2"]
        );
        compare_expected(&c, &c.top, ROUNDS);
        // base: the disk as it was at the cancel (a prefix of rounds),
        // the chain's data all there.
        let b = guest_view(&c.dir, &c.base, "base");
        let held = rounds_held(&b, ROUNDS, &c.base);
        assert!((5..=ROUNDS).contains(&held), "{held}");
        compare_expected(&c, &c.base, held);
    }
}

#[test]
fn an_active_commit_reaches_ready_and_complete_runs_the_disk_on_base() {
    if have_curl() {
        active_commit(true);
    }
}

#[test]
fn an_active_commit_cancelled_at_ready_stays_on_top() {
    if have_curl() {
        active_commit(false);
    }
}

#[test]
fn bad_requests_are_refused_before_anything_is_written() {
    if !have_curl() {
        return;
    }
    let c = chain("stream-bad");
    let raw = c.dir.file("plain.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
    let sums = |c: &Chain| -> Vec<Vec<u8>> {
        [&c.base, &c.mid]
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect()
    };
    let files_before = sums(&c);
    let mut vm = ApiVm::start(
        &c.dir,
        &format!("disks=2 io_rounds={ROUNDS} park"),
        &[
            "--disk",
            &format!("path={},id=d0", c.top),
            "--disk",
            &format!("path={raw},id=d1"),
        ],
    );
    vm.wait_for("ok   round 5\n");
    let cases: &[(&str, String, u16, &str)] = &[
        (
            "vm.disk-stream",
            r#"{"id":"d1"}"#.into(),
            400,
            "no backing file",
        ),
        (
            "vm.disk-commit",
            r#"{"id":"d1"}"#.into(),
            400,
            "no backing file",
        ),
        ("vm.disk-stream", r#"{"id":"nope"}"#.into(), 404, "no disk"),
        (
            "vm.disk-stream",
            format!(
                r#"{{"id":"d0","base":"{}"}}"#,
                c.dir.file("elsewhere.qcow2")
            ),
            400,
            "not a file of the disk's chain",
        ),
        (
            "vm.disk-stream",
            format!(r#"{{"id":"d0","base":"{}"}}"#, c.top),
            400,
            "active image",
        ),
        (
            "vm.disk-commit",
            format!(r#"{{"id":"d0","top":"{}","base":"{}"}}"#, c.base, c.mid),
            400,
            "is not above base",
        ),
        (
            "vm.disk-commit",
            format!(r#"{{"id":"d0","top":"{}","base":"{}"}}"#, c.mid, c.mid),
            400,
            "is not above base",
        ),
    ];
    for (endpoint, body, want, says) in cases {
        let (status, text) = vm.curl("PUT", endpoint, Some(body));
        assert_eq!(status, *want, "{endpoint} {body}: {text}");
        assert!(text.contains(says), "{endpoint} {body}: {text}");
    }
    // A second job on a busy disk: 409 (the first, rate-limited, runs).
    let first = vm.curl_ok(
        "PUT",
        "vm.disk-commit",
        Some(&format!(r#"{{"id":"d0","top":"{}","speed":65536}}"#, c.mid)),
        200,
    );
    assert!(first.contains("job-1"), "{first}");
    let (status, text) = vm.curl("PUT", "vm.disk-stream", Some(r#"{"id":"d0"}"#));
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("job-1"), "{text}");
    vm.curl_ok("PUT", "vm.disk-job-cancel", Some(r#"{"job":"job-1"}"#), 204);
    assert_eq!(job(&vm, "job-1")["state"], "cancelled");
    finish(vm);
    // The cancelled commit wrote into base only where mid decides; the
    // refusals wrote nothing.
    check_clean(&c.base);
    assert_eq!(sums(&c)[1], files_before[1], "mid changed");
    assert_eq!(
        backing_chain(&c.top),
        ["top.qcow2", "mid.qcow2", "base.qcow2"]
    );
    compare_expected(&c, &c.top, ROUNDS);
}
