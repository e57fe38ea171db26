//! qemu-img's progress report for long verbs (convert, commit, rebase,
//! compare, amend).
//!
//! The verb tells [`Progress`] how much of its work is done; the
//! percentage leaves on stdout in qemu-img's format. With `-p` it is
//! printed as `    (xx.xx/100%)` and a carriage return each time it
//! advanced by at least one percent, and a newline at the end. Without
//! `-p`, SIGUSR1 asks for it once: the next update prints it with a
//! newline (as qemu-img does, so `kill -USR1` shows how far a copy is).
//!
//! [`StepProgress`] is qemu's own arithmetic, for verbs whose report is
//! compared with qemu-img's digit for digit (`compare`): each step adds
//! its share of the work to a single-precision sum, and the sum is
//! printed when it moved more than the verb's step since the last print
//! (2 points for compare), or is exactly 0 or 100.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the SIGUSR1 handler, taken by the next update.
static PRINT_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigusr1(_signal: libc::c_int) {
    PRINT_REQUESTED.store(true, Ordering::Relaxed);
}

/// Without `-p`: SIGUSR1 asks for one report.
fn print_on_sigusr1() {
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; no other handler is replaced that the program
    // relies on.
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            on_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
}

/// Progress of one verb (see the module docs).
pub struct Progress {
    enabled: bool,
    total: u64,
    last_printed: Option<f64>,
}

impl Progress {
    /// Starts reporting; `enabled` is `-p`. `total` is the amount of work
    /// (bytes), at least 1.
    pub fn new(enabled: bool, total: u64) -> Self {
        if !enabled {
            print_on_sigusr1();
        }
        let mut p = Progress {
            enabled,
            total: total.max(1),
            last_printed: None,
        };
        p.update(0);
        p
    }

    /// The amount of work, once it is known (at least 1).
    pub fn set_total(&mut self, total: u64) {
        self.total = total.max(1);
    }

    /// `done` of the total is finished.
    pub fn update(&mut self, done: u64) {
        let percent = (done.min(self.total) as f64 * 100.0) / self.total as f64;
        if PRINT_REQUESTED.swap(false, Ordering::Relaxed) {
            print_line(percent, '\n');
        }
        if !self.enabled {
            return;
        }
        let due = match self.last_printed {
            None => true,
            Some(last) => percent >= last + 1.0 || (percent >= 100.0 && last < 100.0),
        };
        if due {
            self.last_printed = Some(percent);
            print_line(percent, '\r');
        }
    }

    /// The work is done: 100% and, with `-p`, the final newline.
    pub fn finish(mut self) {
        self.update(self.total);
        if self.enabled {
            print_line(100.0, '\r');
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out);
            let _ = out.flush();
        }
    }
}

/// qemu's progress arithmetic (see the module docs).
pub struct StepProgress {
    enabled: bool,
    min_skip: f32,
    current: f32,
    last_printed: f32,
}

impl StepProgress {
    /// Starts reporting (`enabled` is `-p`; SIGUSR1 asks otherwise);
    /// the first [`StepProgress::add`] (of 0, when the work begins)
    /// prints 0 %.
    pub fn new(enabled: bool, min_skip: f32) -> Self {
        let p = StepProgress {
            enabled,
            min_skip,
            current: 0.0,
            last_printed: 0.0,
        };
        if !enabled {
            print_on_sigusr1();
        }
        p
    }

    /// `done` more units of `total` are finished.
    pub fn add(&mut self, done: u64, total: u64) {
        // As qemu computes it: ((float) chunk / total) * 100, then
        // current + delta / 100 * 100, all in single precision.
        let delta = (done as f32 / total.max(1) as f32) * 100.0;
        self.set(self.current + delta / 100.0 * 100.0);
    }

    /// The work is `percent` done (qemu's absolute report).
    pub fn set(&mut self, current: f32) {
        self.current = current;
        if PRINT_REQUESTED.swap(false, Ordering::Relaxed) {
            print_line(f64::from(current), '\n');
        }
        if !self.enabled {
            return;
        }
        if current > self.last_printed + self.min_skip
            || current < self.last_printed - self.min_skip
            || current == 100.0
            || current == 0.0
        {
            self.last_printed = current;
            print_line(f64::from(current), '\r');
        }
    }

    /// Ends the report: with `-p`, a newline (after whatever the verb
    /// printed last, as qemu-img ends it).
    pub fn end(self) {
        if self.enabled {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out);
            let _ = out.flush();
        }
    }
}

fn print_line(percent: f64, end: char) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "    ({percent:.2}/100%){end}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_at_most_once_per_percent() {
        let mut p = Progress::new(true, 1000);
        assert_eq!(p.last_printed, Some(0.0));
        p.update(5);
        assert_eq!(p.last_printed, Some(0.0));
        p.update(10);
        assert_eq!(p.last_printed, Some(1.0));
        p.update(1000);
        assert_eq!(p.last_printed, Some(100.0));
    }

    #[test]
    fn step_progress_sums_in_single_precision() {
        // 2 MiB steps of 300 MiB, as qemu-img compare takes them over
        // data: qemu prints 2.67, 5.33, 8.00, then 10.00 (the sum's
        // rounding error lifts it just past 8 + 2).
        let mut p = StepProgress::new(true, 2.0);
        p.add(0, 1);
        let mut printed = Vec::new();
        for _ in 0..15 {
            let before = p.last_printed;
            p.add(2 << 20, 300 << 20);
            if p.last_printed != before {
                printed.push(format!("{:.2}", p.last_printed));
            }
        }
        assert_eq!(printed, ["2.67", "5.33", "8.00", "10.00"]);
    }
}
