//! Per-thread and whole-process CPU time of a run, from procfs and the
//! process CPU clock.
//!
//! Data enters as `/proc/thread-self` (a driver thread reads its own at
//! the end of its run), `/proc/self/task/*` (every live thread, read
//! before and after the run: [`CpuSnapshot`]) and
//! `CLOCK_PROCESS_CPUTIME_ID` (the whole process, threads that exited
//! during the run included); it leaves as [`ThreadCpu`] records that the
//! JSON output prints per thread and as a [`CpuSplit`] by thread kind,
//! both divided by the requests of the run. CPU time is `schedstat`'s
//! time on CPU (nanoseconds, user and system together; the process clock
//! sums the same counter over the thread group); context switches are
//! the voluntary (the thread slept: a wake-up) and involuntary ones of
//! `status`. These counts do not change with the machine's noise the way
//! IOPS do, which is what the per-request comparisons need.
//!
//! Thread kinds: the device's queue workers (`virtio-blk-qN`), the
//! drivers that stand in for the guest (`blk-bench-qN`), and io_uring's
//! io-wq workers (`iou-wrk-N`), which do the copy of buffered and tmpfs
//! requests and come and go while a ring is busy, so their share is the
//! whole process less every other thread (exited io-wq workers included).
//! fio's whole process (its io-wq workers included) is what "whole less
//! driver" compares with (`fio.rs`).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// Name prefix of the device's queue workers (set by `BlockDevice`).
pub const WORKER_PREFIX: &str = "virtio-blk-q";
/// Name prefix of our driver threads (the guest's stand-in).
pub const DRIVER_PREFIX: &str = "blk-bench-q";
/// Name prefix of io_uring's io-wq worker threads (set by the kernel).
pub const IO_WQ_PREFIX: &str = "iou-wrk-";

/// What one thread used up to the moment it was read.
#[derive(Clone, Debug, Default)]
pub struct ThreadCpu {
    pub name: String,
    pub cpu_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

impl ThreadCpu {
    /// Reads the thread whose procfs directory is `dir`; None if it is
    /// gone or unreadable.
    pub fn read(dir: &Path) -> Option<ThreadCpu> {
        let name = fs::read_to_string(dir.join("comm"))
            .ok()?
            .trim()
            .to_string();
        let schedstat = fs::read_to_string(dir.join("schedstat")).ok()?;
        let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
        let status = fs::read_to_string(dir.join("status")).ok()?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Some(ThreadCpu {
            name,
            cpu_ns,
            voluntary_switches: field("voluntary_ctxt_switches:"),
            involuntary_switches: field("nonvoluntary_ctxt_switches:"),
        })
    }

    /// The calling thread. Its CPU time comes from the thread's CPU
    /// clock, which (unlike `schedstat`) includes the time since the
    /// thread last left the CPU.
    pub fn current() -> Option<ThreadCpu> {
        let mut t = ThreadCpu::read(Path::new("/proc/thread-self"))?;
        t.cpu_ns = t.cpu_ns.max(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID));
        Some(t)
    }

    /// Every thread of this process whose name starts with `prefix`.
    pub fn named(prefix: &str) -> Vec<ThreadCpu> {
        let Ok(tasks) = fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        let mut out: Vec<ThreadCpu> = tasks
            .filter_map(|e| ThreadCpu::read(&e.ok()?.path()))
            .filter(|t| t.name.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Every live thread of this process, by thread id.
    pub fn all() -> HashMap<u32, ThreadCpu> {
        let Ok(tasks) = fs::read_dir("/proc/self/task") else {
            return HashMap::new();
        };
        tasks
            .filter_map(|e| {
                let e = e.ok()?;
                let tid = e.file_name().to_str()?.parse().ok()?;
                Some((tid, ThreadCpu::read(&e.path())?))
            })
            .collect()
    }

    /// JSON with the per-request figures over `ops` requests.
    pub fn to_json(&self, ops: u64) -> serde_json::Value {
        let per = |v: f64| v / ops.max(1) as f64;
        serde_json::json!({
            "name": self.name,
            "cpu_s": self.cpu_ns as f64 / 1e9,
            "cpu_us_per_op": per(self.cpu_ns as f64 / 1e3),
            "voluntary_switches_per_op": per(self.voluntary_switches as f64),
            "involuntary_switches_per_op": per(self.involuntary_switches as f64),
        })
    }
}

/// A CPU-time clock's reading in nanoseconds (0 if it cannot be read).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    if r != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// CPU time of the whole process so far (every thread, exited ones
/// included), in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The process's CPU time and every live thread's, at one moment.
pub struct CpuSnapshot {
    process_ns: u64,
    threads: HashMap<u32, ThreadCpu>,
}

impl CpuSnapshot {
    pub fn take() -> CpuSnapshot {
        // Threads first: the process clock read after them is never
        // smaller than their sum.
        let threads = ThreadCpu::all();
        CpuSnapshot {
            process_ns: process_cpu_ns(),
            threads,
        }
    }
}

/// CPU time of a run by thread kind (nanoseconds, summed over the
/// threads of each kind).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    /// The whole process.
    pub whole_ns: u64,
    /// The device's queue workers.
    pub worker_ns: u64,
    /// io_uring's io-wq workers: the whole process less every other
    /// thread (io-wq workers that exited during the run included).
    pub io_wq_ns: u64,
    /// The drivers (the guest's stand-in), as they read themselves.
    pub driver_ns: u64,
    /// Every other live thread (the main thread, helpers).
    pub other_ns: u64,
}

impl CpuSplit {
    /// The split of what happened between `before` and `after`;
    /// `drivers` are the driver threads' own reads (they have exited by
    /// `after`, and started after `before`). A thread's time is its
    /// growth between the snapshots (all of it for a thread born since).
    pub fn between(before: &CpuSnapshot, after: &CpuSnapshot, drivers: &[ThreadCpu]) -> CpuSplit {
        let mut s = CpuSplit {
            whole_ns: after.process_ns.saturating_sub(before.process_ns),
            driver_ns: drivers.iter().map(|t| t.cpu_ns).sum(),
            ..CpuSplit::default()
        };
        let mut named = 0u64;
        for (tid, t) in &after.threads {
            let start = before.threads.get(tid).map_or(0, |b| b.cpu_ns);
            let used = t.cpu_ns.saturating_sub(start);
            if t.name.starts_with(WORKER_PREFIX) {
                s.worker_ns += used;
            } else if t.name.starts_with(DRIVER_PREFIX) {
                // Counted from the drivers' own reads.
                continue;
            } else if !t.name.starts_with(IO_WQ_PREFIX) {
                s.other_ns += used;
            } else {
                continue;
            }
            named += used;
        }
        s.io_wq_ns = s.whole_ns.saturating_sub(named + s.driver_ns);
        s
    }

    /// The whole process less the guest's stand-in: what fio's whole
    /// process compares with.
    pub fn whole_less_driver_ns(&self) -> u64 {
        self.whole_ns.saturating_sub(self.driver_ns)
    }

    /// JSON of the per-request figures (microseconds) over `ops`.
    pub fn to_json(self, ops: u64) -> serde_json::Value {
        let per = |ns: u64| ns as f64 / 1e3 / ops.max(1) as f64;
        serde_json::json!({
            "whole": per(self.whole_ns),
            "whole_less_driver": per(self.whole_less_driver_ns()),
            "worker": per(self.worker_ns),
            "io_wq": per(self.io_wq_ns),
            "driver": per(self.driver_ns),
            "other": per(self.other_ns),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_thread_has_a_name_and_cpu_time() {
        let t = std::thread::Builder::new()
            .name("cpu-probe".into())
            .spawn(|| {
                // Burn a little CPU so the time cannot be zero.
                burn(2_000_000);
                let me = ThreadCpu::current().unwrap();
                let listed = ThreadCpu::named("cpu-probe");
                (me, listed)
            })
            .unwrap();
        let (me, listed) = t.join().unwrap();
        assert_eq!(me.name, "cpu-probe");
        assert!(me.cpu_ns > 0);
        assert_eq!(listed.len(), 1);
        let j = me.to_json(1000);
        assert!(j["cpu_us_per_op"].as_f64().unwrap() > 0.0);
    }

    /// Spends CPU time (a loop the optimizer cannot fold).
    fn burn(n: u64) {
        let mut x = 0u64;
        for i in 0..n {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }

    #[test]
    fn the_split_counts_threads_that_exited_during_the_run() {
        let before = CpuSnapshot::take();
        // A thread named like an io-wq worker that exits before the
        // second snapshot: only the process clock still has its time.
        std::thread::Builder::new()
            .name(format!("{IO_WQ_PREFIX}1"))
            .spawn(|| burn(20_000_000))
            .unwrap()
            .join()
            .unwrap();
        let driver = std::thread::Builder::new()
            .name(format!("{DRIVER_PREFIX}0"))
            .spawn(|| {
                burn(5_000_000);
                ThreadCpu::current().unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
        let after = CpuSnapshot::take();
        let s = CpuSplit::between(&before, &after, std::slice::from_ref(&driver));
        assert_eq!(s.driver_ns, driver.cpu_ns);
        assert!(s.whole_ns >= s.driver_ns + s.io_wq_ns);
        assert!(
            s.io_wq_ns > s.driver_ns,
            "the exited thread burnt 4 x the driver's work: {s:?}"
        );
        assert_eq!(
            s.whole_ns,
            s.worker_ns + s.io_wq_ns + s.driver_ns + s.other_ns
        );
        let j = s.to_json(1000);
        assert!(j["whole_less_driver"].as_f64().unwrap() > 0.0);
    }
}
