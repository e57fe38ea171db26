//! Wrappers around qemu-img and qemu-io, the independent oracle of these
//! tests. Arguments go in as strings; the tool's output comes back as text,
//! and a failing command panics with the command line and its stderr.
//! Every command runs under `testkit::COMMAND_LIMIT`.

use std::path::Path;
use std::process::{Command, Output};

const MISSING: &str =
    "is not installed: the tests use it as the oracle (apt-get install qemu-utils)";

/// A path as `&str` for a command line (test paths are always UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `prog` (qemu-img or qemu-io) and returns whether it succeeded,
/// with its stdout and stderr.
pub fn run_status(prog: &str, args: &[&str]) -> (bool, String) {
    if let Err(e) = testkit::command(prog) {
        panic!("{prog} {MISSING}: {e}");
    }
    let out = testkit::output_within(Command::new(prog).args(args), testkit::COMMAND_LIMIT);
    (out.status.success(), text(&out))
}

/// Runs `prog` (qemu-img or qemu-io); returns stdout and stderr, and
/// panics with them unless it succeeds.
pub fn run(prog: &str, args: &[&str]) -> String {
    let (ok, text) = run_status(prog, args);
    assert!(ok, "{prog} {args:?} failed: {text}");
    text
}

/// Runs a command; returns its stdout, panics with its output on failure.
pub fn run_cmd(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// qemu-img with `args`; returns stdout, panics on failure.
pub fn qemu_img(args: &[&str]) -> String {
    run_cmd(Command::new("qemu-img").args(args))
}

/// qemu-img with `args`, whatever its exit status (for checks whose
/// failure the caller reports itself).
pub fn qemu_img_output(args: &[&str]) -> Output {
    if let Err(e) = testkit::command("qemu-img") {
        panic!("qemu-img {MISSING}: {e}");
    }
    testkit::output_within(Command::new("qemu-img").args(args), testkit::COMMAND_LIMIT)
}

/// qemu-io on `path` opened as `fmt`, one `-c` per command; returns stdout,
/// panics on failure.
pub fn qemu_io(fmt: &str, path: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.arg("-f").arg(fmt);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    c.arg(path);
    run_cmd(&mut c)
}

/// `qemu-img check` finds no errors and no leaks.
pub fn qemu_check(p: &Path) {
    let out = run("qemu-img", &["check", "-U", s(p)]);
    assert!(
        out.contains("No errors were found"),
        "qemu-img check: {out}"
    );
    assert!(!out.contains("leaked"), "qemu-img check: {out}");
}

/// `qemu-img check` finds no corruption: exit 0 (clean) or 3 (leaked
/// clusters only, what a crash or a failed write may leave). `what` names
/// the situation in the failure message; returns the report.
pub fn qemu_check_leaks_only(p: &Path, what: &str) -> String {
    let out = qemu_img_output(&["check", s(p)]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 3,
        "{what}: qemu-img check exited {code}:\n{text}"
    );
    text
}

/// Our check with `Repair::All` repairs `p` completely (nothing left to
/// report), after which `qemu-img check` finds it clean too. `what` names
/// the situation in failure messages.
pub fn our_repair_leaves_qemu_clean(p: &Path, what: &str) {
    let r = block::check::check_image(p, Some(block::check::Repair::All))
        .unwrap_or_else(|e| panic!("{what}: our check -r all failed: {e}"));
    assert_eq!(
        (r.corruptions, r.leaks),
        (0, 0),
        "{what}: our check -r all left {:?}",
        r.messages
    );
    qemu_check(p);
}

/// `qemu-img compare` finds the two images' contents identical.
pub fn qemu_compare(a: &Path, b: &Path) {
    run("qemu-img", &["compare", "-U", s(a), s(b)]);
}
