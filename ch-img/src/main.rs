//! `ch-img`: qemu-img's verbs over the block crate.
//!
//! The first argument names the verb; the rest go to that verb's module in
//! `cmd/`, which parses them (qemu-img's options and meanings), runs the
//! block crate and prints qemu-img's output. The verb returns its exit
//! status; errors are printed as "ch-img: message: cause" on stderr and exit
//! with the verb's error status (1, or 2 for `compare`).

mod args;
mod chunk_bounds;
mod chunk_fill;
mod chunk_pieces;
mod cmd;
mod convert_source;
mod copy_pipeline;
mod error;
mod help;
mod image_io;
mod json_style;
mod option_help;
mod options;
mod progress;
mod size;
mod write_behind;

use std::process::ExitCode;

use error::{chain, CliError};

use help::{asks_for_help, verb_help, USAGE, VERSION};

fn main() -> ExitCode {
    // Like qemu-img, die quietly when stdout is a closed pipe (`| head`)
    // instead of failing every later print.
    // SAFETY: restoring the default action of a signal the Rust runtime
    // set to "ignore"; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((verb, rest)) = argv.split_first() else {
        eprintln!("ch-img: Not enough arguments\n{USAGE}");
        return ExitCode::from(1);
    };
    if let Some(status) = print_help(verb, rest) {
        return status;
    }
    let (result, error_status): (Result<u8, CliError>, u8) = match verb.as_str() {
        "-V" | "--version" => {
            println!("{VERSION}");
            return ExitCode::SUCCESS;
        }
        "amend" => (cmd::amend::run(rest), 1),
        "bitmap" => (cmd::bitmap::run(rest), 1),
        "dd" => (cmd::dd::run(rest), 1),
        "create" => (cmd::create::run(rest), 1),
        "info" => (cmd::info::run(rest), 1),
        "check" => (cmd::check::run(rest), 1),
        "convert" => (cmd::convert::run(rest), 1),
        "map" => (cmd::map::run(rest), 1),
        "measure" => (cmd::measure::run(rest), 1),
        "compare" => (cmd::compare::run(rest), 2),
        "resize" => (cmd::resize::run(rest), 1),
        "bench" => (cmd::bench::run(rest), 1),
        "snapshot" => (cmd::snapshot::run(rest), 1),
        "rebase" => (cmd::rebase::run(rest), 1),
        "commit" => (cmd::commit::run(rest), 1),
        other => {
            eprintln!("ch-img: Command not found: {other}\n{USAGE}");
            return ExitCode::from(1);
        }
    };
    match result {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("ch-img: {}", chain(&e));
            match e {
                CliError::Syntax(_) => ExitCode::from(1),
                _ => ExitCode::from(error_status),
            }
        }
    }
}

/// `--help`, `help [COMMAND]` and `COMMAND --help`; `None` when the
/// words ask for something else.
fn print_help(verb: &str, rest: &[String]) -> Option<ExitCode> {
    let wanted = match verb {
        "-h" | "--help" => None,
        "help" => rest.first().map(String::as_str),
        v if asks_for_help(rest) => Some(v),
        _ => return None,
    };
    let Some(v) = wanted else {
        println!("{USAGE}");
        return Some(ExitCode::SUCCESS);
    };
    match verb_help(v) {
        Some(text) => {
            print!("{text}");
            Some(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("ch-img: Command not found: {v}\n{USAGE}");
            Some(ExitCode::from(1))
        }
    }
}
