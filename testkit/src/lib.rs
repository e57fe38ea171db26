//! When a test may skip, in one place; deadlines for tests that start
//! processes or wait ([`deadline`]); a file system mounted for one test
//! ([`mount`]); NBD servers nobody here wrote ([`nbd_server`]); a scratch
//! folder removed when the test ends ([`TempDir`]); upstream Cloud
//! Hypervisor's binaries, a peer of some tests ([`upstream`]).
//!
//! A test that needs something from outside the project (qemu-img, fio,
//! io_uring, FUSE, QEMU) asks [`available`] before it starts. When the
//! thing is there the test runs. When it is missing the test prints why
//! and returns early, unless `CH_REQUIRE_ALL=1` (set by
//! `scripts/run-tests.sh`, so CI and the README's test command never pass
//! by skipping): then it fails, naming what is missing. Errors of our own
//! code (an image we cannot open, a setup step of ours that fails) are
//! never a reason to skip; tests `unwrap` those.

use std::path::Path;

pub mod deadline;
pub use deadline::{
    exit_within, output_within, signal, stop_cleanly, try_output_within, wait_within,
    with_deadline, ChildGuard, COMMAND_LIMIT,
};
pub mod mount;
pub mod nbd_server;
mod temp_dir;
pub use temp_dir::TempDir;
pub mod upstream;
pub use upstream::{upstream_binary, UPSTREAM_DIR};

/// The environment variable that turns every skip into a failure.
pub const REQUIRE_ALL: &str = "CH_REQUIRE_ALL";

/// True when `CH_REQUIRE_ALL=1`.
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1")
}

/// Whether a test that needs `what` may run: true when `check` is `Ok`.
/// When it is not, the test is skipped (returns false, with a line on
/// stderr), or fails under `CH_REQUIRE_ALL=1`.
#[track_caller]
pub fn available(what: &str, check: Result<(), String>) -> bool {
    match check {
        Ok(()) => true,
        Err(why) if require_all() => {
            panic!("{what} is required ({REQUIRE_ALL}=1) but missing: {why}")
        }
        Err(why) => {
            eprintln!("skipped: {what} is missing: {why} (set {REQUIRE_ALL}=1 to fail instead)");
            false
        }
    }
}

/// `Ok` when `name` is an executable file in one of `$PATH`'s folders.
pub fn command(name: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if found {
        Ok(())
    } else {
        Err(format!("no '{name}' in PATH"))
    }
}

/// [`available`] for a command in `$PATH`.
#[track_caller]
pub fn has_command(name: &str) -> bool {
    available(name, command(name))
}

/// `Ok` when `path` exists.
pub fn exists(path: &Path) -> Result<(), String> {
    if path.exists() {
        Ok(())
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_commands_in_path() {
        assert!(command("sh").is_ok());
        let err = command("no-such-command-here").unwrap_err();
        assert!(err.contains("no-such-command-here"), "{err}");
    }

    #[test]
    fn a_present_tool_always_runs() {
        assert!(available("sh", Ok(())));
    }

    #[test]
    fn a_missing_tool_skips_or_fails_as_the_environment_says() {
        let r = std::panic::catch_unwind(|| available("nothing", Err("gone".into())));
        if require_all() {
            let msg = r.unwrap_err();
            let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(text.contains("nothing") && text.contains("gone"), "{text}");
        } else {
            assert_eq!(r.ok(), Some(false));
        }
    }
}
