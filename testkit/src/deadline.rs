//! Deadlines for tests: a test that starts a process or waits for a case
//! fails, naming what overran, instead of hanging the whole test run.
//!
//! [`output_within`] runs a command with its output captured (as
//! `Command::output` does) and kills it when it overruns, [`wait_within`]
//! does the same for a child already started ([`exit_within`] for one
//! whose output goes elsewhere); [`try_output_within`] is
//! [`output_within`] for a caller that must not panic (a `Drop` that
//! unmounts, a probe whose failure means "not available"); [`signal`]
//! sends a child a signal with `kill(1)` under a deadline;
//! [`stop_cleanly`] stops a daemon a test started (SIGTERM, then exit
//! status 0 in time, or a failure that shows the daemon's log); a
//! [`ChildGuard`] kills its child when a test fails before it does;
//! [`with_deadline`]
//! runs a closure on its own thread and gives up on it when it overruns
//! (its thread is left behind; the failing test ends the process soon).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The limit tests give one command unless they say otherwise: far beyond
/// what any single command of the suite takes on a loaded 2-core machine,
/// far below CI's limit.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(300);

/// Runs `cmd` (stdin from /dev/null, stdout and stderr captured) and
/// returns its output. Panics if it cannot start, or if it runs longer
/// than `limit`: then it is killed and the panic shows what it printed.
#[track_caller]
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    try_output_within(cmd, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// [`output_within`] that returns, instead of panicking, why there is no
/// output: the command could not start, or it overran `limit` (then it
/// was killed; the error holds what it printed).
pub fn try_output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    try_wait_within(child, &format!("{cmd:?}"), limit)
}

/// Waits for a started `child` (named `what` in a failure) and returns its
/// output, as `Child::wait_with_output` does; a child still running after
/// `limit` is killed and fails the test with what it printed.
#[track_caller]
pub fn wait_within(child: Child, what: &str, limit: Duration) -> Output {
    try_wait_within(child, what, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits for `child` (named `what` in a failure) to exit and returns its
/// status, leaving its pipes alone; a child still running after `limit`
/// is killed and fails the test.
#[track_caller]
pub fn exit_within(child: &mut Child, what: &str, limit: Duration) -> ExitStatus {
    try_exit_within(child, what, limit).unwrap_or_else(|e| panic!("{e}"))
}

/// [`exit_within`] that returns why there is no status instead of
/// panicking (the child overran `limit` and was killed).
fn try_exit_within(child: &mut Child, what: &str, limit: Duration) -> Result<ExitStatus, String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what} still running after {limit:?} (a hang?); killed"
                ));
            }
            Err(e) => return Err(format!("waiting for {what}: {e}")),
        }
    }
}

/// Stops a daemon the test started and expects to stop cleanly: SIGTERM,
/// then exit status 0 within `limit`. Fails the test naming `what`, with
/// the daemon's log (the file at `log`, read at that moment), when the
/// signal cannot be sent, the daemon overruns `limit` (it is then
/// killed) or it exits with a failure.
#[track_caller]
pub fn stop_cleanly(child: &mut Child, what: &str, limit: Duration, log: &Path) {
    let log_text = || std::fs::read_to_string(log).unwrap_or_default();
    let stopped = signal(child.id(), "TERM")
        .and_then(|()| try_exit_within(child, &format!("{what} after SIGTERM"), limit));
    match stopped {
        Ok(status) if status.success() => {}
        Ok(status) => panic!(
            "{what} exited with {status} after SIGTERM; log:\n{}",
            log_text()
        ),
        Err(e) => panic!("{e}; log:\n{}", log_text()),
    }
}

fn try_wait_within(mut child: Child, what: &str, limit: Duration) -> Result<Output, String> {
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let (out, err) = (stdout.join(), stderr.join());
                return Err(format!(
                    "{what} still running after {limit:?} (a hang?); killed.\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.unwrap_or_default()),
                    String::from_utf8_lossy(&err.unwrap_or_default())
                ));
            }
            Err(e) => return Err(format!("waiting for {what}: {e}")),
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A started child that is killed (SIGKILL) and reaped when this is
/// dropped, unless it has exited: a test that fails half way (a panic
/// before its own kill) leaves no process running. Derefs to the
/// [`Child`].
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends signal `name` (`TERM`, `USR1`, ...) to process `pid` with
/// `kill(1)`, under a deadline; `Err` says why it was not delivered (the
/// process is gone, `kill` overran).
pub fn signal(pid: u32, name: &str) -> Result<(), String> {
    let out = try_output_within(
        Command::new("kill").args([&format!("-{name}"), &pid.to_string()]),
        Duration::from_secs(30),
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "kill -{name} {pid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Reads a child's pipe to its end on a thread of its own (a full pipe
/// must never stop the child while we wait for it).
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs `case` on its own thread and returns what it returns; panics
/// naming `what` if it takes longer than `limit`, and with the case's
/// own panic if it panics.
#[track_caller]
pub fn with_deadline<T: Send + 'static>(
    what: &str,
    limit: Duration,
    case: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(what.chars().take(15).collect())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)));
        })
        .expect("spawn the case's thread");
    match rx.recv_timeout(limit) {
        Ok(answer) => {
            let _ = thread.join();
            answer.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {limit:?} (a hang)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what}: the case's thread ended without an answer")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_ends_returns_its_output() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(20),
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_command_that_overruns_is_killed_and_named() {
        let started = Instant::now();
        let panic = std::panic::catch_unwind(|| {
            output_within(
                Command::new("sh").args(["-c", "echo begun; exec sleep 30"]),
                Duration::from_millis(300),
            )
        })
        .unwrap_err();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(msg.contains("still running after"), "{msg}");
        assert!(msg.contains("begun"), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_command_that_overruns_or_cannot_start_is_an_error_not_a_panic() {
        let err = try_output_within(
            Command::new("sh").args(["-c", "echo begun; exec sleep 30"]),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(
            err.contains("still running after") && err.contains("begun"),
            "{err}"
        );
        let err = try_output_within(
            &mut Command::new("no-such-command-here"),
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(err.contains("cannot run"), "{err}");
        let out = try_output_within(&mut Command::new("true"), Duration::from_secs(20)).unwrap();
        assert!(out.status.success());
    }

    #[test]
    fn exit_within_returns_the_status_or_kills_an_overrunning_child() {
        let mut quick = Command::new("sh").args(["-c", "exit 4"]).spawn().unwrap();
        let status = exit_within(&mut quick, "sh", Duration::from_secs(20));
        assert_eq!(status.code(), Some(4));
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = slow.id();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exit_within(&mut slow, "sleep", Duration::from_millis(200))
        }))
        .unwrap_err();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(msg.contains("sleep still running"), "{msg}");
        assert!(
            signal(pid, "0").is_err(),
            "the overrunning child was killed"
        );
    }

    #[test]
    fn stop_cleanly_passes_a_clean_exit_and_fails_the_rest_with_the_log() {
        let dir = crate::TempDir::new("testkit-stop");
        let log = dir.join("log");
        std::fs::write(&log, "the daemon's last words").unwrap();
        let daemon = |script: &str| Command::new("sh").args(["-c", script]).spawn().unwrap();
        // Exits 0 on SIGTERM.
        let mut clean = daemon("trap 'exit 0' TERM; while :; do sleep 0.05; done");
        std::thread::sleep(Duration::from_millis(200));
        stop_cleanly(&mut clean, "clean", Duration::from_secs(20), &log);
        let failing = |script: &'static str, limit| {
            let panic = std::panic::catch_unwind(|| {
                let mut child = daemon(script);
                std::thread::sleep(Duration::from_millis(200));
                stop_cleanly(&mut child, "stubborn", limit, &log)
            })
            .unwrap_err();
            panic.downcast_ref::<String>().unwrap().clone()
        };
        let msg = failing(
            "trap 'exit 3' TERM; while :; do sleep 0.05; done",
            Duration::from_secs(20),
        );
        assert!(msg.contains("exited with exit status: 3"), "{msg}");
        assert!(msg.contains("the daemon's last words"), "{msg}");
        let msg = failing(
            "trap '' TERM; while :; do sleep 0.05; done",
            Duration::from_millis(300),
        );
        assert!(
            msg.contains("stubborn after SIGTERM still running"),
            "{msg}"
        );
        assert!(msg.contains("the daemon's last words"), "{msg}");
    }

    #[test]
    fn a_guarded_child_is_killed_when_the_guard_drops() {
        let guard = ChildGuard(Command::new("sleep").arg("30").spawn().unwrap());
        let pid = guard.id();
        assert!(signal(pid, "0").is_ok(), "the child runs");
        drop(guard);
        assert!(signal(pid, "0").is_err(), "the child is gone");
    }

    #[test]
    fn signals_reach_a_child_and_a_gone_process_is_an_error() {
        let child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        signal(pid, "TERM").unwrap();
        let out = wait_within(child, "sleep after SIGTERM", Duration::from_secs(20));
        assert!(!out.status.success());
        assert!(signal(pid, "TERM").is_err());
    }

    #[test]
    fn a_case_that_overruns_fails_the_test() {
        let panic = std::panic::catch_unwind(|| {
            with_deadline("sleeper", Duration::from_millis(100), || {
                std::thread::sleep(Duration::from_secs(5))
            })
        })
        .unwrap_err();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(msg.contains("sleeper: still running"), "{msg}");
        assert_eq!(with_deadline("quick", Duration::from_secs(5), || 7), 7);
        // A case that panics fails with its own message.
        let panic = std::panic::catch_unwind(|| {
            with_deadline("panicker", Duration::from_secs(5), || -> u8 {
                panic!("the case's own words")
            })
        })
        .unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"the case's own words"));
    }
}
