//! Shared helpers for the integration tests: locating binaries, making images with qemu-img.
//!
//! Tests call [`ch_img`] (which builds the `ch-img` binary once per test
//! process with the cargo that runs the tests) and [`qemu_img`] /
//! [`qemu_io`], which fail loudly when qemu-utils is not installed: the
//! test script installs it, and a silent skip would hide missing coverage.
//! Files live in a [`TempDir`] removed when the test ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The scratch folder of every test here: testkit's (under the system
/// temp dir, removed when the test ends).
pub use testkit::TempDir;

/// The target profile directory this test binary was built into
/// (`target/debug`), found from the test executable's path.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// Path of the `ch-img` binary (see [`project_bin`]), found once per test
/// process.
pub fn ch_img() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| project_bin("ch-img", "ch-img"))
}

/// The longest a test waits for cargo to build a binary it runs (a cold
/// build on a loaded 2-core machine takes minutes).
pub const BUILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(1800);

/// Path of binary `bin` of workspace package `package`: `$CH_BIN_DIR/bin`
/// when the test script built the binaries first (scripts/run-tests.sh
/// exports it), else built by the cargo that runs the tests into the same
/// target directory and profile.
pub fn project_bin(package: &str, bin: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("CH_BIN_DIR") {
        let path = PathBuf::from(dir).join(bin);
        assert!(
            path.exists(),
            "CH_BIN_DIR is set but {} does not exist",
            path.display()
        );
        return path;
    }
    let dir = profile_dir();
    let target_dir = dir.parent().expect("target dir").to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        package,
        "--bin",
        bin,
        "--manifest-path",
    ])
    .arg(&manifest)
    .arg("--target-dir")
    .arg(&target_dir);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let out = testkit::output_within(&mut cmd, BUILD_LIMIT);
    assert!(
        out.status.success(),
        "cargo build -p {package} --bin {bin} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(bin);
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// Panics with a clear message when a qemu tool is missing.
fn require(tool: &str) {
    let ok = testkit::try_output_within(
        Command::new(tool).arg("--version"),
        std::time::Duration::from_secs(60),
    )
    .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{tool} is not installed: these tests compare against it (apt-get install qemu-utils)"
    );
}

/// Runs a program; returns its output whatever the exit status. A program
/// still running after `testkit::COMMAND_LIMIT` is killed and fails the test.
pub fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    testkit::output_within(
        Command::new(program.as_ref()).args(args),
        testkit::COMMAND_LIMIT,
    )
}

/// Runs a program and panics with its stderr unless it exits 0.
pub fn run_ok(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    let out = run(program.as_ref(), args);
    assert!(
        out.status.success(),
        "{:?} {:?} failed ({}):\n{}{}",
        program.as_ref(),
        args,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qemu-img ARGS`, which must succeed.
pub fn qemu_img(args: &[&str]) -> String {
    require("qemu-img");
    run_ok("qemu-img", args)
}

/// `qemu-img create -q -f qcow2 -o OPTS PATH SIZE`, which must succeed.
pub fn qemu_create_qcow2(path: &str, opts: &str, size: &str) {
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, path, size]);
}

/// `qemu-img create -q -f qcow2 -b BACKING -F BACKING_FMT PATH`: an
/// overlay of the backing image's size (a relative backing name is
/// resolved from the overlay's folder), which must succeed.
pub fn qemu_create_overlay(path: &str, backing: &str, backing_fmt: &str) {
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        backing,
        "-F",
        backing_fmt,
        path,
    ]);
}

/// `qemu-img ARGS` whatever its exit status.
pub fn qemu_img_status(args: &[&str]) -> Output {
    require("qemu-img");
    run("qemu-img", args)
}

/// Runs qemu-io commands (`-c` each) on an image of format `fmt`.
pub fn qemu_io(fmt: &str, image: &str, commands: &[&str]) {
    require("qemu-io");
    let mut args = vec!["-f", fmt];
    for c in commands {
        args.push("-c");
        args.push(c);
    }
    args.push(image);
    let out = run_ok("qemu-io", &args);
    assert!(
        !out.contains("failed"),
        "qemu-io {commands:?} on {image}: {out}"
    );
}

/// `ch-img ARGS`, which must succeed.
pub fn ch(args: &[&str]) -> String {
    run_ok(ch_img(), args)
}

/// `ch-img ARGS` whatever its exit status.
pub fn ch_status(args: &[&str]) -> Output {
    run(ch_img(), args)
}

/// Parses JSON output, panicking with the text on error.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{text}"))
}

/// Asserts two files have the same bytes; names the first differing offset.
pub fn assert_same_bytes(a: &str, b: &str) {
    let x = std::fs::read(a).unwrap_or_else(|e| panic!("read {a}: {e}"));
    let y = std::fs::read(b).unwrap_or_else(|e| panic!("read {b}: {e}"));
    assert_eq!(x.len(), y.len(), "{a} and {b} differ in length");
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{a} and {b} differ at byte {i}: {:#x} vs {:#x}", x[i], y[i]);
    }
}
