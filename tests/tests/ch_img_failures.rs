//! Issue 27, deliverable 3: a command that fails leaves the image as it
//! was, byte for byte. Each verb that changes an image runs out of space
//! here on a small tmpfs filled up (needs root, as the test run is):
//! `resize --preallocation=full|falloc` (qcow2 and raw), `snapshot -c`,
//! `rebase` (safe mode, which copies data), `commit`. Each must fail
//! naming ENOSPC and leave every file as it was, and qemu-img check must
//! find the image clean. (ENOSPC and EIO at every metadata write and
//! fdatasync of the same operations, injected at the block crate's fault
//! seam: block/tests/tool_failures.rs.)

mod img_safety_support;

use std::io::Write;

use img_safety_support::*;
use integration_tests::{qemu_img, qemu_io};

/// Fills the file system holding `dir` with a file of zeroes.
fn fill(fs: &Mount) {
    let mut f = std::fs::File::create(fs.file("filler")).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

/// Runs ch-img `args` on the full file system: it must fail naming
/// ENOSPC (or "No space left") and leave `files` as they were.
fn fails_and_leaves(fs: &Mount, args: &[&str], files: &[&str]) {
    let before: Vec<Vec<u8>> = files.iter().map(|f| bytes(&fs.file(f))).collect();
    let out = ch_in(fs.path(), args);
    assert!(
        !out.status.success(),
        "ch-img {args:?} succeeded on a full disk"
    );
    let text = stderr(&out);
    assert!(
        text.contains("No space left") || text.contains("ENOSPC"),
        "ch-img {args:?}: {text}"
    );
    for (name, old) in files.iter().zip(&before) {
        unchanged(&fs.file(name), old, &format!("ch-img {args:?}"));
        if name.ends_with(".qcow2") {
            let check = qemu(&["check", &fs.file(name)]);
            assert!(
                check.status.success(),
                "{name} after ch-img {args:?}: {}{}",
                stdout(&check),
                stderr(&check)
            );
        }
    }
}

#[test]
fn resize_with_preallocation_on_a_full_disk_changes_nothing() {
    let fs = tmpfs("4M");
    let x = fs.file("X.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &x, "64M"]);
    qemu_io("qcow2", &x, &["write -P 0x44 0 1M"]);
    let r = fs.file("R.raw");
    qemu_img(&["create", "-q", "-f", "raw", &r, "1M"]);
    qemu_io("raw", &r, &["write -P 0x55 0 1M"]);
    for mode in ["full", "falloc"] {
        let prealloc = format!("--preallocation={mode}");
        fails_and_leaves(&fs, &["resize", &prealloc, "X.qcow2", "+16M"], &["X.qcow2"]);
        fails_and_leaves(
            &fs,
            &["resize", "-f", "raw", &prealloc, "R.raw", "+16M"],
            &["R.raw"],
        );
    }
    // qemu-img fails too (it does not leave the file's bytes alone).
    let out = qemu(&["resize", "--preallocation=full", &x, "+16M"]);
    assert!(!out.status.success());
}

#[test]
fn snapshot_rebase_and_commit_on_a_full_disk_change_nothing() {
    let fs = tmpfs("8M");
    let base = fs.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "64M"]);
    qemu_io("qcow2", &base, &["write -P 0x11 0 2M"]);
    let top = fs.file("top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &top,
    ]);
    qemu_io("qcow2", &top, &["write -P 0x22 4M 1M"]);
    fill(&fs);
    fails_and_leaves(&fs, &["snapshot", "-c", "s1", "top.qcow2"], &["top.qcow2"]);
    // Safe mode copies the base's 2 MiB into the image first.
    fails_and_leaves(
        &fs,
        &["rebase", "-b", "", "top.qcow2"],
        &["top.qcow2", "base.qcow2"],
    );
    fails_and_leaves(&fs, &["commit", "top.qcow2"], &["top.qcow2", "base.qcow2"]);
    // The image still reads as before.
    std::fs::remove_file(fs.file("filler")).unwrap();
    qemu_io("qcow2", &top, &["read -P 0x11 0 2M", "read -P 0x22 4M 1M"]);
}
