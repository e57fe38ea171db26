//! `ch-remote`'s `--wait` for the block-job verbs: after the verb's
//! request succeeded, polls `vm.disk-jobs` for the job, shows its
//! progress on stderr (a bar redrawn in place on a terminal, a line per
//! tenth or state change otherwise) and returns the state it ended in.
//!
//! A mirror or a commit is waited for until it is ready (or has ended);
//! a stream, complete and cancel until the job has ended. Enters as the socket, the job id and
//! what to wait for; leaves as the job's last JSON entry.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::client::{error_text, send, Call, ClientError};

/// How often the job list is read.
const POLL: Duration = Duration::from_millis(200);

/// Whether `--wait` may be given to `verb`, and what it waits for.
pub fn wait_kind(verb: &str) -> Option<Until> {
    match verb {
        // An active commit reaches ready; a stream or another commit
        // ends on its own (an end state counts as ready too).
        "disk-mirror" | "disk-commit" => Some(Until::Ready),
        "disk-stream" => Some(Until::Ended),
        "disk-job-complete" | "disk-job-cancel" => Some(Until::Ended),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// `ready` or an end state.
    Ready,
    /// `completed`, `failed` or `cancelled`.
    Ended,
}

fn is_final(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled")
}

/// Polls job `job` until `until`; returns its last entry.
pub fn wait_for_job(socket: &Path, job: &str, until: Until) -> Result<Value, ClientError> {
    let tty = std::io::stderr().is_terminal();
    let mut shown = (String::new(), u64::MAX);
    loop {
        let call = Call {
            method: "GET",
            endpoint: "vm.disk-jobs",
            body: None,
        };
        let answer = send(socket, &call)?;
        if answer.status >= 300 {
            return Err(ClientError::BadAnswer(format!(
                "vm.disk-jobs failed ({}): {}",
                answer.status,
                error_text(&answer.body)
            )));
        }
        let list: Vec<Value> = serde_json::from_str(&answer.body)
            .map_err(|e| ClientError::BadAnswer(format!("vm.disk-jobs: {e}")))?;
        let entry = list
            .into_iter()
            .find(|j| j["id"] == job)
            .ok_or_else(|| ClientError::BadAnswer(format!("job '{job}' is not listed")))?;
        let state = entry["state"].as_str().unwrap_or("?").to_string();
        let done = entry["bytes_done"].as_u64().unwrap_or(0);
        let total = entry["bytes_total"].as_u64().unwrap_or(0).max(done);
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        if tty || state != shown.0 || tenth != shown.1 {
            show(&entry, &state, done, total, tty);
            shown = (state.clone(), tenth);
        }
        let end = is_final(&state) || (until == Until::Ready && state == "ready");
        if end {
            if tty {
                eprintln!();
            }
            return Ok(entry);
        }
        std::thread::sleep(POLL);
    }
}

fn show(entry: &Value, state: &str, done: u64, total: u64, tty: bool) {
    const WIDTH: u64 = 30;
    let fill = (done * WIDTH).checked_div(total).unwrap_or(0) as usize;
    let pct = (done as f64 * 100.0 / total.max(1) as f64).min(100.0);
    let rate = entry["rate"].as_u64().unwrap_or(0);
    let line = format!(
        "{} {} [{}{}] {pct:5.1}% {} of {} MiB, {} MiB/s, {state}",
        entry["id"].as_str().unwrap_or("?"),
        entry["type"].as_str().unwrap_or("?"),
        "#".repeat(fill),
        " ".repeat(WIDTH as usize - fill),
        done >> 20,
        total >> 20,
        rate >> 20,
    );
    let mut err = std::io::stderr();
    if tty {
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    } else {
        let _ = writeln!(err, "{line}");
    }
}
