//! The examples of docs/api.md's "The endpoints", run as written: the
//! code blocks of that section are read from the doc; the lines that
//! define `S` and `c` run first, then each `c ...` line (curl) in order
//! against one VM and each `ch-remote ...` line against another (a block
//! shows both spellings of the same request, which cannot both succeed
//! on one VM). The one block that shuts the VM down runs last. Every
//! command must exit 0. Only the socket path and the `/images/`
//! directory are moved into the test's own directory, and `ch-remote`
//! is the one just built. The guest is the test guest, waiting for the
//! hot-added disk so that the removal example is answered at its eject.
//!
//! The same for "A VM made through the API": a VMM started with the
//! socket alone, the doc's `vm.json` written as shown (the kernel and
//! its command line made the test guest's), then its `c ...` lines, and
//! on another VMM its `ch-remote ...` lines.

mod e2e_api_support;
mod e2e_support;

use std::process::Command;

use e2e_api_support::{have_curl, ApiVm};
use e2e_support::{check_clean, create_lazy_qcow2, repo};
use integration_tests::{project_bin, TempDir};

/// The code blocks between `## The endpoints` and the next `## `.
fn endpoint_blocks() -> Vec<Vec<String>> {
    section_blocks("The endpoints")
}

/// The code blocks between `## {heading}` and the next `## `.
fn section_blocks(heading: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(repo().join("docs/api.md")).expect("docs/api.md");
    let start = doc
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let section = &doc[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in section[..end].lines() {
        if line.trim_start().starts_with("```") {
            match current.take() {
                Some(b) => blocks.push(b),
                None => current = Some(Vec::new()),
            }
        } else if let Some(b) = current.as_mut() {
            if !line.trim().is_empty() {
                b.push(line.to_string());
            }
        }
    }
    blocks
}

/// Runs every line of `blocks` that starts with `prefix` (the shut-down
/// block last) after `preamble`, in `dir`, asserting each exits 0;
/// `before` sees each line first.
fn run_examples(
    dir: &TempDir,
    preamble: &str,
    blocks: &[Vec<String>],
    prefix: &str,
    before: &mut dyn FnMut(&str),
) -> usize {
    let shuts_down = |b: &Vec<String>| b.iter().any(|l| l.contains("shutdown"));
    let ordered = blocks
        .iter()
        .filter(|b| !shuts_down(b))
        .chain(blocks.iter().filter(|b| shuts_down(b)));
    let bin_dir = project_bin("vmm", "ch-remote")
        .parent()
        .expect("a directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for line in ordered.flatten().filter(|l| l.starts_with(prefix)) {
        before(line);
        let command = line
            .replace("/run/ch.sock", &dir.file("ch.sock"))
            .replace("/images/", &format!("{}/", dir.path().display()));
        let out = testkit::output_within(
            Command::new("bash")
                .args(["-c", &format!("{preamble}\n{command}")])
                .current_dir(dir.path())
                .env("PATH", &path),
            testkit::COMMAND_LIMIT,
        );
        assert!(
            out.status.success(),
            "{line}\n  ran as: {command}\n  exit {}\n  stdout: {}\n  stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    ran
}

fn examples_run_as_written(prefix: &str) {
    if !have_curl() {
        return;
    }
    let blocks = endpoint_blocks();
    let preamble: Vec<&String> = blocks
        .iter()
        .flatten()
        .filter(|l| l.starts_with("S=") || l.starts_with("c() "))
        .collect();
    assert_eq!(preamble.len(), 2, "the S= and c() lines: {blocks:?}");
    let dir = TempDir::new("api-doc-examples");
    let preamble = preamble
        .iter()
        .map(|l| l.replace("/run/ch.sock", &dir.file("ch.sock")))
        .collect::<Vec<_>>()
        .join("\n");
    let root = dir.file("root.qcow2");
    create_lazy_qcow2(&root, "16M");
    let data = dir.file("data.qcow2");
    create_lazy_qcow2(&data, "16M");
    let mut vm = ApiVm::start_at(
        &dir,
        &dir.file("ch.sock"),
        "disks=1 wait_hotplug park",
        &["--disk", &format!("path={root},id=root")],
    );
    vm.wait_for("WAIT hotplug");
    // The guest must have taken the hot-added disk before it is asked
    // to give it back (an announcement not yet seen is withdrawn), as a
    // user waits for the guest to see a new disk.
    let ran = run_examples(&dir, &preamble, &blocks, prefix, &mut |line| {
        if line.contains("remove-device") {
            vm.wait_for("WAIT unplug");
        }
    });
    // ping, info, counters, pause, resume, resize, add, remove,
    // snapshot, disk-info, bitmap add, transaction, bitmap remove,
    // backup begin, backup end, disk-snapshot-external, mirror, jobs,
    // cancel (curl) or complete (ch-remote), vm.shutdown, vmm.shutdown.
    assert_eq!(ran, 21, "{prefix} examples");
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("disk data: the guest ejected slot 2"),
        "{stderr}"
    );
    check_clean(&root);
    check_clean(&dir.file("root-1.qcow2"));
    check_clean(&data);
}

/// The `S=` and `c()` lines of "The endpoints", with the socket moved.
fn preamble(socket: &str) -> String {
    endpoint_blocks()
        .iter()
        .flatten()
        .filter(|l| l.starts_with("S=") || l.starts_with("c() "))
        .map(|l| l.replace("/run/ch.sock", socket))
        .collect::<Vec<_>>()
        .join("\n")
}

fn lifecycle_examples_run_as_written(prefix: &str) {
    if !have_curl() {
        return;
    }
    let blocks = section_blocks("A VM made through the API");
    assert!(
        blocks[0]
            .iter()
            .any(|l| l == "cloud-hypervisor --api-socket path=/run/ch.sock"),
        "{blocks:?}"
    );
    let dir = TempDir::new("api-doc-lifecycle");
    let root = dir.file("root.qcow2");
    create_lazy_qcow2(&root, "16M");
    // vm.json as the doc shows it, with the test guest as the payload.
    let text = blocks[1].join("\n").replace(
        "/images/vmlinux",
        &e2e_support::test_guest().display().to_string(),
    );
    let text = text.replace("/images/", &format!("{}/", dir.path().display()));
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("the doc's vm.json");
    config["payload"]["cmdline"] = "disks=1 park".into();
    std::fs::write(dir.file("vm.json"), config.to_string()).unwrap();
    let vm = ApiVm::start_vmm(&dir, &[]);
    // `$S` is the socket this VMM listens on.
    let socket = vm.socket.clone();
    let ran = run_examples(&dir, &preamble(&socket), &blocks[2..], prefix, &mut |_| {});
    // create, boot, reboot, power-button, shutdown, boot, delete.
    assert_eq!(ran, 7, "{prefix} examples");
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&root);
}

#[test]
fn the_curl_lifecycle_examples_run_as_written() {
    lifecycle_examples_run_as_written("c ");
}

#[test]
fn the_ch_remote_lifecycle_examples_run_as_written() {
    lifecycle_examples_run_as_written("ch-remote ");
}

#[test]
fn the_curl_examples_run_as_written() {
    examples_run_as_written("c ");
}

#[test]
fn the_ch_remote_examples_run_as_written() {
    examples_run_as_written("ch-remote ");
}
