//! End-to-end: the command-line contract of `cloud-hypervisor`. Errors
//! name the key and the value, and nothing is opened before the whole
//! command line is valid. The flags and syntax are upstream Cloud
//! Hypervisor's: `--help`/`--version` in its form, its flags we lack
//! refused by name (exit 1), a command line written for it boots here.

mod e2e_support;

use std::process::Command;

use e2e_support::{boot, test_guest, vmm_binary};
use integration_tests::{qemu_img, TempDir};

fn make_image(dir: &TempDir, name: &str, fmt: &str, size: &str) -> String {
    let p = dir.file(name);
    qemu_img(&["create", "-q", "-f", fmt, &p, size]);
    p
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = cli_code(args);
    (code == Some(0), out, err)
}

/// Exit code, stdout, stderr.
fn cli_code(args: &[&str]) -> (Option<i32>, String, String) {
    let out = testkit::output_within(
        Command::new(vmm_binary()).args(args),
        testkit::COMMAND_LIMIT,
    );
    (
        out.status.code(),
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
    // Upstream's form (clap): usage line, options with their syntax.
    assert!(out.contains("Usage: cloud-hypervisor [OPTIONS]"), "{out}");
    for flag in [
        "--api-socket",
        "--cpus",
        "--memory",
        "--kernel",
        "--cmdline",
        "--serial",
    ] {
        assert!(out.contains(flag), "--help lacks {flag}");
    }
    let (ok, short, _) = cli(&["-h"]);
    assert!(ok && short.contains("--disk"));
    let (ok, out, _) = cli(&["--version"]);
    assert!(ok, "{out}");
    assert_eq!(
        out.trim(),
        concat!("cloud-hypervisor v", env!("CARGO_PKG_VERSION"))
    );
    let (ok, out, _) = cli(&["-V"]);
    assert!(ok && out.starts_with("cloud-hypervisor v"));
    // No arguments: the help, on stderr, exit 2 (as upstream).
    let (code, _, err) = cli_code(&[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("Usage:"), "{err}");
}

#[test]
fn upstream_flags_we_lack_are_refused_in_one_line() {
    let dir = TempDir::new("e2e-cli-unsupported");
    let missing_kernel = dir.file("no-such-kernel");
    for args in [
        &["--net", "tap=tap0"][..],
        &["--fs", "tag=a,socket=/s"],
        &["--pmem", "file=/x"],
        &["--vsock", "cid=3,socket=/s"],
        &["--rng", "src=/dev/urandom"],
        &["--balloon", "size=1G"],
        &["--device", "path=/sys/x"],
        &["--watchdog"],
        &["--pvpanic"],
        &["--net", "tap=a", "tap=b"],
    ] {
        let mut a = vec!["--kernel", &missing_kernel];
        a.extend_from_slice(args);
        let (code, _, err) = cli_code(&a);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(args[0]) && err.contains("not supported"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("no-such-kernel"), "{args:?}: {err}");
    }
    // A flag nobody has: clap's usage error, exit 2 (as upstream).
    let (code, _, err) = cli_code(&["--kernel", &missing_kernel, "--frobnicate"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--frobnicate"), "{err}");
    // Values upstream takes that cannot be honoured here: one line, exit 1.
    for (flag, value, word) in [
        ("--console", "tty", "console"),
        ("--serial", "pty", "pty"),
        ("--cpus", "boot=2,max=4", "max"),
        ("--disk", "path=/x,iommu=on", "iommu"),
        ("--disk", "path=/x,pci_segment=1", "pci_segment"),
        ("--disk", "path=/x,sparse=off", "sparse"),
        (
            "--disk",
            "path=/x,lock_granularity=full",
            "lock_granularity",
        ),
        ("--disk", "path=/x,rate_limit_group=g", "rate_limit_group"),
        ("--disk", "path=/x,image_type=vhdx", "image_type"),
        ("--seccomp", "errno", "errno"),
    ] {
        let (code, _, err) = cli_code(&["--kernel", &missing_kernel, flag, value]);
        assert_eq!(code, Some(1), "{flag} {value}: {err}");
        assert!(err.contains(word), "{flag} {value}: {err}");
        assert!(!err.contains("no-such-kernel"), "{flag} {value}: {err}");
    }
}

#[test]
fn a_command_line_written_for_upstream_boots() {
    let dir = TempDir::new("e2e-cli-upstream");
    let a = make_image(&dir, "a.qcow2", "qcow2", "64M");
    let b = make_image(&dir, "b.raw", "raw", "16M");
    let log = dir.file("vmm.log");
    // Upstream's spellings: several values after one --disk, max=boot,
    // --console off, --log-file, --seccomp true, a counted -v.
    let r = boot(
        &dir,
        test_guest(),
        &[
            "--cpus",
            "boot=2,max=2",
            "--memory",
            "size=256M",
            "--cmdline",
            "disks=2",
            "--disk",
            &format!("path={a},num_queues=2,image_type=qcow2,backing_files=off"),
            &format!("path={b},id=second,direct=off,sparse=on,lock_granularity=byte-range"),
            "--console",
            "off",
            "--seccomp",
            "true",
            "--log-file",
            &log,
            "-vv",
        ],
    );
    assert!(r.status.success(), "{}\n{}", r.stderr, r.serial);
    assert!(r.serial.contains("RESULT: PASS"), "{}", r.serial);
    // The log went to the file, not to stderr.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("cloud-hypervisor: INFO:"), "{logged}");
    assert!(!r.stderr.contains("INFO:"), "{}", r.stderr);
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

#[test]
fn the_event_monitor_takes_a_path_or_an_open_descriptor() {
    let dir = TempDir::new("e2e-cli-events");
    let img = make_image(&dir, "d.raw", "raw", "8M");
    let guest = test_guest().display().to_string();
    let disk = format!("path={img}");
    let vm = [
        "--kernel",
        &guest,
        "--cmdline",
        "disks=1",
        "--disk",
        &disk,
        "--serial",
        "off",
    ];
    // A descriptor the parent opened: the events of one boot to its
    // power-off, in upstream's form (object, blank line).
    let events = dir.file("events.json");
    let script = format!("exec 7>{events}; exec \"$0\" \"$@\" --event-monitor fd=7",);
    let out = testkit::output_within(
        Command::new("bash")
            .args(["-c", &script, &vmm_binary().display().to_string()])
            .args(vm),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&events).unwrap();
    let names: Vec<String> = text
        .split("\n\n")
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let v: serde_json::Value = serde_json::from_str(t).expect("an event object");
            format!(
                "{} {}",
                v["source"].as_str().unwrap(),
                v["event"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "vmm starting",
            "vm booting",
            "vm booted",
            "virtio-device activated",
            "vm shutdown",
            "vm deleted",
            "vmm shutdown"
        ],
        "{text}"
    );
    assert!(text.ends_with("}\n\n"), "{text:?}");
    // What cannot be used fails before anything starts, in one line.
    let missing_dir = dir.file("no/such/dir/events.json");
    for (arg, word) in [
        ("fd=9", "not open"),
        ("fd=2x", "fd"),
        (events.as_str(), "--event-monitor"),
        (&format!("path={missing_dir}"), "cannot create"),
    ] {
        let mut a = vm.to_vec();
        a.extend(["--event-monitor", arg]);
        let (code, _, err) = cli_code(&a);
        assert_eq!(code, Some(1), "{arg}: {err}");
        assert!(
            err.contains(word) && err.lines().count() == 1,
            "{arg}: {err}"
        );
    }
}
