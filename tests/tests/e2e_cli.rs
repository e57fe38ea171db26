//! End-to-end: the command-line contract of `cloud-hypervisor`. Errors
//! name the key and the value, and nothing is opened before the whole
//! command line is valid.

mod e2e_support;

use std::process::Command;

use e2e_support::{test_guest, vmm_binary};
use integration_tests::{qemu_img, TempDir};

fn make_image(dir: &TempDir, name: &str, fmt: &str, size: &str) -> String {
    let p = dir.file(name);
    qemu_img(&["create", "-q", "-f", fmt, &p, size]);
    p
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = testkit::output_within(
        Command::new(vmm_binary()).args(args),
        testkit::COMMAND_LIMIT,
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version() {
    let (ok, out, _) = cli(&["--help"]);
    assert!(ok && out.contains("--disk") && out.contains("num_queues"));
    for word in ["cache=none", "directsync", "unsafe", "aio", "threads"] {
        assert!(out.contains(word), "--help lacks {word}");
    }
    let (ok, out, _) = cli(&["--version"]);
    assert!(ok && out.starts_with("cloud-hypervisor "));
}

#[test]
fn bad_disk_options_are_refused_before_anything_is_opened() {
    let dir = TempDir::new("e2e-cli");
    let img = make_image(&dir, "d.raw", "raw", "1M");
    let missing_kernel = dir.file("no-such-kernel");
    for (arg, must_name) in [
        (
            format!("path={img},cache=nocache"),
            vec!["cache", "nocache"],
        ),
        (
            format!("path={img},engine=native"),
            vec!["engine", "native"],
        ),
        (
            format!("path={img},engine=aio"),
            vec!["engine=aio", "cache="],
        ),
        (
            format!("path={img},engine=aio,cache=writethrough"),
            vec!["engine=aio", "cache=writethrough"],
        ),
        (
            format!("path={img},direct=on,cache=unsafe"),
            vec!["direct=on", "cache=unsafe"],
        ),
        (format!("path={img},num_queues=0"), vec!["num_queues", "0"]),
        (format!("path={img},queue_size=3"), vec!["queue_size", "3"]),
        (format!("path={img},readonly=yes"), vec!["readonly", "yes"]),
        (format!("path={img},direct=1"), vec!["direct", "1"]),
        (
            format!("path={img},image_type=vmdk"),
            vec!["image_type", "vmdk"],
        ),
        ("readonly=on".to_string(), vec!["path"]),
    ] {
        // The kernel does not exist: an error about it would mean the
        // VMM opened things before validating the whole command line.
        let (ok, _, err) = cli(&["--kernel", &missing_kernel, "--disk", &arg]);
        assert!(!ok, "{arg} accepted");
        for word in must_name {
            assert!(
                err.contains(word),
                "{arg}: error does not name {word}: {err}"
            );
        }
        assert!(
            !err.contains("no-such-kernel"),
            "{arg}: opened the kernel first: {err}"
        );
    }
    let (ok, _, err) = cli(&["--kernel", &missing_kernel, "--memory", "size=12Q"]);
    assert!(!ok && err.contains("size") && err.contains("12Q"), "{err}");
    let (ok, _, err) = cli(&["--kernel", &missing_kernel, "--serial", "pty"]);
    assert!(!ok && err.contains("pty"), "{err}");
    let (ok, _, err) = cli(&["--disk", &format!("path={img}")]);
    assert!(!ok && err.contains("--kernel"), "{err}");
}

#[test]
fn missing_kernel_or_image_fails_with_a_message() {
    let dir = TempDir::new("e2e-missing");
    let (ok, _, err) = cli(&["--kernel", &dir.file("nope")]);
    assert!(!ok && err.contains("nope"), "{err}");
    let (ok, _, err) = cli(&[
        "--kernel",
        test_guest().to_str().unwrap(),
        "--disk",
        &format!("path={}", dir.file("missing.img")),
    ]);
    assert!(!ok && err.contains("missing.img"), "{err}");
}
