//! The `cloud-hypervisor` binary: parse the whole command line, start
//! the VMM (and the command line's VM, if it describes one), and exit 0
//! after a guest power-off, SIGTERM/SIGINT or `vmm.shutdown`, non-zero
//! with a message on any error: as upstream, 2 for a command line the
//! parser refuses (with its usage), 1 for anything else (one line).

use std::process::ExitCode;

use vmm::config::{args, parse_args, Command, ConfigError};
use vmm::vm::ExitReason;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        eprint!("{}", args::help());
        return ExitCode::from(2);
    }
    let config = match parse_args(&argv) {
        Ok(Command::Help) => {
            print!("{}", args::help());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("{}", args::version());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(c)) => c,
        Err(ConfigError::Usage(text)) => {
            eprint!("{text}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("cloud-hypervisor: {e}");
            return ExitCode::FAILURE;
        }
    };
    let level = match config.verbosity {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        2 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    };
    match &config.log_file {
        None => ch_log::install("cloud-hypervisor", level),
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path);
            match file {
                Ok(f) => ch_log::install_to_file("cloud-hypervisor", level, f),
                Err(e) => {
                    eprintln!(
                        "cloud-hypervisor: cannot open the log file {}: {e}",
                        path.display()
                    );
                    return ExitCode::FAILURE;
                }
            }
        }
    }

    if let Some(monitor) = &config.event_monitor {
        if let Err(e) = vmm::vm::start_event_monitor(monitor, config.seccomp) {
            eprintln!("cloud-hypervisor: {}", ch_log::error_chain(&e));
            return ExitCode::FAILURE;
        }
    }
    let code = run(*config);
    vmm::events::finish(std::time::Duration::from_secs(5));
    code
}

fn run(config: vmm::config::RunConfig) -> ExitCode {
    let builder = match vmm::vm::prepare_process(config.seccomp) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cloud-hypervisor: {}", ch_log::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    match vmm::vm::run(config, builder) {
        Ok(ExitReason::Fatal(msg)) => {
            eprintln!("cloud-hypervisor: fatal: {msg}");
            ExitCode::FAILURE
        }
        Ok(reason) => {
            log::info!("clean exit ({reason:?})");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cloud-hypervisor: {}", ch_log::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
