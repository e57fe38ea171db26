//! The `cloud-hypervisor` binary: parse the whole command line, open the
//! disks, boot, and exit 0 after a clean guest reset/power-off or
//! SIGTERM/SIGINT, non-zero with a message on any error.

use std::process::ExitCode;

use vmm::config::{args::USAGE, parse_args, Command};
use vmm::vm::ExitReason;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match parse_args(&args) {
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("cloud-hypervisor {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(c)) => c,
        Err(e) => {
            eprintln!("cloud-hypervisor: {e}");
            return ExitCode::from(2);
        }
    };
    ch_log::install(
        "cloud-hypervisor",
        match config.verbosity {
            0 => log::LevelFilter::Warn,
            1 => log::LevelFilter::Info,
            2 => log::LevelFilter::Debug,
            _ => log::LevelFilter::Trace,
        },
    );

    if let Err(e) = vmm::vm::prepare_process(config.seccomp) {
        eprintln!("cloud-hypervisor: {}", ch_log::error_chain(&e));
        return ExitCode::FAILURE;
    }
    let disks = match vmm::device_manager::open_disks(&config.disks) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cloud-hypervisor: {}", ch_log::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // The guest owns the terminal while it runs (restored on drop).
    let _raw_terminal = if config.serial == vmm::config::SerialMode::Tty {
        vmm::terminal::RawTerminal::enter().unwrap_or_else(|e| {
            log::warn!("cannot put the terminal in raw mode: {e}");
            None
        })
    } else {
        None
    };
    match vmm::vm::run(&config, disks) {
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
