//! Shared by the ch_img_* test files of issue 27 (sources never touched,
//! locks, failed commands, broken chains, hostile images, convert's
//! options): running ch-img and qemu-img with a deadline, comparing their
//! answers, and a file system mounted for one test.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use integration_tests::ch_img;
pub use testkit::mount::Mount;

/// Longest a ch-img or qemu-img command may run here: a hostile image
/// must be refused at once, and nothing else these tests do takes long.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `program` with `args`, killing it (and failing the test) if it
/// is still running after `limit`.
pub fn timed(program: impl AsRef<std::ffi::OsStr>, args: &[&str], limit: Duration) -> Output {
    timed_in(Path::new("."), program, args, limit)
}

/// [`timed`] in the folder `dir`.
pub fn timed_in(
    dir: &Path,
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    limit: Duration,
) -> Output {
    testkit::output_within(Command::new(program).current_dir(dir).args(args), limit)
}

/// `ch-img ARGS` with the deadline, whatever its exit status.
pub fn ch(args: &[&str]) -> Output {
    timed(ch_img(), args, DEADLINE)
}

/// [`ch`] in the folder `dir` (relative names are its files).
pub fn ch_in(dir: &Path, args: &[&str]) -> Output {
    timed_in(dir, ch_img(), args, DEADLINE)
}

/// `qemu-img ARGS` with the deadline, whatever its exit status.
pub fn qemu(args: &[&str]) -> Output {
    timed("qemu-img", args, DEADLINE)
}

/// stdout of a command that must have succeeded.
pub fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a user sees of a run: stdout, stderr with ch-img's prefix read
/// as qemu-img's, and the exit status.
pub fn seen(out: &Output) -> String {
    format!(
        "{}{}exit {:?}",
        stdout(out),
        stderr(out).replace("ch-img: ", "qemu-img: "),
        out.status.code()
    )
}

/// Runs the same command line through qemu-img and ch-img (from `dir`)
/// and asserts the same output, messages and exit status.
pub fn same_as_qemu_img(dir: &Path, args: &[&str]) {
    let q = timed_in(dir, "qemu-img", args, DEADLINE);
    let c = ch_in(dir, args);
    assert_eq!(seen(&c), seen(&q), "ch-img {args:?} differs from qemu-img");
}

/// The file's bytes.
pub fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Asserts `path` still holds `before`.
#[track_caller]
pub fn unchanged(path: &str, before: &[u8], what: &str) {
    let after = bytes(path);
    assert!(
        after == before,
        "{what}: {path} changed ({} bytes, was {})",
        after.len(),
        before.len()
    );
}

/// A tmpfs of `size` for one test ([`testkit::mount::Mount`]), which
/// must mount (the test run has root).
pub fn tmpfs(size: &str) -> Mount {
    Mount::tmpfs(size).unwrap_or_else(|e| panic!("{e}"))
}
