//! `ch-remote --api-socket PATH COMMAND [ARGS]`: the API's command-line
//! client, with Cloud Hypervisor's verbs and their syntax (the endpoint
//! table's, [`vmm::endpoints`]). A thin front end over
//! [`vmm::api::client`]: prints the answer's JSON body on success (exit
//! 0), the error on stderr otherwise (exit 1; 2 for a usage error).
//! `--version` (`-V`) prints `ch-remote vVERSION`, as Cloud Hypervisor's
//! ch-remote does. The block-job verbs take `--wait`
//! ([`vmm::api::job_wait`]): progress on stderr, the job's last state
//! printed, exit 1 if it failed.

use std::path::PathBuf;
use std::process::ExitCode;

use vmm::api::client::{call_for, error_text, send, usage, ClientError};
use vmm::api::job_wait::{wait_for_job, wait_kind};

fn main() -> ExitCode {
    let table = vmm::endpoints::table();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", usage(&table));
        return if args.is_empty() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    let mut socket: Option<PathBuf> = None;
    if let Some(i) = args.iter().position(|a| a == "--api-socket") {
        if i + 1 < args.len() {
            socket = Some(PathBuf::from(args.remove(i + 1)));
        }
        args.remove(i);
    } else if let Some(i) = args.iter().position(|a| a.starts_with("--api-socket=")) {
        socket = args
            .remove(i)
            .strip_prefix("--api-socket=")
            .map(PathBuf::from);
    }
    // Before the command only: a value after it may be spelt so.
    if matches!(args.first().map(String::as_str), Some("--version" | "-V")) {
        println!("ch-remote v{}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let Some(socket) = socket else {
        eprintln!("ch-remote: --api-socket PATH is required (see --help)");
        return ExitCode::from(2);
    };
    let Some((command, rest)) = args.split_first() else {
        eprintln!("ch-remote: no command given (see --help)");
        return ExitCode::from(2);
    };
    let mut rest = rest.to_vec();
    let wait = match rest.iter().position(|a| a == "--wait") {
        Some(i) if wait_kind(command).is_some() => {
            rest.remove(i);
            wait_kind(command)
        }
        _ => None,
    };
    let call = match call_for(&table, command, &rest) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ch-remote: {e}");
            return ExitCode::from(2);
        }
    };
    match send(&socket, &call) {
        Ok(answer) if answer.status < 300 => {
            if !answer.body.is_empty() {
                println!("{}", answer.body);
            }
            match wait {
                Some(until) => {
                    let job = serde_json::from_str::<serde_json::Value>(&answer.body)
                        .ok()
                        .and_then(|v| v["job"].as_str().map(String::from))
                        .or_else(|| rest.first().cloned())
                        .unwrap_or_default();
                    match wait_for_job(&socket, &job, until) {
                        Ok(last) => {
                            println!("{last}");
                            if last["state"] == "failed" {
                                eprintln!(
                                    "ch-remote: job {job} failed: {}",
                                    last["error"].as_str().unwrap_or("")
                                );
                                ExitCode::FAILURE
                            } else {
                                ExitCode::SUCCESS
                            }
                        }
                        Err(e) => {
                            eprintln!("ch-remote: {}", ch_log::error_chain(&e));
                            ExitCode::FAILURE
                        }
                    }
                }
                None => ExitCode::SUCCESS,
            }
        }
        Ok(answer) => {
            eprintln!(
                "ch-remote: {} failed ({}): {}",
                call.endpoint,
                answer.status,
                error_text(&answer.body)
            );
            ExitCode::FAILURE
        }
        Err(e @ ClientError::Usage(_)) => {
            eprintln!("ch-remote: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("ch-remote: {}", ch_log::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
