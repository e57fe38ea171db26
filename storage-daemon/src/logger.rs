//! A minimal stderr logger (`-v` raises the level) and the error-chain
//! printer for the one line the daemon prints when it fails.

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("ch-storage-daemon: {}: {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// Logs at info by default (one line per export), debug with `-v`, trace
/// with `-vv`.
pub fn install(verbosity: u8) {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(match verbosity {
        0 => log::LevelFilter::Info,
        1 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    });
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
