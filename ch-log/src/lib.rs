//! What every binary of the project prints on stderr: log records as
//! `<program>: <LEVEL>: <message>` through the `log` crate's facade, and
//! an error with its whole chain of sources on one line. Records may go
//! to a file instead ([`install_to_file`], `cloud-hypervisor --log-file`).
//!
//! A binary calls [`install`] once with its name and level; libraries log
//! through `log` and format errors with [`error_chain`]. Written here
//! rather than taken from a logging crate: nothing more than these lines
//! is needed, and the format is part of what tests and users read.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

struct StderrLogger;

static PROGRAM: OnceLock<&'static str> = OnceLock::new();
static LOGGER: StderrLogger = StderrLogger;
/// Where records go instead of stderr, once set.
static FILE: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let program = PROGRAM.get().copied().unwrap_or("ch");
            match FILE.get() {
                Some(f) => {
                    let mut f = f.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let _ = writeln!(f, "{program}: {}: {}", r.level(), r.args());
                }
                None => eprintln!("{program}: {}: {}", r.level(), r.args()),
            }
        }
    }
    fn flush(&self) {}
}

/// Logs to stderr as `program`, at `level` and above. A second call
/// changes only the level.
pub fn install(program: &'static str, level: log::LevelFilter) {
    let _ = PROGRAM.set(program);
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

/// As [`install`], with the records appended to `file` instead of
/// stderr (errors a binary prints itself still go to stderr).
pub fn install_to_file(program: &'static str, level: log::LevelFilter, file: std::fs::File) {
    let _ = FILE.set(Mutex::new(file));
    install(program, level);
}

/// The descriptor records are written to: the log file's once
/// [`install_to_file`] set one, else stderr's. For code that must write a
/// record in the log's format without the logger (a signal handler,
/// which may not take the file's lock).
pub fn raw_fd() -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    match FILE.get() {
        Some(f) => f
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_raw_fd(),
        None => 2,
    }
}

/// `e` and each of its sources, joined by ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|l| l as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn the_chain_joins_every_source() {
        let e = Layer(
            "cannot open disk",
            Some(Box::new(Layer(
                "img.qcow2",
                Some(Box::new(Layer("EACCES", None))),
            ))),
        );
        assert_eq!(error_chain(&e), "cannot open disk: img.qcow2: EACCES");
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
