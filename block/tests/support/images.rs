//! Test images made by qemu-img (the independent maker): a path and a size
//! go in, an image file on disk comes out; failures panic with qemu-img's
//! output.

use std::path::Path;

use super::qemu::{run, s};
use super::tmp::TempDir;

fn push_opts<'a>(args: &mut Vec<&'a str>, opts: &'a str) {
    if !opts.is_empty() {
        args.extend(["-o", opts]);
    }
}

/// `qemu-img create -f FMT [-o OPTS] PATH SIZE` (`opts` empty for none).
pub fn qemu_create(fmt: &str, path: &str, size: &str, opts: &str) {
    let mut args = vec!["create", "-q", "-f", fmt];
    push_opts(&mut args, opts);
    args.extend([path, size]);
    run("qemu-img", &args);
}

/// `qemu-img create -f FMT [-o OPTS] -b BACKING -F BACKING_FMT PATH [SIZE]`;
/// without a size the overlay takes the backing image's.
pub fn qemu_create_overlay(
    fmt: &str,
    path: &str,
    size: Option<&str>,
    opts: &str,
    backing: &str,
    backing_fmt: &str,
) {
    let mut args = vec!["create", "-q", "-f", fmt];
    push_opts(&mut args, opts);
    args.extend(["-b", backing, "-F", backing_fmt, path]);
    args.extend(size);
    run("qemu-img", &args);
}

/// `qemu-img convert -c -f raw -O qcow2 -o OPTS RAW IMG`: every cluster
/// of a raw file compressed into a new qcow2 image.
pub fn qemu_convert_compressed(raw: &Path, img: &Path, opts: &str) {
    run(
        "qemu-img",
        &[
            "convert",
            "-q",
            "-c",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            opts,
            s(raw),
            s(img),
        ],
    );
}

/// Writes `model` (the expected guest-visible bytes) next to the image as
/// `model.raw` in `dir`, and asserts `qemu-img compare` finds the image
/// (opened as `fmt`) equal to it.
pub fn qemu_compare_to_model(dir: &TempDir, img: &Path, fmt: &str, model: &[u8]) {
    let reference = dir.join("model.raw");
    std::fs::write(&reference, model)
        .unwrap_or_else(|e| panic!("write {}: {e}", reference.display()));
    run(
        "qemu-img",
        &[
            "compare",
            "-q",
            "-f",
            fmt,
            "-F",
            "raw",
            s(img),
            s(&reference),
        ],
    );
}
