//! Issue 27, deliverable 1: a command never truncates a file it reads.
//! `convert` keeps its sources open (reader locks) while it locks the
//! output like a writer and compares it, by device and inode, with every
//! file of every source chain before truncating it; `create` refuses a
//! backing file that is the new image itself. Each case (the same path,
//! `./X`, a symbolic link, a hard link, raw and qcow2, an output that is a
//! backing file of the source, with and without `-U`, `-n`, several
//! sources) must fail and leave every source byte for byte as it was.
//! Where qemu-img 7.2 refuses too (everything but `-U`, where qemu-img
//! truncates the source), its output and exit status must be ours.

mod img_safety_support;

use img_safety_support::*;
use integration_tests::{qemu_img, qemu_io, TempDir};

/// X.qcow2 (5 MiB of data), R (a raw file with data), O.qcow2 over
/// X.qcow2, and the links L -> X.qcow2 (symbolic) and H (hard).
fn sources(dir: &TempDir) {
    let x = dir.file("X.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &x, "64M"]);
    qemu_io("qcow2", &x, &["write -P 0x5a 0 5M"]);
    let r = dir.file("R");
    qemu_img(&["create", "-q", "-f", "raw", &r, "1M"]);
    qemu_io("raw", &r, &["write -P 0x6b 0 1M"]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "X.qcow2",
        "-F",
        "qcow2",
        &dir.file("O.qcow2"),
    ]);
    std::os::unix::fs::symlink("X.qcow2", dir.file("L")).unwrap();
    std::fs::hard_link(&x, dir.file("H")).unwrap();
}

/// Runs `args` in `dir`; it must fail, name `words`, and leave X.qcow2
/// and R as they were.
fn refused(dir: &TempDir, args: &[&str], words: &str) {
    let (x, r) = (dir.file("X.qcow2"), dir.file("R"));
    let (x0, r0) = (bytes(&x), bytes(&r));
    let out = ch_in(dir.path(), args);
    assert!(!out.status.success(), "ch-img {args:?} succeeded");
    assert!(
        stderr(&out).contains(words),
        "ch-img {args:?}: {}",
        stderr(&out)
    );
    unchanged(&x, &x0, &format!("ch-img {args:?}"));
    unchanged(&r, &r0, &format!("ch-img {args:?}"));
}

const LOCKED: &str = "Failed to get \"write\" lock";
const SAME_FILE: &str = "is also a file the command reads from";

#[test]
fn convert_never_truncates_its_source() {
    let dir = TempDir::new("safety-convert");
    sources(&dir);
    let cases: &[&[&str]] = &[
        &["convert", "-O", "qcow2", "X.qcow2", "X.qcow2"],
        &["convert", "-O", "qcow2", "X.qcow2", "./X.qcow2"],
        &["convert", "-O", "qcow2", "X.qcow2", "L"],
        &["convert", "-O", "qcow2", "X.qcow2", "H"],
        &["convert", "-O", "raw", "R", "R"],
        // The output is the source's backing file.
        &["convert", "-O", "qcow2", "O.qcow2", "X.qcow2"],
        &["convert", "-O", "qcow2", "O.qcow2", "H"],
        // Several sources: the output is the second.
        &["convert", "-O", "raw", "X.qcow2", "R", "R"],
    ];
    for args in cases {
        // qemu-img refuses these the same way (and leaves the files).
        same_as_qemu_img(dir.path(), args);
        refused(&dir, args, LOCKED);
        // -U lets the locks pass: the device and inode check refuses.
        let mut shared = args.to_vec();
        shared.insert(1, "-U");
        refused(&dir, &shared, SAME_FILE);
    }
    // -n writes into an existing output: locked, or with -U the same file.
    refused(
        &dir,
        &["convert", "-n", "-O", "qcow2", "X.qcow2", "L"],
        LOCKED,
    );
    refused(
        &dir,
        &["convert", "-U", "-n", "-O", "qcow2", "O.qcow2", "H"],
        SAME_FILE,
    );
}

#[test]
fn create_never_truncates_its_backing_file() {
    let dir = TempDir::new("safety-create");
    sources(&dir);
    const SAME_NAME: &str = "Trying to create an image with the same filename as the backing file";
    let same: &[&str] = &[
        "create", "-f", "qcow2", "-b", "X.qcow2", "-F", "qcow2", "X.qcow2",
    ];
    same_as_qemu_img(dir.path(), same);
    refused(&dir, same, SAME_NAME);
    // Names qemu-img does not recognise as the same file (it then loops
    // on the chain it made, so it is not run here).
    for (backing, image) in [("./X.qcow2", "X.qcow2"), ("L", "X.qcow2"), ("X.qcow2", "H")] {
        for unsafe_flag in [false, true] {
            let mut args = vec!["create", "-f", "qcow2"];
            if unsafe_flag {
                args.push("-u");
            }
            args.extend(["-b", backing, "-F", "qcow2", image, "64M"]);
            refused(&dir, &args, SAME_NAME);
        }
    }
}
