//! `ch-storage-daemon`: exports one disk image to other consumers, the job
//! of qemu-storage-daemon.
//!
//! ```text
//! ch-storage-daemon --image path=IMG[,readonly=on][,direct=on][,engine=..] \
//!     --export type=fuse,mountpoint=FILE[,writable=on]... \
//!     --export type=vhost-user-blk,socket=PATH[,num_queues=N]... \
//!     --export type=nbd,addr=unix:PATH|tcp:HOST:PORT[,name=NAME][,writable=on]...
//! ```
//!
//! A thin front end: [`args`] parses the command line, [`daemon`] opens
//! the image through the block crate (holding its lock, as the VMM does),
//! starts every export ([`export`]) and waits for SIGTERM or SIGINT; then
//! it stops each export (which drains its requests) and closes the image
//! clean. Exit status: 0 after a clean stop, 1 on a runtime error, 2 on a
//! bad command line.

mod args;
mod daemon;
mod export;

use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let config = match args::parse_args(&argv) {
        Ok(args::Command::Help) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(args::Command::Version) => {
            println!("ch-storage-daemon {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(args::Command::Run(c)) => c,
        Err(e) => {
            eprintln!("ch-storage-daemon: {e}");
            return ExitCode::from(2);
        }
    };
    ch_log::install(
        "ch-storage-daemon",
        match config.verbosity {
            0 => log::LevelFilter::Info,
            1 => log::LevelFilter::Debug,
            _ => log::LevelFilter::Trace,
        },
    );
    match daemon::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ch-storage-daemon: {}", ch_log::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
